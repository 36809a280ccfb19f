"""The errors a Consul call raises, apart from the client so that importing them costs nothing.

(:mod:`.client` pulls in ``socket`` and ``json``; ``hvd-elastic discover``
answering from its cache needs neither, only the class for its ``except``.)
"""

from __future__ import annotations

from hvd_elastic.errors import HvdElasticError


class ConsulError(HvdElasticError, RuntimeError):
    """A Consul request failed; ``str()`` is a one-line explanation (never the token).

    ``retryable``: whether asking again later may succeed.  ``status``: the
    HTTP status when Consul answered, None when it did not (unreachable,
    timeout, TLS failure, garbage).  ``index``: the ``X-Consul-Index`` of that
    answer, 0 without one (a 404 of a key carries the index to block on).
    """

    def __init__(self, message: str, *, retryable: bool, status: int | None = None, index: int = 0):
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.index = index


class ConsulTimeout(ConsulError):
    """The deadline passed before Consul answered."""
