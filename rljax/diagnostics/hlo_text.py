"""Reading optimised HLO text: computations, instructions, shapes and replica groups.

Everything that needs balanced brackets or top-level splitting goes through one scanner, ``scan``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

# ----------------------------------------------------------------------------- the one scanner

_OPEN, _CLOSE = "([{", ")]}"
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[][(){},]')  # a whole quoted string, or one bracket/comma


def scan(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """``(index, char, depth)`` for each bracket and comma of ``text[start:]`` outside
    double-quoted strings; ``depth`` counts the brackets open around it (a bracket pair shares
    the depth of its surroundings)."""
    depth = 0
    for m in _TOKENS.finditer(text, start):
        c = m.group()
        if c[0] == '"':
            continue
        if c in _CLOSE:
            depth -= 1
        yield m.start(), c, depth
        if c in _OPEN:
            depth += 1


def split_top(text: str) -> list[str]:
    """Split on commas outside brackets and strings; empty parts dropped."""
    cuts = [i for i, c, depth in scan(text) if c == "," and depth == 0]
    parts = [text[a + 1 : b] for a, b in zip([-1, *cuts], [*cuts, len(text)], strict=True)]
    return [p.strip() for p in parts if p.strip()]


def balanced_end(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``text[start]``."""
    for i, c, depth in scan(text, start):
        if c in _CLOSE and depth == 0:
            return i + 1
    raise ValueError(f"unbalanced brackets in HLO: {text[start : start + 80]!r}")


def _depth(text: str) -> int:
    """Brackets left open at the end of ``text``."""
    return sum(1 if c in _OPEN else -1 for _, c, _ in scan(text) if c != ",")


def inner(text: str) -> str:
    """``"{a, {b}} rest"`` -> ``"a, {b}"``: the contents of the bracket group ``text`` opens."""
    return text[1 : balanced_end(text, 0) - 1]


# ----------------------------------------------------------------------------------- HLO text


@dataclasses.dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: dict[str, str]  # top-level `key=value` attributes, in text order


@dataclasses.dataclass
class Module:
    computations: dict[str, list[Instr]]
    entry: str | None
    num_partitions: int | None
    replica_count: int | None


_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_INSTR = re.compile(r"^(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<rest>.*)$", re.S)
_INSTR_START = re.compile(r"^(?:ROOT\s+)?%?[^\s=]+\s*=\s*(?:\(|[a-z][a-z0-9]*\[[\d,<=?\s]*\])")
_COMP_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s({]+)")
_OPCODE = re.compile(r"(?P<op>[A-Za-z][\w\-]*)\s*\(")


def _parse_instr(stmt: str) -> Instr | None:
    m = _INSTR.match(stmt)
    if not m:
        return None
    rest = m.group("rest").strip()
    if not rest:
        return None
    end = balanced_end(rest, 0) if rest.startswith("(") else len(rest.split(None, 1)[0])
    shape, rest = rest[:end], rest[end:].lstrip()
    op = _OPCODE.match(rest)
    if not op:
        return None
    close = balanced_end(rest, op.end() - 1)
    attrs = {}
    for part in split_top(rest[close:]):
        key, eq, value = part.partition("=")
        if eq:
            attrs[key.strip()] = value.strip()
    operands = split_top(rest[op.end() : close - 1])
    return Instr(m.group("name"), shape, op.group("op"), operands, attrs)


def parse_module(text: str) -> Module:
    text = _COMMENT.sub("", text)
    header = re.search(r"^\s*HloModule\b[^\n]*", text, re.M)
    header_text = header.group(0) if header else ""
    parts = re.search(r"\bnum_partitions=(\d+)", header_text)
    reps = re.search(r"\breplica_count=(\d+)", header_text)
    computations: dict[str, list[Instr]] = {}
    entry, current, stmt, depth = None, None, "", 0
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            m = _COMP_HEADER.match(stripped)
            if m and stripped.endswith("{") and not stripped.startswith("HloModule"):
                current = computations.setdefault(m.group("name"), [])
                entry = m.group("name") if m.group("entry") else entry
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
        depth += _depth(stripped)
    return Module(
        computations,
        entry,
        int(parts.group(1)) if parts else None,
        int(reps.group(1)) if reps else None,
    )


# ------------------------------------------------------------------------------------- shapes

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_BITS = re.compile(r"^[a-z]+?(\d+)")


def arrays(shape: str) -> list[tuple[str, int]]:
    """``"(f32[8,8]{1,0}, s8[4])"`` -> ``[("f32", 256), ("s8", 4)]`` (dtype, bytes); ``pred`` is
    one byte per element, packed sub-byte types are rounded up per array."""
    out = []
    for dtype, dims in _ARRAY.findall(shape):
        count = 1
        for dim in filter(str.strip, dims.split(",")):
            digits = re.sub(r"[^0-9]", "", dim)  # "<=8" (bounded dynamic) -> 8
            count *= int(digits) if digits else 0
        bits = _BITS.match(dtype)
        bits = 8 if dtype == "pred" else int(bits.group(1)) if bits else 0  # token, opaque: 0
        out.append((dtype, math.ceil(count * bits / 8)))
    return out


def shape_bytes(shape: str) -> int:
    return sum(b for _, b in arrays(shape))


# ------------------------------------------------------------------------------ replica groups


def _ints(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"-?\d+", text)]


def _nested_ints(text: str) -> tuple[tuple[int, ...], ...]:
    """``"{{0,2},{1,3}}"`` -> ``((0, 2), (1, 3))``; ``"{}"`` -> ``()``."""
    return tuple(tuple(_ints(g)) for g in split_top(inner(text)))


def _iota(reshape: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
    arr = np.arange(math.prod(reshape)).reshape(reshape)
    return arr.transpose(perm) if perm else arr


_IOTA = re.compile(r"\[([\d,\s]*)\]<=\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?")
_AXIS_REF = re.compile(r"\s*'?([^':]+?)'?\s*(?::\((\d+)\)(\d+))?\s*")


def _mesh_groups(axes_text: str, ids_text: str | None, group_text: str):
    """``mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)) {'a'}`` -> groups (XLA's order)."""
    names, sizes = [], []
    for item in split_top(axes_text):
        name, _, size = item.rpartition("=")
        names.append(name.strip().strip("'\""))
        sizes.append(int(size))
    if ids_text:
        iota = re.fullmatch(r"\s*\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?\s*", ids_text)
        if iota:
            ids = _iota(_ints(iota.group(1)), _ints(iota.group(2)) if iota.group(2) else None)
        else:
            ids = np.array(_ints(ids_text))
        devices = ids.reshape(sizes)
    else:
        devices = np.arange(math.prod(sizes)).reshape(sizes)
    refs = []  # (mesh axis index, pre_size, size)
    for item in split_top(group_text):
        m = _AXIS_REF.fullmatch(item)
        if not m or m.group(1) not in names:
            raise ValueError(f"cannot parse mesh replica-group axis {item!r}")
        axis = names.index(m.group(1))
        pre, size = (int(m.group(2)), int(m.group(3))) if m.group(2) else (1, sizes[axis])
        refs.append((axis, pre, size))
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


def replica_groups(attrs: dict[str, str]) -> tuple[tuple[int, ...], ...] | None:
    """Groups as written (explicit, iota or mesh-axes form); ``()`` for ``{}``; None if absent
    or unrecognised."""
    value = attrs.get("replica_groups", "")
    if value.startswith("mesh["):  # the group follows the mesh, or device_ids=(...) if given
        end = balanced_end(value, 4)
        axes_text, ids_text, tail = value[5 : end - 1], None, value[end:].strip()
        if "device_ids" in attrs:
            ids = attrs["device_ids"]
            ids_text, tail = inner(ids), ids[balanced_end(ids, 0) :].strip()
        return _mesh_groups(axes_text, ids_text, inner(tail)) if tail[:1] == "{" else None
    if m := _IOTA.fullmatch(value):
        table = _iota(_ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None)
        return tuple(tuple(int(v) for v in row) for row in table.reshape(_ints(m.group(1))))
    return _nested_ints(value) if value.startswith("{") else None


def _largest_component(pairs: Iterable[tuple[int, ...]]) -> int:
    parent: dict[int, int] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for pair in pairs:
        parent[find(pair[0])] = find(pair[-1])
    sizes: dict[int, int] = {}
    for x in list(parent):
        sizes[find(x)] = sizes.get(find(x), 0) + 1
    return max(sizes.values(), default=0)


def device_groups(kind: str, instr: Instr, partitions: int, replicas: int):
    """``(groups as written, group size n, groups as global device ids)`` of a collective; a
    global id is ``replica * partitions + partition``. A collective-permute's groups are its
    ``(source, target)`` pairs and ``n`` the most devices they connect."""
    attrs = instr.attrs
    has_channel = "channel_id" in attrs
    P, R = partitions, replicas
    if kind == "collective-permute":
        pairs = _nested_ints(attrs.get("source_target_pairs", "{}"))
        if has_channel:  # pairs of partition ids, within each replica
            expanded = [[r * P + a, r * P + b] for r in range(R) for a, b in pairs]
        else:  # pairs of replica ids, within each partition
            expanded = [[a * P + p, b * P + p] for p in range(P) for a, b in pairs]
        return pairs, _largest_component(pairs), expanded
    written = replica_groups(attrs)
    if written is None and "replica_groups" in attrs:
        warnings.warn(
            f"rljax.diagnostics.hlo: unrecognised replica_groups in {instr.name!r} "
            f"({attrs['replica_groups'][:80]!r}); counted as one group of all devices",
            stacklevel=4,
        )
    written = written or ()
    if attrs.get("use_global_device_ids") == "true":
        mode, domain = "flat", R * P
    elif has_channel and kind == "all-to-all":
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


# ------------------------------------------------------------------------------------- calls

_CALLEE_ROLES = ("to_apply", "calls", "body", "condition", "true_computation")
_CALLEE_ROLES += ("false_computation", "branch_computations", "called_computations")


def called(instr: Instr) -> list[tuple[str, str]]:
    """``[(role, computation)]`` for every computation ``instr`` calls, in text order."""
    out = []
    for role, value in instr.attrs.items():
        if role in _CALLEE_ROLES:
            names = split_top(inner(value)) if value.startswith("{") else [value]
            out.extend((role, name.lstrip("%")) for name in names)
    return out
