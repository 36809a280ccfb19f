"""The elastic demo: ``hvd-elastic demo`` (:mod:`.command`) and the job it trains (:mod:`.train`).

:mod:`.schedule` parses and checks the event schedule, :mod:`.live` draws the
terminal's status line, :mod:`.digits` is the data set and its fixed split.
"""

from .command import add_arguments, run

__all__ = ["add_arguments", "run"]
