"""Elementwise kernels (passes/tile/kernels/elementwise.py) against torch, through tile/allocate/schedule/emit and
both runtimes (the harness requires the reference and the JIT to agree bit for bit).

Tolerance: fp32 results within max|diff| / max|ref| <= 1e-5. IEEE operations (add, mul, div, sqrt, ...)
match torch exactly; the activation functions are fixed fp32 sequences accurate to a few ulp
(runtime/fp32math.py), far inside 1e-5 relative to the largest value.
"""
from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import pytest
import torch

import harness
from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.dtypes import DType
from trnc.isa.ap import Engine, Mem
from trnc.isa.config import get_target
from trnc.passes.tile.kernels.elementwise import Operand, candidates, emit_chain
from trnc.passes.tile.tiles import TileBuilder, TileProgram

F32, BF16, U8, I32 = DType.FP32, DType.BF16, DType.UINT8, DType.INT32
RNG = np.random.default_rng(7)
TOL = 1e-5


def rel_err(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan), "NaNs differ"
    scale = np.abs(ref[~nan]).max(initial=0.0) or 1.0
    return float(np.abs(got[~nan] - ref[~nan]).max(initial=0.0) / scale)


def node(kind, inputs, shape, dtype=F32, **attrs) -> ir.Node:
    return ir.Node(kind, tuple(inputs), shape, dtype, attrs)


def unary(x, func, dtype=F32):
    return node("unary", [x], x.shape, dtype, func=func)


def binary(a, b, op, dtype=None):
    shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    cmp = op in ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor")
    return node("binary", [a, b], shape, dtype or (U8 if cmp else F32), op=op)


def scalar(x, op, value, reverse=False):
    cmp = op in ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor")
    return node("scalar", [x], x.shape, U8 if cmp else F32, op=op, value=float(value), reverse=reverse)


def run(inputs, arrays, nodes, partition_dim=None, pre=()):
    """Compile `pre` kernels (movement views) and one elementwise kernel of `nodes`; the output and state."""
    kernels = [ir.Kernel("movement", [m]) for m in pre] + [ir.Kernel("elementwise", list(nodes),
                                                                       partition_dim=partition_dim)]
    outs, state = harness.compile_and_run(inputs, kernels, arrays)
    return outs[0], state


def opcodes(state) -> Counter:
    return Counter(i.opcode for i in state.program.instructions)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


TORCH_UNARY = {
    "copy": lambda t: t.clone(), "relu": torch.relu, "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"), "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "square": torch.square, "abs": torch.abs,
    "neg": torch.neg, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erf": torch.erf, "erfc": torch.erfc, "exp2": torch.exp2, "log2": torch.log2,
    "log10": torch.log10, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "rint": torch.round,
    "sign": torch.sign, "erfinv": torch.erfinv,
    "erfcx": torch.special.erfcx,
    "i0e": torch.special.i0e,
    "i1e": torch.special.i1e,
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
}
DOMAIN = {"log": np.abs, "sqrt": np.abs, "rsqrt": np.abs, "log2": np.abs, "log10": np.abs,   # then + 0.01
          "acosh": lambda v: np.abs(v) + 0.99, "asin": np.tanh, "acos": np.tanh, "atanh": np.tanh,
          "erfinv": np.tanh}


@pytest.mark.parametrize("func", sorted(ir.UNARY_FUNCS))
def test_every_unary_function(func):
    xs = randn(3, 5, 7) * 3
    if func in DOMAIN:
        xs = (DOMAIN[func](xs) + 0.01).astype(np.float32)
    # a second node after the function, so the function is not the output write alone
    x = harness.inp(0, xs.shape, F32)
    f = unary(x, func)
    out, _ = run([x], [xs], [f, scalar(f, "mul", 2.0)])
    assert rel_err(out, TORCH_UNARY[func](torch.tensor(xs)).numpy() * 2) <= TOL


TORCH_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "pow": torch.pow, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "atan2": torch.atan2, "fmod": torch.fmod, "remainder": torch.remainder, "hypot": torch.hypot,
    "logaddexp": torch.logaddexp,
}


@pytest.mark.parametrize("op", sorted(ir.BINARY_OPS))
def test_every_binary_op(op):
    a_np, b_np = randn(33, 70), randn(33, 70)
    if op == "pow":
        a_np = np.abs(a_np) + 0.5
    if op in ("eq", "ne", "and", "or", "xor"):    # make equal values and zeros common
        a_np, b_np = np.round(a_np), np.round(b_np)
    a, b = harness.inp(0, a_np.shape, F32), harness.inp(1, b_np.shape, F32)
    out, _ = run([a, b], [a_np, b_np], [binary(a, b, op)])
    ref = TORCH_BINARY[op](torch.tensor(a_np), torch.tensor(b_np)).numpy()
    if ref.dtype == bool:
        assert out.dtype == np.uint8 and np.array_equal(out, ref.astype(np.uint8))
    else:
        assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize("op,value,reverse", [
    ("add", 1.5, False), ("sub", 0.25, False), ("sub", 0.25, True), ("mul", -3.0, False),
    ("div", 7.0, False), ("div", 7.0, True), ("max", 0.1, False), ("min", 0.1, True), ("pow", 3.0, False),
    ("pow", 2.0, True), ("pow", 2.0, False), ("pow", 0.5, False), ("pow", -0.5, False), ("pow", -1.0, False),
    ("gt", 0.0, False), ("le", 0.5, True)])
def test_scalar_ops_with_reverse(op, value, reverse):
    xs = np.abs(randn(130, 9)) + 0.1
    x = harness.inp(0, xs.shape, F32)
    out, _ = run([x], [xs], [scalar(x, op, value, reverse)])
    t, v = torch.tensor(xs), torch.tensor(value, dtype=torch.float32)
    ref = TORCH_BINARY[op](v, t) if reverse else TORCH_BINARY[op](t, v)
    ref = ref.numpy()
    if ref.dtype == bool:
        assert np.array_equal(out, ref.astype(np.uint8))
    else:
        assert rel_err(out, ref) <= TOL


def test_where_with_broadcast_condition_and_constant():
    c_np = (randn(1, 40) > 0).astype(np.uint8)
    a_np = randn(50, 40)
    c, a = harness.inp(0, c_np.shape, U8), harness.inp(1, a_np.shape, F32)
    fill = harness.const(np.array(-1e9, np.float32), F32)
    w = node("where", [c, a, fill], a_np.shape)
    out, _ = run([c, a], [c_np, a_np], [w])
    assert np.array_equal(out, np.where(c_np != 0, a_np, np.float32(-1e9)))


def test_where_of_per_partition_operands():
    c_np = (randn(200, 1) > 0).astype(np.uint8)
    a_np, b_np = randn(200, 1), randn(200, 300)
    c, a, b = harness.inp(0, c_np.shape, U8), harness.inp(1, a_np.shape, F32), harness.inp(2, b_np.shape, F32)
    w = node("where", [c, a, b], b_np.shape)
    out, _ = run([c, a, b], [c_np, a_np, b_np], [w], partition_dim=0)
    assert np.array_equal(out, np.where(c_np != 0, a_np, b_np))


@pytest.mark.parametrize("src,dst", [(F32, BF16), (BF16, F32)])
def test_cast_between_fp32_and_bf16(src, dst):
    xs = (randn(70, 33) * 100).astype(src.storage)
    x = harness.inp(0, xs.shape, src)
    out, _ = run([x], [xs], [node("cast", [x], xs.shape, dst)])
    ref = torch.tensor(xs.astype(np.float32)).to(torch.bfloat16 if dst is BF16 else torch.float32)
    assert np.array_equal(out.astype(np.float32), ref.float().numpy())


def test_cast_inside_a_chain_rounds():
    """x.to(bf16).to(fp32) * 3: the intermediate cast must round, although intermediates are fp32 on chip."""
    xs = randn(64, 100)
    x = harness.inp(0, xs.shape, F32)
    c = node("cast", [x], xs.shape, BF16)
    up = node("cast", [c], xs.shape, F32)
    out, _ = run([x], [xs], [c, up, scalar(up, "mul", 3.0)])
    ref = (torch.tensor(xs).bfloat16().float() * 3).numpy()
    assert np.array_equal(out, ref)


def test_bf16_inputs_and_output():
    a_np, b_np = randn(128, 96).astype(ml_dtypes.bfloat16), randn(96).astype(ml_dtypes.bfloat16)
    a, b = harness.inp(0, a_np.shape, BF16), harness.inp(1, b_np.shape, BF16)
    s = binary(a, b, "mul", BF16)
    out, _ = run([a, b], [a_np, b_np], [s, unary(s, "silu", BF16)])
    ref = torch.nn.functional.silu(torch.tensor(a_np.astype(np.float32)) * torch.tensor(b_np.astype(np.float32)))
    # one rounding to bf16 at the end: within half a bf16 ulp (2^-8 relative) of the fp32 result
    assert rel_err(out.astype(np.float32), ref.numpy()) <= 2.0 ** -8


@pytest.mark.parametrize("partition_dim", [None, 0, 1])
def test_bias_row_and_per_row_column(partition_dim):
    """x * scale_col + bias_row, then tanh: [130, 515] with both broadcast kinds, on either layout."""
    xs, col, row = randn(130, 515), randn(130, 1), randn(515)
    x, c, r = (harness.inp(i, a.shape, F32) for i, a in enumerate((xs, col, row)))
    m = binary(x, c, "mul")
    a = binary(m, r, "add")
    out, _ = run([x, c, r], [xs, col, row], [m, a, unary(a, "tanh")], partition_dim)
    ref = torch.tanh(torch.tensor(xs) * torch.tensor(col) + torch.tensor(row)).numpy()
    assert rel_err(out, ref) <= TOL


def test_layout_decides_per_partition_instructions():
    """With the bias's dim on the partitions the add fuses into the activation's bias_ap (no
    tensor_tensor); on the other layout the bias row is a full operand."""
    xs, bias = randn(256, 512), randn(512)
    x, b = harness.inp(0, xs.shape, F32), harness.inp(1, bias.shape, F32)
    a = binary(x, b, "add")
    nodes = [a, unary(a, "exp")]
    ref = torch.exp(torch.tensor(xs) + torch.tensor(bias)).numpy()
    out, state = run([x, b], [xs, bias], nodes, partition_dim=1)
    assert rel_err(out, ref) <= TOL
    acts = [i for i in state.program.instructions if i.opcode == "activation"]
    assert acts and all(i["bias_ap"] is not None for i in acts)
    assert "tensor_tensor" not in opcodes(state)
    out, state = run([x, b], [xs, bias], nodes, partition_dim=0)
    assert rel_err(out, ref) <= TOL
    assert opcodes(state)["tensor_tensor"] >= 1
    assert candidates(ir.Kernel("elementwise", nodes))[0] == 1


def test_scalar_steps_fuse_into_one_activation():
    xs = randn(128, 256)
    x = harness.inp(0, xs.shape, F32)
    m = scalar(x, "mul", 0.5)
    s = scalar(m, "sub", 1.0)
    out, state = run([x], [xs], [m, s, unary(s, "sigmoid")])
    assert rel_err(out, torch.sigmoid(torch.tensor(xs) * 0.5 - 1.0).numpy()) <= TOL
    assert opcodes(state)["activation"] == 1 and "tensor_scalar" not in opcodes(state)


def test_two_scalar_steps_are_one_tensor_scalar():
    xs = randn(128, 256)
    x = harness.inp(0, xs.shape, F32)
    d = scalar(x, "div", 3.0)
    out, state = run([x], [xs], [d, scalar(d, "max", 0.0)])
    assert np.array_equal(out, torch.clamp_min(torch.tensor(xs) / 3.0, 0.0).numpy())
    assert opcodes(state)["tensor_scalar"] == 1


@pytest.mark.parametrize("dtype", [BF16, DType.FP8_E4M3])
def test_a_final_cast_rounds_as_its_producer_stores(dtype):
    """x * s then a cast (fp8 quantization, a bf16 result): the tensor_scalar writes the narrow output itself,
    bit for bit what a fp32 intermediate and a tensor_copy give (ml_dtypes rounds the fp32 product the same
    way; e4m3fn saturates, so values stay below 448)."""
    xs = randn(128, 512) * 50
    x = harness.inp(0, xs.shape, F32)
    m = scalar(x, "mul", 1.7)
    out, state = run([x], [xs], [m, node("cast", [m], m.shape, dtype)])
    narrow = ml_dtypes.bfloat16 if dtype is BF16 else ml_dtypes.float8_e4m3fn
    ref = np.minimum(np.maximum(xs * np.float32(1.7), -448), 448) if dtype is not BF16 else xs * np.float32(1.7)
    assert np.array_equal(np.asarray(out, np.float32), ref.astype(narrow).astype(np.float32))
    assert "tensor_copy" not in opcodes(state) and opcodes(state)["tensor_scalar"] >= 1


def test_shared_intermediate_silu_by_hand():
    """x * sigmoid(x): x is used twice, the product is a tensor_tensor of two full tiles."""
    xs = randn(5, 6, 700)
    x = harness.inp(0, xs.shape, F32)
    s = unary(x, "sigmoid")
    out, _ = run([x], [xs], [s, binary(x, s, "mul")])
    t = torch.tensor(xs)
    assert rel_err(out, (t * torch.sigmoid(t)).numpy()) <= TOL


def test_scalar_const_and_uniform_const_are_immediates():
    xs = randn(100, 30)
    x = harness.inp(0, xs.shape, F32)
    zero_d = harness.const(np.array(2.5, np.float32), F32)
    uniform = harness.const(np.full((30,), -0.75, np.float32), F32)
    varied = harness.const(np.arange(30, dtype=np.float32), F32)
    a = binary(x, zero_d, "mul")
    b = binary(uniform, a, "sub")
    out, state = run([x], [xs], [a, b, binary(b, varied, "add")])
    assert rel_err(out, -0.75 - xs * 2.5 + np.arange(30)) <= TOL
    # only x and the varied constant are read; the other two are immediates of tensor_scalar
    tensors = state.program.tensors
    read = {tensors[i["src"].tensor].name for i in state.program.instructions
            if i.opcode == "dma_copy" and i["src"].mem is Mem.HBM}
    assert read == {"in0", f"c_{varied.name}"}
    assert opcodes(state)["tensor_scalar"] >= 1


def test_expand_view_and_zero_d_input():
    xs, s = randn(1, 64), np.array(3.0, np.float32)
    x, c = harness.inp(0, xs.shape, F32), harness.inp(1, (), F32)
    e = node("expand", [x], (200, 64))
    out, _ = run([x, c], [xs, s], [binary(e, c, "mul")], pre=[e])
    assert np.array_equal(out, np.broadcast_to(xs, (200, 64)) * s)


def test_permuted_and_sliced_inputs():
    xs, ys = randn(40, 9, 33), randn(33, 50, 9)
    x, y = harness.inp(0, xs.shape, F32), harness.inp(1, ys.shape, F32)
    p = node("permute", [x], (33, 40, 9), dims=(2, 0, 1))
    sl = node("slice", [y], (33, 40, 9), dim=1, start=3, stop=43, step=1)
    out, _ = run([x, y], [xs, ys], [binary(p, sl, "sub")], pre=[p, sl])
    assert np.array_equal(out, xs.transpose(2, 0, 1) - ys[:, 3:43])


def test_strided_slice_and_odd_sizes():
    xs = randn(3, 11, 7)
    x = harness.inp(0, xs.shape, F32)
    sl = node("slice", [x], (3, 5, 7), dim=1, start=1, stop=11, step=2)
    out, _ = run([x], [xs], [unary(sl, "abs")], pre=[sl])
    assert np.array_equal(out, np.abs(xs[:, 1:11:2]))


@pytest.mark.parametrize("partition_dim", [None, 0, 1, 2, 3, 4])
def test_rank5_each_partition_dim(partition_dim):
    shape = (2, 3, 130, 5, 7)
    xs, bs = randn(*shape), randn(3, 1, 5, 1)
    x, b = harness.inp(0, shape, F32), harness.inp(1, bs.shape, F32)
    a = binary(x, b, "add")
    out, _ = run([x, b], [xs, bs], [a, unary(a, "relu")], partition_dim)
    assert np.array_equal(out, np.maximum(xs + bs, 0))


def test_rank6_permuted_input():
    xs = randn(2, 3, 4, 5, 6, 7)
    dims = (5, 3, 1, 4, 2, 0)
    x = harness.inp(0, xs.shape, F32)
    p = node("permute", [x], tuple(xs.shape[d] for d in dims), dims=dims)
    out, _ = run([x], [xs], [scalar(p, "add", 1.0)], pre=[p])
    assert np.array_equal(out, xs.transpose(dims) + np.float32(1.0))


def test_long_flat_tensor():
    xs = randn(66950)
    x = harness.inp(0, xs.shape, F32)
    out, state = run([x], [xs], [unary(x, "exp")])
    assert rel_err(out, np.exp(xs.astype(np.float64))) <= TOL
    assert opcodes(state)["activation"] <= 4     # rows of hundreds of elements, not 523 thin tiles


def test_comparison_chain_to_uint8_and_logical():
    a_np, b_np = randn(150, 20), randn(150, 20)
    a, b = harness.inp(0, a_np.shape, F32), harness.inp(1, b_np.shape, F32)
    gt = binary(a, b, "gt")
    pos = scalar(a, "gt", 0.0)
    out, _ = run([a, b], [a_np, b_np], [gt, pos, binary(gt, pos, "xor")])
    assert np.array_equal(out, ((a_np > b_np) ^ (a_np > 0)).astype(np.uint8))


def test_integer_arithmetic_is_rejected():
    xs = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = harness.inp(0, xs.shape, I32)
    with pytest.raises(UnsupportedOpError, match="integer binary 'add'"):
        run([x], [xs], [binary(x, x, "add", I32)])


def test_float_to_int_cast_is_rejected():
    xs = randn(3, 4)
    x = harness.inp(0, xs.shape, F32)
    with pytest.raises(UnsupportedOpError, match="truncates toward zero"):
        run([x], [xs], [node("cast", [x], xs.shape, I32)])


def test_int_comparison_and_cast_to_float():
    xs = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    x = harness.inp(0, xs.shape, I32)
    m = scalar(x, "ge", 0)
    out, _ = run([x], [xs], [m, node("cast", [m], xs.shape, F32)])
    assert np.array_equal(out, (xs >= 0).astype(np.float32))


def test_emit_chain_on_a_psum_operand_avoids_gpsimd():
    """A matmul epilogue: (psum + bias column) -> max with a full SBUF tile -> relu, written as bf16. GpSimdE
    cannot read PSUM and ScalarE's tensor_scalar cannot take max, so those engines must not be offered."""
    kb = TileBuilder(TileProgram(get_target("trn2")), "k0")
    acc = kb.psum("acc", 128, (512,))
    bias = kb.sbuf("bias", F32, 128, (1,))
    other = kb.sbuf("other", F32, 128, (512,))
    mm, b, o = (harness.inp(i, (128, 512), F32) for i in range(3))
    add = binary(mm, b, "add")
    mx = scalar(add, "max", 0.5)
    top = binary(mx, o, "min")
    out = kb.sbuf("out", BF16, 128, (512,))
    emit_chain(kb, [add, mx, top, unary(top, "relu", BF16)],
               {mm: Operand(acc, False), b: Operand(bias, True), o: Operand(other, False)}, out)
    instrs = kb.program.instrs
    assert [i.opcode for i in instrs] == ["tensor_scalar", "tensor_tensor", "activation"]
    first = instrs[0]
    assert first.fields["src"] is acc and first.fields["scalar0_ap"] is bias and first.fields["scalar1"] == 0.5
    assert set(first.engines) == {Engine.DVE}          # max rules out ScalarE, PSUM rules out GpSimdE
    assert set(instrs[1].engines) == {Engine.DVE, Engine.POOL}
    assert instrs[2].fields["dst"] is out
