"""Start a training command and SIGKILL it once a checkpoint is on disk (resume tests)."""

import signal
import subprocess
import time
from pathlib import Path


def kill_after_checkpoint(command, env, run_dir: Path, step: int, timeout: float = 240) -> None:
    """Run ``command`` until ``run_dir``'s checkpoint ``step`` has its manifest, then SIGKILL it;
    fails if the run ended on its own first."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = Path(run_dir) / "checkpoints" / str(step) / "rljax_manifest.json"
    deadline = time.monotonic() + timeout
    while not manifest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the run ended before it could be killed"
