"""Loads :mod:`.rules` into horovodrun's own process, the moment it imports its elastic launcher.

This module is imported at the start of EVERY interpreter of an environment
where hvd-elastic is installed (the one line of ``hvd_elastic_horovodrun.pth``
in site-packages), so it imports nothing but ``os``, ``sys`` and the
dependency-free :mod:`hvd_elastic.envvars`, and only puts
a finder on ``sys.meta_path`` that waits for ``horovod.runner.gloo_run``: the
module holding horovodrun's elastic launcher, which horovodrun (and Horovod's
Ray and Spark drivers) import and workers never do.  When it is imported, the
finder steps aside and :func:`hvd_elastic.horovodrun.rules.install` runs right
after the module body.  Whether the rules then apply to a job is decided per
driver (see :mod:`.rules`); ``HVD_ELASTIC_DRIVER=0`` (or false) keeps the
finder out altogether.
"""

from __future__ import annotations

import os
import sys

from hvd_elastic.envvars import FALSE  # dependency-free, as this start-up needs

MODULE = "horovod.runner.gloo_run"
ENV = "HVD_ELASTIC_DRIVER"


class _Finder:
    """A one-shot meta-path finder: patches :data:`MODULE` after it executes."""

    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)  # one shot; the real finders locate it now
        from importlib.util import find_spec

        spec = find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module = _patched(spec.loader.exec_module)  # this spec's own loader instance
        return spec


def _patched(exec_module):
    def exec_then_install(module):
        exec_module(module)
        from hvd_elastic.horovodrun import rules

        rules.install(module)

    return exec_then_install


def install() -> None:
    """Put the finder in place, unless switched off or already there (idempotent)."""
    if os.environ.get(ENV, "") in FALSE or MODULE in sys.modules:
        return
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
