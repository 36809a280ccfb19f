"""The standby under systemd (``Type=notify``): READY=1 once its socket answers, STOPPING=1 at the first stop."""

from __future__ import annotations

import socket

import pytest

from hvd_elastic import sdnotify
from testbed.standby import READY_WAIT, StandbyProcess


def test_notify_sends_one_datagram_to_a_path_or_an_abstract_socket(tmp_path, monkeypatch):
    for address, bind in ((str(tmp_path / "notify"), str(tmp_path / "notify")),
                          ("@hvd-elastic-test", "\0hvd-elastic-test")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
            manager.bind(bind)
            monkeypatch.setenv(sdnotify.ENV, address)
            assert sdnotify.notify("READY=1\nSTATUS=up")
            assert manager.recv(4096) == b"READY=1\nSTATUS=up"


def test_notify_outside_systemd_or_to_nobody_sends_nothing_and_never_fails(tmp_path, monkeypatch):
    monkeypatch.delenv(sdnotify.ENV, raising=False)
    assert not sdnotify.notify("READY=1")
    monkeypatch.setenv(sdnotify.ENV, str(tmp_path / "nobody-listens"))
    assert not sdnotify.notify("READY=1")


@pytest.mark.slow
def test_the_standby_is_ready_for_systemd_when_its_socket_answers(tmp_path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(tmp_path / "notify"))
        manager.settimeout(READY_WAIT)
        with StandbyProcess(tmp_path, "sd", env={sdnotify.ENV: str(tmp_path / "notify")}) as standby:
            ready = manager.recv(4096).decode()
            assert ready.startswith("READY=1\nSTATUS=standby sd ready at "), ready
            assert standby.hello()["pid"] == standby.proc.pid  # it answers by the time systemd is told
            standby.proc.terminate()
            assert manager.recv(4096) == b"STOPPING=1"
            assert standby.proc.wait(30) == 0
