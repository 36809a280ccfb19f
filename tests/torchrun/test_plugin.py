"""The ``torchrun.handlers`` entry point: torch finds ``consul`` in the installed metadata and builds our handler
through its own registry; loading the plugin (torch does in every process that imports its rendezvous
package) imports nothing of ours beyond the module itself."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

from hvd_elastic.torchrun.handler import ConsulRendezvousHandler
from tests.torchrun.rdzv_params import parameters


def test_the_entry_point_is_installed_and_torch_registers_it():
    found = [ep for ep in entry_points(group="torchrun.handlers") if ep.name == "consul"]
    assert [ep.value for ep in found] == ["hvd_elastic.torchrun.plugin:handler_creator"]
    handler = rendezvous_handler_registry.create_handler(parameters("127.0.0.1:1", "job-1"))
    assert isinstance(handler, ConsulRendezvousHandler)
    assert handler.get_backend() == "consul" and handler.get_run_id() == "job-1"


def test_loading_the_plugin_imports_nothing_heavy():
    code = ("import sys, hvd_elastic.torchrun.plugin as p; p.handler_creator(); "
            "print(sorted(m for m in sys.modules if m.startswith('hvd_elastic.') or m == 'torch'))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "'torch'" not in loaded and "hvd_elastic.consul" not in loaded and "hvd_elastic.torchrun.plugin" in loaded


def test_a_bad_parameter_ends_torchrun_in_one_line_with_exit_2(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run([str(torchrun), "--nnodes", "1", "--rdzv-backend", "consul", "--rdzv-id", "a/b",
                             str(tmp_path / "train.py")], capture_output=True, text=True, timeout=120)
    ours = [line for line in result.stderr.splitlines() if "consul" in line]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert ours == ["torchrun --rdzv-backend consul: --rdzv-id='a/b' is not a run id (expected 1-128 letters, "
                    "digits, '.', '_' or '-')"]
