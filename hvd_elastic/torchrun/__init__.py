"""``torchrun --rdzv-backend consul``: torch's elastic agent rendezvousing through Consul's KV store.

* :mod:`.plugin`: the ``torchrun.handlers`` entry point (imports nothing heavy: torch loads it in every
  process that imports its rendezvous package).
* :mod:`.settings`: the rendezvous parameters (``--rdzv-endpoint``, ``--rdzv-id``, ``--rdzv-conf``) read
  once into a frozen object, bad values refused in one line.
* :mod:`.backend`: the rendezvous state, one KV key per run, written by check-and-set on its index.
* :mod:`.store`: the ``torch.distributed.Store`` the agents bootstrap from, on KV keys beside the state.
* :mod:`.handler`: torch's ``DynamicRendezvousHandler`` over these two.

Loaded into the user's torchrun agent: no command line here, only :mod:`hvd_elastic.consul` below it.
"""
