"""Diagnostics off the training hot path: the communication of compiled programs."""

from rljax.diagnostics.communication import comm_bytes_per_update, communication, describe
from rljax.diagnostics.hlo import KINDS, Collective, collectives, comm_summary, format_table

__all__ = [
    "KINDS",
    "Collective",
    "collectives",
    "comm_bytes_per_update",
    "comm_summary",
    "communication",
    "describe",
    "format_table",
]
