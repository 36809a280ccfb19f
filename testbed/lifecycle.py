"""One rule for every set-up the test bed builds: what ``open`` started, ``close`` takes down, also half-way."""

from __future__ import annotations


class Closing:
    """A context manager over ``open()``/``close()``; ``close`` must undo any part of ``open`` that ran."""

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self.open()
        except BaseException:
            self.close()  # a set-up that failed half-way leaves nothing running
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
