import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.parallel import replicas
from rljax.parallel.replicas import per_replica, pmean_tree


def tree(r):
    keys = jax.random.split(jax.random.key(0), 4)
    return {
        "w": jax.random.normal(keys[0], (r, 4, 3)),
        "b": jax.random.normal(keys[1], (r, 3)),
        "big": jax.random.normal(keys[2], (r, 40)),
        "half": jax.random.normal(keys[3], (r, 5)).astype(jnp.bfloat16),
    }


@pytest.mark.parametrize("fused_elements", [1 << 20, 16])
def test_pmean_tree_equals_the_mean_of_each_leaf(monkeypatch, fused_elements):
    monkeypatch.setattr(replicas, "FUSED_ELEMENTS", fused_elements)  # "big" alone when 16
    x = tree(4)
    out = jax.jit(jax.vmap(pmean_tree, axis_name="data"))(x)
    for name, leaf in x.items():
        expected = np.broadcast_to(np.mean(np.asarray(leaf, np.float32), 0), leaf.shape)
        assert out[name].dtype == leaf.dtype
        tol = 1e-2 if leaf.dtype == jnp.bfloat16 else 1e-6
        np.testing.assert_allclose(np.asarray(out[name], np.float32), expected, rtol=tol, atol=tol)


def test_pmean_tree_crosses_devices_in_one_collective_per_dtype():
    from rljax.parallel import make_mesh

    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    mesh = make_mesh("data=2")
    x = {k: v for k, v in tree(2).items() if k != "half"}
    spec = jax.P("data")
    fn = jax.jit(per_replica(pmean_tree, 2, (spec,), spec))
    with jax.set_mesh(mesh):
        hlo = fn.lower(x).compile().as_text()
        out = fn(x)
    assert hlo.count(" all-reduce(") + hlo.count(" all-reduce-start(") == 1
    for name, leaf in x.items():
        np.testing.assert_allclose(out[name][1], np.mean(np.asarray(leaf), 0), rtol=1e-6)
