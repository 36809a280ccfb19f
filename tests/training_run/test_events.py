"""EventLog: JSON lines written whole, read back, torn last line tolerated."""

from __future__ import annotations

import contextlib
import logging
import sys
import textwrap

from testbed import Job, child_env
from hvd_elastic.training.events import EventLog


def test_emit_and_read_back_with_context(tmp_path):
    path = tmp_path / "logs" / "events.jsonl"
    log = EventLog(path, context=lambda: {"rank": 0, "size": 2})
    assert not path.exists()  # nothing is created before the first event
    log.emit("reset", reason="hosts_updated", hosts="added", old_size=2, new_size=3)
    log.emit("commit", seconds=0.001, commit_count=1, bytes=4096)
    log.close()
    records = EventLog.read(path)
    assert [r["event"] for r in records] == ["reset", "commit"]
    assert records[0]["rank"] == 0 and records[0]["size"] == 2
    assert (records[0]["old_size"], records[0]["new_size"], records[0]["hosts"]) == (2, 3, "added")
    assert records[0]["time"] <= records[1]["time"]
    assert EventLog.read(path, event="commit") == [records[1]]


def test_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.emit("start")
    log.emit("checkpoint", path="/x", bytes=10, seconds=0.5)
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"time": 1, "event": "comm')  # a job killed mid-write
    with caplog.at_level(logging.WARNING, logger="hvd_elastic.training.events"):
        records = EventLog.read(path)
    assert [r["event"] for r in records] == ["start", "checkpoint"]
    assert f"{path}:3" in caplog.text


def test_concurrent_writers_never_interleave_within_a_line(tmp_path):
    """Two processes (a retiring and a new rank 0) and two threads each append at once."""
    path = tmp_path / "events.jsonl"
    script = textwrap.dedent(f"""
        import threading
        from hvd_elastic.training.events import EventLog
        log = EventLog({str(path)!r}, context=lambda: {{"who": WHO}})
        def burst(thread):
            for i in range(300):
                log.emit("commit", thread=thread, i=i, pad="x" * 500)
        threads = [threading.Thread(target=burst, args=(t,)) for t in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        log.close()
    """)
    with contextlib.ExitStack() as jobs:  # both writers die with the test, also when it fails
        writers = [jobs.enter_context(Job([sys.executable, "-c", script.replace("WHO", str(who))], env=child_env(),
                                          logdir=tmp_path, name=f"writer-{who}"))
                   for who in range(2)]
        for writer in writers:
            writer.start()
        assert [writer.wait(timeout=60) for writer in writers] == [0, 0]
    records = EventLog.read(path)
    assert len(records) == 2 * 2 * 300
    seen = {(r["who"], r["thread"], r["i"]) for r in records}
    assert len(seen) == 1200


def test_write_errors_do_not_raise(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    log = EventLog(blocker / "events.jsonl")
    with caplog.at_level(logging.ERROR, logger="hvd_elastic.training.events"):
        record = log.emit("start")
    assert record["event"] == "start"
    assert "could not append start event" in caplog.text
    log.close()



def test_every_event_written_is_named_once_in_events():
    """The names the decorator, the state and the checkpoint writer emit are EVENTS, which report reads."""
    import re

    from hvd_elastic.report import runlog
    from testbed import REPO
    from hvd_elastic.training.events import EVENTS

    training = REPO / "hvd_elastic" / "training"
    emitted = {name for module in ("runner.py", "state.py", "checkpoint.py")
               for name in re.findall(r"_emit\(\"(\w+)\"", (training / module).read_text())}
    emitted.discard("committed")  # the state's listener event for the straggler clock, which the decorator never logs
    assert emitted and emitted <= set(EVENTS), emitted - set(EVENTS)
    assert set(runlog.NEEDED_NUMBERS) <= set(EVENTS)
    table = (training / "events.py").read_text().split('"""')[1].split("=" * 19 + " ")[1]  # between the rules
    documented = re.findall(r"^``(\w+)``", table.split("\n", 1)[1], re.M)
    assert documented == list(EVENTS)
