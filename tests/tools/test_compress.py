"""``rljax compress``: int8 round trip within half a step per channel, exact global magnitude
sparsity, fine-tuning keeps pruned weights at 0, every variant evaluated against float32, and a
sparsity outside (0, 1) is one error with nothing written."""

import math

import numpy as np
import pytest

from rljax.cli import main
from rljax.tools.compress import (
    CompressArgs,
    compress_run,
    dequantize_int8,
    prune_masks,
    quantize_int8,
)


def test_int8_round_trip_error_is_at_most_half_a_step_per_output_channel():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 3, 5, 8)).astype(np.float32) * np.linspace(0.01, 3.0, 8)
    w[..., 2] = 0.0  # an all-zero channel: scale 1, exact zeros
    q, scale = quantize_int8(w)
    assert q.dtype == np.int8 and scale.shape == (8,) and np.abs(q).max() <= 127
    error = np.abs(np.asarray(dequantize_int8(q, scale)) - w)
    assert np.all(error <= scale / 2 + 1e-7)
    np.testing.assert_array_equal(np.abs(q).reshape(-1, 8).max(0)[[0, 1, 3]], 127)
    assert np.all(q[..., 2] == 0)


@pytest.mark.parametrize("sparsity", [0.5, 0.8, 0.9, 0.123])
def test_pruning_removes_exactly_the_smallest_weights_over_all_kernels(sparsity):
    rng = np.random.default_rng(1)
    kernels = {"a/kernel": rng.normal(size=(7, 9)), "b/kernel": 5 * rng.normal(size=(9, 4))}
    masks = prune_masks(kernels, sparsity)
    n = sum(k.size for k in kernels.values())
    removed = sum(int((~m).sum()) for m in masks.values())
    assert removed == math.floor(sparsity * n)
    kept = np.concatenate([np.abs(kernels[p])[masks[p]] for p in kernels])
    dropped = np.concatenate([np.abs(kernels[p])[~masks[p]] for p in kernels])
    assert dropped.max() <= kept.min()  # global: the larger-scale kernel keeps more


def test_every_variant_is_evaluated_against_float32(trained):
    args = CompressArgs(run_dir=str(trained.run_dir), int8=True, bf16=True, prune=(0.5,),
                        finetune=128, episodes=4)  # fmt: skip
    report = compress_run(args)
    rows = {r["variant"]: r for r in report["rows"]}
    assert list(rows) == ["float32", "bf16", "int8", "prune-0.5", "prune-0.5+ft"]
    evals = [r for r in trained.metrics if r["update"] == 6 and "eval_return" in r]
    # The float32 row is training's own evaluation at that update.
    assert rows["float32"]["mean"] == pytest.approx(evals[0]["eval_return"], rel=1e-6)
    base = rows["float32"]["bytes"]
    assert rows["bf16"]["bytes"] < 0.55 * base and rows["int8"]["bytes"] < 0.35 * base
    # Fine-tuning moved the weights but kept exactly the pruned ones at 0.
    assert rows["prune-0.5"]["kernel_sparsity"] == rows["prune-0.5+ft"]["kernel_sparsity"]
    assert rows["prune-0.5"]["kernel_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert all(r["steps_per_s"] > 0 for r in rows.values())
    assert (trained.run_dir / "compress.json").exists()
    assert "| int8 |" in (trained.run_dir / "compress.md").read_text()


@pytest.mark.parametrize("value", ["0", "1", "1.5"])
def test_a_sparsity_outside_0_1_is_one_error_and_nothing_is_written(trained, capsys, value):
    (trained.run_dir / "compress.json").unlink(missing_ok=True)
    assert main(["compress", str(trained.run_dir), "--prune", "0.5", value]) == 2
    assert capsys.readouterr().err == f"error: --prune sparsities must be in (0, 1), got {value}\n"
    assert not (trained.run_dir / "compress.json").exists()
