"""Flax networks with logically-named, tensor-parallel parameters."""

from rljax.networks import distributions
from rljax.networks.mlp import (
    ACTIVATIONS,
    ActorCritic,
    MLPTower,
    QNetwork,
    check_tensor_parallel,
)
from rljax.networks.residual import ResidualActorCritic, ResidualQNetwork, ResidualTower

__all__ = [
    "ACTIVATIONS",
    "ActorCritic",
    "MLPTower",
    "QNetwork",
    "ResidualActorCritic",
    "ResidualQNetwork",
    "ResidualTower",
    "check_tensor_parallel",
    "distributions",
]
