"""Shared plumbing of the benchmarks: one subprocess per device count, timing, table and JSON.

The number of emulated CPU devices is fixed when JAX starts, so a benchmark re-runs its own script
as a worker per device group (``--_worker GROUP``); the worker prints one JSON line after
``marker`` and the parent collects the rows.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed(fn, fresh_input, repeats: int):
    """Best-of-``repeats`` wall time of ``fn(fresh_input())`` (input built untimed each time).

    Returns ``(best_seconds, all_seconds, last_output)``."""
    import jax

    times, out = [], None
    for _ in range(repeats):
        arg = jax.block_until_ready(fresh_input())
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - t0)
    return min(times), times, out


def run_worker(script: Path, group: str, argv: list[str], marker: str, timeout=None) -> dict:
    """Run ``script --_worker group *argv`` and return the JSON it printed after ``marker``."""
    cmd = [sys.executable, str(script), "--_worker", group, *argv]
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    log(f"== group {group!r} ==")
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, text=True, env=env, check=False, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"worker {group!r} timed out after {timeout} s") from e
    results = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker)]
    if proc.returncode != 0 or not results:
        sys.stderr.write(proc.stdout)
        raise SystemExit(f"worker {group!r} failed (exit code {proc.returncode})")
    return json.loads(results[-1][len(marker) :])


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``columns``: ``(header, row key, format spec)``; numeric columns are right-aligned."""
    header = "| " + " | ".join(h for h, _, _ in columns) + " |"
    align = "|" + "|".join("--:" if f else "---" for _, _, f in columns) + "|"
    lines = [header, align]
    for r in rows:
        cells = []
        for _, key, fmt in columns:
            value = r.get(key)
            cells.append("-" if value is None else format(value, fmt) if fmt else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(out: Path, name: str, report: dict[str, Any]) -> None:
    """Atomically write ``report`` plus the machine description as JSON."""
    import jax

    report = {
        "benchmark": name,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **report,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    print(f"\nwrote {out}")
