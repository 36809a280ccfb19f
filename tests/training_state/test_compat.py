"""The compat module: private Horovod/torch attributes in one place, versions checked at import."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import child_env

PACKAGE = Path(__file__).resolve().parents[2] / "hvd_elastic"


def test_supported_versions_pass_and_others_fail_at_import_with_one_line():
    from hvd_elastic.training._internal import compat

    compat.check_versions("0.28.1", "2.13.0+cpu")
    for horovod_version, torch_version, named in [("0.29.0", "2.13.0", "Horovod 0.29.0"),
                                                  ("0.28.1", "3.0.0", "torch 3.0.0"),
                                                  ("0.28.1", "nightly", "torch nightly")]:
        with pytest.raises(ImportError, match=re.escape(named)) as raised:
            compat.check_versions(horovod_version, torch_version)
        assert "\n" not in str(raised.value) and "install a supported version" in str(raised.value)


def test_importing_with_an_unsupported_horovod_fails_there():
    code = "import horovod; horovod.__version__ = '0.30.0'; import hvd_elastic.training.state"
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert ("ImportError: hvd_elastic.training._internal.compat uses private Horovod/torch attributes and found "
            "Horovod 0.30.0") in proc.stderr


# Private attributes of Horovod and torch objects that only compat.py may touch.
_PRIVATE = re.compile(r"from horovod\S* import .*(notification_manager|HostUpdateResult)|\b_handles\b"
                      r"|\b_allreduce_delay\b|\b_should_synchronize\b|\b_synchronized\b|\b_last_lr\b"
                      r"|\._version\b|\b_foreach_copy_|\b_bcast_object\b")


def test_no_private_horovod_or_torch_attribute_outside_compat():
    offenders = []
    for path in sorted((PACKAGE / "training").glob("*.py")):
        if path.name == "compat.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if _PRIVATE.search(code) and "``" not in code:  # ``name`` in a docstring only names it
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
