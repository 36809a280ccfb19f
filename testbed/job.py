"""Test-only ways to start what a test talks to: the dev agent as its own process, a host-file discovery script.

On top of :class:`hvd_elastic.local.job.Job`; the demo needs neither (it runs the dev agent in-process).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path

from hvd_elastic.local.env import HVD_ELASTIC
from hvd_elastic.local.job import Job


def start_dev_agent(nodes: Sequence[str], *, env: dict[str, str], logdir: Path, name: str = "consul-dev",
                    port: int = 0, log_level: str = "WARNING") -> tuple[Job, dict[str, str]]:
    """``hvd-elastic consul-dev`` for ``nodes`` in its own process, as Consul would run: (its Job, {node: host:port}).

    Returns once every node answers.  ``port`` is the first node's HTTP port (the
    others follow); 0 lets each take a free one, read back from the agent's ready
    file, never guessed beforehand.  Stop it with :meth:`Job.stop` or :meth:`Job.kill`.
    """
    ready = Path(logdir) / f"{name}.{uuid.uuid4().hex}.ready.json"
    job = Job([HVD_ELASTIC, "--log-level", log_level, "consul-dev", "--nodes", ",".join(nodes), "--http-port", port,
               "--ready-file", ready], env=env, logdir=logdir, name=name)
    job.start()
    try:
        text = job.wait_until("the dev agent to answer on every node",
                              lambda: ready.exists() and ready.read_text().strip(), 60, 0.05)
    except BaseException:
        job.kill()  # one that never answered is not left running
        raise
    ready.unlink()
    return job, json.loads(text)


def host_file_discovery(hosts_file: Path, hosts: str) -> Path:
    """Horovod's plain way to drive membership: a script that prints ``hosts_file``.

    Writes ``hosts`` into the file and returns the script; rewrite the file to change the hosts.
    """
    hosts_file.write_text(hosts)
    script = hosts_file.with_name(hosts_file.name + ".sh")
    script.write_text(f"#!/bin/sh\nexec cat '{hosts_file}'\n")
    script.chmod(0o755)
    return script
