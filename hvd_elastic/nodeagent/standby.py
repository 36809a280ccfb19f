"""The ``standby`` probe: announce a node only once its warm standby can start a worker at once.

Horovod stops every survivor while a newcomer starts, so a node whose standby
(:mod:`hvd_elastic.standby`) is still importing torch should not be announced
yet: the join would take the slow path and cost the survivors its whole
start-up.  With ``node-agent --standby NAME`` this probe is critical ("not ready
yet") until standby ``NAME`` answers as a launcher here could use it (this code, this
network namespace: :func:`hvd_elastic.standby.protocol.unusable`), and at most
``--standby-wait`` seconds: a node whose standby never comes joins the slow way
(one log line says so).  After that the probe only reports: a standby that dies
later never takes a healthy node out of the job.
"""

from __future__ import annotations

import logging
import time

from hvd_elastic.nodeagent.probes import CRITICAL, PASSING, Probe, ProbeResult, ProbeSettings, register_probe
from hvd_elastic.standby import protocol

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 0.5  # seconds: a ready standby answers from its select loop at once


def standby_state(name: str) -> str | None:
    """None when standby ``name`` answers and a launcher here could use it; else why not (a few words)."""
    try:
        sock, hello = protocol.connect(name, HELLO_TIMEOUT)
        sock.close()
    except FileNotFoundError:
        return "not started"
    except (OSError, protocol.ProtocolError) as exc:
        return f"not answering ({getattr(exc, 'strerror', None) or exc or type(exc).__name__})"
    return protocol.unusable(hello)


@register_probe("standby")
class StandbyProbe(Probe):
    """Critical until the standby is ready or ``standby_wait`` seconds have passed; then passing."""

    def __init__(self, settings: ProbeSettings):
        if not settings.standby_name:
            raise ValueError("the standby probe needs a standby name (--standby NAME)")
        self.standby = settings.standby_name
        self.wait = settings.standby_wait
        self.started = time.monotonic()
        self.gate_open = False

    def check(self) -> ProbeResult:
        why = standby_state(self.standby)
        if why is None:
            if not self.gate_open:
                log.info("standby %r is ready: announcing this node", self.standby)
            self.gate_open = True
            return ProbeResult(PASSING, f"standby {self.standby} ready")
        if self.gate_open:
            return ProbeResult(PASSING, f"standby {self.standby} {why}: workers start directly")
        waited = time.monotonic() - self.started
        if waited < self.wait:
            return ProbeResult(CRITICAL,
                               f"standby {self.standby} not ready yet ({why}; {waited:.0f} of {self.wait:g} s)")
        log.warning("standby %r still %s after %g s: announcing this node, its workers start directly",
                    self.standby, why, self.wait)
        self.gate_open = True
        return ProbeResult(PASSING, f"standby {self.standby} {why}: workers start directly")
