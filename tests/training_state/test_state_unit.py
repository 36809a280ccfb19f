"""TrainingState commit/restore/snapshot in one process (Horovod initialised as a world of one)."""

from __future__ import annotations

import io
import random

import pytest
import torch

from hvd_elastic.training.batching import BatchPolicy
from hvd_elastic.training.sampler import ExactlyOnceSampler


def make(seed=0, **kw):
    from hvd_elastic.training.state import TrainingState

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    sampler = ExactlyOnceSampler(64, 4)
    state = TrainingState(model=model, optimizer=opt, schedulers=[sched], scaler=scaler, sampler=sampler,
                          epoch=0, step=0, history=[], **kw)
    return state


def train_step(state):
    x = torch.randn(8, 4)
    loss = state.model(x).pow(2).mean()
    state.optimizer.zero_grad()
    state.scaler.scale(loss).backward()
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.schedulers[0].step()
    state.sampler.record_batch()
    state.step += 1
    state.history.append(state.step)


def fingerprint(state):
    """Everything that must come back after restore, as comparable values."""
    opt = state.optimizer
    return {
        "model": {k: v.clone() for k, v in state.model.state_dict().items()},
        "opt": [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[p].items()}
                for g in opt.param_groups for p in g["params"] if p in opt.state],
        "lr": [g["lr"] for g in opt.param_groups],
        "sched": state.schedulers[0].state_dict(),
        "scaler": state.scaler.state_dict(),
        "sampler": state.sampler.state_dict(),
        "values": {k: list(v) if isinstance(v, list) else v for k, v in state.values.items()},
        "rng": (torch.rand(3), random.random(), _numpy_random()),
    }


def _numpy_random():
    try:
        import numpy
    except ImportError:
        return None
    return float(numpy.random.random())


def assert_same(a, b):
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert len(a["opt"]) == len(b["opt"])
    for x, y in zip(a["opt"], b["opt"]):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k]
    for key in ("lr", "sched", "scaler", "sampler", "values"):
        assert a[key] == b[key], key
    assert torch.equal(a["rng"][0], b["rng"][0]) and a["rng"][1:] == b["rng"][1:]


def test_restore_returns_everything_to_the_last_commit(hvd):
    state = make()
    train_step(state)
    state.commit()
    expected = fingerprint(state)  # draws from the committed RNG states
    for _ in range(3):
        train_step(state)
    state.epoch = 7
    state.restore()
    assert_same(fingerprint(state), expected)


def test_restore_before_the_first_step_drops_lazily_created_optimizer_state(hvd):
    state = make()
    before = fingerprint(state)  # the construction-time state, RNG draws included
    assert not state.optimizer.state
    train_step(state)  # Adam creates exp_avg/exp_avg_sq/step now
    state.restore()
    assert not state.optimizer.state
    assert_same(fingerprint(state), before)


def test_commit_reuses_its_buffer_until_the_layout_changes(hvd):
    state = make()
    first = state._buffer
    train_step(state)
    state.commit()  # Adam state appeared: new layout, new buffer
    second = state._buffer
    assert second is not first
    views = [v.data_ptr() for v in second.views]
    for _ in range(3):
        train_step(state)
        state.commit()
    assert state._buffer is second and [v.data_ptr() for v in state._buffer.views] == views
    assert state.commit_count == 4


def test_restore_copies_into_the_live_tensors_in_place(hvd):
    state = make()
    train_step(state)
    state.commit()
    params = [p.data_ptr() for p in state.model.parameters()]

    def moments():
        return {(id(p), k): t.data_ptr() for p, s in state.optimizer.state.items() for k, t in s.items()}

    before = moments()
    train_step(state)
    state.restore()
    assert params == [p.data_ptr() for p in state.model.parameters()]
    assert moments() == before


def test_snapshot_is_weights_only_loadable_and_loads_into_fresh_objects(hvd):
    state = make(seed=1)
    for _ in range(3):
        train_step(state)
        state.commit()
    expected = fingerprint(state)  # draws from the committed RNG states
    buffer = io.BytesIO()
    torch.save(state.snapshot(), buffer)
    buffer.seek(0)
    snap = torch.load(buffer, weights_only=True)
    assert snap["commit_count"] == 3 and snap["values"]["step"] == 3

    fresh = make(seed=2)  # different initial weights and RNG states, no optimizer state
    fresh.load_snapshot(snap)
    assert fresh.commit_count == 0
    # No reseeding here: the RNG draws match only if load_snapshot restored the generators.
    assert_same(fingerprint(fresh), expected)
    # and it is now the committed state: a restore goes back to it
    train_step(fresh)
    fresh.restore()
    assert fresh.step == 3


def test_snapshot_views_change_with_the_next_commit_unless_copied(hvd):
    state = make()
    train_step(state)
    state.commit()
    view, private = state.snapshot(), state.snapshot(copy=True)
    key = next(iter(view["components"]["model"]["tensors"]))
    before = private["components"]["model"]["tensors"][key].clone()
    train_step(state)
    state.commit()
    assert torch.equal(private["components"]["model"]["tensors"][key], before)
    assert not torch.equal(view["components"]["model"]["tensors"][key], before)


def test_sync_on_rank_0_commits_its_live_state_changed_or_not(hvd):
    state = make()
    train_step(state)
    state.commit()
    key = "0.weight"
    for change in (True, False):
        if change:
            train_step(state)  # in-place parameter updates since the commit
        state.sync()
        committed = state.snapshot()["components"]["model"]["tensors"][key]
        assert torch.equal(committed, state.model.state_dict()[key])
        state.restore()
        assert torch.equal(committed, state.model.state_dict()[key])


def test_sync_copies_changes_version_counters_miss(hvd):
    from hvd_elastic.training.state import TrainingState

    # 1. a change through .data, then a check for host updates outside commit()
    state = make()
    train_step(state)
    state.commit()
    state.model[0].weight.data.add_(1.0)
    state.check_host_updates()
    state.sync()
    committed = state.snapshot()["components"]["model"]["tensors"]["0.weight"]
    assert torch.equal(committed, state.model[0].weight.detach())

    # 2. a fused optimizer step, which bypasses version counters
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    state = TrainingState(model=model, optimizer=opt, rng=False)
    state.commit()
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    state.sync()
    committed = state.snapshot()["components"]["model"]["tensors"]["weight"]
    assert torch.equal(committed, model.weight.detach())


def test_load_snapshot_rejects_foreign_dicts(hvd):
    state = make()
    with pytest.raises(ValueError, match="not a TrainingState snapshot"):
        state.load_snapshot({"model": {}})


def test_listeners_see_commit_restore_and_sync(hvd):
    state = make()
    events = []
    state.add_listener(lambda event, fields: events.append((event, fields)))
    state.add_listener(lambda event, fields: 1 / 0)  # a broken listener must not break training
    train_step(state)
    state.commit()
    state.restore()
    state.sync()
    names = [e for e, _ in events]
    assert names == ["commit", "committed", "restore", "sync"]
    commit = events[0][1]
    assert commit["commit_count"] == 1 and commit["bytes"] > 0 and commit["seconds"] >= 0
    # alone, after a restore, the rank holds its committed state: nothing moves
    assert events[1][1] == {"commit_count": 1}  # its host check passed: the next step starts
    assert events[3][1]["bytes"] == 0 and events[3][1]["transfer"] == "none"


def test_user_values_are_attributes_and_reserved_names_are_refused(hvd):
    from hvd_elastic.training.state import TrainingState

    state = make()
    state.epoch = 4
    assert state.values["epoch"] == 4
    with pytest.raises(ValueError, match="reserved"):
        TrainingState(commit_count=1)
    with pytest.raises(AttributeError):
        state.not_a_value


def test_a_new_attribute_after_construction_is_refused_with_the_fix(hvd):
    """Before: ``state.best = x`` set a plain attribute that no commit, restore or
    checkpoint ever saw; now it is refused, naming the name and the fix."""
    state = make(best=None)
    state.best = {"loss": 0.5}  # a value named at construction: committed like the rest
    state.commit()
    state.best = {"loss": 0.1}
    state.restore()
    assert state.best == {"loss": 0.5}
    with pytest.raises(AttributeError, match=r"cannot set 'metric' on TrainingState: it is not one of its values "
                                             r"\(best, epoch, history, step\).*TrainingState\(\.\.\., metric=\.\.\.\)"):
        state.metric = 0.3
    assert "metric" not in state.__dict__ and "metric" not in state.values
    # What exists stays assignable: components, Horovod's private bookkeeping, the policy.
    state.batch_policy = None
    state._last_updated_timestamp = 0
    state.on_reset()  # Horovod's State sets _host_messages here
    state.commit()


def test_register_extension_point(hvd):
    class Counter:
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n, "t": torch.tensor([self.n])}

        def load_state_dict(self, sd):
            self.n = sd["n"]
            assert sd["t"].item() == sd["n"]

    state = make()
    counter = Counter()
    state.register("counter", counter)
    counter.n = 3
    state.restore()  # registered after the last commit: left as it is
    assert counter.n == 3
    counter.n = 5
    state.commit()
    counter.n = 9
    state.restore()
    assert counter.n == 5
    with pytest.raises(TypeError, match="needs state_dict"):
        state.register("bad", object())
    with pytest.raises(ValueError, match="already registered"):
        state.register("counter", Counter())


def test_scale_lr_policy_follows_world_size_and_is_committed(hvd):
    from hvd_elastic.training.state import TrainingState

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0)
    state = TrainingState(model=model, optimizer=opt, schedulers=[sched], rng=False,
                          batch_policy=BatchPolicy.scale_lr(8, base_world_size=4))
    # world of one, base of four: a quarter of the LR
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    state.commit()
    state.reset()  # idempotent for the same world size
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    assert state.snapshot()["policy"]["lr_factor"] == pytest.approx(0.25)


def test_batch_policy_arithmetic():
    g = BatchPolicy.constant_global(96)
    assert [g.step_samples(w) for w in (1, 2, 5)] == [96, 96, 96] and g.accumulation_steps(5) == 1
    a = BatchPolicy.accumulate(256, 32)
    assert [a.accumulation_steps(w) for w in (1, 2, 3, 8, 16)] == [8, 4, 3, 1, 1]
    assert a.effective_global_batch(2) == 256 and a.step_samples(2) == 64
    s = BatchPolicy.scale_lr(16)
    assert s.step_samples(3) == 48 and s.lr_factor(6, base_world_size=2) == 3.0
    assert g.lr_factor(6, base_world_size=2) == 1.0
    with pytest.raises(ValueError, match="unknown batch policy mode 'x'"):
        BatchPolicy("x")
    with pytest.raises(ValueError, match="global_batch_size must be a positive integer, got 0"):
        BatchPolicy.constant_global(0)


def test_a_sampler_batch_size_beside_a_batch_policy_is_refused(hvd):
    """Before: the policy silently overrode the sampler's batch_size (the demo passed its
    GLOBAL batch as the per-rank size); now the pair is refused, naming both."""
    from hvd_elastic.training.state import TrainingState

    policy = BatchPolicy.constant_global(24)
    with pytest.raises(ValueError, match=r"^ExactlyOnceSampler\(batch_size=16\) and batch_policy=BatchPolicy\("
                                         r"'constant_global', global_batch_size=24\) both set the batch.*"
                                         r"leave batch_size out of the sampler$"):
        TrainingState(rng=False, sampler=ExactlyOnceSampler(100, 16), batch_policy=policy)
    state = TrainingState(rng=False, sampler=ExactlyOnceSampler(100, 16))  # a batch_size alone is fine
    state.batch_policy = policy  # a policy set later is refused where it takes effect: the next reset
    with pytest.raises(ValueError, match=r"batch_size=16\) and batch_policy="):
        state.reset()


def test_batch_policies_drive_sampler_and_accumulation(hvd):
    from hvd_elastic.training.state import TrainingState

    model = torch.nn.Linear(2, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    sampler = ExactlyOnceSampler(100)  # no batch_size: the policy sets the step
    state = TrainingState(model=model, optimizer=opt, sampler=sampler, rng=False,
                          batch_policy=BatchPolicy.accumulate(64, 8))
    assert sampler.step_samples == 8 and state.accumulation_steps == 8
    assert opt.backward_passes_per_step == 8
    state.batch_policy = BatchPolicy.constant_global(24)
    state.reset()
    assert sampler.step_samples == 24 and state.accumulation_steps == 1
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
