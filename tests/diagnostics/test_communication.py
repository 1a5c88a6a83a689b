"""communication(): one optimizer step's bytes by mesh axis, measured once per process."""

import dataclasses

import jax
import pytest

from rljax import PPO, PPOConfig
from rljax.diagnostics import comm_bytes_per_update, communication, describe
from rljax.parallel import make_mesh

# gamma is unique to this module, so the first measurement below is this process's first.
CONFIG = PPOConfig(
    num_envs=8, num_steps=16, total_timesteps=8 * 16 * 4, num_minibatches=2, gamma=0.987
)


@pytest.fixture
def backend_compiles():
    """XLA compiles while the test runs (jax's public monitoring events)."""
    events = []

    def listener(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listener)
    yield events
    jax.monitoring.unregister_event_duration_listener(listener)


def test_measured_once_per_algorithm_and_mesh(mesh4, backend_compiles):
    first = communication(PPO(CONFIG, replicas=2), mesh4)
    compiles = len(backend_compiles)
    assert compiles >= 1  # the optimizer step was compiled and measured
    assert set(first) >= {"data", "model"}
    assert all(v["always"] >= 0 and v["on_sync"] >= 0 for v in first.values())
    assert first["data"]["always"] > 0  # gradients all-reduced over the two replicas

    # An equal algorithm, built anew, on the same mesh: the cached result, no compile.
    again = communication(PPO(CONFIG, replicas=2), mesh4)
    assert again == first and len(backend_compiles) == compiles
    again["data"]["always"] = -1.0  # each call gets its own copy
    assert communication(PPO(CONFIG, replicas=2), mesh4) == first

    # Other devices (same axes and shape) are another program: measured again.
    other = make_mesh("data=2,model=2", devices=jax.devices()[4:8])
    assert communication(PPO(CONFIG, replicas=2), other) == first
    assert len(backend_compiles) > compiles


def test_a_different_config_is_measured_again(mesh4, backend_compiles):
    communication(PPO(CONFIG, replicas=2), mesh4)
    compiles = len(backend_compiles)
    communication(PPO(dataclasses.replace(CONFIG, gamma=0.986), replicas=2), mesh4)
    assert len(backend_compiles) > compiles


def test_bytes_per_update_and_description():
    comm = {
        "data": {"always": 18968.0, "on_sync": 0.0},
        "model": {"always": 32792.0, "on_sync": 0.0},
    }
    assert describe(comm) == "data 18,968, model 32,792"
    local = {"data": {"always": 0.0, "on_sync": 1000.0}}
    assert describe(local) == "data 0 (+1,000 when syncing)"
    assert comm_bytes_per_update(comm, 4, 1) == {
        "comm_bytes_data": 4 * 18968.0,
        "comm_bytes_model": 4 * 32792.0,
    }
    assert comm_bytes_per_update(local, 8, 2) == {"comm_bytes_data": 2000.0}
