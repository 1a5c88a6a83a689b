#!/usr/bin/env bash
# Issue 15's GPU rows in one call: bench_ppo at 1, 64, 1,024 and 4,096 seeds, rljax beside the
# PureJaxRL port, on the accelerator JAX finds (docs/performance.md, "On a GPU").
#
#   experiments/gpu_bench.sh fetch            # here, once: the wheels the GPU image lacks -> .whl/
#   experiments/gpu_bench.sh run [OUT_DIR]    # there (the device tool: carry [".whl"], OUT_DIR=$OUT)
#   SMOKE=1 PY=.venv/bin/python experiments/gpu_bench.sh run /tmp/gpu-smoke   # any machine, tiny
#
# The GPU image has jax (0.11, CUDA), flax, optax, chex, orbax-checkpoint and matplotlib, but not
# gymnax or tyro; `fetch` downloads those and their pure-Python requirements. Steps per seed are
# 1e5 (195 updates): enough for a steady steps/s, and the whole call fits in ~10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(gymnax==1.0.1 gymnasium==1.3.0 farama-notifications==0.0.4 tyro==1.0.17
        docstring-parser==0.18.0 typeguard==4.6.1)

case "${1:-run}" in
fetch)
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d .whl "${WHEELS[@]}"
  ls .whl
  ;;
run)
  out=${2:-${OUT:-experiments/results}}
  PY=${PY:-python3}
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/rljax-site .whl/*.whl
    export PYTHONPATH=/tmp/rljax-site:${PYTHONPATH:-}
  fi
  export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
  mkdir -p "$out"
  nvidia-smi -L 2>/dev/null || true
  "$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
  if [ -n "${SMOKE:-}" ]; then
    seeds=(1 2) steps=4096 repeats=1
  else
    seeds=(1 64 1024 4096) steps=100000 repeats=2
  fi
  "$PY" experiments/bench_ppo.py --groups single --seeds "${seeds[@]}" \
    --total-timesteps "$steps" --implementations rljax purejaxrl --repeats "$repeats" \
    --compile-repeats 1 --worker-timeout 540 --out "$out/bench_ppo_gpu.json" \
    2>&1 | tee "$out/bench_ppo_gpu.log"
  ;;
*)
  echo "usage: $0 fetch | run [OUT_DIR]" >&2
  exit 2
  ;;
esac
