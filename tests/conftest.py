"""Suite-wide rules and fixtures.

``consul_kind``: a test that takes it runs twice, against the project's dev agent
("dev") and against HashiCorp Consul ("consul", :mod:`hvd_elastic.local.realconsul`);
build its cluster with ``consul_cluster(consul_kind, nodes, ...)``.  A test marked
``dev_agent_only("why")`` runs on the dev agent alone: the reason names the
difference (see the table in :mod:`hvd_elastic.devagent`).

``serial``: ``make test`` runs the rest side by side (pytest-xdist, a file per
worker), then these alone.  Every ``multihost`` test is one: the network-namespace
bed is one per machine (``testbed.netns`` holds a lock), and a rank of a bed
sharing the cores with another test is a straggler by the clock.

The side-by-side pass hands out whole files longest first (``long`` tests, minutes
each, then ``slow`` ones, then the rest), so the pass ends on short files instead of
one worker finishing a long test alone; ``make test`` turns off pytest-xdist's own
order, which is by number of tests.

In CI (``CI`` set to a true value, as ``.ci/run`` does) a skipped test is a
failure naming what was missing: every prerequisite of the suite (root for the
network-namespace bed, ``openssl``, Open MPI, torchdata, the cached Horovod wheel)
is installed by ``scripts/bootstrap.sh``, so a skip there means a suite silently
did not run.  On a developer's machine a skip stays a skip, with its reason.
"""

from __future__ import annotations

import os

import pytest

from hvd_elastic.local.realconsul import KINDS, unavailable_reason

IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"missing prerequisite (a skip fails in CI, CI={os.environ['CI']!r}): {reason}"


# Rough seconds a test takes, by its marker: enough to order files, longest first.
ESTIMATED_SECONDS = (("long", 300.0), ("slow", 30.0))
UNMARKED_SECONDS = 0.5


def estimated_seconds(item) -> float:
    return next((s for name, s in ESTIMATED_SECONDS if item.get_closest_marker(name)), UNMARKED_SECONDS)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("multihost"):
            item.add_marker(pytest.mark.serial)
    per_file: dict[str, float] = {}
    for item in items:
        per_file[item.path] = per_file.get(item.path, 0.0) + estimated_seconds(item)
    # Stable: a file's tests keep their order, files of equal estimate keep theirs.
    items.sort(key=lambda item: -per_file[item.path])


def pytest_generate_tests(metafunc):
    if "consul_kind" in metafunc.fixturenames:
        kinds = ["dev"] if metafunc.definition.get_closest_marker("dev_agent_only") else list(KINDS)
        metafunc.parametrize("consul_kind", kinds, indirect=True)


@pytest.fixture
def consul_kind(request):
    """The parametrized kind; "consul" without the binary skips naming why (a failure in CI)."""
    kind = request.param
    if kind == "consul" and (reason := unavailable_reason()):
        pytest.skip(reason)
    return kind
