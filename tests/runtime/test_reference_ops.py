"""The reference semantics of each opcode, for the dtypes it takes, against independent computations.

Every instruction is first checked by the verifier (so each case is a legal instruction), then run
on a Machine. Expected values come from numpy/torch written here: torch and ml_dtypes casts for
conversions (spec_intro.md names them as the references), numpy float32 arithmetic (one IEEE
operation each), explicit Python loops for the sequential folds, and float64 torch for bounds.
Results are compared bit for bit, NaN by class (any NaN matches any NaN).
"""
import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from trnc.isa import AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, ReduceOp, Rounding, ScaleMode
from trnc.isa.dtypes import VALUE_DTYPES
from trnc.isa.program import TensorDecl, TensorKind
from trnc.isa.verify import verify
from trnc.runtime.fp32math import ACTIVATIONS
from trnc.runtime.mx import quantize_mx
from trnc.runtime.reference import Machine
from trnc.runtime.reference_ops import fma_f32
from aps import onchip

F32, BF16, FP16, E4M3, E5M2, FP4, E8M0 = (DType.FP32, DType.BF16, DType.FP16, DType.FP8_E4M3, DType.FP8_E5M2,
                                           DType.FP4_E2M1, DType.E8M0)
VALUES = sorted(VALUE_DTYPES, key=lambda d: d.code)
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
TORCH = {BF16: torch.bfloat16, FP16: torch.float16, E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}
F = np.float32


def execute(ins, writes=(), target="trn2", tensors=(), binds=None):
    """Verify the one-instruction program, write the operands, execute, return the Machine."""
    program = Program(tuple(tensors), (ins,), target=target)
    verify(program)
    m = Machine(program)
    for name, value in (binds or {}).items():
        m.bind(name, value)
    for ap, value in writes:
        m.write(ap, value)
    m.execute(ins)
    return m


# -- independent oracles ---------------------------------------------------------------------------

def widen(raw):
    """fp32(x): floats widen exactly (ml_dtypes), ints convert with numpy's round-to-nearest-even."""
    return np.asarray(raw).astype(F)


def cast(x, dtype):
    """convert(x, dtype) from fp32, by the references spec_intro.md names (torch 2.13 e4m3fn saturates)."""
    x = np.ascontiguousarray(x, dtype=F)
    if dtype is F32:
        return x.copy()
    if dtype in TORCH:
        t = torch.from_numpy(x).to(TORCH[dtype])
        return t.view(torch.uint8 if dtype.itemsize == 1 else torch.int16).numpy().view(dtype.storage)
    if dtype is FP4:  # ml_dtypes saturates; no NaN code, NaN writes +0
        return np.where(np.isnan(x), F(0), x).astype(dtype.storage)
    info = np.iinfo(dtype.storage)
    rounded = np.clip(np.rint(np.where(np.isnan(x), 0, x).astype(np.float64)), info.min, info.max)
    return rounded.astype(dtype.storage)


def move(raw, src_dtype, dst_dtype):
    return raw if src_dtype is dst_dtype else cast(widen(raw), dst_dtype)


def assert_same(got, want, dtype):
    """Bit equality of two storage arrays (same number of elements), any NaN matching any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == dtype.storage and got.size == want.size
    g, w = got.reshape(-1).view(UINT[dtype.itemsize]), want.reshape(-1).astype(dtype.storage).view(UINT[dtype.itemsize])
    both_nan = np.isnan(widen(got).reshape(-1)) & np.isnan(widen(want.astype(dtype.storage)).reshape(-1))
    bad = np.flatnonzero((g != w) & ~both_nan)
    assert bad.size == 0, f"{bad.size} of {g.size} differ, e.g. at {bad[:5]}: got {g[bad[:5]]}, want {w[bad[:5]]}"


def finite(dtype, shape, rng, spread=4):
    """Random finite values of `dtype` (storage), of magnitudes 2^-spread .. 2^spread."""
    if dtype.is_int:
        info = np.iinfo(dtype.storage)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype.storage)
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread + 1, size=shape)
    lim = dtype.value.max_finite
    return np.clip(x, -lim, lim).astype(F).astype(dtype.storage)


def any_codes(dtype, shape, rng):
    """Random codes of `dtype`: NaN, Inf, subnormals and every magnitude for floats (fp32 half random bits,
    half moderate values), the full range for ints."""
    if dtype is FP4:
        return rng.integers(0, 16, size=shape, dtype=np.uint8).view(dtype.storage)
    if dtype.is_int:
        info = np.iinfo(dtype.storage)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype.storage)
    bits = rng.integers(0, 2 ** (8 * dtype.itemsize), size=shape, dtype=UINT[dtype.itemsize]).view(dtype.storage)
    if dtype is F32:
        bits = np.where(rng.random(shape) < 0.5, bits, finite(F32, shape, rng, spread=12))
    return bits


# -- moves and conversions -------------------------------------------------------------------------

@pytest.mark.parametrize("src_dtype", VALUES, ids=lambda d: d.text)
@pytest.mark.parametrize("dst_dtype", VALUES, ids=lambda d: d.text)
def test_dma_copy_moves_bits_or_converts_through_fp32(src_dtype, dst_dtype):
    x = any_codes(src_dtype, (4, 64), np.random.default_rng(10))
    src = AP(Mem.HBM, src_dtype, 4, ((1, 64),), tensor=0, partition_stride=64)
    dst = onchip(dst_dtype, (4, 2, 32), offset=256)
    m = execute(Instruction.make("dma_copy", dst=dst, src=src),
                tensors=(TensorDecl("x", TensorKind.INPUT, src_dtype, (4, 64)),), binds={"x": x})
    assert_same(m.read(dst), move(x, src_dtype, dst_dtype), dst_dtype)


@pytest.mark.parametrize("src_dtype", VALUES, ids=lambda d: d.text)
@pytest.mark.parametrize("dst_dtype", VALUES, ids=lambda d: d.text)
def test_tensor_copy_rne_moves_bits_or_converts_through_fp32(src_dtype, dst_dtype):
    x = any_codes(src_dtype, (8, 2, 24), np.random.default_rng(11))
    src, dst = onchip(src_dtype, (8, 2, 24)), onchip(dst_dtype, (8, 48), offset=1024)
    m = execute(Instruction.make("tensor_copy", Engine.POOL, dst=dst, src=src), [(src, x)])
    assert_same(m.read(dst), move(x, src_dtype, dst_dtype), dst_dtype)


def spec_rand(seed, p, e):
    """rand(S, p, e) of spec_intro.md, on Python ints."""
    h = (seed * 0x9E3779B1 + p * 0x85EBCA77 + e * 0xC2B2AE3D) % 2**32
    h ^= h >> 16
    h = h * 0x85EBCA6B % 2**32
    h ^= h >> 13
    h = h * 0xC2B2AE35 % 2**32
    return h ^ (h >> 16)


def test_tensor_copy_stochastic_rounding_to_bf16_adds_16_random_bits_then_truncates():
    """For normal fp32 x far from overflow, the spec's SR to bf16 is (|bits(x)| + (R mod 2^16)) >> 16, sign kept."""
    rng = np.random.default_rng(12)
    x = finite(F32, (4, 40), rng, spread=10)
    src, dst = onchip(F32, (4, 40), start=32), onchip(BF16, (4, 5, 8), offset=512, start=32)
    seed = 1234567
    m = execute(Instruction.make("tensor_copy", dst=dst, src=src, rounding=Rounding.SR, seed=seed), [(src, x)])
    u = x.view(np.uint32).astype(np.int64)
    rand = np.array([[spec_rand(seed, p, e) for e in range(40)] for p in range(4)], dtype=np.int64)
    want = ((u & 0x80000000) >> 16) | (((u & 0x7FFFFFFF) + (rand & 0xFFFF)) >> 16)
    assert_same(m.read(dst), want.astype(np.uint16).view(ml_dtypes.bfloat16), BF16)
    # so each result is x truncated to bf16 or the next bf16 away from zero
    truncated = (u >> 16).astype(np.uint16)
    got = m.read(dst).reshape(4, 40).view(np.uint16)
    assert ((got == truncated) | (got == truncated + 1)).all() and (got != truncated).any()


@pytest.mark.parametrize("dtype", [BF16, FP16, E4M3, E5M2, FP4], ids=lambda d: d.text)
def test_tensor_copy_stochastic_rounding_picks_a_neighbour_with_the_right_frequency(dtype):
    """Rounding 1 + 1/4 ulp: about 1/4 of the elements round up, the rest down; the same seed repeats."""
    ulp = {BF16: 2.0**-7, FP16: 2.0**-10, E4M3: 2.0**-3, E5M2: 2.0**-2, FP4: 0.5}[dtype]
    x = np.full((128, 64), 1 + ulp / 4, dtype=F)
    src, dst = onchip(F32, (128, 64)), onchip(dtype, (128, 64), offset=1024)
    runs = [execute(Instruction.make("tensor_copy", dst=dst, src=src, rounding=Rounding.SR, seed=s),
                    [(src, x)]).read(dst).astype(np.float64) for s in (7, 7, 8)]
    assert set(np.unique(runs[0])) <= {1.0, 1 + ulp}
    assert abs((runs[0] > 1).mean() - 0.25) < 0.02
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])


@pytest.mark.parametrize("dtype", VALUES, ids=lambda d: d.text)
def test_partition_broadcast_copies_row_zero_to_every_partition(dtype):
    rng = np.random.default_rng(13)
    x = any_codes(dtype, (1, 12), rng)
    src = onchip(dtype, (1, 12), start=32)
    for dst_dtype in (dtype, F32, BF16):
        dst = onchip(dst_dtype, (16, 3, 4), offset=256)
        m = execute(Instruction.make("partition_broadcast", dst=dst, src=src), [(src, x)])
        assert_same(m.read(dst), np.repeat(move(x, dtype, dst_dtype), 16, axis=0), dst_dtype)


@pytest.mark.parametrize("dtype", VALUES, ids=lambda d: d.text)
def test_memset_converts_its_value(dtype):
    for value in (0.1, -3.5, 2.5, 1e10, -1e10, float("inf"), float("-inf"), float("nan"), -0.0):
        dst = onchip(dtype, (4, 3, 5), offset=64)
        m = execute(Instruction.make("memset", dst=dst, value=value))
        assert_same(m.read(dst), np.repeat(cast(np.array([value], F), dtype), 60), dtype)


@pytest.mark.parametrize("dtype", [F32, BF16, FP16, E4M3, E5M2, FP4, DType.INT8, DType.INT32])
def test_transpose_moves_bits_or_widens_to_fp32(dtype):
    x = any_codes(dtype, (24, 16), np.random.default_rng(14))
    src = onchip(dtype, (24, 2, 8))
    for dst_dtype in {dtype, F32} if dtype.is_float else {dtype}:
        dst = onchip(dst_dtype, (16, 24), mem=Mem.PSUM)
        m = execute(Instruction.make("transpose", dst=dst, src=src), [(src, x.reshape(24, 2, 8))])
        assert_same(m.read(dst), move(x, dtype, dst_dtype).T, dst_dtype)


# -- TensorE ---------------------------------------------------------------------------------------

def fp32_of(x: Fraction) -> np.float32:
    """The exact rational x rounded once to fp32, to nearest, ties to even (Inf past the largest finite)."""
    if x == 0:
        return F(0)
    mag = abs(x)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()
    e = e - 1 if Fraction(2) ** e > mag else e           # 2^e <= mag < 2^(e + 1)
    quantum = Fraction(2) ** (max(e, -126) - 23)          # the fp32 spacing there (subnormals: 2^-149)
    q, rest = divmod(mag / quantum, 1)
    q += rest > Fraction(1, 2) or (rest == Fraction(1, 2) and q % 2 == 1)
    value = q * quantum
    return F(math.copysign(math.inf if value >= 2 ** 128 else float(value), x))


def fma_cases(rng) -> np.ndarray:
    """(a, b, c) triples in fp32: random, near cancellation, exact ties of a * b that a tiny c breaks (where
    rounding the sum to float64 first would round wrong), and subnormal and overflowing results."""
    random = (rng.standard_normal((600, 3)) * np.exp2(rng.integers(-30, 30, (600, 3)))).astype(F)
    a, b = (rng.standard_normal((300, 2))).astype(F).T
    near = np.stack([a, b, (-(a.astype(np.float64) * b)).astype(F)], axis=1)
    halves = 1 + rng.integers(0, 2 ** 12, (300, 2)) * 2.0 ** -12     # a * b has up to 25 significant bits
    tiny = rng.choice([2.0 ** -60, -2.0 ** -60, 2.0 ** -80, 0.0], 300)
    ties = np.concatenate([halves, tiny[:, None]], axis=1).astype(F)
    edges = np.array([[1 + 2 ** -12, 1 + 2 ** -12, 2 ** -80], [1.25 * 2 ** -74, 2 ** -75, 2 ** -125],
                      [2 ** 64, 2 ** 64, -3.4028235e38], [2 ** 70, 2 ** 60, 0], [2 ** -100, 2 ** -60, -0.0],
                      [-0.0, 5, -0.0], [3, -5, 15], [2 ** -75, 2 ** -75, 0]], F)
    return np.concatenate([random, near, ties, edges])


def test_fma_f32_rounds_the_exact_result_once():
    x = fma_cases(np.random.default_rng(23))
    got = fma_f32(x[:, 0], x[:, 1], x[:, 2])
    want = np.array([fp32_of(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))) for a, b, c in x])
    zero = x[:, 0].astype(np.float64) * x[:, 1] + x[:, 2] == 0   # exact zeros: the sign follows IEEE addition
    want[zero] = (x[zero, 0] * x[zero, 1]) + x[zero, 2]
    assert_same(got, want, F32)
    double_rounded = (x[:, 0].astype(np.float64) * x[:, 1] + x[:, 2]).astype(F)
    assert not np.array_equal(double_rounded.view(np.uint32), want.view(np.uint32))   # the cases bite


def test_fma_f32_keeps_inf_and_nan():
    inf, nan = np.inf, np.nan
    x = np.array([[inf, 2, 1], [inf, 0, 1], [inf, 1, -inf], [1, 1, nan], [2, 3, inf], [-inf, -inf, 0]], F)
    got = fma_f32(x[:, 0], x[:, 1], x[:, 2])
    assert_same(got, np.array([inf, nan, nan, nan, inf, inf], F), F32)


def sequential_sum(acc, s, v):
    """acc + sum over k of s[k, m] * v[k, n], one k after the other, each as one fused multiply-add in fp32."""
    for k in range(s.shape[0]):
        acc = fma_f32(s[k][:, None], v[k][None, :], acc)
    return acc


def within_fp32_accumulation_bound(got, s, v, acc0):
    """|got - exact| <= gamma_K * (|acc0| + sum |s v|) for K + 1 fp32 additions (Higham)."""
    s64, v64 = torch.from_numpy(s.astype(np.float64)), torch.from_numpy(v.astype(np.float64))
    exact = acc0.astype(np.float64) + (s64.T @ v64).numpy()
    k = s.shape[0] + 1
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    return (np.abs(got - exact) <= gamma * (np.abs(acc0) + (s64.abs().T @ v64.abs()).numpy())).all()


@pytest.mark.parametrize("st_dtype, mv_dtype", [(F32, F32), (BF16, BF16), (FP16, FP16), (E4M3, E4M3),
                                                (E5M2, E5M2), (BF16, E4M3), (FP16, E5M2)],
                         ids=lambda d: d.text)
@pytest.mark.parametrize("accumulate", [False, True])
def test_matmul_accumulates_products_in_k_order(st_dtype, mv_dtype, accumulate):
    rng = np.random.default_rng(20)
    k, m_size, n_size = 96, 24, 40
    s, v = finite(st_dtype, (k, m_size), rng), finite(mv_dtype, (k, n_size), rng)
    init = finite(F32, (m_size, n_size), rng)
    st, mv = onchip(st_dtype, (k, 4, 6)), onchip(mv_dtype, (k, n_size), offset=512)
    dst = onchip(F32, (m_size, n_size), offset=2048, mem=Mem.PSUM)
    ins = Instruction.make("matmul", dst=dst, stationary=st, moving=mv, accumulate=accumulate)
    got = execute(ins, [(st, s.reshape(k, 4, 6)), (mv, v), (dst, init)]).read(dst)
    acc0 = init if accumulate else np.zeros_like(init)
    assert_same(got, sequential_sum(acc0, widen(s), widen(v)), F32)
    assert within_fp32_accumulation_bound(got, widen(s), widen(v), acc0)


def test_overwriting_matmul_starts_from_positive_zero():
    s = np.full((8, 4), -1.0, ml_dtypes.bfloat16)
    v = np.zeros((8, 4), ml_dtypes.bfloat16)   # every product is -0.0; +0.0 + -0.0 = +0.0
    st, mv, dst = onchip(BF16, (8, 4)), onchip(BF16, (8, 4), offset=64), onchip(F32, (4, 4), mem=Mem.PSUM)
    got = execute(Instruction.make("matmul", dst=dst, stationary=st, moving=mv), [(st, s), (mv, v)]).read(dst)
    assert (got.view(np.uint32) == 0).all()


def test_double_row_matmul_contracts_both_row_groups_first_group_first():
    rng = np.random.default_rng(21)
    k, m_size, n_size = 64, 16, 20
    s, v = finite(E4M3, (k, 2, m_size), rng), finite(E5M2, (k, 2, n_size), rng)
    st, mv = onchip(E4M3, (k, 2, m_size)), onchip(E5M2, (k, 2, n_size), offset=256)
    dst = onchip(F32, (m_size, n_size), mem=Mem.PSUM)
    got = execute(Instruction.make("matmul", dst=dst, stationary=st, moving=mv, double_row=True),
                  [(st, s), (mv, v)]).read(dst)
    # the same as one K = 128 matmul over partitions (r, k) in that order
    s2, v2 = widen(s).transpose(1, 0, 2).reshape(2 * k, m_size), widen(v).transpose(1, 0, 2).reshape(2 * k, n_size)
    assert_same(got, sequential_sum(np.zeros((m_size, n_size), F), s2, v2), F32)


@pytest.mark.parametrize("st_dtype, mv_dtype, groups", [(E4M3, E4M3, 2), (E5M2, E5M2, 1), (FP4, FP4, 3),
                                                        (E4M3, FP4, 1)], ids=str)
def test_matmul_mx_sums_each_block_then_scales_it_exactly(st_dtype, mv_dtype, groups):
    rng = np.random.default_rng(22)
    k, m_size, n_size = 64, 8, 12
    blocks = k // 32
    s, v = finite(st_dtype, (k, groups, m_size), rng), finite(mv_dtype, (k, groups, n_size), rng)
    ss = rng.integers(100, 150, size=(blocks, groups, m_size), dtype=np.uint8)
    sv = rng.integers(100, 150, size=(blocks, groups, n_size), dtype=np.uint8)
    ss[1, 0, 3] = 0xFF  # a NaN scale: row m = 3 of the result is NaN
    init = finite(F32, (m_size, n_size), rng)
    shape = (lambda x: x) if groups > 1 else (lambda x: x.reshape(x.shape[0], -1))
    st, mv = onchip(st_dtype, shape(s).shape), onchip(mv_dtype, shape(v).shape, offset=256)
    sts, mvs = onchip(E8M0, shape(ss).shape, offset=512), onchip(E8M0, shape(sv).shape, offset=768)
    dst = onchip(F32, (m_size, n_size), mem=Mem.PSUM)
    ins = Instruction.make("matmul_mx", dst=dst, stationary=st, stationary_scale=sts, moving=mv, moving_scale=mvs,
                           accumulate=True)
    writes = [(st, shape(s)), (mv, shape(v)), (sts, shape(ss).view(E8M0.storage)), (mvs, shape(sv).view(E8M0.storage)),
              (dst, init)]
    got = execute(ins, writes, target="trn3").read(dst)
    acc = init.copy()
    for r in range(groups):
        for b in range(blocks):
            rows = slice(32 * b, 32 * (b + 1))
            part = sequential_sum(np.zeros((m_size, n_size), F), widen(s[rows, r]), widen(v[rows, r]))
            exponent = ss[b, r].astype(np.int64)[:, None] + sv[b, r].astype(np.int64)[None, :] - 254
            factor = np.where((ss[b, r][:, None] == 255) | (sv[b, r][None, :] == 255), np.nan, 2.0 ** exponent)
            acc = acc + (part.astype(np.float64) * factor).astype(F)
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()
    assert_same(got, acc, F32)


# -- ScalarE ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("func", list(ActFunc), ids=lambda f: f.text)
def test_activation_applies_func_to_scaled_biased_input_and_sums_in_order(func):
    rng = np.random.default_rng(30)
    p, f = 16, 40
    x = finite(BF16, (p, f), rng, spread=2)
    if func in (ActFunc.LOG, ActFunc.SQRT, ActFunc.RSQRT):
        x = np.abs(x) + ml_dtypes.bfloat16(0.25)
    scale, bias = finite(F32, (p, 1), rng, spread=1), finite(F32, (p, 1), rng, spread=1)
    if func in (ActFunc.LOG, ActFunc.SQRT, ActFunc.RSQRT):
        scale, bias = np.abs(scale), np.abs(bias)
    src, dst = onchip(BF16, (p, 5, 8)), onchip(BF16, (p, f), offset=256)
    scale_ap, accum = onchip(F32, (p, 1), offset=512), onchip(F32, (p, 1), offset=520)
    ins = Instruction.make("activation", dst=dst, src=src, func=func, scale_ap=scale_ap, bias=0.3, accum=accum)
    m = execute(ins, [(src, x.reshape(p, 5, 8)), (scale_ap, scale)])
    t = (widen(x) * scale) + F(0.3)
    y = ACTIVATIONS[func](t)
    assert_same(m.read(dst), cast(y, BF16), BF16)
    acc = np.zeros(p, F)
    for e in range(f):
        acc = acc + y[:, e]
    assert_same(m.read(accum), acc, F32)
    # and with a per-partition bias and an immediate scale
    bias_ap = onchip(F32, (p, 1), offset=528)
    ins = Instruction.make("activation", dst=dst, src=src, func=func, scale=1.5, bias_ap=bias_ap)
    m = execute(ins, [(src, x.reshape(p, 5, 8)), (bias_ap, bias)])
    assert_same(m.read(dst), cast(ACTIVATIONS[func]((widen(x) * F(1.5)) + bias), BF16), BF16)


def test_activation_accum_starts_from_positive_zero():
    """The table's fold starts at +0.0, so all -0.0 results sum to +0.0 (a fold from the first y would give -0.0)."""
    x = np.full((4, 6), -0.0, F)
    src, dst, accum = onchip(F32, (4, 6)), onchip(F32, (4, 6), offset=64), onchip(F32, (4, 1), offset=128)
    m = execute(Instruction.make("activation", dst=dst, src=src, bias=-0.0, accum=accum), [(src, x)])  # -0 + -0 = -0
    assert (m.read(dst).view(np.uint32) == 0x80000000).all() and (m.read(accum).view(np.uint32) == 0).all()


# What each function computes, in float64, and fp32math.py's bound: ulps between its fp32 result and the
# correctly rounded one (0: correctly rounded; float64 then fp32 rounds these correctly, 53 >= 2 * 24 + 2).
FLOAT64 = {
    ActFunc.COPY: (lambda x: x, 0), ActFunc.RELU: (torch.relu, 0), ActFunc.ABS: (torch.abs, 0),
    ActFunc.SQRT: (torch.sqrt, 0), ActFunc.RECIPROCAL: (torch.reciprocal, 0), ActFunc.SQUARE: (torch.square, 0),
    ActFunc.RSQRT: (torch.rsqrt, 1), ActFunc.EXP: (torch.exp, 1), ActFunc.LOG: (torch.log, 1),
    ActFunc.SILU: (torch.nn.functional.silu, 2), ActFunc.SIGMOID: (torch.sigmoid, 2), ActFunc.TANH: (torch.tanh, 2),
    ActFunc.GELU: (torch.nn.functional.gelu, 3),
    ActFunc.GELU_TANH: (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), 2),
    ActFunc.SIN: (torch.sin, 0.8), ActFunc.COS: (torch.cos, 0.8), ActFunc.TAN: (torch.tan, 2.2),
    ActFunc.ASIN: (torch.asin, 0.7), ActFunc.ACOS: (torch.acos, 1), ActFunc.ATAN: (torch.atan, 0.9),
    ActFunc.SINH: (torch.sinh, 1.6), ActFunc.COSH: (torch.cosh, 1.4), ActFunc.ASINH: (torch.asinh, 1.9),
    ActFunc.ACOSH: (torch.acosh, 2.1), ActFunc.ATANH: (torch.atanh, 1.9), ActFunc.ERF: (torch.erf, 1.3),
    ActFunc.ERFC: (torch.erfc, 3), ActFunc.EXP2: (torch.exp2, 1), ActFunc.LOG2: (torch.log2, 0.8),
    ActFunc.LOG10: (torch.log10, 0.8), ActFunc.FLOOR: (torch.floor, 0), ActFunc.CEIL: (torch.ceil, 0),
    ActFunc.TRUNC: (torch.trunc, 0), ActFunc.RINT: (torch.round, 0), ActFunc.SIGN: (torch.sign, 0),
    ActFunc.ERFINV: (torch.erfinv, 2.5), ActFunc.ERFCX: (torch.special.erfcx, 2.5),
    ActFunc.I0E: (torch.special.i0e, 2.6), ActFunc.I1E: (torch.special.i1e, 3.1),
    ActFunc.LGAMMA: (torch.lgamma, 1.9), ActFunc.DIGAMMA: (torch.digamma, 1.7),
}
# inputs in each function's domain, from x in [-6, 6]
DOMAIN = {ActFunc.LOG: lambda x: np.abs(x) + F(2.0**-10), ActFunc.SQRT: lambda x: np.abs(x) + F(2.0**-10),
          ActFunc.RSQRT: lambda x: np.abs(x) + F(2.0**-10), ActFunc.LOG2: lambda x: np.abs(x) + F(2.0**-10),
          ActFunc.LOG10: lambda x: np.abs(x) + F(2.0**-10), ActFunc.ACOSH: lambda x: np.abs(x) + F(1),
          ActFunc.ASIN: lambda x: x * F(0.99 / 6), ActFunc.ACOS: lambda x: x * F(0.99 / 6),
          ActFunc.ATANH: lambda x: x * F(0.99 / 6), ActFunc.ERFINV: lambda x: x * F(0.99 / 6),
          # the bound for x > 0 (test_fp32math checks the reflection below 0)
          ActFunc.LGAMMA: lambda x: np.abs(x) + F(2.0**-10), ActFunc.DIGAMMA: lambda x: np.abs(x) + F(2.0**-10)}


def gelu_tanh_conditioning(x):
    """fp32math's gelu_tanh bound adds the effect of a 2^-22 relative error in the sigmoid's argument s:
    |d(x sigmoid(s))/ds * s| * 2^-22 = |x sigmoid(s) (1 - sigmoid(s)) s| * 2^-22."""
    s = math.sqrt(8 / math.pi) * (x + 0.044715 * x**3)
    sig = 1 / (1 + np.exp(-s))
    return np.abs(x * sig * (1 - sig) * s) * 2.0**-22


@pytest.mark.parametrize("func", list(ActFunc), ids=lambda f: f.text)
def test_activation_matches_torch_float64_within_the_stated_ulps(func):
    fn, ulps = FLOAT64[func]
    x = np.linspace(-6, 6, 4096, dtype=F).reshape(128, 32)
    x = DOMAIN.get(func, lambda v: v)(x).astype(F)
    src, dst = onchip(F32, (128, 32)), onchip(F32, (128, 32), offset=256)
    got = execute(Instruction.make("activation", Engine.ACT, dst=dst, src=src, func=func), [(src, x)]).read(dst)
    want = fn(torch.from_numpy(x.astype(np.float64))).numpy()
    if ulps == 0:
        assert_same(got, want.astype(F), F32)
        return
    ulp = np.maximum(np.spacing(np.abs(want).astype(F)).astype(np.float64), 2.0**-149)   # ulp of the fp32 result
    allowed = (ulps + 0.5) * ulp    # N ulps from the correctly rounded result, which is within 1/2 ulp
    if func is ActFunc.GELU_TANH:
        allowed = allowed + gelu_tanh_conditioning(x.astype(np.float64))
    excess = np.abs(got - want) / allowed
    worst = np.unravel_index(np.argmax(excess), x.shape)
    assert excess[worst] <= 1, f"at x = {x[worst]!r}: got {got[worst]!r}, float64 {want[worst]!r}"


# -- VectorE / GpSimdE elementwise ---------------------------------------------------------------------

def _nan_or(a, b, value):
    return np.where(np.isnan(a) | np.isnan(b), F(np.nan), value)


# spec_intro.md "ALU ops", in numpy float32 (pow is fp32math's own algorithm and is checked against float64).
ALU_NUMPY = {
    AluOp.BYPASS: lambda a, b: a, AluOp.ADD: np.add, AluOp.SUB: np.subtract, AluOp.MUL: np.multiply,
    AluOp.DIV: np.divide,
    AluOp.MAX: lambda a, b: _nan_or(a, b, np.where(a > b, a, b)),
    AluOp.MIN: lambda a, b: _nan_or(a, b, np.where(a < b, a, b)),
    AluOp.EQ: np.equal, AluOp.NE: np.not_equal, AluOp.LT: np.less, AluOp.LE: np.less_equal,
    AluOp.GT: np.greater, AluOp.GE: np.greater_equal,
    AluOp.AND: lambda a, b: (a != 0) & (b != 0), AluOp.OR: lambda a, b: (a != 0) | (b != 0),
    AluOp.XOR: lambda a, b: (a != 0) ^ (b != 0),
    AluOp.FMOD: np.fmod,   # C's fmodf, exact
    AluOp.REMAINDER: lambda a, b: np.where((np.fmod(a, b) != 0) & ((b < 0) != (np.fmod(a, b) < 0)),
                                           np.fmod(a, b) + b, np.fmod(a, b)),
}
# fp32math's own algorithms, checked against float64 (tests/runtime/test_fp32math.py measures them densely)
ALU_FLOAT64 = {AluOp.POW: (np.power, 4), AluOp.ATAN2: (np.arctan2, 1.5), AluOp.HYPOT: (np.hypot, 1.2),
               AluOp.LOGADDEXP: (np.logaddexp, 4)}   # logaddexp: 2.5 ulp plus 2^-23, here results above 0.1


def alu(op, a, b):
    with np.errstate(all="ignore"):
        return np.asarray(ALU_NUMPY[op](a, b)).astype(F)


def alu_operands(rng, shape):
    """Small integers (so comparisons see ties), fractions, zeros of both signs, Inf and NaN."""
    a = (rng.integers(-3, 4, size=shape) * rng.choice([1, 0.75, 2.5], size=shape)).astype(F)
    a.reshape(-1)[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]
    return a


@pytest.mark.parametrize("op", [op for op in AluOp if op in ALU_NUMPY], ids=lambda o: o.text)
def test_tensor_tensor_alu_ops(op):
    rng = np.random.default_rng(40)
    a, b = alu_operands(rng, (8, 48)), alu_operands(rng, (8, 48))
    b.reshape(-1)[6:12] = [-0.0, 0.0, 1.0, np.nan, np.inf, 0.0]
    in0, in1, dst = onchip(F32, (8, 6, 8)), onchip(F32, (8, 48), offset=256), onchip(F32, (8, 48), offset=512)
    for engine in (Engine.DVE, Engine.POOL):
        m = execute(Instruction.make("tensor_tensor", engine, dst=dst, in0=in0, in1=in1, op=op),
                    [(in0, a.reshape(8, 6, 8)), (in1, b)])
        assert_same(m.read(dst), alu(op, a, b), F32)


@pytest.mark.parametrize("op", list(ALU_FLOAT64), ids=lambda o: o.text)
def test_tensor_tensor_pow_atan2_hypot_logaddexp_match_float64(op):
    rng = np.random.default_rng(41)
    a = (rng.random((4, 64)) * 4 + 0.1).astype(F)
    b = (rng.random((4, 64)) * 6 - 3).astype(F)
    in0, in1, dst = onchip(F32, (4, 64)), onchip(F32, (4, 64), offset=256), onchip(F32, (4, 64), offset=512)
    got = execute(Instruction.make("tensor_tensor", dst=dst, in0=in0, in1=in1, op=op),
                  [(in0, a), (in1, b)]).read(dst)
    ref, ulps = ALU_FLOAT64[op]
    want = ref(a.astype(np.float64), b.astype(np.float64))
    assert (np.abs(got - want) <= (ulps + 0.5) * np.spacing(np.abs(want).astype(F))).all()


@pytest.mark.parametrize("in_dtype", VALUES, ids=lambda d: d.text)
def test_tensor_tensor_reads_every_dtype_into_fp32_and_converts_on_write(in_dtype):
    rng = np.random.default_rng(42)
    a, b = any_codes(in_dtype, (4, 32), rng), finite(in_dtype, (4, 32), rng)
    in0, in1 = onchip(in_dtype, (4, 32)), onchip(in_dtype, (4, 32), offset=256)
    for dst_dtype in (F32, BF16, E4M3, DType.INT8):
        dst = onchip(dst_dtype, (4, 32), offset=512)
        m = execute(Instruction.make("tensor_tensor", dst=dst, in0=in0, in1=in1, op=AluOp.MUL), [(in0, a), (in1, b)])
        assert_same(m.read(dst), cast(alu(AluOp.MUL, widen(a), widen(b)), dst_dtype), dst_dtype)


@pytest.mark.parametrize("engine", [Engine.DVE, Engine.ACT, Engine.POOL], ids=lambda e: e.text)
def test_tensor_scalar_two_ops_immediate_or_per_partition_and_reversed(engine):
    rng = np.random.default_rng(43)
    x = finite(FP16, (8, 3, 7), rng)
    s1 = finite(F32, (8, 1), rng)
    src, dst = onchip(FP16, (8, 3, 7)), onchip(BF16, (8, 21), offset=256)
    s1_ap = onchip(F32, (8, 1), offset=512)
    cases = [(AluOp.MUL, False, AluOp.ADD, False), (AluOp.ADD, True, AluOp.MUL, True)]
    if engine is not Engine.ACT:  # ScalarE's tensor_scalar does multiply and add only
        cases += [(AluOp.SUB, True, AluOp.DIV, False), (AluOp.DIV, True, AluOp.MAX, True),
                  (AluOp.GT, False, AluOp.BYPASS, False)]
    for op0, rev0, op1, rev1 in cases:
        ins = Instruction.make("tensor_scalar", engine, dst=dst, src=src, op0=op0, scalar0=0.1, reverse0=rev0,
                               op1=op1, scalar1_ap=s1_ap, reverse1=rev1)
        m = execute(ins, [(src, x), (s1_ap, s1)])
        s0 = np.full((8, 1), 0.1, F)   # the immediate is an fp32
        t = widen(x).reshape(8, 21)
        t = alu(op0, s0, t) if rev0 else alu(op0, t, s0)
        t = alu(op1, np.broadcast_to(s1, t.shape), t) if rev1 else alu(op1, t, np.broadcast_to(s1, t.shape))
        assert_same(m.read(dst), cast(t, BF16), BF16)


@pytest.mark.parametrize("pred_dtype", [F32, BF16, DType.INT32, DType.UINT8], ids=lambda d: d.text)
def test_select_takes_on_true_where_pred_is_nonzero(pred_dtype):
    rng = np.random.default_rng(44)
    pred = any_codes(pred_dtype, (4, 30), rng)
    if pred_dtype.is_int:
        pred = np.where(rng.random((4, 30)) < 0.5, pred, 0).astype(pred_dtype.storage)
    on_true, on_false = any_codes(FP16, (4, 30), rng), finite(E5M2, (4, 30), rng)
    aps = [onchip(pred_dtype, (4, 30)), onchip(FP16, (4, 30), offset=256), onchip(E5M2, (4, 5, 6), offset=512)]
    dst = onchip(BF16, (4, 30), offset=768)
    m = execute(Instruction.make("select", dst=dst, pred=aps[0], on_true=aps[1], on_false=aps[2]),
                list(zip(aps, (pred, on_true, on_false.reshape(4, 5, 6)))))
    assert_same(m.read(dst), cast(np.where(widen(pred) != 0, widen(on_true), widen(on_false)), BF16), BF16)


# -- reductions ----------------------------------------------------------------------------------------

FOLD = {ReduceOp.SUM: lambda a, b: F(a + b), ReduceOp.MAX: lambda a, b: alu(AluOp.MAX, a, b),
        ReduceOp.MIN: lambda a, b: alu(AluOp.MIN, a, b)}


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.text)
@pytest.mark.parametrize("axes", [0b001, 0b010, 0b100, 0b011, 0b101, 0b110, 0b111])
def test_tensor_reduce_folds_the_chosen_axes_in_row_major_order(op, axes):
    rng = np.random.default_rng(45)
    shape = (4, 3, 4, 5)
    x = finite(BF16, shape, rng, spread=8)
    x[1, 2, 0, 3] = np.nan
    src = onchip(BF16, shape)
    kept = [j for j in range(3) if not axes >> j & 1]
    reduced = [j for j in range(3) if axes >> j & 1]
    out_shape = (4, *(shape[1 + j] for j in kept))
    dst = onchip(F32, out_shape if kept else (4, 1), offset=512)
    m = execute(Instruction.make("tensor_reduce", dst=dst, src=src, op=op, axes=axes), [(src, x)])
    want = np.zeros(out_shape, F)
    for p, *keep in itertools.product(range(4), *(range(shape[1 + j]) for j in kept)):
        acc = None
        for red in itertools.product(*(range(shape[1 + j]) for j in reduced)):
            index = [0, 0, 0]
            for j, i in zip(kept + reduced, keep + list(red)):
                index[j] = i
            value = F(x[(p, *index)])
            acc = value if acc is None else FOLD[op](acc, value)
        want[(p, *keep)] = acc
    assert_same(m.read(dst), want, F32)


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.text)
def test_partition_reduce_folds_partitions_in_order(op):
    rng = np.random.default_rng(46)
    x = finite(FP16, (32, 12), rng, spread=8)
    x[5, 7] = np.nan
    src, dst = onchip(FP16, (32, 3, 4)), onchip(F32, (1, 12), offset=256, start=64)
    m = execute(Instruction.make("partition_reduce", dst=dst, src=src, op=op), [(src, x.reshape(32, 3, 4))])
    want = []
    for f in range(12):
        acc = F(x[0, f])
        for p in range(1, 32):
            acc = FOLD[op](acc, F(x[p, f]))
        want.append(acc)
    assert_same(m.read(dst), np.array(want, F), F32)


# -- GpSimdE index arithmetic ---------------------------------------------------------------------

def affine(p, idx, base, partition_step, steps):
    """The spec's int32 expression on Python ints, wrapped to int32."""
    v = base + p * partition_step + sum(i * s for i, s in zip(idx, steps))
    return (v + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize("dtype", [DType.INT32, F32, BF16, DType.INT8, DType.UINT8], ids=lambda d: d.text)
def test_iota_writes_the_wrapped_int32_expression(dtype):
    shape = (6, 3, 5)
    base, partition_step, steps = 2**31 - 40, 7, (1000, -3, 0, 0)    # wraps past 2^31 - 1
    dst = onchip(dtype, shape, offset=64)
    m = execute(Instruction.make("iota", dst=dst, base=base, partition_step=partition_step, steps=steps))
    v = np.array([affine(p, (i, j), base, partition_step, steps) for p, i, j in itertools.product(*map(range, shape))],
                 dtype=np.int64).reshape(shape)
    want = v.astype(np.int32) if dtype is DType.INT32 else cast(v.astype(np.int32).astype(F), dtype)
    assert_same(m.read(dst), want, dtype)


def test_random_draws_the_counter_of_each_element_under_the_stream_key():
    """(2 (h >> 9) + 1) 2^-24 of h = rand(rand(S, stream, 0), 0, v), from the spec's hash written out here."""
    def fmix(h):
        for shift, mul in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
            h = (h ^ (h >> shift)) * mul % 2**32
        return h ^ (h >> 16)

    def rand(s, p, e):
        return fmix((s * 0x9E3779B1 + p * 0x85EBCA77 + e * 0xC2B2AE3D) % 2**32)

    shape, seed, stream = (5, 3, 4), -123456, 2**32 - 3
    base, partition_step, steps = 2**31 - 20, 12, (4, -1, 0, 0)    # the counters wrap past 2^31 - 1
    dst = onchip(F32, shape, offset=64)
    seed_ap = onchip(DType.INT32, (1, 1), offset=4096)
    m = execute(Instruction.make("random", dst=dst, seed=seed_ap, stream=stream, base=base,
                                 partition_step=partition_step, steps=steps),
                writes=[(seed_ap, np.array([[seed]], dtype=np.int32))])
    key = rand(seed % 2**32, stream, 0)
    want = [(2 * (rand(key, 0, affine(p, (i, j), base, partition_step, steps) % 2**32) >> 9) + 1) * 2.0**-24
            for p, i, j in itertools.product(*map(range, shape))]
    assert_same(m.read(dst), np.array(want, dtype=F).reshape(shape), F32)


@pytest.mark.parametrize("cmp", [AluOp.EQ, AluOp.NE, AluOp.LT, AluOp.LE, AluOp.GT, AluOp.GE], ids=lambda c: c.text)
def test_affine_select_keeps_src_where_the_expression_compares_true(cmp):
    rng = np.random.default_rng(47)
    shape = (8, 4, 6)
    x = finite(BF16, shape, rng)
    base, partition_step, steps = -5, 2, (-1, 1, 0, 0)
    src, dst = onchip(BF16, (8, 24)), onchip(F32, shape, offset=256)
    ins = Instruction.make("affine_select", dst=dst, src=src, cmp=cmp, fill=-1e30, base=base,
                           partition_step=partition_step, steps=steps)
    m = execute(ins, [(src, x.reshape(8, 24))])
    compare = {AluOp.EQ: np.equal, AluOp.NE: np.not_equal, AluOp.LT: np.less, AluOp.LE: np.less_equal,
               AluOp.GT: np.greater, AluOp.GE: np.greater_equal}[cmp]
    v = np.array([affine(p, (i, j), base, partition_step, steps) for p, i, j in itertools.product(*map(range, shape))])
    assert_same(m.read(dst), np.where(compare(v.reshape(shape), 0), widen(x), F(-1e30)), F32)


def test_affine_select_builds_a_causal_mask():
    x = np.ones((16, 16), F)
    src, dst = onchip(F32, (16, 16)), onchip(F32, (16, 16), offset=128)
    ins = Instruction.make("affine_select", dst=dst, src=src, cmp=AluOp.GE, fill=float("-inf"), partition_step=1,
                           steps=(-1, 0, 0, 0))   # keep where p - i >= 0
    got = execute(ins, [(src, x)]).read(dst)
    assert np.array_equal(got, np.where(np.tril(np.ones((16, 16), bool)), F(1), F(-np.inf)))


# -- gather and MX quantization ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", VALUES, ids=lambda d: d.text)
def test_dma_gather_moves_rows_bit_for_bit(dtype):
    rng = np.random.default_rng(48)
    table = any_codes(dtype, (20, 6), rng)
    rows = rng.integers(0, 20, size=(12, 1), dtype=np.int32)
    index, dst = onchip(DType.INT32, (12, 1)), onchip(dtype, (12, 2, 3), offset=64)
    ins = Instruction.make("dma_gather", dst=dst, table=AP(Mem.HBM, dtype, 20, ((1, 6),), tensor=0, partition_stride=6),
                           index=index)
    m = execute(ins, [(index, rows)], tensors=(TensorDecl("t", TensorKind.INPUT, dtype, (20, 6)),),
                binds={"t": table})
    assert_same(m.read(dst), table[rows[:, 0]], dtype)


@pytest.mark.parametrize("elem", [E4M3, E5M2, FP4], ids=lambda d: d.text)
@pytest.mark.parametrize("mode", list(ScaleMode), ids=lambda m: m.text)
def test_quantize_mx_writes_codes_and_one_scale_per_32_partitions(elem, mode):
    rng = np.random.default_rng(49)
    x = finite(BF16, (64, 10), rng, spread=20)
    x[40, 3] = np.nan
    src = onchip(BF16, (64, 2, 5))
    dst, scale = onchip(elem, (64, 10), offset=128), onchip(E8M0, (2, 10), offset=256, start=32)
    m = execute(Instruction.make("quantize_mx", dst=dst, scale=scale, src=src, scale_mode=mode),
                [(src, x.reshape(64, 2, 5))], target="trn3")
    codes, scales = quantize_mx(widen(x), elem, mode)
    assert_same(m.read(dst), codes, elem)
    assert np.array_equal(m.read(scale).view(np.uint8), scales.astype(np.uint8))
    assert m.read(scale).view(np.uint8)[1, 3] == 0xFF     # the NaN's block


def test_quantize_mx_golden_blocks():
    """Blocks with known results (precision.md 2, torchao golden cases), e4m3 elements, OCP floor scale."""
    x = np.ones((96, 3), F)
    x[32:64, 1] = 0.5
    x[40, 1] = 480.0          # amax 480: scale 0x7F, 480 clamps to 448 (0x7E)
    x[64:, 2] = 0.0           # an all-zero block: scale 0, codes 0
    src, dst, scale = onchip(F32, (96, 3)), onchip(E4M3, (96, 3), offset=64), onchip(E8M0, (3, 3), offset=128)
    m = execute(Instruction.make("quantize_mx", dst=dst, scale=scale, src=src), [(src, x)], target="trn3")
    scales, codes = m.read(scale).view(np.uint8), m.read(dst).view(np.uint8)
    assert scales[0, 0] == 0x77 and (codes[:32, 0] == 0x78).all()    # 1.0 blocks: 2^(127-8-127), 1.0 * 2^8
    assert scales[1, 1] == 0x7F and codes[40, 1] == 0x7E
    assert scales[2, 2] == 0 and (codes[64:, 2] == 0).all()
