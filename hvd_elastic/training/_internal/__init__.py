"""The training library's internals: nothing here is API, and any of it may change.

* :mod:`.flat`, :mod:`.sync`, :mod:`.transfer`, :mod:`.snapshot`, :mod:`.rng` --
  how :class:`~hvd_elastic.training.state.TrainingState` lays out, syncs, moves
  and checkpoints its tensors;
* :mod:`.elastic_loop`, :mod:`.compat` -- the copy of Horovod's elastic loop
  and every private Horovod/torch attribute the library depends on;
* :mod:`.forksafe`, :mod:`.gloo_hangup`, :mod:`.health_cut`, :mod:`.shared_dir`
  -- fork safety, the hang-up of stuck Gloo connections, the health-driven cut
  and the shared checkpoint-directory check that :func:`hvd_elastic.run` turns on;
* :mod:`.rendezvous`, :mod:`.join_ahead` -- Horovod's rendezvous server as a
  worker asks it (its place in the next world, whether that world is doomed),
  and the join that lets the survivors train on while a newcomer starts;
* :mod:`.comm` -- the collectives all of these use: Horovod's in a horovodrun job,
  torch.distributed's in a torchrun job (the seam between the library and a launcher);
* :mod:`.objects` -- small Python objects between the ranks, one collective each;
* :mod:`.pace` -- each rank's own work per step, gathered once per window, and
  the verdict on slow hosts (stragglers) that :func:`hvd_elastic.run` reports, and
  :mod:`.straggler_drain`, rank 0's request that a slow host's node agent drain it;
* :mod:`.preload` -- what a script would import after ``hvd.init()``, imported
  before it, so a joining worker's survivors do not wait for it.

What users import lives one level up: ``state``, ``runner``, ``sampler``,
``batching``, ``checkpoint``, ``events`` and ``components``.
"""
