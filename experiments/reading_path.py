"""How much rljax source a reader must follow for one PPO update.

Traces ``PPO.update`` once (``jax.make_jaxpr``, default config, one device, allreduce) under
``sys.settrace`` and counts the distinct lines of rljax source that run, per module, next to
the size of each module a reader has to open. Works on any commit that has
``from rljax import PPO, PPOConfig``, so it compares before and after a refactor:

    PYTHONPATH=<checkout> python experiments/reading_path.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    import jax

    import rljax
    from rljax import PPO, PPOConfig

    root = Path(rljax.__file__).resolve().parent
    ppo = PPO(PPOConfig())
    state = jax.eval_shape(ppo.init, jax.random.key(0))
    executed: dict[str, set[int]] = {}

    def tracer(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if root in path.parents or path.parent == root:
            if event == "line":
                executed.setdefault(str(path.relative_to(root.parent)), set()).add(frame.f_lineno)
            return tracer
        return None

    sys.settrace(tracer)
    try:
        jax.make_jaxpr(ppo.update)(state)
    finally:
        sys.settrace(None)
    rows = []
    for module, lines in sorted(executed.items()):
        total = sum(1 for _ in open(root.parent / module))
        rows.append({"module": module, "lines_run": len(lines), "module_lines": total})
    print(f"{'module':40s} {'lines run':>10s} {'module lines':>13s}")
    for r in rows:
        print(f"{r['module']:40s} {r['lines_run']:>10d} {r['module_lines']:>13d}")
    run, opened = sum(r["lines_run"] for r in rows), sum(r["module_lines"] for r in rows)
    print(f"{'total (' + str(len(rows)) + ' modules)':40s} {run:>10d} {opened:>13d}")
    print(json.dumps({"modules": len(rows), "lines_run": run, "module_lines": opened}))


if __name__ == "__main__":
    main()
