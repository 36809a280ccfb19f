"""The error a handler raises to answer with a status code and Consul's plain-text reason."""

from __future__ import annotations


class HTTPError(Exception):
    """Answer ``status`` with ``reason`` as a text/plain body, as Consul's ``HTTPError`` does."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}
