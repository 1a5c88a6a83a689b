"""What a run leaves on disk: ``config.json``, ``metrics.jsonl`` (one row per update) and a plot."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from rljax.run.plots import plot_learning_curve  # noqa: F401  (moved; still importable here)


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()] if value.ndim else _jsonable(value.item())
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def default_run_name(algo: str, env: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{algo}-{env}-{stamp}"


class RunLog:
    """Writes one run directory; every write is flushed so a killed run keeps its rows."""

    def __init__(
        self,
        run_dir: str | Path,
        append: bool = False,
        tensorboard: bool = False,
        wandb_project: str | None = None,
    ):
        """A fresh run replaces an earlier run's files of the same name; ``append`` continues.

        ``tensorboard``: every numeric metric also goes to TensorBoard event files under
        ``<run_dir>/tensorboard`` (tensorboardX), with the env step as the x axis.
        ``wandb_project``: the same scalars also go to a Weights & Biases run (files under
        ``<run_dir>/wandb``; offline unless the environment sets ``WANDB_MODE``). Each start or
        resume is its own wandb run, grouped under the run name."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "config.json"
        self.metrics_path = self.dir / "metrics.jsonl"
        self.plot_path = self.dir / "learning_curve.png"
        self.tensorboard_dir = self.dir / "tensorboard"
        self._metrics_file = open(self.metrics_path, "a" if append else "w")
        self._tensorboard = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(str(self.tensorboard_dir), flush_secs=10)
        self._wandb = None
        if wandb_project is not None:
            import wandb

            self._wandb = wandb.init(
                project=wandb_project,
                group=self.dir.name,
                name=self.dir.name,
                dir=str(self.dir),
                mode=os.environ.get("WANDB_MODE", "offline"),
            )

    def write_config(self, **sections: Any) -> None:
        data = {
            k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            for k, v in sections.items()
        }
        self.config_path.write_text(json.dumps(_jsonable_tree(data), indent=2) + "\n")
        if self._wandb is not None:
            self._wandb.config.update(_jsonable_tree(data), allow_val_change=True)

    def write_extra(self, section: str, value: Any) -> None:
        """Add a section to ``config.json`` (e.g. measured communication)."""
        data = json.loads(self.config_path.read_text()) if self.config_path.exists() else {}
        data[section] = _jsonable_tree(value)
        self.config_path.write_text(json.dumps(data, indent=2) + "\n")

    def append(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._metrics_file.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
            if self._tensorboard is not None or self._wandb is not None:
                step = int(row["env_steps"])
                scalars = {
                    name: float(value)
                    for name, value in row.items()
                    if name not in ("update", "env_steps") and np.ndim(value) == 0
                }
                if self._tensorboard is not None:
                    for name, value in scalars.items():
                        self._tensorboard.add_scalar(name, value, step)
                if self._wandb is not None:
                    self._wandb.log({**scalars, "update": int(row["update"])}, step=step)
        self._metrics_file.flush()
        if self._tensorboard is not None:
            self._tensorboard.flush()

    def truncate(self, last_update: int) -> None:
        """Drop rows after ``last_update`` (resume / rollback: they are recomputed)."""
        self._metrics_file.close()
        rows = [r for r in read_metrics(self.metrics_path) if r.get("update", 0) <= last_update]
        with open(self.metrics_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        self._metrics_file = open(self.metrics_path, "a")

    def close(self) -> None:
        self._metrics_file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


class NullRunLog:
    """What processes other than 0 use: they write nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _jsonable_tree(value):
    if isinstance(value, dict):
        return {k: _jsonable_tree(v) for k, v in value.items()}
    return _jsonable(value)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
