"""What ``test_checkpoint.py`` still imports by its old name; new code imports
:func:`testbed.child_env` itself (this module goes once nothing uses it)."""

from __future__ import annotations

from testbed import child_env as subprocess_env  # noqa: F401 (re-exported)
