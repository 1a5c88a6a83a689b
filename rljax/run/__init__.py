"""Running algorithms: configuration, sharded execution, the one host loop and its hooks.

config.py      RunConfig (groups: parallel, logging, checkpointing, faults, evaluation)
sharded.py     ShardedRun, prepare, state_shardings, replicate; the algorithm registry access
loop.py        Loop: compiled chunks to the end, hooks between them (Hook, ChunkInfo)
hooks.py       guard, signals, evaluation, metrics, progress, checkpoints as hooks
training.py    train(): the whole job
sweep.py       sweep(): settings x seeds through the same loop
resume.py, run_log.py, evaluation.py
"""

from rljax.run.config import (
    CheckpointConfig,
    EvalConfig,
    FaultConfig,
    LoggingConfig,
    ParallelConfig,
    RunConfig,
    resumable_fields,
)
from rljax.run.loop import ChunkInfo, Hook, Loop
from rljax.run.sharded import ShardedRun, prepare
from rljax.run.training import TrainResult, train

__all__ = [
    "CheckpointConfig",
    "ChunkInfo",
    "EvalConfig",
    "FaultConfig",
    "Hook",
    "LoggingConfig",
    "Loop",
    "ParallelConfig",
    "RunConfig",
    "ShardedRun",
    "TrainResult",
    "prepare",
    "resumable_fields",
    "train",
]
