"""What hvd-elastic changes inside horovodrun's own process: :mod:`.rules`, loaded there by :mod:`.hook`.

The one thing workers say to those rules goes through horovodrun's rendezvous
store: a ``PUT`` of :data:`RESUMABLE_PATH` once a durable checkpoint exists
(:mod:`hvd_elastic.training.runner`), which lets a round in which every worker
failed restart from it.
"""

RESUMABLE_SCOPE, RESUMABLE_KEY = "hvd_elastic", "resumable"
RESUMABLE_PATH = f"/{RESUMABLE_SCOPE}/{RESUMABLE_KEY}"
