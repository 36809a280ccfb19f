"""hvd_elastic.procfs against this machine's real /proc: this process, its connections, sessions below it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from hvd_elastic import procfs


def test_it_reads_this_process_and_its_connections():
    me = procfs.stat(os.getpid())
    assert me.ppid == os.getppid() and me.sid == os.getsid(0) and me.state == "R"
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            assert ("127.0.0.1", port) in procfs.established_peers(os.getpid())
    assert procfs.stat(2 ** 22 + 1) is None, "a pid that is not there"


def test_session_leaders_are_found_below_a_middle_process_and_zombies_only_when_asked():
    # A middle process (as a forkserver) starts a session leader (as safe_shell_exec's middleman) and a leader
    # that exits at once and is never reaped: a zombie.
    code = ("import subprocess, sys, time\n"
            "live = subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
            "dead = subprocess.Popen(['true'], start_new_session=True)\n"
            "print(live.pid, dead.pid, flush=True)\n"
            "time.sleep(30)\n")
    middle = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        live, dead = (int(v) for v in middle.stdout.readline().split())
        deadline = time.monotonic() + 10
        while procfs.stat(dead).state != procfs.ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        # Of this test's processes only: another test's leftovers may still lead sessions below this process.
        ours = {middle.pid, live, dead}
        assert ours.intersection(procfs.session_leaders(os.getpid())) == {live, dead}
        assert ours.intersection(procfs.session_leaders(os.getpid(), zombies=False)) == {live}
        assert procfs.descendants(os.getpid(), procfs.all_stats()) >= {middle.pid, live, dead}
    finally:
        for pid in (live, middle.pid):
            os.kill(pid, 9)
        middle.wait()
