"""Check runners: TTL, HTTP and TCP, each turning probe results into a check status.

Behaviour follows Consul's ``agent/checks``: a TTL check goes critical with
output ``TTL expired`` when no update arrives within its TTL; HTTP checks are
passing on 2xx, warning on 429 and critical otherwise; TCP checks are passing
when a connection opens.  Interval checks start after a random stagger within
one interval and never run more often than once a second.  Runners live on
the dev agent's event loop; blocking HTTP probes run in its thread pool.
"""

from __future__ import annotations

import abc
import asyncio
import random
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable

from hvd_elastic.gotypes import SECOND

from .catalog import CRITICAL, PASSING, WARNING

MIN_INTERVAL_NS = 1 * SECOND
DEFAULT_TIMEOUT_NS = 10 * SECOND
OUTPUT_MAX_SIZE = 4096

Report = Callable[[str, str], None]


def truncate_output(output: str, limit: int = OUTPUT_MAX_SIZE) -> str:
    """Cap check output the way Consul does, saying how much was kept."""
    data = output.encode()
    if len(data) <= limit:
        return output
    kept = data[:limit].decode(errors="ignore")
    return f"{kept} ... (captured {limit} of {len(data)} bytes)"


class CheckRunner(abc.ABC):
    """Runs one check while its node's agent is up."""

    type_name: str

    def __init__(self, definition: dict, report: Report) -> None:
        self.definition = definition
        self.report = report

    @abc.abstractmethod
    def start(self) -> None:
        """Begin running (called on the event loop)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop running; the check keeps its last status."""


class TTLRunner(CheckRunner):
    """A TTL check.  Across an agent restart it keeps only what Consul persists: the
    status of the last update while that update's TTL has not run out; a check that
    was never updated, or whose TTL ran out, comes back critical with no output."""

    type_name = "ttl"

    def __init__(self, definition: dict, report: Report) -> None:
        super().__init__(definition, report)
        self._timer: asyncio.TimerHandle | None = None
        self._last_output = ""
        self._started = False
        self._persisted: tuple[str, str, float] | None = None  # status, output, expiry (loop time)

    def start(self) -> None:
        if self._started:  # a restart of the agent
            loop_time = asyncio.get_running_loop().time()
            if self._persisted is not None and loop_time < self._persisted[2]:
                self.report(*self._persisted[:2])
            else:
                self.report(CRITICAL, "")
        self._started = True
        self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self.stop()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.definition["TTL"] / SECOND, self._expire)

    def _expire(self) -> None:
        self._timer = None
        output = "TTL expired"
        if self._last_output:
            output += f" (last output before timeout follows): {self._last_output}"
        self.report(CRITICAL, output)

    def update(self, status: str, output: str) -> None:
        """A pass/warn/fail/update call: record it and restart the TTL."""
        self._last_output = truncate_output(output)
        self.report(status, self._last_output)
        self._arm()
        expiry = asyncio.get_running_loop().time() + self.definition["TTL"] / SECOND
        self._persisted = (status, self._last_output, expiry)


class IntervalRunner(CheckRunner):
    """A probe run every ``Interval`` with a ``Timeout``."""

    def __init__(self, definition: dict, report: Report) -> None:
        super().__init__(definition, report)
        self.interval = max(definition["Interval"], MIN_INTERVAL_NS) / SECOND
        self.timeout = (definition.get("Timeout") or DEFAULT_TIMEOUT_NS) / SECOND
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self) -> None:
        await asyncio.sleep(random.uniform(0, self.interval))
        while True:
            status, output = await self.probe()
            self.report(status, truncate_output(output))
            await asyncio.sleep(self.interval)

    @abc.abstractmethod
    async def probe(self) -> tuple[str, str]:
        """Run the probe once; return (status, output)."""


class HTTPRunner(IntervalRunner):
    type_name = "http"

    async def probe(self) -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._probe_blocking)

    def _probe_blocking(self) -> tuple[str, str]:
        url = self.definition["HTTP"]
        method = self.definition.get("Method") or "GET"
        body = self.definition.get("Body")
        request = urllib.request.Request(url, method=method, data=body.encode() if body else None)
        request.add_header("User-Agent", "Consul Health Check")
        request.add_header("Accept", "text/plain, text/*, */*")
        for name, values in (self.definition.get("Header") or {}).items():
            for value in values:
                request.add_header(name, value)
        context = None
        if url.startswith("https:") and self.definition.get("TLSSkipVerify"):
            context = ssl._create_unverified_context()  # the check asked for it explicitly
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                code, reason, text = response.status, response.reason, response.read(OUTPUT_MAX_SIZE)
        except urllib.error.HTTPError as exc:
            code, reason, text = exc.code, exc.reason, exc.read(OUTPUT_MAX_SIZE)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return CRITICAL, f'{method.capitalize()} "{url}": {reason}'
        output = f"HTTP {method} {url}: {code} {reason} Output: {text.decode(errors='replace')}"
        if 200 <= code < 300:
            return PASSING, output
        if code == 429:
            return WARNING, output
        return CRITICAL, output


class TCPRunner(IntervalRunner):
    type_name = "tcp"

    async def probe(self) -> tuple[str, str]:
        target = self.definition["TCP"]
        host, _, port = target.rpartition(":")
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), int(port)), timeout=self.timeout
            )
        except asyncio.TimeoutError:
            return CRITICAL, f"dial tcp {target}: i/o timeout"
        except (OSError, ValueError) as exc:
            return CRITICAL, f"dial tcp {target}: {exc}"
        writer.close()
        return PASSING, f"TCP connect {target}: Success"


RUNNERS: dict[str, type[CheckRunner]] = {r.type_name: r for r in (TTLRunner, HTTPRunner, TCPRunner)}


def check_type(definition: dict) -> str:
    """The runner type a decoded check definition asks for."""
    if definition.get("HTTP"):
        return "http"
    if definition.get("TCP"):
        return "tcp"
    return "ttl"


def validate(definition: dict) -> None:
    """Consul's ``CheckType.Validate``; raises ValueError with its message."""
    interval_check = bool(definition.get("HTTP") or definition.get("TCP"))
    interval = definition.get("Interval", 0)
    ttl = definition.get("TTL", 0)
    if interval > 0 and ttl > 0:
        raise ValueError("Interval and TTL cannot both be specified")
    if interval_check and interval <= 0:
        raise ValueError("Interval must be > 0 for Script, HTTP, H2PING, TCP or UDP checks")
    if not interval_check and ttl <= 0:
        raise ValueError("TTL must be > 0 for TTL checks")
    if definition.get("OutputMaxSize", 0) < 0:
        raise ValueError("MaxOutputMaxSize must be positive")
    for name in ("SuccessBeforePassing", "FailuresBeforeWarning", "FailuresBeforeCritical"):
        if definition.get(name):
            raise ValueError(f"{name} is not supported by the hvd-elastic dev agent")
    status = definition.get("Status", "")
    if status and status not in (PASSING, WARNING, CRITICAL):
        raise StatusError("Status for checks must 'passing', 'warning', 'critical'")


class StatusError(ValueError):
    """A check definition carries an invalid initial status (Consul reports it without the 'Invalid check' prefix)."""
