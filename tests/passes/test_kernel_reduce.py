"""Reduce kernels (passes/tile/kernels/reduce.py) against numpy, through tile/allocate/schedule/emit and both
runtimes (the harness requires the reference and the JIT to agree bit for bit).

Most inputs are small integers (`ints`), whose fp32 sums are exact in any order while below 2^24, so every
result must equal numpy's exactly; the last element is a large marker, so a box that reads the wrong
elements (a tail region, an edge chunk) changes the result. For random real inputs, a sum of n fp32 values
accumulated in fp32 in any order is within (n - 1) * 2^-24 * sum|x| of the exact sum (the classic bound for
recursive summation, Higham 4.2); those sums are checked against a float64 reference with that bound.
"""
from __future__ import annotations

import itertools
from collections import Counter

import ml_dtypes
import numpy as np
import pytest

import harness
from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.tile.kernels.reduce import candidates

F32, BF16 = DType.FP32, DType.BF16
RNG = np.random.default_rng(11)
NP_OPS = {"sum": np.sum, "max": np.max, "min": np.min}


def ints(*shape) -> np.ndarray:
    x = RNG.integers(-8, 8, size=shape).astype(np.float32)
    x.reshape(-1)[-1] = 1000.0
    return x


def reduce_node(x: ir.Node, op: str, axes, keepdim=False, dtype=F32) -> ir.Node:
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape) if keepdim or d not in axes)
    return ir.Node("reduce", (x,), shape, dtype, {"op": op, "axes": tuple(axes), "keepdim": keepdim})


def run(inputs, arrays, node, partition_dim=None, pre=()):
    kernels = [ir.Kernel("movement", [m]) for m in pre] + [ir.Kernel("reduce", [node], partition_dim=partition_dim)]
    if node.shape == ():     # the harness compares outputs bytewise, which needs at least one dim
        kernels.append(ir.Kernel("movement", [ir.Node("reshape", (node,), (1,), node.dtype)]))
    outs, state = harness.compile_and_run(inputs, kernels, arrays)
    return outs[0].reshape(node.shape), state


def check(got, x: np.ndarray, op: str, axes, keepdim=False):
    x64 = x.astype(np.float64)
    ref = NP_OPS[op](x64, axis=tuple(axes), keepdims=keepdim)
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape
    if op != "sum" or np.array_equal(x, np.round(x)):    # exact
        assert np.array_equal(got, ref)
        return
    n = int(np.prod([x.shape[a] for a in axes]))
    bound = (n - 1) * 2.0 ** -24 * np.sum(np.abs(x64), axis=tuple(axes), keepdims=keepdim)
    assert np.all(np.abs(got - ref) <= bound + 1e-30)


def opcodes(state) -> Counter:
    return Counter(i.opcode for i in state.program.instructions)


SHAPE = (5, 130, 7)
AXES = [a for r in range(1, 4) for a in itertools.combinations(range(3), r)]


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("axes", AXES)
def test_every_axis_set(axes, op):
    xs = ints(*SHAPE)
    x = harness.inp(0, SHAPE, F32)
    out, _ = run([x], [xs], reduce_node(x, op, axes))
    check(out, xs, op, axes)


@pytest.mark.parametrize("axes", [(1,), (0, 2)])
def test_keepdim(axes):
    xs = ints(*SHAPE)
    x = harness.inp(0, SHAPE, F32)
    out, _ = run([x], [xs], reduce_node(x, "sum", axes, keepdim=True))
    check(out, xs, "sum", axes, keepdim=True)


@pytest.mark.parametrize("shape", [(66950,), (300, 700)])
def test_full_reduction_folds_the_partitions(shape):
    xs = ints(*shape)
    x = harness.inp(0, shape, F32)
    axes = tuple(range(len(shape)))
    for op in ("sum", "max"):
        out, state = run([x], [xs], reduce_node(x, op, axes))
        check(out, xs, op, axes)
        assert opcodes(state)["partition_reduce"] == 1


def test_few_outputs_of_long_rows_use_the_partitions_for_the_reduction():
    xs = ints(3, 20000)
    x = harness.inp(0, xs.shape, F32)
    out, state = run([x], [xs], reduce_node(x, "sum", (1,)))
    check(out, xs, "sum", (1,))
    assert opcodes(state)["partition_reduce"] >= 1


def test_rows_on_partitions_with_long_rows_folds_chunks():
    xs = RNG.standard_normal((256, 9000)).astype(np.float32)
    x = harness.inp(0, xs.shape, F32)
    for op in ("sum", "min"):
        out, state = run([x], [xs], reduce_node(x, op, (1,)), partition_dim=0)
        check(out, xs, op, (1,))
        assert "partition_reduce" not in opcodes(state)
        assert opcodes(state)["tensor_tensor"] >= 2     # the row is reduced in chunks, combined in fp32


def test_interleaved_axes_of_rank5():
    shape = (3, 4, 5, 6, 7)
    xs = ints(*shape)
    x = harness.inp(0, shape, F32)
    for axes in [(0, 2, 4), (1, 3)]:
        out, _ = run([x], [xs], reduce_node(x, "max", axes))
        check(out, xs, "max", axes)


def test_rank6_sum_over_middle_axes():
    shape = (2, 3, 4, 5, 6, 7)
    xs = ints(*shape)
    x = harness.inp(0, shape, F32)
    out, _ = run([x], [xs], reduce_node(x, "sum", (1, 2, 4)))
    check(out, xs, "sum", (1, 2, 4))


def test_permuted_input_view():
    xs = ints(64, 200, 3)
    x = harness.inp(0, xs.shape, F32)
    p = ir.Node("permute", (x,), (3, 200, 64), F32, {"dims": (2, 1, 0)})
    out, _ = run([x], [xs], reduce_node(p, "sum", (2,)), pre=[p])
    check(out, xs.transpose(2, 1, 0), "sum", (2,))


def test_bf16_input_accumulates_in_fp32():
    xs = RNG.random((128, 3000), dtype=np.float32).astype(ml_dtypes.bfloat16)
    x = harness.inp(0, xs.shape, BF16)
    out, _ = run([x], [xs], reduce_node(x, "sum", (1,)))
    check(out, xs.astype(np.float32), "sum", (1,))


def test_bf16_output_is_rounded_once():
    xs = RNG.random((130, 50), dtype=np.float32)
    x = harness.inp(0, xs.shape, F32)
    out, _ = run([x], [xs], reduce_node(x, "sum", (1,), dtype=BF16))
    ref = xs.astype(np.float64).sum(axis=1)
    # fp32 accumulation (tiny error) then one rounding to bf16: within one bf16 ulp (2^-7 relative)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= 2.0 ** -7 * np.abs(ref))


def test_reducing_only_size_one_axes_is_a_copy():
    xs = RNG.standard_normal((4, 1, 6)).astype(np.float32)
    x = harness.inp(0, xs.shape, F32)
    out, state = run([x], [xs], reduce_node(x, "sum", (1,)))
    assert np.array_equal(out, xs[:, 0])
    assert set(opcodes(state)) == {"dma_copy"}


def test_odd_small_tensor_all_ops():
    xs = ints(3, 5, 7)
    x = harness.inp(0, xs.shape, F32)
    for op in ("sum", "max", "min"):
        out, _ = run([x], [xs], reduce_node(x, op, (0, 1, 2), keepdim=True))
        check(out, xs, op, (0, 1, 2), keepdim=True)


def test_candidates_are_kept_dims():
    x = harness.inp(0, (6, 130, 7), F32)
    assert candidates(ir.Kernel("reduce", [reduce_node(x, "sum", (1,))])) == [1, 0]
    assert candidates(ir.Kernel("reduce", [reduce_node(x, "sum", (1,), keepdim=True)])) == [2, 0]


def test_an_epilogue_runs_on_the_result_before_the_store():
    """The fuse pass joins the elementwise nodes that read a reduction's result: mean of squares, + eps, rsqrt
    (an RMS norm's scale) is one kernel, its chain applied to the fp32 accumulator as elementwise kernels apply
    it; also with a full reduction folded over the partitions and a per-row input of the epilogue."""
    xs = RNG.random((300, 96)).astype(np.float32)
    bias = RNG.random((300, 1)).astype(np.float32)
    x, b = harness.inp(0, xs.shape, F32), harness.inp(1, bias.shape, F32)
    total = reduce_node(x, "sum", (1,), keepdim=True)
    mean = ir.Node("scalar", (total,), total.shape, F32, {"op": "mul", "value": 1 / 96, "reverse": False})
    shifted = ir.Node("binary", (mean, b), total.shape, F32, {"op": "add"})
    rs = ir.Node("unary", (shifted,), total.shape, F32, {"func": "rsqrt"})
    outs, state = harness.compile_and_run([x, b], [ir.Kernel("reduce", [total, mean, shifted, rs])], [xs, bias])
    ref = 1 / np.sqrt(xs.astype(np.float64).sum(1, keepdims=True) / 96 + bias)
    assert np.allclose(np.asarray(outs[0], np.float64), ref, rtol=1e-5, atol=0)   # rsqrt within a few ulp
    whole = reduce_node(x, "max", (0, 1))
    scale = ir.Node("scalar", (whole,), (), F32, {"op": "div", "value": 448.0, "reverse": True})
    outs, _ = harness.compile_and_run([x], [ir.Kernel("reduce", [whole, scale]),
                                            ir.Kernel("movement", [ir.Node("reshape", (scale,), (1,), F32)])], [xs])
    assert np.float32(outs[0][0]) == np.float32(448.0) / xs.max()
