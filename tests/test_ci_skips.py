"""In CI a skipped test fails, naming what was missing (tests/conftest.py); elsewhere it stays a skip.

A skip in setup (a marker) reports as an error, one in the test body as a failure: both fail the run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SKIPPING = '''
import pytest

@pytest.mark.skipif(True, reason="needs the frobnicator")
def test_marked():
    pass

def test_imported():
    pytest.importorskip("no_such_module_for_hvd_elastic")
'''


@pytest.mark.parametrize("ci, outcome", [("true", "1 failed, 1 error"), ("", "2 skipped")])
def test_a_skip_fails_in_ci_naming_the_prerequisite(tmp_path, ci, outcome):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "CI": ci},
                         timeout=120)
    assert outcome in run.stdout, run.stdout
    if ci:
        assert "missing prerequisite" in run.stdout and "needs the frobnicator" in run.stdout, run.stdout
        assert "no_such_module_for_hvd_elastic" in run.stdout, run.stdout
