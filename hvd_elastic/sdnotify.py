"""systemd's readiness protocol (``sd_notify(3)``): one datagram to ``$NOTIFY_SOCKET``.

A unit of ``Type=notify`` counts as started only once its main process sends
``READY=1``, so units ordered ``After=`` it (a node agent that must not
announce the node before its standby can fork workers) wait for that moment.
Outside systemd (no ``NOTIFY_SOCKET``) nothing is sent.
"""

from __future__ import annotations

import os
import socket

ENV = "NOTIFY_SOCKET"


def notify(state: str) -> bool:
    """Send ``state`` (``"READY=1"``, ``"STOPPING=1"``, ``"STATUS=..."`` lines) to systemd.

    Returns False when not run by systemd or when the message could not be sent
    (readiness is a courtesy to the service manager, never a reason to fail).
    """
    address = os.environ.get(ENV)
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError:
        return False
    return True
