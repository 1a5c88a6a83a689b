"""Flax networks with logically-named, tensor-parallel parameters."""

from rljax.networks import distributions, matmul
from rljax.networks.mlp import (
    ACTIVATIONS,
    ActorCritic,
    MLPTower,
    QNetwork,
    check_tensor_parallel,
)
from rljax.networks.residual import ResidualActorCritic, ResidualQNetwork, ResidualTower
from rljax.networks.zoo import NetworkSettings

__all__ = [
    "ACTIVATIONS",
    "ActorCritic",
    "MLPTower",
    "NetworkSettings",
    "QNetwork",
    "ResidualActorCritic",
    "ResidualQNetwork",
    "ResidualTower",
    "check_tensor_parallel",
    "distributions",
    "matmul",
]
