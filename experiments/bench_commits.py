"""PPO throughput of two commits, side by side: ``bench_ppo.py`` run in a checkout of each,
alternating the commits round by round so that load drift on the machine hits both alike.

    python experiments/bench_commits.py BASE_COMMIT [NEW_COMMIT] --rounds 2

Each round runs ``experiments/bench_ppo.py --groups single --repeats 1`` once per commit (in a
``git worktree`` under a temporary directory, imported from there), and the table takes the best
steps/s per row over the rounds. Rows: rljax on one device at 1 / 8 / 64 vmapped seeds (and the
PureJaxRL port timed in the same process, as a drift check). Compile time is reported apart.
Writes ``experiments/results/bench_commits.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "experiments" / "results" / "bench_commits"


def checkout(commit: str, root: Path) -> Path:
    path = root / commit[:10]
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit],
        check=True,
        capture_output=True,
    )
    return path


def run_bench(tree: Path, seeds: list[int], total: int, out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(tree / "experiments" / "bench_ppo.py"), "--groups", "single"]
    cmd += ["--repeats", "1", "--total-timesteps", str(total), "--out", str(out), "--seeds"]
    cmd += [str(s) for s in seeds]
    subprocess.run(cmd, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["rows"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the commit before")
    p.add_argument("new", nargs="?", default="HEAD", help="the commit after (default HEAD)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--total-timesteps", type=int, default=500_000)
    args = p.parse_args(argv)
    commits = {
        label: subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", ref], check=True, capture_output=True, text=True
        ).stdout.strip()
        for label, ref in (("before", args.base), ("after", args.new))
    }
    best: dict[tuple[str, str, int], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {label: checkout(c, Path(tmp)) for label, c in commits.items()}
        try:
            for r in range(args.rounds):
                for label, tree in trees.items():
                    print(f"round {r + 1}/{args.rounds}: {label} ({commits[label][:10]})")
                    rows = run_bench(tree, args.seeds, args.total_timesteps, Path(tmp) / "o.json")
                    for row in rows:
                        key = (label, row["implementation"], row["seeds"])
                        if key not in best or row["steps_per_s"] > best[key]["steps_per_s"]:
                            best[key] = row
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)])
    lines = [
        f"PPO CartPole, {args.total_timesteps:,} steps per seed, one device, best of "
        f"{args.rounds} alternating rounds.",
        "",
        "| implementation | seeds | before steps/s | after steps/s | after/before "
        "| compile s before | compile s after |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    table = []
    for impl in ("rljax", "purejaxrl"):
        for seeds in args.seeds:
            b, a = best.get(("before", impl, seeds)), best.get(("after", impl, seeds))
            if not (a and b):
                continue
            ratio = a["steps_per_s"] / b["steps_per_s"]
            table.append({"implementation": impl, "seeds": seeds, "before": b, "after": a})
            lines.append(
                f"| {impl} | {seeds} | {b['steps_per_s']:,.0f} | {a['steps_per_s']:,.0f} "
                f"| {ratio:.3f} | {b['compile_s']:.1f} | {a['compile_s']:.1f} |"
            )
    text = "\n".join(lines)
    print(text)
    OUT.with_suffix(".md").write_text(text + "\n")
    OUT.with_suffix(".json").write_text(json.dumps({"commits": commits, "rows": table}, indent=1))


if __name__ == "__main__":
    main()
