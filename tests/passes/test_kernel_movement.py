"""Movement and gather kernels (passes/tile/kernels/movement.py): copies of views straight from HBM to HBM, cat and
gather, through tile/allocate/schedule/emit and both runtimes (bit-equal), checked exactly against numpy."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import harness
from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.ap import MAX_COUNT, Mem
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.isa.program import TensorKind
from trnc.passes.tile.kernels import movement
from trnc.passes.tile.tiles import TileBuilder, TileProgram

F32, BF16, I32 = DType.FP32, DType.BF16, DType.INT32
RNG = np.random.default_rng(5)


def node(kind, inputs, shape, dtype=F32, **attrs) -> ir.Node:
    return ir.Node(kind, tuple(inputs), shape, dtype, attrs)


def compile_run(inputs, arrays, chain, kind="movement"):
    """Each node of `chain` its own kernel (movement kinds, the last `kind`); the last node is the output."""
    kernels = [ir.Kernel("movement", [n]) for n in chain[:-1]] + [ir.Kernel(kind, [chain[-1]])]
    outs, state = harness.compile_and_run(inputs, kernels, arrays)
    return outs[0], state


def hbm_only(state) -> bool:
    return all(i.opcode == "dma_copy" and i["dst"].mem is Mem.HBM and i["src"].mem is Mem.HBM
               for i in state.program.instructions)


def test_copy_of_a_permuted_4d_view_is_hbm_to_hbm():
    xs = RNG.standard_normal((6, 7, 130, 5)).astype(np.float32)
    x = harness.inp(0, xs.shape, F32)
    p = node("permute", [x], (130, 5, 6, 7), dims=(2, 3, 0, 1))
    out, state = compile_run([x], [xs], [p])
    assert np.array_equal(out, xs.transpose(2, 3, 0, 1))
    assert hbm_only(state)


def test_large_permuted_copy_spreads_over_queues_within_limits():
    xs = RNG.standard_normal((700, 1500)).astype(np.float32)
    x = harness.inp(0, xs.shape, F32)
    p = node("permute", [x], (1500, 700), dims=(1, 0))
    out, state = compile_run([x], [xs], [p])
    assert np.array_equal(out, xs.T)
    dmas = state.program.instructions
    assert len({i.queue for i in dmas}) == 16
    assert all(c <= MAX_COUNT for i in dmas for ap in (i["dst"], i["src"]) for _, c in ap.dims)


def test_long_contiguous_slice_copy():
    xs = RNG.standard_normal(200003).astype(np.float32)
    x = harness.inp(0, xs.shape, F32)
    sl = node("slice", [x], (199999,), dim=0, start=1, stop=200000)
    out, state = compile_run([x], [xs], [sl])
    assert np.array_equal(out, xs[1:200000])
    assert hbm_only(state) and len(state.program.instructions) >= 8


def test_expand_and_strided_slice_output():
    xs = RNG.standard_normal((1, 9, 1)).astype(np.float32)
    x = harness.inp(0, xs.shape, F32)
    e = node("expand", [x], (4, 9, 3))
    sl = node("slice", [e], (4, 3, 3), dim=1, start=0, stop=9, step=3)
    out, _ = compile_run([x], [xs], [e, sl])
    assert np.array_equal(out, np.broadcast_to(xs, (4, 9, 3))[:, ::3])


def test_an_expanded_byte_copy_cuts_a_dim_beyond_the_ap_limit_in_halves():
    """Regression (fuzz seed 11004000138, a compile that never finished): the output [2, 69120] (merged) of a
    uint8 expand wants boxes of 65536 elements along its long dim, one more than an AP dim holds; the plan gave
    up on that dim and copied 2 elements per DMA (69120 DMAs, which the scheduler took tens of minutes over)
    rather than halving the chunk until it fits."""
    xs = (RNG.standard_normal((1, 1536, 45)) > 0).astype(np.uint8)
    x = harness.inp(0, xs.shape, DType.UINT8)
    e = node("expand", [x], (2, 1536, 45), DType.UINT8)
    out, state = compile_run([x], [xs], [e], kind="movement")
    assert np.array_equal(out, np.broadcast_to(xs, (2, 1536, 45)))
    assert hbm_only(state) and len(state.program.instructions) <= 16
    assert all(c <= MAX_COUNT for i in state.program.instructions for ap in (i["dst"], i["src"]) for _, c in ap.dims)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cat_along_each_dim(dim):
    shapes = [[3, 5, 7], [3, 5, 7], [3, 5, 7]]
    for s, extra in zip(shapes, (2, 1, 4)):
        s[dim] += extra
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    ins = [harness.inp(i, a.shape, F32) for i, a in enumerate(arrays)]
    ref = np.concatenate(arrays, axis=dim)
    c = node("cat", ins, ref.shape, dim=dim)
    out, state = compile_run(ins, arrays, [c])
    assert np.array_equal(out, ref)
    assert hbm_only(state)


def test_cat_of_views_and_repeated_input_with_dtype_change():
    xs = RNG.standard_normal((4, 6)).astype(np.float32)
    x = harness.inp(0, xs.shape, F32)
    t = node("permute", [x], (6, 4), dims=(1, 0))
    c = node("cat", [t, t, node("slice", [t], (2, 4), dim=0, start=1, stop=5, step=2)], (14, 4), BF16, dim=0)
    kernels = [ir.Kernel("movement", [t]), ir.Kernel("movement", [c.inputs[2]]), ir.Kernel("movement", [c])]
    outs, _ = harness.compile_and_run([x], kernels, [xs])
    ref = np.concatenate([xs.T, xs.T, xs.T[1:5:2]]).astype(ml_dtypes.bfloat16)
    assert np.array_equal(outs[0].view(np.uint16), ref.view(np.uint16))


@pytest.mark.parametrize("rows,cols,index_shape,dtype", [
    (50, 64, (5, 7), F32), (1000, 5000, (300,), F32), (7, 3, (130,), BF16), (2, 1, (1,), F32)])
def test_gather_rows(rows, cols, index_shape, dtype):
    table = RNG.standard_normal((rows, cols)).astype(dtype.storage)
    index = RNG.integers(0, rows, size=index_shape).astype(np.int32)
    t, i = harness.inp(0, table.shape, dtype), harness.inp(1, index.shape, I32)
    g = node("gather", [t, i], index_shape + (cols,), dtype)
    out, state = compile_run([t, i], [table, index], [g], kind="gather")
    assert np.array_equal(out.view(np.uint8), table[index].view(np.uint8))
    gathers = [ins["dst"] for ins in state.program.instructions if ins.opcode == "dma_gather"]
    assert sum(d.num_elements for d in gathers) == index.size * cols      # every row fetched once
    assert all(d.partitions <= 128 and d.free_size <= movement.GATHER_COLUMNS for d in gathers)


def test_gather_through_a_permuted_index_and_a_sliced_table():
    table = RNG.standard_normal((40, 30)).astype(np.float32)
    index = RNG.integers(0, 40, size=(9, 200)).astype(np.int32)
    t, i = harness.inp(0, table.shape, F32), harness.inp(1, index.shape, I32)
    cols = node("slice", [t], (40, 10), dim=1, start=5, stop=25, step=2)
    perm = node("permute", [i], (200, 9), dims=(1, 0))
    g = node("gather", [cols, perm], (200, 9, 10))
    kernels = [ir.Kernel("movement", [cols]), ir.Kernel("movement", [perm]), ir.Kernel("gather", [g])]
    outs, _ = harness.compile_and_run([t, i], kernels, [table, index])
    assert np.array_equal(outs[0], table[:, 5:25:2][index.T])


def test_movement_lower_rejects_other_ops():
    tp = TileProgram(get_target("trn2"))
    kb = TileBuilder(tp, "k0")
    x = harness.inp(0, (4, 4), F32)
    r = node("reshape", [x], (16,))
    with pytest.raises(UnsupportedOpError, match="cat and gather"):
        movement.lower(kb, ir.Kernel("movement", [r]), {}, None, ir.KernelPlan())


def test_copy_view_needs_equal_shapes():
    tp = TileProgram(get_target("trn2"))
    kb = TileBuilder(tp, "k0")
    a = kb.tensor("a", TensorKind.INPUT, F32, (4, 4))
    b = kb.tensor("b", TensorKind.OUTPUT, F32, (16,))
    with pytest.raises(ValueError, match="copy_view"):
        movement.copy_view(kb, a, b)
