"""hvd_elastic.horovodrun in one process: when the rules apply, what a failed round decides, the hook's reach."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hvd_elastic.envvars import ConfigError
from hvd_elastic.horovodrun import rules
from hvd_elastic.horovodrun.hook import MODULE


class Discovery:
    def __init__(self, script: str):
        self._discovery_script = script


@pytest.mark.parametrize("script", [
    "consul_hosts", "/opt/hvd-elastic/.venv/bin/consul_hosts --service horovod", "discovery/consul_hosts",
    "env CONSUL_HTTP_ADDR=h:8500 consul_hosts", "hvd-elastic discover --tag gpu", "'/a b/consul_hosts'",
])
def test_the_rules_apply_to_hvd_elastics_discovery(script):
    assert rules.applies(Discovery(script), environ={})


@pytest.mark.parametrize("script", ["./discover.sh", "/etc/mpi/discover_hosts.sh", "my_consul_hosts.sh",
                                    "hvd-elastic status"])
def test_the_rules_leave_any_other_discovery_to_horovod(script):
    assert not rules.applies(Discovery(script), environ={})


def test_hvd_elastic_driver_decides_when_set():
    assert rules.applies(Discovery("./discover.sh"), environ={"HVD_ELASTIC_DRIVER": "1"})
    assert not rules.applies(Discovery("consul_hosts"), environ={"HVD_ELASTIC_DRIVER": "false"})
    assert not rules.applies(object(), environ={})  # fixed hosts (-H): no script at all
    with pytest.raises(ConfigError, match=r"^HVD_ELASTIC_DRIVER='auto' is not a boolean"):
        rules.applies(Discovery("consul_hosts"), environ={"HVD_ELASTIC_DRIVER": "auto"})


def test_a_round_in_which_every_worker_failed_restarts_only_from_a_checkpoint_and_not_forever():
    job = rules.Job()
    assert job.restart_refusal([137, 255]) is None  # nothing trained yet: a host lost at the job's first rendezvous
    job.initialized = True
    assert "no worker announced a durable checkpoint" in job.restart_refusal([137])
    job.resumable = True
    assert job.restart_refusal([134, 137]) is None
    assert job.restart_refusal([1, 137]) is None  # one worker raised, another was killed: a fault, not a bug
    assert "every worker exited 1" in job.restart_refusal([1])
    job.all_failed = rules.ALL_FAILED_ROUNDS
    assert f"{rules.ALL_FAILED_ROUNDS} such rounds in a row" in job.restart_refusal([137])


def test_the_hook_patches_horovods_launcher_when_it_is_imported_and_only_then():
    """In a fresh interpreter of this environment: the .pth line put the finder in place, importing the
    launcher installs the rules, and a worker's imports (horovod.torch) do not."""
    probe = (
        "import sys\n"
        "finders = [type(f).__name__ for f in sys.meta_path]\n"
        "import horovod.torch\n"
        f"assert {MODULE!r} not in sys.modules, 'a worker imported the launcher'\n"
        f"import {MODULE} as g\n"
        "from horovod.runner.elastic import driver\n"
        "print(finders[0], g._hvd_elastic_rules, driver.ElasticDriver.stop.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["_Finder", "True", "hvd_elastic.horovodrun.rules"]
    off = subprocess.run([sys.executable, "-c", probe.replace("print(finders[0], ", "print(")],
                         capture_output=True, text=True, timeout=120, env={"HVD_ELASTIC_DRIVER": "0"})
    assert off.returncode != 0 and "_hvd_elastic_rules" in off.stderr, "HVD_ELASTIC_DRIVER=0 still installed them"


def test_another_horovod_is_left_alone_with_one_warning(monkeypatch, caplog):
    import horovod
    from horovod.runner import gloo_run

    monkeypatch.setattr(horovod, "__version__", "0.29.0")
    monkeypatch.delattr(gloo_run, "_hvd_elastic_rules", raising=False)
    stop = gloo_run.ElasticDriver.stop
    rules.install(gloo_run)
    assert gloo_run.ElasticDriver.stop is stop
    assert "written for Horovod 0.28.1, found 0.29.0" in caplog.text


def test_the_default_cooldown_doubles_only_for_failures_close_together():
    import threading
    import time
    from types import SimpleNamespace

    from horovod.runner.elastic.discovery import HostManager, HostState

    driver = SimpleNamespace(_host_manager=HostManager(None, rules.COOLDOWN), _wait_hosts_cond=threading.Condition())
    driver._host_manager._hosts_state["early"].blacklist()  # a state the discovery thread made before the swap
    rules._forget_old_failures(driver, HostState)
    states = driver._host_manager._hosts_state
    assert states["early"].is_blacklisted() and states["early"]._blacklist_count == 1

    def fail_again(host: str, last_failure_ago: float) -> float:
        state = states[host]
        state._cooldown_period_end_ts = 0  # its previous cooldown is over
        state._last_failure = time.time() - last_failure_ago
        state.blacklist()
        return state._cooldown_period_end_ts - time.time()

    low = rules.COOLDOWN[0]
    assert 2 * low - 1 < fail_again("flaky", 1e9) <= 3 * low  # a first failure: 4-6 s
    assert 4 * low - 1 < fail_again("flaky", 5.0) <= 5 * low  # again soon after: doubled
    assert 8 * low - 1 < fail_again("flaky", 5.0) <= 9 * low
    assert 2 * low - 1 < fail_again("flaky", rules.DECAY_S + 1) <= 3 * low  # after a quiet spell: from the start


def test_a_world_whose_worker_failed_is_doomed_until_the_next_world_starts():
    """Rule 5 on Horovod's own rendezvous server: the world as the driver tells it, the ranks that arrived
    (ready or already in Gloo's rendezvous), Gloo's requests of a doomed world answered 503, and the host of a
    worker so refused not blacklisted for its failure."""
    from types import SimpleNamespace

    from tests.horovodrun.rules_driver import driver_with_rules

    with driver_with_rules() as driver:
        driver.start_world("a", "b", "c")
        client = driver.client
        assert client.world().hosts == ("a", "b", "c") and not client.world().present
        assert client.world().min_np == 2  # the floor of a straggler drain
        client.request("PUT", "/hvd_elastic_ready/0", b"a")
        client.request("PUT", "/global/2", bytes(2 * rules.GLOO_ADDRESS_BYTES))  # rank 2's block in a world of 3
        assert client.world().present == {0, 2} and client.world().doomed == ""
        assert client.request("GET", "/global/2")[0] == 200

        rules._doom(driver, "c[0] exited 3")
        assert client.world().doomed == "c[0] exited 3"
        assert [client.request("GET", path)[0] for path in ("/global/2", "/local_a/0", "/cross_0/1")] == [503] * 3
        assert client.request("GET", "/hvd_elastic_ready/0")[0] == 200  # only Gloo's rendezvous is refused

        # The worker refused there fails: its host is not blacklisted for it in that round; another host is,
        # and so is the spared host in a later round.
        blacklisted = []
        manager = SimpleNamespace(blacklist=blacklisted.append)
        rules._spare_sent_away(manager, driver._hvd_elastic)
        rules._note_sent_away(driver._hvd_elastic, "localhost", 0, 255)
        rules._note_sent_away(driver._hvd_elastic, "a-host-that-was-never-refused.invalid", 0, 255)
        for host in ("localhost", "b"):
            manager.blacklist(host)
        driver._hvd_elastic.spared.clear()  # what the round's end does (rules._patch_registry)
        manager.blacklist("localhost")
        assert blacklisted == ["b", "localhost"]

        driver.start_world("a", "b")  # the next world starts: the store, and the doom with it, are cleared
        world = client.world()
        assert (world.hosts, world.present, world.doomed) == (("a", "b"), frozenset(), "")
        assert client.request("GET", "/global/2")[0] == 404


def test_rule_9_gloo_addresses_of_a_world_of_another_size_are_refused():
    """The soak's and the peers run's whole-round failures (``address.cc: 136 vs 170``): a worker started for an
    earlier world writes its block of Gloo addresses into the new world's store, and every rank that reads it
    aborts.  On Horovod's own server: this world's block is stored, another size's is refused with 503 and not
    stored, and its host is spared as under rule 5."""
    from tests.horovodrun.rules_driver import driver_with_rules

    with driver_with_rules() as driver:
        driver.start_world("a", "b", "c")
        client = driver.client
        block = bytes(range(256)) * 2
        assert client.request("PUT", "/global/1", block[:2 * rules.GLOO_ADDRESS_BYTES])[0] == 200
        for size in (2, 5, 6):  # a rank of a world of `size` publishes size - 1 addresses
            assert client.request("PUT", "/global/0", block[:(size - 1) * rules.GLOO_ADDRESS_BYTES])[0] == 503
        assert client.request("GET", "/global/0")[0] == 404  # nothing of them was stored
        assert client.request("GET", "/global/1") == (200, block[:2 * rules.GLOO_ADDRESS_BYTES])
        assert "127.0.0.1" in driver._hvd_elastic.sent_away  # its failure will not hold its host out
        assert client.request("PUT", "/local_a/0", b"any")[0] == 200  # only the global block is sized here
        assert client.request("PUT", "/global/rank_1", b"ab")[0] == 200  # Horovod's own values beside Gloo's


def test_rule_8_once_the_job_is_done_a_joiner_is_ended_and_its_exit_is_no_failure():
    from hvd_elastic.horovodrun import slots

    class Workers(slots.Workers):
        def __init__(self, running: dict, exited: dict):
            super().__init__()
            self.running, self.exited, self.ended = running, exited, []

        def any_registered(self):
            return any(self.running.values())

        def unregistered(self):
            return sorted(slot for slot, registered in self.running.items() if not registered)

        def exited_registered(self, slot):
            return self.exited.get(slot, False)

        def end(self, slot):
            self.ended.append(slot)

    job = rules.Job(workers=Workers({("b", 0): True, ("c", 0): False}, {("a", 0): True}))
    assert rules._after_the_end(job, ("x", 0), 134) == 134  # before the end a failure is a failure
    assert rules._after_the_end(job, ("a", 0), 0) == 0 and job.done
    assert job.workers.ended == []  # b still finishes (a checkpoint, say): nobody is ended under it
    job.workers.running.pop(("b", 0))
    assert rules._after_the_end(job, ("b", 0), 0) == 0 and job.workers.ended == [("c", 0)]
    assert rules._after_the_end(job, ("c", 0), 143) == 0  # the joiner it ended never got through hvd.init()
    job.workers.exited[("d", 0)] = True
    assert rules._after_the_end(job, ("d", 0), 134) == 134  # a worker that trained and failed still failed
