"""The notebooks run top to bottom on CPU with small budgets, and are committed without outputs.

Each notebook is executed by nbclient in a fresh kernel that runs this interpreter (the venv's
python, through a kernelspec written to a temporary directory), in a temporary working directory,
with the cell tagged ``parameters`` replaced by a small budget and one cell appended that prints
the notebook's results as JSON for the assertions. A cell that raises fails the tests of its
notebook (``nbclient.exceptions.CellExecutionError``, with the cell's traceback).
"""

import json
import math
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ["quickstart.ipynb", "sharding_tour.ipynb"]
KERNEL = "rljax-test-python"
RESULT = "NOTEBOOK-RESULT "
CELL_TIMEOUT_S = 300

# Small budgets: the source of each notebook's `parameters` cell, and the report it prints.
QUICKSTART_PARAMETERS = """
TOTAL_TIMESTEPS = 4 * 512  # four updates of 4 envs x 128 steps
NUM_CPU_DEVICES = 4
NUM_SEEDS = 2
PURE_UPDATES = 2
RUNS_DIR = "runs"
"""
QUICKSTART_REPORT = """{
    "backend": backend,
    "devices": jax.device_count(),
    "spec": spec,
    "env_steps": [row["env_steps"] for row in result.metrics],
    "returns_finite": bool(np.isfinite(returns).all()),
    "run_dir": str(result.run_dir),
    "loss": float(metrics["loss"]),
    "seed_returns_shape": list(seed_returns.shape),
    "seed_kernel_shape": list(states.params["params"]["actor"]["dense_0"]["kernel"].shape),
}"""
TOUR_PARAMETERS = """
NUM_CPU_DEVICES = 4
MESHES = ["data=4", "data=2,model=2", "model=4"]
COMPARE_MESH = "data=2,model=2"
"""
TOUR_REPORT = """{
    "devices": jax.device_count(),
    "placement": {spec: {k: list(v) for k, v in p.items()} for spec, p in placement.items()},
    "specs": {name: str(x.sharding.spec) for name, x in first.items()},
    "max_diff": max_diff,
    "comm": comm,
}"""
BUDGETS = {
    "quickstart.ipynb": (QUICKSTART_PARAMETERS, QUICKSTART_REPORT),
    "sharding_tour.ipynb": (TOUR_PARAMETERS, TOUR_REPORT),
}


# -- helpers -------------------------------------------------------------------------------------
def read(name: str):
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def parameters_cell(nb):
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert cell.cell_type == "code"
    return cell


def cell(nb, cell_id: str):
    (found,) = [c for c in nb.cells if c.get("id") == cell_id]
    return found


def stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def displayed_text(cell) -> str:
    """text/plain of displayed objects, ANSI styling removed (rich highlights numbers)."""
    text = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def images(nb) -> int:
    return sum(
        "image/png" in o.get("data", {})
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )


def kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    # conftest emulates 8 devices in this process; each notebook sets its own count.
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("MPLBACKEND", None)  # ipykernel's inline backend, as in Jupyter and Colab
    return env


def with_budget(name: str):
    """Notebook ``name`` with its parameters cell replaced and a report cell appended."""
    parameters, report = BUDGETS[name]
    nb = read(name)
    parameters_cell(nb).source = parameters
    nb.cells.append(
        nbformat.v4.new_code_cell(f"import json\nprint({RESULT!r} + json.dumps({report}))")
    )
    return nb


def run(nb, kernel_dir: Path, cwd: Path):
    """Execute ``nb`` in place in a fresh kernel (this interpreter) working in ``cwd``."""
    # Only our kernelspec directory: a `python3` kernel installed elsewhere is never picked.
    km = AsyncKernelManager(
        kernel_name=KERNEL,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]),
        connection_file=str(cwd / "kernel-connection.json"),
    )
    client = NotebookClient(
        nb, km=km, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute(cleanup_kc=True, env=kernel_env())  # cleanup_kc: shut our kernel down


def report_of(nb) -> dict:
    (line,) = [x for x in stdout(nb.cells[-1]).splitlines() if x.startswith(RESULT)]
    return json.loads(line[len(RESULT) :])


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    """A kernelspec directory whose one kernel runs this interpreter with ipykernel."""
    root = tmp_path_factory.mktemp("kernels")
    (root / KERNEL).mkdir()
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rljax tests",
        "language": "python",
    }
    (root / KERNEL / "kernel.json").write_text(json.dumps(spec))
    return root


def execute(name: str, kernel_dir: Path, cwd: Path):
    """Run ``name`` with its small budget; returns (executed notebook, report, cwd)."""
    nb = with_budget(name)
    run(nb, kernel_dir, cwd)
    return nb, report_of(nb), cwd


@pytest.fixture(scope="module")
def quickstart(kernel_dir, tmp_path_factory):
    return execute("quickstart.ipynb", kernel_dir, tmp_path_factory.mktemp("quickstart"))


@pytest.fixture(scope="module")
def tour(kernel_dir, tmp_path_factory):
    return execute("sharding_tour.ipynb", kernel_dir, tmp_path_factory.mktemp("tour"))


# -- committed form ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_committed_without_outputs(name):
    nb = read(name)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 5, name
    for c in code:
        assert c.outputs == [], f"{name}: cell {c.get('id')} has outputs; clear them"
        assert c.execution_count is None, f"{name}: cell {c.get('id')} has an execution count"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def install_cell(nb):
    cell = [c for c in nb.cells if c.cell_type == "code"][0]
    assert "RLJAX_SOURCE" in cell.source
    return cell


def run_install_cell(source: str, monkeypatch, importable: bool, rljax_source=None) -> list:
    """Execute an install cell in this process with pip recorded, not run; returns the pip
    argument lists."""
    import importlib.util
    import subprocess

    calls = []
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: find_spec(name, *a) if importable or name != "rljax" else None,
    )
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd[5:]))
    if rljax_source is not None:
        source = re.sub(
            r"^RLJAX_SOURCE = .*$", f"RLJAX_SOURCE = {rljax_source!r}", source, count=1, flags=re.M
        )
    exec(compile(source, "install-cell", "exec"), {})
    return calls


@pytest.mark.parametrize("name", NAMES)
def test_install_cell_is_a_no_op_where_rljax_is_importable(name, monkeypatch):
    nb = read(name)
    source = install_cell(nb).source
    assert source.count("RLJAX_SOURCE = ") == 1  # the one place the user edits
    assert run_install_cell(source, monkeypatch, importable=True) == []
    assert parameters_cell(nb).id == "parameters"  # exactly one, replaceable by the tests


@pytest.mark.parametrize("name", NAMES)
def test_install_cell_never_replaces_the_runtimes_jax(name, monkeypatch, tmp_path):
    from importlib.metadata import version

    source = install_cell(read(name)).source
    with pytest.raises(RuntimeError, match="set RLJAX_SOURCE"):  # the placeholder is not a URL
        run_install_cell(source, monkeypatch, importable=False)
    wheel = str(tmp_path / "rljax-0.1.0-py3-none-any.whl")
    first, second = run_install_cell(source, monkeypatch, importable=False, rljax_source=wheel)
    assert first == ["--no-deps", wheel]  # rljax alone
    assert second[0] == "-c" and "flax>=0.12" in second and "jax>=0.10.2" in second
    pins = Path(second[1]).read_text().split()
    assert pins == [f"jax=={version('jax')}", f"jaxlib=={version('jaxlib')}"]


def test_a_failing_cell_fails_and_the_kernel_is_this_interpreter(kernel_dir, tmp_path):
    source = f"""
import os, sys
assert sys.executable == {sys.executable!r}, sys.executable
assert "JAX_NUM_CPU_DEVICES" not in os.environ
raise ValueError("boom")
"""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    with pytest.raises(CellExecutionError) as error:
        run(nb, kernel_dir, tmp_path)
    # the asserts before it held: the cell got as far as the ValueError
    assert (error.value.ename, error.value.evalue) == ("ValueError", "boom")


# -- quickstart ----------------------------------------------------------------------------------
def test_quickstart_trains_on_an_emulated_mesh(quickstart):
    nb, report, cwd = quickstart
    assert report["backend"] == "cpu"
    assert report["devices"] == 4  # the notebook's count, not conftest's 8
    assert report["spec"] == "data=2,model=2"
    assert report["env_steps"] == [512, 1024, 1536, 2048]
    assert report["returns_finite"]
    run_dir = cwd / report["run_dir"]  # relative to the kernel's working directory
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 4
    assert (run_dir / "config.json").is_file() and (run_dir / "learning_curve.png").is_file()
    progress = stdout(cell(nb, "train"))
    assert "compiled in" in progress
    assert re.search(r"update\s+4/4\s+env steps\s+2,048", progress), progress


def test_quickstart_plots_inline_and_runs_the_pure_functions(quickstart):
    nb, report, _ = quickstart
    assert images(nb) == 2  # the learning curve and the per-seed curves, despite train's Agg
    assert math.isfinite(report["loss"])
    assert report["seed_returns_shape"] == [2, 2]  # [PURE_UPDATES, NUM_SEEDS]
    assert report["seed_kernel_shape"] == [2, 4, 64]  # [seeds, obs, width]: lax.map'ed init


# -- sharding tour -------------------------------------------------------------------------------
def test_tour_places_parameters_and_env_batch_by_the_rules(tour):
    nb, report, _ = tour
    assert report["devices"] == 4
    specs, placement = report["specs"], report["placement"]
    names = ["params/actor/dense_0/kernel", "params/actor/dense_1/kernel"]
    names += ["params/policy_head/kernel", "env/obs"]
    # Column-split first layer [obs 4, 64], row-split second [64, 64], replicated head, batch.
    assert [specs[n] for n in names] == [
        "P(None, 'model')",
        "P('model', None)",
        "P(None, None)",
        "P('data',)",
    ]
    expected = {  # one device's piece of each, 8 environments
        "data=4": [[4, 64], [64, 64], [64, 2], [2, 4]],
        "data=2,model=2": [[4, 32], [32, 64], [64, 2], [4, 4]],
        "model=4": [[4, 16], [16, 64], [64, 2], [8, 4]],
    }
    for spec, shapes in expected.items():
        assert [placement[spec][n] for n in names] == shapes, spec
    # rows [0, 32) of the row-split kernel on model position 0: devices 0 and 2
    assert "CPU 0,2" in displayed_text(cell(nb, "picture"))
    assert stdout(cell(nb, "compare")).count("forward pass equal") == 3


def test_tour_sharded_update_equals_single_device(tour):
    _, report, _ = tour
    assert report["max_diff"] <= 1e-5  # also asserted inside the notebook


def test_tour_counts_collectives_per_strategy(tour):
    nb, report, _ = tour
    comm = report["comm"]
    allreduce = comm["allreduce"]["data"]["always"]
    int8 = comm["compressed int8"]["data"]["always"]
    local = comm["local_sgd K=4"]["data"]
    assert allreduce > 0 and comm["allreduce"]["data"]["on_sync"] == 0
    assert 0.25 < int8 / allreduce < 0.4  # int8 plus per-block f32 scales
    # local SGD: a few scalars every step; on a sync, the gradient and the parameters averaged
    assert local["always"] < 0.01 * allreduce
    assert local["on_sync"] == pytest.approx(2 * allreduce, rel=0.01)
    # the tensor-parallel all-reduces over `model` do not depend on the data strategy
    model = comm["allreduce"]["model"]["always"]
    assert model > 0
    assert comm["compressed int8"]["model"]["always"] == model
    tables = stdout(cell(nb, "comm"))
    assert tables.count("total sent per device per call") == 3
    assert re.search(r"all-to-all\s+s8", tables)  # the int8 stages
