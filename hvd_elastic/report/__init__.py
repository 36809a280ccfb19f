"""``hvd-elastic report RUN_DIR``: what happened to one run of ``@hvd_elastic.run``, as a table and a picture.

A run directory holds (names relative to it; only the first is required):

``events.jsonl``
    the decorator's event log (``event_log=``, see :mod:`hvd_elastic.training.events`).
``progress.jsonl``
    one JSON object per committed step, appended by rank 0: ``time`` (Unix
    seconds), ``step``, ``size`` and, when the script has them, ``loss`` and
    ``epoch`` (``examples/`` and :mod:`.evidence` write it).
    Without it, world sizes come from the event log's ``commit`` records.
``actions.jsonl``
    what an operator (the demo) did to the job: ``time``, ``action``, ``host``;
    each membership change is paired with the action before it, and its
    recovery is measured from that action.
``ledger/`` and ``final-<rank>.json``
    per-sample evidence as :mod:`.evidence` writes it (the demo's training job
    does); when present the exactly-once verdict of :mod:`.ledger` is shown.

Modules: :mod:`.runlog` reads the files (tolerating a run still being
written), :mod:`.timeline` turns them into membership changes with their
recovery times and rolled-back steps, :mod:`.plot` draws the PNG,
:mod:`.summary` puts them together (``hvd-elastic report`` is
:mod:`hvd_elastic.commands.report`); :mod:`.evidence` writes the per-sample
evidence (in training processes), :mod:`.ledger` judges it, :mod:`.jsonlines`
reads JSON-lines files still being appended to.
"""
