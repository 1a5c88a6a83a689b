"""What a run leaves on disk: ``config.json``, ``metrics.jsonl`` (one row per update) and a plot.

Failed writes (full disk, I/O error) raise ``RunWriteError`` naming the file and the cause (plus
``RunLog.error_hint()``: what is intact, how to resume). ``config.json`` is replaced atomically
(never half-written); a torn or garbage line of ``metrics.jsonl`` is skipped by ``read_metrics``
and dropped, with one ``RunLogWarning``, when a resume rewrites the file (``truncate``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rljax.errors import RunWriteError, describe_os_error, warn_from_caller
from rljax.run.plots import plot_learning_curve  # noqa: F401  (moved; still importable here)


class RunLogWarning(UserWarning):
    """Damaged lines of ``metrics.jsonl`` were dropped."""


def _warn(message: str) -> None:
    warn_from_caller(message, RunLogWarning)


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


def write_text_atomic(path: str | Path, text: str | bytes) -> None:
    """Replace ``path`` by ``text`` (or bytes) all at once: written to a temporary file beside
    it, synced, then renamed over it, so a failure (``OSError``) leaves the old file as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


class RunLog:
    """Writes one run directory; every write is flushed so a killed run keeps its rows."""

    def __init__(
        self,
        run_dir: str | Path,
        append: bool = False,
        tensorboard: bool = False,
        wandb_project: str | None = None,
    ):
        """``append`` continues an existing ``metrics.jsonl``; else it is started empty (the run
        directory's rules, ``rljax.run.run_dir``, decide whether a directory may be reused).

        ``tensorboard``: every numeric metric also goes to TensorBoard event files under
        ``<run_dir>/tensorboard`` (tensorboardX), with the env step as the x axis.
        ``wandb_project``: the same scalars also go to a Weights & Biases run (files under
        ``<run_dir>/wandb``; offline unless the environment sets ``WANDB_MODE``). Each start or
        resume is its own wandb run, grouped under the run name."""
        self.dir = Path(run_dir)
        self.config_path = self.dir / "config.json"
        self.metrics_path = self.dir / "metrics.jsonl"
        self.plot_path = self.dir / "learning_curve.png"
        self.tensorboard_dir = self.dir / "tensorboard"
        # What a RunWriteError adds after the cause (e.g. the intact checkpoint, how to resume).
        self.error_hint: Callable[[], str] | None = None
        self._metrics_file = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._metrics_file = open(self.metrics_path, "a" if append else "w")
        except OSError as error:
            raise self._write_error(self.metrics_path, error) from error
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

    def _write_error(self, path: Path, error: BaseException) -> RunWriteError:
        hint = self.error_hint() if self.error_hint is not None else ""
        message = f"could not write {path}: {describe_os_error(error)}"
        return RunWriteError(message + (f"; {hint}" if hint else ""))

    def write_config(self, **sections: Any) -> None:
        """``config.json`` holding ``sections`` (dataclasses as dicts), replaced atomically."""
        data = {
            k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            for k, v in sections.items()
        }
        self.write_config_data(data)

    def write_config_data(self, data: dict) -> None:
        """``config.json`` replaced by ``data`` atomically (``RunWriteError``: it is unchanged)."""
        text = json.dumps(_jsonable_tree(data), indent=2) + "\n"
        try:
            write_text_atomic(self.config_path, text)
        except OSError as error:
            raise self._write_error(self.config_path, error) from error
        if self._wandb is not None:
            self._wandb.config.update(_jsonable_tree(data), allow_val_change=True)

    def write_extra(self, section: str, value: Any) -> None:
        """Add a section to ``config.json`` (e.g. measured communication)."""
        data = json.loads(self.config_path.read_text()) if self.config_path.exists() else {}
        data[section] = _jsonable_tree(value)
        self.write_config_data(data)

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Rows to ``metrics.jsonl`` (flushed), TensorBoard and wandb. A failed write:
        ``RunWriteError`` (the file may end in a torn line, which a resume drops)."""
        try:
            for row in rows:
                line = json.dumps({k: _jsonable(v) for k, v in row.items()})
                self._metrics_file.write(line + "\n")
            self._metrics_file.flush()
        except OSError as error:
            self._abandon_metrics_file()
            raise self._write_error(self.metrics_path, error) from error
        for row in rows:
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
        if self._tensorboard is not None:
            self._tensorboard.flush()

    def _abandon_metrics_file(self) -> None:
        """After a failed write: close without flushing what is left (it would fail again)."""
        f, self._metrics_file = self._metrics_file, None
        if f is None:
            return
        try:
            f.close()
        except OSError:
            pass

    def truncate(self, last_update: int) -> None:
        """Drop rows after ``last_update`` (resume / rollback: they are recomputed), and damaged
        lines (a torn last line after a crash or a full disk, garbage): one ``RunLogWarning``
        saying how many. The file is replaced atomically."""
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None
        rows, dropped = scan_metrics(self.metrics_path)
        if dropped:
            _warn(
                f"dropped {dropped} damaged line(s) of {self.metrics_path} (a torn last line from "
                f"a crash or a full disk, or garbage); rows are kept up to update {last_update}"
            )
        rows = [r for r in rows if r.get("update", 0) <= last_update]
        try:
            write_text_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))
            self._metrics_file = open(self.metrics_path, "a")
        except OSError as error:
            raise self._write_error(self.metrics_path, error) from error

    def close(self) -> None:
        try:
            if self._metrics_file is not None:
                f, self._metrics_file = self._metrics_file, None
                try:
                    f.close()
                except OSError as error:
                    raise self._write_error(self.metrics_path, error) from error
        finally:
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


def scan_metrics(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """``(rows, damaged)`` of a ``metrics.jsonl``: every line that is a JSON object, and the
    number of other non-blank lines (torn by a crash or a full disk, or garbage)."""
    rows, damaged = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                damaged += 1
    return rows, damaged


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (damaged lines skipped: see ``scan_metrics``)."""
    return scan_metrics(path)[0]
