"""benchmarks/peers.py's injector: churn joins retire after a hold, and the next join brings a retired host back."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import peers as harness  # noqa: E402


class FakeStack:
    """What the injector calls, recorded: hosts h0..h(n-1), joins add h<n>, h<n+1>, ..."""

    def __init__(self, hosts: int):
        self.names = [f"h{i}" for i in range(hosts)]
        self.calls: list[tuple[str, str]] = []

    def hosts(self) -> list[str]:
        return list(self.names)

    def join(self) -> str:
        host = f"h{len(self.names)}"
        self.names.append(host)
        self.calls.append(("join", host))
        return host

    def leave(self, host: str) -> None:
        self.calls.append(("leave", host))

    def rejoin(self, host: str) -> None:
        self.calls.append(("rejoin", host))

    def trainer(self, host: str) -> list[int]:
        return []


def test_a_churn_join_retires_after_its_hold_and_the_next_join_brings_it_back():
    stack = FakeStack(2)
    injector = harness.Injector(stack, down=10.0, hold=0.0)
    assert injector.inject(harness.Fault(0.0, "join", 0, churn=True))["host"] == "h2"
    # While its join is under way the new host is no fault's target.
    assert injector.inject(harness.Fault(0.0, "worker-kill", 2))["skipped"] == "no training process on h0 yet"
    time.sleep(0.01)
    injector.heal_due()
    assert stack.calls == [("join", "h2"), ("leave", "h2")]
    assert injector.inject(harness.Fault(0.0, "join", 1, churn=True))["host"] == "h2"
    assert stack.calls[-1] == ("rejoin", "h2") and len(stack.names) == 3  # the bed did not grow


def test_an_isolated_join_stays_and_the_runs_end_retires_nobody():
    stack = FakeStack(2)
    injector = harness.Injector(stack, down=10.0, hold=0.0)
    injector.inject(harness.Fault(0.0, "join", 0))
    injector.inject(harness.Fault(0.0, "join", 0, churn=True))
    injector.heal_due(everything=True)
    assert stack.calls == [("join", "h2"), ("join", "h3")]
