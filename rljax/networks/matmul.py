"""``nn.Dense``'s ``dot_general`` for rljax's layers: a narrow contraction over few rows as
multiply-adds, and a narrow output's weight gradient one column at a time.

An observation of ``K <= SMALL_CONTRACTION`` features (CartPole's 4) entering a layer while acting
in ``<= SMALL_ROWS`` environments is ``K`` multiply-adds per output. XLA fuses those with the bias
and the activation into one loop; a dot call on CPU costs more than its arithmetic there.
Larger batches keep the dot, which was faster in the SGD step at 128 rows, unless they are
vmapped (seeds): XLA CPU's batched dot is slower than the multiply-adds there. Derivatives are dots
either way: the multiply-adds' transpose would be reductions over the batch.

A head of ``2 <= n <= SMALL_OUTPUTS`` outputs (policy logits, Q-values) is the dot, but its
kernel's gradient ``x^T g`` is ``n`` vector-matrix products: XLA CPU's dot of a ``[rows, n]``
cotangent is 2-5x slower. Measurements: docs/performance.md ("What makes rljax faster").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

SMALL_CONTRACTION = 8  # the largest contracted size computed as multiply-adds
SMALL_ROWS = 32  # ... over at most this many rows (the product of the leading dimensions)
SMALL_OUTPUTS = 8  # a layer of 2 to this many outputs (a head) takes narrow_output


def dot_general(x, kernel, dimension_numbers, precision=None, preferred_element_type=None):
    """``lax.dot_general`` for ``nn.Dense``: ``x [..., K] . kernel [K, N] -> [..., N]``. Float32
    operands of known sizes (not an export's symbolic batch) at the default precision take
    ``narrow_contraction`` when ``K <= SMALL_CONTRACTION``, and ``narrow_output`` when a wider
    ``K`` goes into ``2 <= N <= SMALL_OUTPUTS`` outputs. Every other call is
    ``lax.dot_general``."""
    contracting, batch = dimension_numbers
    plain_float32 = (
        kernel.ndim == 2
        and not batch[0]
        and tuple(contracting[0]) == (x.ndim - 1,)
        and tuple(contracting[1]) == (0,)
        and all(isinstance(d, int) for d in x.shape)  # not symbolic (shape-polymorphic export)
        and x.dtype == kernel.dtype == jnp.float32
        and preferred_element_type in (None, jnp.float32)
        and precision is None
    )
    if plain_float32 and x.shape[-1] <= SMALL_CONTRACTION:
        return narrow_contraction(x, kernel)
    if plain_float32 and 2 <= kernel.shape[1] <= SMALL_OUTPUTS:
        return narrow_output(x, kernel)
    return lax.dot_general(
        x, kernel, dimension_numbers, precision, preferred_element_type=preferred_element_type
    )


def _products(x, kernel):
    """``sum_k x[..., k] * kernel[..., k, :]``, ``k`` in order (``kernel`` may lead with a batch
    axis broadcast against ``x``'s rows)."""
    out = x[..., 0:1] * kernel[..., 0, :]
    for k in range(1, x.shape[-1]):
        out = out + x[..., k : k + 1] * kernel[..., k, :]
    return out


def _by_rows(x, kernel):
    """One call: multiply-adds over at most ``SMALL_ROWS`` rows, the dot over more."""
    if math.prod(x.shape[:-1]) <= SMALL_ROWS:
        return _products(x, kernel)
    return jnp.matmul(x, kernel)


_products_or_dot = jax.custom_batching.custom_vmap(_by_rows)


@_products_or_dot.def_vmap
def _vmapped(axis_size, in_batched, x, kernel):
    """Under a vmap of two or more (seeds, emulated replicas): multiply-adds over any number of
    rows, where XLA CPU's batched dot of so narrow a contraction is slower. A vmap of one keeps
    the rule of one call."""
    x_batched, kernel_batched = in_batched
    if not (x_batched or kernel_batched):  # nothing to batch (higher-order derivatives)
        return _by_rows(x, kernel), False
    if not x_batched:
        x = jnp.broadcast_to(x, (axis_size, *x.shape))
    if axis_size == 1 and math.prod(x.shape[1:-1]) > SMALL_ROWS:
        return jnp.matmul(x, kernel), True
    if kernel_batched:  # [S, K, N] -> [S, 1 per row axis, K, N]
        kernel = kernel.reshape(axis_size, *[1] * (x.ndim - 2), *kernel.shape[1:])
    return _products(x, kernel), True


@jax.custom_jvp
def narrow_contraction(x, kernel):
    """``x [..., K] @ kernel [K, N]`` for ``K <= SMALL_CONTRACTION``: multiply-adds over at most
    ``SMALL_ROWS`` rows or under a vmap of two or more, the dot otherwise."""
    return _products_or_dot(x, kernel)


@jax.custom_jvp
def narrow_output(x, kernel):
    """``x [..., K] @ kernel [K, n]`` for a narrow ``n`` (a policy or Q head): the dot, whose
    kernel tangent is ``n`` matrix-vector products. Reverse mode transposes those into ``n``
    vector-matrix products over the rows, where XLA CPU's dot of ``x^T [K, rows]`` with the
    cotangent ``[rows, n]`` is 2-5x slower."""
    return jnp.matmul(x, kernel)


def _columns(x, kernel):
    """``x [..., K] @ kernel [K, n]`` one output column at a time."""
    return jnp.stack([x @ kernel[:, j] for j in range(kernel.shape[1])], axis=-1)


def _jvp_of(primal, kernel_tangent=jnp.matmul):
    def jvp(primals, tangents):
        (x, kernel), (dx, dkernel) = primals, tangents
        # Tangents as dots, so that reverse mode transposes them into dots too; an input without
        # a tangent (the observation) adds no term.
        terms = [jnp.matmul(dx, kernel)] if not _zero(dx) else []
        terms += [kernel_tangent(x, dkernel)] if not _zero(dkernel) else []
        out = primal(x, kernel)
        return out, sum(terms[1:], terms[0]) if terms else jnp.zeros_like(out)

    return jvp


def _zero(tangent) -> bool:
    return isinstance(tangent, jax.custom_derivatives.SymbolicZero)


narrow_contraction.defjvp(_jvp_of(_products_or_dot), symbolic_zeros=True)
narrow_output.defjvp(_jvp_of(jnp.matmul, kernel_tangent=_columns), symbolic_zeros=True)
