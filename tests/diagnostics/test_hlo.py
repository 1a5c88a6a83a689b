"""Collectives and their bytes, read from real compiled HLO (8 CPU devices) and HLO snippets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding

from rljax.diagnostics.hlo import Collective, collectives, comm_summary, format_table
from rljax.errors import ConfigError

P = jax.P
F32_8x8 = 8 * 8 * 4  # the per-device block of x below


@pytest.fixture(scope="module")
def shuffled_mesh():
    """data=4, model=2 over the 8 devices in a scrambled order: position != device id."""
    devices = jax.devices()
    order = [3, 1, 0, 2, 7, 5, 6, 4]
    return jax.make_mesh(
        (4, 2),
        ("data", "model"),
        axis_types=(AxisType.Auto,) * 2,
        devices=[devices[i] for i in order],
    )


@pytest.fixture(scope="module")
def manual_step(shuffled_mesh):
    """One shard_map step using every kind of collective; x: [32@data, 16@model] (8x8 f32)."""

    def step(x, y, p, n):
        loop = lax.fori_loop(0, 5, lambda i, c: c + lax.psum(c, "data"), x)
        scanned, _ = lax.scan(lambda c, _: (lax.pmean(c, "model"), None), x, None, length=3)
        cond = lax.cond(p[0] > 0, lambda: lax.psum(x, "data"), lambda: x)
        dyn = lax.while_loop(
            lambda c: c[1] < n, lambda c: (c[0] + lax.psum(c[0], "model"), c[1] + 1), (x, 0)
        )[0]
        return (
            lax.psum(x, "data"),
            lax.all_gather(x, "model", tiled=True),
            lax.ppermute(x, "data", [(i, (i + 1) % 4) for i in range(4)]),
            lax.all_to_all(x, "data", 0, 0, tiled=True),
            lax.psum(x, ("data", "model")),
            lax.psum_scatter(x, "data", scatter_dimension=0, tiled=True),
            lax.psum(y, "model"),
            loop,
            scanned,
            cond,
            dyn,
        )

    fn = jax.shard_map(
        step,
        mesh=shuffled_mesh,
        in_specs=(P("data", "model"), P("data"), P(), P()),
        out_specs=P(),
        check_vma=False,
    )
    args = (jnp.ones((32, 16)), jnp.ones((8, 4), jnp.int8), jnp.ones(1), jnp.int32(2))
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, collectives(compiled)


def find(colls, kind, axes, **fields):
    hits = [
        c
        for c in colls
        if c.kind == kind and c.axes == axes and all(getattr(c, k) == v for k, v in fields.items())
    ]
    assert len(hits) == 1, (kind, axes, fields, format_table(colls))
    return hits[0]


def ring(kind, n, operand, result):
    return {
        "all-reduce": 2 * (n - 1) / n * operand,
        "all-gather": (n - 1) / n * result,
        "reduce-scatter": (n - 1) / n * operand,
        "all-to-all": (n - 1) / n * operand,
        "collective-permute": operand,
    }[kind]


def test_every_kind_from_shard_map(manual_step):
    _, colls = manual_step
    top = [c for c in colls if c.multiplicity == 1 and not c.conditional and c.trip_count_known]
    # (kind, axes, dtype, operand bytes, result bytes, n)
    expected = [
        ("all-reduce", ("data",), "f32", F32_8x8, F32_8x8, 4),
        ("all-gather", ("model",), "f32", F32_8x8, 2 * F32_8x8, 2),
        ("collective-permute", ("data",), "f32", F32_8x8, F32_8x8, 4),
        ("all-to-all", ("data",), "f32", F32_8x8, F32_8x8, 4),
        ("all-reduce", ("data", "model"), "f32", F32_8x8, F32_8x8, 8),
        ("reduce-scatter", ("data",), "f32", F32_8x8, F32_8x8 // 4, 4),
        ("all-reduce", ("model",), "s8", 2 * 4, 2 * 4, 2),
    ]
    assert len(top) == len(expected)
    for kind, axes, dtype, operand, result, n in expected:
        c = find(top, kind, axes, dtype=dtype)
        assert (c.operand_bytes, c.result_bytes, c.group_size) == (operand, result, n)
        assert c.sent_bytes == pytest.approx(ring(kind, n, operand, result))
        assert len(c.replica_groups) > 0
    assert find(top, "all-reduce", ("data",)).sent_bytes == 384.0  # 2 * 3/4 * 256
    assert find(top, "all-gather", ("model",)).sent_bytes == 256.0  # 1/2 * 512


def test_loops_and_conditionals(manual_step):
    _, colls = manual_step
    fori = find(colls, "all-reduce", ("data",), multiplicity=5)
    entry = find(colls, "all-gather", ("model",)).computation
    assert fori.trip_count_known and not fori.conditional and fori.computation != entry
    scan = find(colls, "all-reduce", ("model",), multiplicity=3, dtype="f32")
    assert scan.trip_count_known
    cond = find(colls, "all-reduce", ("data",), conditional=True)
    assert cond.multiplicity == 1 and "cond" in cond.op_name
    dyn = find(colls, "all-reduce", ("model",), trip_count_known=False)
    assert dyn.multiplicity == 1 and not dyn.conditional


def test_group_ids_are_mesh_positions_not_device_ids(manual_step, shuffled_mesh):
    compiled, colls = manual_step
    data_sum = find(colls, "all-reduce", ("data",), multiplicity=1, conditional=False)
    assert data_sum.replica_groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    # Read as jax device ids, the first group would wrongly span the model axis too.
    coords = {d.id: idx for idx, d in np.ndenumerate(shuffled_mesh.devices)}
    assert len({coords[g][1] for g in data_sum.replica_groups[0]}) == 2
    # Text plus the mesh gives the same answer as the compiled step (whose mesh is inferred).
    assert collectives(compiled.as_text(), shuffled_mesh) == colls
    assert all(c.axes == () for c in collectives(compiled.as_text()))


def test_summary_weights_loops_and_conditional_rate(manual_step):
    _, colls = manual_step
    # psum data, all_gather, ppermute, all_to_all, psum data+model, psum_scatter, s8 psum,
    # fori 5 x psum data, scan 3 x pmean model, while (unknown trips: once) psum model
    uncond = 384 + 256 + 256 + 192 + 448 + 192 + 8 + 5 * 384 + 3 * 256 + 256
    cond = 384.0  # the psum in the cond branch
    s = comm_summary(colls, conditional_rate=0.25)
    assert s["conditional_bytes"] == cond and s["unconditional_bytes"] == uncond
    assert s["bytes_per_call"] == pytest.approx(uncond + 0.25 * cond)
    assert s["bytes_by_axis"]["data+model"] == pytest.approx(2 * 7 / 8 * F32_8x8)
    assert s["bytes_by_axis"]["model"] == 256 + 8 + 3 * 256 + 256
    assert sum(c.bytes_per_call for c in colls) == uncond + cond
    assert sum(s["bytes_by_axis"].values()) == pytest.approx(s["bytes_per_call"])
    assert s["count_by_kind"] == {
        "all-reduce": 7,
        "all-gather": 1,
        "collective-permute": 1,
        "all-to-all": 1,
        "reduce-scatter": 1,
    }
    assert not s["trip_counts_known"]
    table = format_table(colls)
    assert table.splitlines()[0].split()[:3] == ["kind", "dtype", "operand"]
    assert len(table.splitlines()) == 2 + len(colls) + 1
    assert f"{comm_summary(colls)['bytes_per_call']:,.0f} B" in table.splitlines()[-1]


def test_auto_partitioned_matmul_all_reduces_over_model(shuffled_mesh):
    mesh = shuffled_mesh

    def mlp(x, w1, w2):  # column- then row-split: one all-reduce of the [4, 32] block
        return jnp.tanh(x @ w1) @ w2

    def spec(shape, p):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, p))

    args = (spec((16, 32), P("data")), spec((32, 64), P(None, "model")), spec((64, 32), P("model")))
    out = NamedSharding(mesh, P("data"))
    colls = collectives(jax.jit(mlp, out_shardings=out).lower(*args).compile())
    (c,) = colls
    assert (c.kind, c.axes, c.group_size, c.dtype) == ("all-reduce", ("model",), 2, "f32")
    assert c.operand_bytes == 4 * 32 * 4 and c.sent_bytes == 512.0
    assert comm_summary(colls)["bytes_by_axis"] == {"model": 512.0}


def test_no_collectives():
    assert collectives(jax.jit(lambda x: x * 2).lower(jnp.ones(3)).compile()) == []
    assert comm_summary([])["bytes_per_call"] == 0.0


# ----------------------------------------------------------------------- hand-written HLO

ASYNC_HLO = """\
HloModule gpu_like, is_scheduled=true, entry_computation_layout={(f32[64,64]{1,0})->f32[]}, \
num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%async_computation (p0: s8[4,16]) -> s8[4,16] {
  %p0 = s8[4,16]{1,0} parameter(0)
  ROOT %a2a = s8[4,16]{1,0} all-to-all(%p0), channel_id=4, replica_groups=[2,4]<=[8], \
dimensions={0}
}

ENTRY %main (x: f32[64,64], y: bf16[10], z: s8[4,16], w: u8[3], v: s32[16], f: f32[64]) -> f32[] {
  %x = f32[64,64]{1,0} parameter(0)
  %y = bf16[10]{0} parameter(1)
  %z = s8[4,16]{1,0} parameter(2)
  %w = u8[3]{0} parameter(3)
  %v = s32[16]{0} parameter(4)
  %ars = (f32[64,64]{1,0}, bf16[10]{0}) all-reduce-start(%x, %y), channel_id=1, \
replica_groups=[4,2]<=[8], use_global_device_ids=true, to_apply=%add
  %ard = (f32[64,64]{1,0}, bf16[10]{0}) all-reduce-done(%ars)
  %ags = (u8[3]{0}, u8[12]{0}) all-gather-start(u8[3]{0} %w), channel_id=2,
      replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
  %agd = u8[12]{0} all-gather-done((u8[3]{0}, u8[12]{0}) %ags)
  %cps = (s32[16]{0}, s32[16]{0}, u32[], u32[]) collective-permute-start(%v), channel_id=3, \
source_target_pairs={{0,1},{1,0},{2,3},{3,2},{4,5},{5,4},{6,7},{7,6}}
  %cpd = s32[16]{0} collective-permute-done(%cps)
  %a2as = ((s8[4,16]{1,0}), s8[4,16]{1,0}) async-start(%z), calls=%async_computation
  %a2ad = s8[4,16]{1,0} async-done(%a2as), calls=%async_computation
  %flat = f32[64]{0} parameter(5)
  %rs = f32[8]{0} reduce-scatter(%flat), channel_id=5, replica_groups={}, \
use_global_device_ids=true, dimensions={0}, to_apply=%add
  %all = (pred[8], s8[8], u8[8], s32[8], u32[8], s64[8], f16[8], bf16[8], f32[], s4[3]) \
all-reduce(%p1, %p2, %p3, %p4, %p5, %p6, %p7, %p8, %p9, %p10), channel_id=6, \
replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %r = f32[] constant(0)
}
"""


@pytest.fixture(scope="module")
def async_colls():
    return {c.kind: c for c in collectives(ASYNC_HLO)}


def test_async_pairs_count_once_with_done_shapes(async_colls):
    assert [c.kind for c in collectives(ASYNC_HLO)] == [
        "all-reduce",
        "all-gather",
        "collective-permute",
        "all-to-all",
        "reduce-scatter",
        "all-reduce",
    ]
    ags = async_colls["all-gather"]
    assert (ags.operand_bytes, ags.result_bytes, ags.group_size, ags.dtype) == (3, 12, 4, "u8")
    assert ags.replica_groups == ((0, 2, 4, 6), (1, 3, 5, 7)) and ags.sent_bytes == 9.0
    cp = async_colls["collective-permute"]
    assert (cp.operand_bytes, cp.result_bytes, cp.group_size, cp.sent_bytes) == (64, 64, 2, 64.0)
    assert cp.replica_groups[:2] == ((0, 1), (1, 0))
    a2a = async_colls["all-to-all"]  # inside the async-start wrapper, not again at async-done
    assert (a2a.operand_bytes, a2a.group_size, a2a.computation) == (64, 4, "async_computation")
    assert a2a.replica_groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and a2a.sent_bytes == 48.0
    rs = async_colls["reduce-scatter"]  # empty groups: all num_partitions devices
    assert (rs.group_size, rs.operand_bytes, rs.result_bytes, rs.sent_bytes) == (8, 256, 32, 224)


def test_tuple_all_reduces_and_element_sizes():
    colls = [c for c in collectives(ASYNC_HLO) if c.kind == "all-reduce"]
    assert len(colls) == 2
    combined, mixed = colls
    assert combined.name == "ars" and combined.dtype == "f32,bf16"
    assert combined.operand_bytes == combined.result_bytes == 64 * 64 * 4 + 10 * 2
    assert combined.replica_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert combined.sent_bytes == pytest.approx(2 * 1 / 2 * combined.operand_bytes)
    # Operands unknown here (%p1...): sizes come from the result tuple. s4[3] packs to 2 bytes.
    assert mixed.result_bytes == 8 + 8 + 8 + 32 + 32 + 64 + 16 + 16 + 4 + 2
    assert mixed.operand_bytes == mixed.result_bytes and mixed.group_size == 8
    assert mixed.dtype == "pred,s8,u8,s32,u32,s64,f16,bf16,f32,s4"


LOOPS_HLO = """\
HloModule loops, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%inner_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[8]{0} get-tuple-element(%p), index=1
  %ar = f32[8]{0} all-reduce(%v), channel_id=1, replica_groups={{0,1}}, \
use_global_device_ids=true, to_apply=%add
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %ar)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  ROOT %k = pred[] constant(true)
}

%branch_true (q: (f32[8])) -> (f32[8]) {
  %q = (f32[8]{0}) parameter(0)
  %e = f32[8]{0} get-tuple-element(%q), index=0
  %cp = f32[8]{0} collective-permute(%e), channel_id=2, source_target_pairs={{0,1},{1,0}}
  ROOT %t = (f32[8]{0}) tuple(%cp)
}

%branch_false (q: (f32[8])) -> (f32[8]) {
  ROOT %q = (f32[8]{0}) parameter(0)
}

%outer_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %w = (s32[], f32[8]{0}) while(%p), condition=%cond, body=%inner_body, \
backend_config={"known_trip_count":{"n":"4"}}
  %v = f32[8]{0} get-tuple-element(%w), index=1
  %b = pred[] constant(true)
  %tv = (f32[8]{0}) tuple(%v)
  %c = (f32[8]{0}) conditional(%b, %tv, %tv), true_computation=%branch_true, \
false_computation=%branch_false
  ROOT %r = (s32[], f32[8]{0}) copy(%w)
}

%callee (x: f32[4]) -> f32[8] {
  %x = f32[4]{0} parameter(0)
  ROOT %ag = f32[8]{0} all-gather(%x), channel_id=3, replica_groups=[1,2]<=[2], \
dimensions={0}, use_global_device_ids=true
}

ENTRY %main (p: (s32[], f32[8]), x: f32[4]) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %x = f32[4]{0} parameter(1)
  %outer = (s32[], f32[8]{0}) while(%p), condition=%cond, body=%outer_body, \
backend_config={"known_induction_variable":{"tuple_index":"0"},"known_trip_count":{"n":"3"}}
  %dyn = (s32[], f32[8]{0}) while(%p), condition=%cond, body=%inner_body
  %c1 = f32[8]{0} call(%x), to_apply=%callee
  %c2 = f32[8]{0} call(%x), to_apply=%callee
  ROOT %r = (s32[], f32[8]{0}) copy(%dyn)
}
"""


def test_nested_loops_conditionals_and_calls():
    colls = collectives(LOOPS_HLO)
    by = [(c.kind, c.multiplicity, c.trip_count_known, c.conditional, c.computation) for c in colls]
    assert by == [
        ("all-reduce", 12, True, False, "inner_body"),  # 3 outer x 4 inner
        ("collective-permute", 3, True, True, "branch_true"),
        ("all-reduce", 1, False, False, "inner_body"),  # no known_trip_count
        ("all-gather", 1, True, False, "callee"),  # one per call site
        ("all-gather", 1, True, False, "callee"),
    ]
    s = comm_summary(colls, conditional_rate=0.5)
    ar = 2 * 1 / 2 * 32
    assert s["bytes_per_call"] == pytest.approx(12 * ar + 0.5 * 3 * 32 + ar + 2 * 16)


def test_iota_mesh_axes_and_replica_partition_groups():
    def one(attrs, parts=8):
        hlo = (
            f"HloModule m, num_partitions={parts}\n"
            "%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n"
            "  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(%a, %b)\n}\n"
            "ENTRY %e (x: f32[4]) -> f32[4] {\n  %x = f32[4]{0} parameter(0)\n"
            f"  ROOT %r = f32[4]{{0}} all-reduce(%x), {attrs}, to_apply=%add\n}}\n"
        )
        (c,) = collectives(hlo, mesh=mesh)
        return c

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    g = one("channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true")
    assert g.replica_groups == ((0, 2, 4, 6), (1, 3, 5, 7)) and g.axes == ("data",)
    g = one("channel_id=1, replica_groups=[4,2]<=[8], use_global_device_ids=true")
    assert g.replica_groups == ((0, 1), (2, 3), (4, 5), (6, 7)) and g.axes == ("model",)
    # Shardy's mesh-axes form, with a transposed device order and a sub-axis (major half of a).
    g = one(
        "channel_id=1, replica_groups=mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) "
        "{'a':(1)2}, use_global_device_ids=true"
    )
    assert g.replica_groups == ((0, 2), (4, 6), (1, 3), (5, 7)) and g.group_size == 2
    assert g.axes == ("data",)
    g = one(
        "channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], "
        "device_ids=([4,2]T(1,0)) {'axis_0'}, use_global_device_ids=true"
    )
    assert g.replica_groups == ((0, 1), (2, 3), (4, 5), (6, 7)) and g.axes == ("model",)
    # channel_id without use_global_device_ids: replica groups x all partitions.
    g = one("channel_id=1, replica_groups={{0}}")
    assert g.group_size == 8 and g.axes == ("data", "model")
    assert g.sent_bytes == pytest.approx(2 * 7 / 8 * 16)


def test_invalid_inputs_raise_config_error(shuffled_mesh):
    lowered = jax.jit(lambda x: x + 1).lower(jnp.ones(2))
    with pytest.raises(ConfigError, match="compile"):
        collectives(lowered)
    with pytest.raises(ConfigError, match="StableHLO"):
        collectives(lowered.as_text())
    with pytest.raises(ConfigError, match="compiled step"):
        collectives(42)
    with pytest.raises(ConfigError, match="mesh"):
        collectives(ASYNC_HLO, mesh="data=4")
    with pytest.raises(ConfigError, match="conditional_rate"):
        comm_summary([], conditional_rate=-1.0)


def test_collective_is_a_frozen_record():
    c = Collective("all-reduce", "f32", 8, 8, 2, ((0, 1),), ("data",), 8.0, False, 3, True, "e")
    assert c.bytes_per_call == 24.0
    with pytest.raises(AttributeError):
        c.kind = "all-gather"


def test_headerless_snippet_with_wrapped_operands():
    # As in XLA's own tests: no module header, operands with shapes, an instruction over lines.
    hlo = """
    ENTRY ag {
      %input = f32[8,256]{1,0:T(8,128)} parameter(0)
      %ag-start = (f32[8,256], f32[16,256]) all-gather-start(
        f32[8,256] %input), replica_groups={{0,1}}, dimensions={0},
        metadata={op_type="AllGather" op_name="ag0"}
      ROOT %ag-done = f32[16,256] all-gather-done(
        (f32[8,256], f32[16,256]) %ag-start)
    }
    """
    snippet = """
    body {
      p = u32[2] parameter(0)
      start = (u32[2], u32[4]) all-gather-start(p), dimensions={0}
      ROOT done = u32[4] all-gather-done(start)
    }
    """
    (a,) = collectives(hlo)
    (b,) = collectives(snippet)  # no ENTRY: every computation that nothing calls is a root
    assert (a.operand_bytes, a.result_bytes, a.group_size, a.op_name) == (8192, 16384, 2, "ag0")
    assert a.sent_bytes == 8192.0
    # No groups and no num_partitions: n from the gathered size.
    assert (b.computation, b.group_size, b.replica_groups, b.sent_bytes) == ("body", 2, (), 8.0)
