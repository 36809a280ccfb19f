"""The elastic demo's parts: the job it trains (:mod:`.train`) and what it puts that job through (:mod:`.scenario`).

``hvd-elastic demo`` is :mod:`hvd_elastic.commands.demo`.  :mod:`.schedule`
parses and checks the event schedule, :mod:`.live` draws the terminal's status
line, :mod:`.digits` is the data set and its fixed split.
"""
