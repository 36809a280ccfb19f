"""The root of the errors hvd-elastic raises to its callers.

``except hvd_elastic.errors.HvdElasticError`` catches every error of ours that
reaches a caller, whatever the package that raised it; each one also derives
from the builtin a caller would expect (``ValueError`` for a bad value,
``RuntimeError`` for a failed operation, ...), so existing ``except`` clauses
keep working.  Exceptions used only for control flow inside a module (and
Horovod's ``HostsUpdatedInterrupt`` family, which Horovod's loop catches) are
not errors and do not derive from it; ``tests/test_errors.py`` holds the list.

Stdlib-free and cheap to import: discovery imports it under ``python -I -S``.
"""

from __future__ import annotations


class HvdElasticError(Exception):
    """An error of hvd-elastic's; ``str()`` is a one-line explanation naming the bad value."""
