"""The collectives of a compiled step, read from its optimised HLO text, and the bytes they move.

Reports per device and per mesh axis, so gradient synchronisation over ``data`` shows apart from
tensor-parallel all-reduces over ``model``. Counting convention: ``collectives``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rljax.diagnostics.hlo_text import (
    Instr,
    Module,
    arrays,
    called,
    device_groups,
    inner,
    parse_module,
    replica_groups,
    shape_bytes,
    split_top,
)
from rljax.errors import ConfigError

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

__all__ = ["KINDS", "Collective", "collectives", "comm_summary", "format_table"]


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of the optimised HLO, at one call site (bytes per device)."""

    kind: str  # one of KINDS
    dtype: str  # element type(s) of the operands, e.g. "f32"; mixed -> "f32,bf16"
    operand_bytes: int  # per device, all operands summed
    result_bytes: int  # per device, all results summed
    group_size: int  # n; for collective-permute the most devices its pairs connect
    replica_groups: tuple[tuple[int, ...], ...]  # as in the HLO; permute: (source, target) pairs
    axes: tuple[str, ...]  # mesh axes a group spans, in mesh order; () if unknown
    sent_bytes: float  # per device per execution, by the convention of `collectives`
    conditional: bool  # inside a branch of a `conditional`
    multiplicity: int  # product of the known trip counts of the enclosing while loops
    trip_count_known: bool  # False if some enclosing loop's trip count is unknown
    computation: str  # HLO computation holding the instruction
    name: str = ""  # HLO instruction name (the start op of an async pair)
    op_name: str = ""  # metadata op_name, e.g. "jit(step)/shard_map/psum"

    @property
    def bytes_per_call(self) -> float:
        """``sent_bytes * multiplicity`` (conditional ops counted as if their branch ran)."""
        return self.sent_bytes * self.multiplicity


# --------------------------------------------------------------------------------- traversal

_TRIP = re.compile(r'known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"?(\d+)')
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


def _base_kind(opcode: str) -> tuple[str | None, bool]:
    """``"all-gather-start"`` -> ``("all-gather", True)``; non-collectives -> ``(None, False)``."""
    if opcode in KINDS:
        return opcode, False
    if opcode.endswith("-start") and opcode[: -len("-start")] in KINDS:
        return opcode[: -len("-start")], True
    return None, False


def _counted_later(instr: Instr) -> bool:
    """The done/update half of an async pair: its work is counted at the start."""
    return instr.opcode.endswith("-done") or instr.opcode == "async-update"


@dataclasses.dataclass(frozen=True)
class _Ctx:
    multiplicity: int = 1
    known: bool = True
    conditional: bool = False


class _Walker:
    def __init__(self, module: Module, coords, axis_names):
        self.module = module
        self.coords = coords  # global id -> mesh coordinates (tuple) or None
        self.axis_names = axis_names
        self.parts = module.num_partitions or 1
        self.reps = module.replica_count or 1
        self.unknown_size = module.num_partitions is None and module.replica_count is None
        self._has: dict[str, bool] = {}
        self.found: list[Collective] = []

    def has_collectives(self, comp: str, stack=()) -> bool:
        if comp not in self._has:
            if comp in stack:
                return False
            instrs = self.module.computations.get(comp, [])
            self._has[comp] = any(_base_kind(i.opcode)[0] for i in instrs) or any(
                self.has_collectives(c, (*stack, comp))
                for i in instrs
                if not _counted_later(i)
                for _, c in called(i)
            )
        return self._has[comp]

    def walk(self, comp: str, ctx: _Ctx, stack=()) -> None:
        if comp in stack or not self.has_collectives(comp):
            return
        instrs = self.module.computations.get(comp, [])
        shapes = {i.name: i.shape for i in instrs}
        dones = {  # start name -> its -done, whose shape is the result
            i.operands[0].split()[-1].lstrip("%"): i
            for i in instrs
            if i.opcode.endswith("-done") and i.operands
        }
        for instr in instrs:
            kind, is_start = _base_kind(instr.opcode)
            if kind:
                self.found.append(self.collective(kind, is_start, instr, dones, shapes, comp, ctx))
                continue
            if _counted_later(instr):
                continue
            trip = _TRIP.search(instr.attrs.get("backend_config", ""))
            for role, callee in called(instr):
                sub = ctx
                if instr.opcode == "while" and trip:
                    n = int(trip.group(1)) + (1 if role == "condition" else 0)
                    sub = dataclasses.replace(ctx, multiplicity=ctx.multiplicity * n)
                elif instr.opcode == "while":
                    sub = dataclasses.replace(ctx, known=False)
                elif instr.opcode == "conditional":
                    sub = dataclasses.replace(ctx, conditional=True)
                self.walk(callee, sub, (*stack, comp))

    def collective(self, kind, is_start, instr, dones, shapes, comp, ctx) -> Collective:
        operand_shapes = []
        for operand in instr.operands:  # "f32[8]{0} %x" or "%x"
            shape, _, name = operand.rpartition(" ")
            operand_shapes.append(shape.strip() or shapes.get(name.lstrip("%")))
        result_shape = instr.shape
        if is_start:
            done = dones.get(instr.name)
            if done is not None and done.opcode == f"{kind}-done":
                result_shape = done.shape
            elif kind in ("all-gather", "collective-permute"):
                # start shape: (operands, results[, context scalars])
                shape = instr.shape.strip()
                elements = split_top(inner(shape)) if shape.startswith("(") else [shape]
                result_shape = elements[1] if len(elements) > 1 else elements[0]
        result_bytes = shape_bytes(result_shape)

        groups_written, n, expanded = device_groups(kind, instr, self.parts, self.reps)
        known = [s for s in operand_shapes if s is not None]
        operand_bytes = sum(map(shape_bytes, known)) if known == operand_shapes and known else None
        if operand_bytes is None:  # an operand we could not resolve: infer from the result
            operand_bytes = {
                "all-gather": result_bytes // max(n, 1),
                "reduce-scatter": result_bytes * max(n, 1),
            }.get(kind, result_bytes)
        elif (
            self.unknown_size
            and kind in ("all-gather", "reduce-scatter")
            and not replica_groups(instr.attrs)
            and operand_bytes
            and result_bytes
        ):
            # `replica_groups={}` in a snippet without a module header: n from the shapes
            ratio = result_bytes / operand_bytes
            n = max(1, round(ratio if kind == "all-gather" else 1 / ratio))
            groups_written, expanded = (), []
        dtypes: list[str] = []
        for shape in known or [result_shape]:
            for dtype, _ in arrays(shape):
                if dtype not in dtypes and dtype not in ("token", "opaque"):
                    dtypes.append(dtype)
        op_name = _OP_NAME.search(instr.attrs.get("metadata", ""))
        return Collective(
            kind=kind,
            dtype=",".join(dtypes),
            operand_bytes=operand_bytes,
            result_bytes=result_bytes,
            group_size=n,
            replica_groups=groups_written,
            axes=self.axes(expanded),
            sent_bytes=_sent_bytes(kind, n, operand_bytes, result_bytes),
            conditional=ctx.conditional,
            multiplicity=ctx.multiplicity,
            trip_count_known=ctx.known,
            computation=comp,
            name=instr.name,
            op_name=op_name.group(1) if op_name else "",
        )

    def axes(self, groups) -> tuple[str, ...]:
        if self.coords is None or not groups:
            return ()
        varying: set[int] = set()
        for group in groups:
            points = [self.coords[g] if 0 <= g < len(self.coords) else None for g in group]
            if any(p is None for p in points):
                return ()
            for axis in range(len(self.axis_names)):
                if len({p[axis] for p in points}) > 1:
                    varying.add(axis)
        return tuple(self.axis_names[a] for a in sorted(varying))


def _sent_bytes(kind: str, n: int, operand_bytes: int, result_bytes: int) -> float:
    if kind == "collective-permute":
        return float(operand_bytes)
    if n <= 1:
        return 0.0
    frac = (n - 1) / n
    if kind == "all-reduce":
        return 2 * frac * operand_bytes
    if kind == "all-gather":
        return frac * result_bytes
    return frac * operand_bytes  # reduce-scatter, all-to-all


# --------------------------------------------------------------------------------------- API


def _hlo_text_of(obj) -> tuple[str, object | None]:
    if isinstance(obj, str):
        text, compiled = obj, None
    elif hasattr(obj, "compile") or not hasattr(obj, "as_text"):
        raise ConfigError(
            f"collectives() takes a compiled step (jax.jit(f).lower(*args).compile()) or its "
            f"HLO text (compiled.as_text()); got {type(obj).__name__}"
            + (" -- call .compile() on it first" if hasattr(obj, "compile") else "")
        )
    else:
        text, compiled = obj.as_text(), obj
        if not isinstance(text, str):
            raise ConfigError(f"{type(obj).__name__}.as_text() returned no HLO text")
    if re.search(r"\b(?:func\.func|stablehlo\.|mhlo\.)", text) or not re.search(
        r"\{\s*$", text, re.M
    ):
        raise ConfigError(
            "collectives() needs optimised HLO text (as from compiled.as_text(), with "
            "'ENTRY ... {' computations), not StableHLO/MLIR or other text"
        )
    return text, compiled


def _mesh_of_compiled(compiled) -> Mesh | None:
    for attr in ("output_shardings", "input_shardings"):
        try:
            tree = getattr(compiled, attr)
        except Exception:  # optional metadata, absent on some backends / versions
            continue
        for s in jax.tree.leaves(tree):
            if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh):
                return s.mesh
    return None


def _device_assignment(compiled, total: int):
    """Devices by global id (replica * num_partitions + partition), if the executable says."""
    try:
        devices = list(compiled.runtime_executable().local_devices())
    except Exception:  # runtime details differ across jax versions and backends
        return None
    return devices if len(devices) == total else None


def collectives(compiled_or_hlo_text, mesh: Mesh | None = None) -> list[Collective]:
    """Every collective one call of the compiled step executes, in HLO order, one per call site.

    Takes ``jax.jit(f).lower(*args).compile()`` or its ``as_text()`` (optimised, post-SPMD HLO).
    ``mesh`` names the axes; by default it is taken from the compiled step's NamedShardings
    (text alone: no mesh, ``axes == ()``).

    ``sent_bytes``: bytes *sent by one device* per execution, for ring algorithms, with ``n`` the
    group size and ``S`` the per-device payload (all operands summed, tuple shapes included):
    all-reduce ``2 (n-1)/n S`` (S = operand bytes); all-gather ``(n-1)/n S`` (S = the gathered
    result); reduce-scatter and all-to-all ``(n-1)/n S`` (S = operand bytes); collective-permute
    ``S`` (what a sending device sends). A group of size 1 sends nothing.

    ``multiplicity``: product of the enclosing while loops' ``known_trip_count`` (a collective in
    a loop condition runs ``trip + 1`` times); unknown trip counts leave it per iteration with
    ``trip_count_known=False``. Collectives in a ``conditional`` branch are flagged
    (``comm_summary`` weights them). Async pairs count once, at the start.

    Group ids are partition ids (``replica * num_partitions + partition`` when flattened);
    partition ``p`` runs on the ``p``-th device of the executable's device assignment, read from
    a compiled step, else assumed to be ``mesh.devices.flat`` (not the device with ``id == p``).
    ``axes`` are the mesh axes along which the devices of a group differ. Groups are read in the
    explicit (``{{0,2},{1,3}}``), iota (``[2,4]<=[4,2]T(1,0)``) and mesh-axes
    (``mesh['a'=4,'b'=2], device_ids=(...) {'a'}``) forms; ``{}`` means every device. The HLO is
    what runs, so backend rewrites show (XLA:CPU all-reduces a bf16 ``psum`` in f32).
    """
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
    text, compiled = _hlo_text_of(compiled_or_hlo_text)
    module = parse_module(text)
    if not module.computations:
        raise ConfigError("no HLO computations found in the given text")
    if compiled is not None and mesh is None:
        mesh = _mesh_of_compiled(compiled)
    parts, reps = module.num_partitions or 1, module.replica_count or 1
    coords = None
    if mesh is not None:
        position = {d.id: idx for idx, d in np.ndenumerate(mesh.devices)}
        assigned = _device_assignment(compiled, parts * reps) if compiled is not None else None
        if assigned is not None:
            coords = [position.get(d.id) for d in assigned]
        else:
            coords = [np.unravel_index(g, mesh.devices.shape) for g in range(mesh.devices.size)]
            coords = [tuple(int(i) for i in c) for c in coords]
    walker = _Walker(module, coords, tuple(mesh.axis_names) if mesh is not None else ())
    if module.entry is not None:
        roots = [module.entry]
    else:  # a hand-written snippet without ENTRY: every computation nobody calls
        comps = module.computations.values()
        callees = {c for instrs in comps for i in instrs for _, c in called(i)}
        roots = [c for c in module.computations if c not in callees]
    for root in roots:
        walker.walk(root, _Ctx())
    return walker.found


def _axis_key(axes: tuple[str, ...]) -> str:
    return "+".join(axes) if axes else "unknown"


def comm_summary(colls: Sequence[Collective], conditional_rate: float = 1.0) -> dict:
    """Bytes sent per device per call of the step, in total, by mesh axes and by kind.

    Each collective contributes ``sent_bytes * multiplicity``, times ``conditional_rate`` if it
    sits in a ``conditional`` branch (the expected number of times the branch runs per execution
    of the ``conditional``, e.g. syncs per update for a local-SGD ``lax.cond`` in the step).
    ``conditional_bytes`` is unweighted (every branch run once); ``bytes_by_axis`` keys are the
    axes joined by ``+`` (``"data"``, ``"model"``, ``"data+model"``) or ``"unknown"``.
    """
    if not isinstance(conditional_rate, numbers.Real) or not (
        math.isfinite(conditional_rate) and conditional_rate >= 0
    ):
        raise ConfigError(
            f"conditional_rate must be a finite number >= 0 (expected executions of a "
            f"conditional branch per execution of its `conditional`), got {conditional_rate!r}"
        )
    total = uncond = cond = 0.0
    by_axis: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    count: dict[str, int] = {}
    for c in colls:
        raw = c.sent_bytes * c.multiplicity
        weighted = raw * conditional_rate if c.conditional else raw
        if c.conditional:
            cond += raw
        else:
            uncond += raw
        total += weighted
        key = _axis_key(c.axes)
        by_axis[key] = by_axis.get(key, 0.0) + weighted
        by_kind[c.kind] = by_kind.get(c.kind, 0.0) + weighted
        count[c.kind] = count.get(c.kind, 0) + 1
    return {
        "bytes_per_call": total,
        "bytes_by_axis": by_axis,
        "unconditional_bytes": uncond,
        "conditional_bytes": cond,
        "bytes_by_kind": by_kind,
        "count_by_kind": count,
        "trip_counts_known": all(c.trip_count_known for c in colls),
    }


def _short_op_name(op_name: str, width: int = 48) -> str:
    """``"jit(step)/while/body/psum"`` -> ``"while/body/psum"``, at most ``width`` characters."""
    name = re.sub(r"^jit\([^)]*\)/", "", op_name)
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def format_table(colls: Sequence[Collective]) -> str:
    """A fixed-width table of the collectives, one row each, and the total bytes per call."""
    header = ("kind", "dtype", "operand B", "n", "axes", "sent B", "x", "cond", "op")
    rows = [
        (
            c.kind,
            c.dtype,
            f"{c.operand_bytes:,}",
            str(c.group_size),
            _axis_key(c.axes),
            f"{c.sent_bytes:,.0f}",
            f"{c.multiplicity}" + ("" if c.trip_count_known else "?"),
            "yes" if c.conditional else "",
            _short_op_name(c.op_name) or c.name,
        )
        for c in colls
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = {2, 3, 5, 6}

    def line(r):
        cells = [r[i].rjust(w) if i in numeric else r[i].ljust(w) for i, w in enumerate(widths)]
        return "  ".join(cells).rstrip()

    total = comm_summary(colls)["bytes_per_call"]
    out = [line(header), "  ".join("-" * w for w in widths), *map(line, rows)]
    out.append(
        f"total sent per device per call: {total:,.0f} B"
        + (" (conditional ops counted once; '?' = unknown trip count)" if rows else "")
    )
    return "\n".join(out)
