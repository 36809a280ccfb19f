"""The elastic training library: state, sampler, batch policy, checkpoints, events, runner.

Submodules are imported on use (``from hvd_elastic.training.state import
TrainingState``); importing this package alone loads neither torch nor horovod.
"""
