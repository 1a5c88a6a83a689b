"""On-device replay buffers (see ``rljax.buffers.replay``)."""

from rljax.buffers.replay import (
    ReplayBuffer,
    Sample,
    add,
    buffer_logical_specs,
    init_buffer,
    sample,
    update_priorities,
)

__all__ = [
    "ReplayBuffer",
    "Sample",
    "add",
    "buffer_logical_specs",
    "init_buffer",
    "sample",
    "update_priorities",
]
