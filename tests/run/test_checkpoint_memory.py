"""Checkpoint saves do not leak memory on orbax's save path."""

import jax
import jax.numpy as jnp
import tensorstore

from rljax.run.checkpoint import Checkpointer


def test_saves_do_not_poll_tensorstore_metrics(tmp_path, monkeypatch):
    # Orbax read TensorStore's I/O counters before and after every save for a log line, and
    # tensorstore's experimental_collect_matching_metrics leaks what it returns (~20 KB of RSS
    # per save over a long run). Checkpointer turns that probe off.
    calls = []
    original = tensorstore.experimental_collect_matching_metrics

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(tensorstore, "experimental_collect_matching_metrics", counting)
    state = {"w": jnp.ones((4, 3)), "key": jax.random.key(0)}
    with Checkpointer(tmp_path / "ckpt", keep=2) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, state, {"step": step})
        ckpt.wait()
        assert ckpt.steps() == [2, 3]
    assert calls == []
