"""Warm standbys: start a worker by forking a process that already imported torch and horovod.

Horovod's driver starts a joining worker only after every survivor has stopped
at its commit, so the survivors wait through the newcomer's ssh, interpreter
start, ``import torch, horovod`` and the script's own imports.  A standby
(:mod:`.server`, ``hvd-elastic standby``: :mod:`hvd_elastic.commands.standby`) pays for those imports once, ahead
of time, and waits on a per-user Unix socket; the worker command horovodrun
runs becomes ``hvd-elastic exec -- python train.py ...`` (:mod:`hvd_elastic.commands.exec`,
stdlib only), which hands its argv, environment, working directory and stdio
to the standby.  The standby forks; the child (:mod:`.child`) becomes the
worker, running the script as ``__main__``.  The launcher relays signals and
the worker's real exit status, and runs the command itself (``exec``) when no
compatible standby answers, so the same command works on every host.

:mod:`.protocol` holds what both sides must agree on: the socket's place, the
messages, and the fingerprint that tells a launcher its standby runs the code
it expects.
"""
