"""Every benchmark script still starts: its imports resolve and ``--help`` works, so none rots unnoticed.

The long runs stay out of the suite; a script whose import breaks (a module
moved, a name renamed) would otherwise be found only when someone reruns it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
LIBRARIES = {"report.py", "peers_ledger.py"}  # imported by the scripts, no command line of their own
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in LIBRARIES)


def test_every_script_runs_as_a_program_and_the_libraries_do_not():
    runs = {p.name for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}
    assert runs == set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_starts_and_prints_its_help(script):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
