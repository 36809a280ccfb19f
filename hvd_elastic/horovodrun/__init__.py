"""What hvd-elastic changes inside horovodrun's own process: :mod:`.rules`, loaded there by :mod:`.hook`.

Workers talk to those rules through horovodrun's rendezvous store (every path
below answers 404 from a horovodrun without them, and workers then do as
Horovod does):

* a ``PUT`` of :data:`RESUMABLE_PATH` once a durable checkpoint exists
  (:mod:`hvd_elastic.training.runner`), which lets a round in which every
  worker failed restart from it;
* a ``PUT`` of ``/READY_SCOPE/RANK`` (body: the host name) by a rank of a
  forming world about to enter ``hvd.init()``, and ``GET`` :data:`WORLD_PATH`:
  the forming world as JSON, ``{"hosts": [host by rank], "present": [ranks
  ready or already in Gloo's rendezvous], "doomed": "why" or "", "min_np":
  horovodrun's --min-np}``.  A world is doomed once one of its workers exited
  with a failure: it can never form
  (:mod:`hvd_elastic.training._internal.rendezvous`); ``min_np`` is the floor
  a straggler drain respects (:mod:`hvd_elastic.training._internal.straggler_drain`).
"""

SCOPE = "hvd_elastic"
RESUMABLE_KEY, WORLD_KEY = "resumable", "world"
RESUMABLE_PATH = f"/{SCOPE}/{RESUMABLE_KEY}"
WORLD_PATH = f"/{SCOPE}/{WORLD_KEY}"
READY_SCOPE = "hvd_elastic_ready"
