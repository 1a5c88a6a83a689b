"""Communication accounting: the collectives of a compiled step and the bytes they move.

``collectives(compiled)`` reads the optimised (post-SPMD-partitioning) HLO of
``jax.jit(f).lower(*args).compile()`` (or its ``as_text()``), lists every collective the step
executes and names the mesh axes each one spans, so that gradient synchronisation over ``data``
can be reported separately from tensor-parallel activation all-reduces over ``model``.

Counting convention: bytes *sent by one device* per execution of the op, for ring algorithms,
with ``n`` the group size and ``S`` the per-device payload (all operands of the op summed; tuple
shapes of combined ops included; element types by bit width, ``pred`` as one byte, packed
sub-byte types rounded up per array):

====================  ==========================  ===========================================
kind                  sent_bytes                  S
====================  ==========================  ===========================================
all-reduce            2 (n-1)/n * S               operand (= result) bytes
all-gather            (n-1)/n * S                 result bytes (the gathered array)
reduce-scatter        (n-1)/n * S                 operand bytes (the full array)
all-to-all            (n-1)/n * S                 operand (= result) bytes
collective-permute    S                           operand bytes (what a sending device sends)
====================  ==========================  ===========================================

A group of size 1 sends nothing. ``multiplicity`` multiplies this by the trip counts of the
enclosing while loops (``lax.fori_loop``/``scan`` with static bounds, where XLA records
``known_trip_count``); a collective in a loop condition runs ``trip + 1`` times. Collectives in
a branch of a ``conditional`` (``lax.cond``/``switch``) are flagged and weighted at summary time
by ``conditional_rate``. Async pairs (``all-reduce-start``/``-done``, ``async-start`` wrappers
on GPU/TPU) count once, at the start.

Replica-group ids in an SPMD program (``num_partitions = N``, one replica) are partition ids
(``use_global_device_ids=true`` flattens ``replica * N + partition``, which is the same with one
replica). Partition ``p`` runs on the ``p``-th device of the executable's device assignment, which
for ``jax.jit`` over a mesh is ``mesh.devices.flat[p]`` -- *not* the device with ``id == p``.
Given a compiled object, the assignment is read from the executable; given only text, it is
assumed to be ``mesh.devices.flat``. An op's ``axes`` are the mesh axes along which the devices
of one of its groups differ. Groups are read in the explicit (``{{0,2},{1,3}}``), iota
(``[2,4]<=[4,2]T(1,0)``) and mesh-axes (``mesh['a'=4,'b'=2], device_ids=(...) {'a'}``, printed by
jax >= 0.10 for partitioner-made collectives) forms; ``{}`` means every device.

Notes: the HLO is what runs, so backend rewrites show (XLA:CPU all-reduces a bf16 ``psum`` in
f32). With an unknown trip count the bytes are per loop iteration (``trip_count_known=False``).
A collective-permute's ``S`` is what a *sending* device sends. Collectives in several branches of
one ``conditional`` are each weighted by ``conditional_rate``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import warnings
from collections.abc import Iterable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rljax.errors import ConfigError

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

__all__ = ["KINDS", "Collective", "collectives", "comm_summary", "format_table"]


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of the optimised HLO, at one call site."""

    kind: str  # one of KINDS
    dtype: str  # element type(s) of the operands, e.g. "f32"; mixed -> "f32,bf16"
    operand_bytes: int  # per device, all operands summed
    result_bytes: int  # per device, all results summed
    group_size: int  # n; for collective-permute the most devices its pairs connect
    replica_groups: tuple[tuple[int, ...], ...]  # as in the HLO; permute: (source, target) pairs
    axes: tuple[str, ...]  # mesh axes a group spans, in mesh order; () if unknown
    sent_bytes: float  # per device per execution, by the module's convention
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


# ----------------------------------------------------------------------------------- HLO text


@dataclasses.dataclass
class _Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str  # everything after the operand list, double-quoted strings blanked
    raw_attrs: str  # the same, strings kept (backend_config, metadata)


@dataclasses.dataclass
class _Module:
    computations: dict[str, list[_Instr]]
    entry: str | None
    num_partitions: int | None
    replica_count: int | None


_OPEN, _CLOSE = "([{", ")]}"


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and double-quoted strings."""
    parts, depth, start, i, quoted = [], 0, 0, 0, False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _balanced_end(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``text[start]`` (quote-aware)."""
    depth, i, quoted = 0, start, False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced brackets in HLO: {text[start : start + 80]!r}")


def _depth_delta(line: str) -> int:
    depth, quoted, i = 0, False, 0
    while i < len(line):
        c = line[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        i += 1
    return depth


_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_INSTR = re.compile(r"^(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<rest>.*)$", re.S)
_INSTR_START = re.compile(r"^(?:ROOT\s+)?%?[^\s=]+\s*=\s*(?:\(|[a-z][a-z0-9]*\[[\d,<=?\s]*\])")
_COMP_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s({]+)")


def _parse_instr(stmt: str) -> _Instr | None:
    m = _INSTR.match(stmt)
    if not m:
        return None
    rest = m.group("rest").strip()
    if rest.startswith("("):
        end = _balanced_end(rest, 0)
    else:
        end = re.match(r"\S+", rest).end()
    shape, rest = rest[:end], rest[end:].lstrip()
    op = re.match(r"(?P<op>[A-Za-z][\w\-]*)\s*\(", rest)
    if not op:
        return None
    open_at = op.end() - 1
    close_at = _balanced_end(rest, open_at)
    operands = _split_top(rest[open_at + 1 : close_at - 1])
    raw_attrs = rest[close_at:].lstrip(", \n")
    attrs = _STRING.sub('""', raw_attrs)
    return _Instr(m.group("name"), shape, op.group("op"), operands, attrs, raw_attrs)


def _parse_module(text: str) -> _Module:
    text = _COMMENT.sub("", text)
    computations: dict[str, list[_Instr]] = {}
    entry = None
    header = re.search(r"^\s*HloModule\b[^\n]*", text, re.M)
    header_text = header.group(0) if header else ""
    parts = re.search(r"\bnum_partitions=(\d+)", header_text)
    reps = re.search(r"\breplica_count=(\d+)", header_text)

    current: list[_Instr] | None = None
    stmt, depth = "", 0
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            if stripped.endswith("{") and not stripped.startswith("HloModule"):
                m = _COMP_HEADER.match(stripped)
                if m:
                    name = m.group("name")
                    current = computations.setdefault(name, [])
                    if m.group("entry"):
                        entry = name
            continue
        if not stripped:
            continue
        # An instruction may wrap over lines, even between top-level attributes; a new one starts
        # with `name = shape opcode(`.
        if depth <= 0 and (stripped == "}" or _INSTR_START.match(stripped)):
            if stmt and (instr := _parse_instr(stmt)) is not None:
                current.append(instr)
            stmt, depth = "", 0
            if stripped == "}":
                current = None
                continue
        stmt = f"{stmt} {stripped}" if stmt else stripped
        depth += _depth_delta(stripped)
    return _Module(
        computations,
        entry,
        int(parts.group(1)) if parts else None,
        int(reps.group(1)) if reps else None,
    )


# ------------------------------------------------------------------------------------- shapes

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_BITS = re.compile(r"^[a-z]+?(\d+)")


def _arrays(shape: str) -> list[tuple[str, int]]:
    """``"(f32[8,8]{1,0}, s8[4])"`` -> ``[("f32", 256), ("s8", 4)]`` (dtype, bytes)."""
    out = []
    for dtype, dims in _ARRAY.findall(shape):
        count = 1
        for dim in dims.split(","):
            digits = re.sub(r"[^0-9]", "", dim)  # "<=8" (bounded dynamic) -> 8
            if dim.strip():
                count *= int(digits) if digits else 0
        if dtype == "pred":
            bits = 8
        elif dtype in ("token", "opaque"):
            bits = 0
        else:
            m = _BITS.match(dtype)
            bits = int(m.group(1)) if m else 0
        out.append((dtype, math.ceil(count * bits / 8)))
    return out


def _bytes(shape: str) -> int:
    return sum(b for _, b in _arrays(shape))


def _tuple_elements(shape: str) -> list[str]:
    shape = shape.strip()
    if shape.startswith("("):
        return _split_top(shape[1 : _balanced_end(shape, 0) - 1])
    return [shape]


# ------------------------------------------------------------------------------ replica groups

_RG_LIST = re.compile(r"replica_groups=(\{(?:[^{}]|\{[^{}]*\})*\})")
_RG_IOTA = re.compile(r"replica_groups=\[([\d,\s]*)\]<=\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?")
_RG_MESH = re.compile(
    r"replica_groups=mesh\[(?P<axes>[^\]]*)\]"
    r"(?:\s*,\s*device_ids=\((?P<ids>(?:[^()]|\([^()]*\))*)\))?\s*\{(?P<group>[^{}]*)\}"
)
_PAIRS = re.compile(r"source_target_pairs=(\{(?:[^{}]|\{[^{}]*\})*\})")


def _ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def _nested_ints(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(_ints(g)) for g in re.findall(r"\{([^{}]*)\}", text[1:-1]))


def _iota(reshape: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
    arr = np.arange(math.prod(reshape)).reshape(reshape)
    return arr.transpose(perm) if perm else arr


def _mesh_groups(axes_text: str, ids_text: str | None, group_text: str):
    """``mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)) {'a'}`` -> groups (XLA's order)."""
    names, sizes = [], []
    for item in _split_top(axes_text):
        name, _, size = item.rpartition("=")
        names.append(name.strip().strip("'\""))
        sizes.append(int(size))
    total = math.prod(sizes)
    if ids_text:
        iota = re.fullmatch(r"\s*\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?\s*", ids_text)
        if iota:
            ids = _iota(_ints(iota.group(1)), _ints(iota.group(2)) if iota.group(2) else None)
        else:
            ids = np.array(_ints(ids_text))
        devices = ids.reshape(sizes)
    else:
        devices = np.arange(total).reshape(sizes)
    refs = []  # (mesh axis index, pre_size, size)
    for item in _split_top(group_text):
        m = re.fullmatch(r"\s*'?([^':]+?)'?\s*(?::\((\d+)\)(\d+))?\s*", item)
        if not m or m.group(1) not in names:
            raise ValueError(f"cannot parse mesh replica-group axis {item!r}")
        axis = names.index(m.group(1))
        if m.group(2):
            refs.append((axis, int(m.group(2)), int(m.group(3))))
        else:
            refs.append((axis, 1, sizes[axis]))
    # Split every referenced mesh axis at its sub-axis boundaries (major to minor), then move
    # the referenced pieces last, in the order listed: each row is one group.
    dims, grouped, offset = [], {}, 0
    for axis, size in enumerate(sizes):
        cuts = sorted({1, size} | {c for a, p, s in refs if a == axis for c in (p, p * s)})
        pieces = [cuts[i + 1] // cuts[i] for i in range(len(cuts) - 1)] or [size]
        for ref_index, (a, p, _) in enumerate(refs):
            if a == axis:
                grouped[ref_index] = offset + cuts.index(p)
        dims.extend(pieces)
        offset += len(pieces)
    order = [grouped[i] for i in range(len(refs))]
    rest = [d for d in range(len(dims)) if d not in order]
    group_size = math.prod(dims[d] for d in order)
    table = devices.reshape(dims).transpose(rest + order).reshape(-1, group_size)
    return tuple(tuple(int(v) for v in row) for row in table)


def _replica_groups(attrs: str) -> tuple[tuple[int, ...], ...] | None:
    """Groups as written (explicit, iota or mesh-axes form); ``()`` for ``{}``; None if absent."""
    m = _RG_MESH.search(attrs)
    if m:
        return _mesh_groups(m.group("axes"), m.group("ids"), m.group("group"))
    m = _RG_IOTA.search(attrs)
    if m:
        shape = _ints(m.group(1))
        table = _iota(_ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None)
        return tuple(tuple(int(v) for v in row) for row in table.reshape(shape))
    m = _RG_LIST.search(attrs)
    if m:
        return _nested_ints(m.group(1))
    return None


def _largest_component(pairs: Iterable[tuple[int, ...]]) -> int:
    parent: dict[int, int] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for pair in pairs:
        a, b = find(pair[0]), find(pair[-1])
        parent[a] = b
    sizes: dict[int, int] = {}
    for x in list(parent):
        root = find(x)
        sizes[root] = sizes.get(root, 0) + 1
    return max(sizes.values(), default=0)


# --------------------------------------------------------------------------------- traversal

_CALLED_ONE = re.compile(
    r"\b(to_apply|calls|body|condition|true_computation|false_computation)=%?([^\s,{}]+)"
)
_CALLED_LIST = re.compile(r"\b(branch_computations|called_computations|calls)=\{([^{}]*)\}")
_TRIP = re.compile(r'known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"?(\d+)')
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


def _called(instr: _Instr) -> list[tuple[str, str]]:
    """``[(role, computation)]`` for every computation ``instr`` calls."""
    out = [(role, name) for role, name in _CALLED_ONE.findall(instr.attrs)]
    for role, names in _CALLED_LIST.findall(instr.attrs):
        out.extend((role, n.strip().lstrip("%")) for n in names.split(",") if n.strip())
    return out


def _base_kind(opcode: str) -> tuple[str | None, bool]:
    """``"all-gather-start"`` -> ``("all-gather", True)``; non-collectives -> ``(None, False)``."""
    if opcode in KINDS:
        return opcode, False
    if opcode.endswith("-start") and opcode[: -len("-start")] in KINDS:
        return opcode[: -len("-start")], True
    return None, False


@dataclasses.dataclass(frozen=True)
class _Ctx:
    multiplicity: int = 1
    known: bool = True
    conditional: bool = False


class _Walker:
    def __init__(self, module: _Module, coords, axis_names):
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
                if not i.opcode.endswith("-done") and i.opcode != "async-update"
                for _, c in _called(i)
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
            if instr.opcode.endswith("-done") or instr.opcode == "async-update":
                continue  # the work was counted at the matching start
            trip = _TRIP.search(instr.raw_attrs) if instr.opcode == "while" else None
            for role, callee in _called(instr):
                sub = ctx
                if instr.opcode == "while":
                    if trip:
                        n = int(trip.group(1)) + (1 if role == "condition" else 0)
                        sub = dataclasses.replace(ctx, multiplicity=ctx.multiplicity * n)
                    else:
                        sub = dataclasses.replace(ctx, known=False)
                elif instr.opcode == "conditional":
                    sub = dataclasses.replace(ctx, conditional=True)
                self.walk(callee, sub, (*stack, comp))

    def collective(self, kind, is_start, instr, dones, shapes, comp, ctx) -> Collective:
        operand_shapes = []
        for operand in instr.operands:
            m = re.fullmatch(r"(?P<shape>.*[\])}])\s+%?(?P<name>[^\s]+)", operand, re.S)
            if m:
                operand_shapes.append(m.group("shape"))
            elif operand.lstrip("%") in shapes:
                operand_shapes.append(shapes[operand.lstrip("%")])
            else:
                operand_shapes.append(None)
        result_shape = instr.shape
        if is_start:
            done = dones.get(instr.name)
            if done is not None and done.opcode == f"{kind}-done":
                result_shape = done.shape
            elif kind in ("all-gather", "collective-permute"):
                # start shape: (operands, results[, context scalars])
                elements = _tuple_elements(instr.shape)
                result_shape = elements[1] if len(elements) > 1 else elements[0]
        result_bytes = _bytes(result_shape)

        groups_written, n, expanded = self.groups(kind, instr)
        operand_bytes = (
            sum(_bytes(s) for s in operand_shapes)
            if operand_shapes and all(s is not None for s in operand_shapes)
            else None
        )
        if operand_bytes is None:  # an operand we could not resolve: infer from the result
            operand_bytes = {
                "all-gather": result_bytes // max(n, 1),
                "reduce-scatter": result_bytes * max(n, 1),
            }.get(kind, result_bytes)
        elif (
            self.unknown_size
            and kind in ("all-gather", "reduce-scatter")
            and not _replica_groups(instr.attrs)
            and operand_bytes
            and result_bytes
        ):
            # `replica_groups={}` in a snippet without a module header: n from the shapes
            ratio = result_bytes / operand_bytes
            n = max(1, round(ratio if kind == "all-gather" else 1 / ratio))
            groups_written, expanded = (), []
        dtypes: list[str] = []
        for shape in [s for s in operand_shapes if s is not None] or [result_shape]:
            for dtype, _ in _arrays(shape):
                if dtype not in dtypes and dtype not in ("token", "opaque"):
                    dtypes.append(dtype)
        op_name = _OP_NAME.search(instr.raw_attrs)
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

    def groups(self, kind, instr):
        """(groups as written, group size n, groups as global device ids)."""
        attrs = instr.attrs
        has_channel = re.search(r"\bchannel_id=", attrs) is not None
        flattened = re.search(r"\buse_global_device_ids=true", attrs) is not None
        P, R = self.parts, self.reps
        if kind == "collective-permute":
            m = _PAIRS.search(attrs)
            pairs = _nested_ints(m.group(1)) if m else ()
            if has_channel:  # pairs of partition ids, within each replica
                expanded = [[r * P + a, r * P + b] for r in range(R) for a, b in pairs]
            else:  # pairs of replica ids, within each partition
                expanded = [[a * P + p, b * P + p] for p in range(P) for a, b in pairs]
            return pairs, _largest_component(pairs), expanded
        written = _replica_groups(attrs)
        if written is None and "replica_groups=" in attrs:
            warnings.warn(
                f"rljax.parallel.comm: unrecognised replica_groups in {instr.name!r} "
                f"({attrs[attrs.index('replica_groups=') :][:80]!r}); counted as one group of "
                "all devices",
                stacklevel=4,
            )
        written = written or ()
        if flattened:
            mode, domain = "flat", R * P
        elif has_channel and kind in ("all-to-all",):
            mode, domain = "partition", P
        elif has_channel:
            mode, domain = "replica+partition", R
        else:
            mode, domain = "replica", R
        groups = [list(g) for g in written] or [list(range(domain))]
        if mode == "flat":
            expanded = groups
        elif mode == "partition":
            expanded = [[r * P + p for p in g] for r in range(R) for g in groups]
        elif mode == "replica":
            expanded = [[r * P + p for r in g] for p in range(P) for g in groups]
        else:
            expanded = [[r * P + p for r in g for p in range(P)] for g in groups]
        n = len(expanded[0]) if expanded else 1
        return tuple(tuple(g) for g in groups), n, expanded

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
    """Every collective a call of the compiled step executes, in HLO order, one per call site.

    ``mesh`` names the axes; by default it is taken from the compiled step's NamedShardings
    (text alone: no mesh, ``axes == ()``).
    """
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
    text, compiled = _hlo_text_of(compiled_or_hlo_text)
    module = _parse_module(text)
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
            coords = [
                tuple(int(i) for i in np.unravel_index(g, mesh.devices.shape))
                for g in range(mesh.devices.size)
            ]
    walker = _Walker(module, coords, tuple(mesh.axis_names) if mesh is not None else ())
    if module.entry is not None:
        roots = [module.entry]
    else:  # a hand-written snippet without ENTRY: every computation nobody calls
        callees = {
            c for instrs in module.computations.values() for i in instrs for _, c in _called(i)
        }
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
    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    out.append(
        f"total sent per device per call: {total:,.0f} B"
        + (" (conditional ops counted once; '?' = unknown trip count)" if rows else "")
    )
    return "\n".join(out)
