"""The JIT's register-blocked matmul against the reference interpreter, bit for bit, across shapes and layouts.

runtime/jit/kernels_pe.py blocks matmul into micro-kernels of MR rows x NR columns and widens its inputs
into fp32 buffers first, so what can go wrong lies at the edges: M and N that are not multiples of the
blocking (and smaller than it), K shorter than the unrolled k loop, every input dtype (and fp8 double_row),
accumulate on and off, and operands whose free dims are strided, reversed or split into two dims that do
not merge. The cases below cover the grid M in {1, 5, 64, 128}, N in {1, 7, 16, 100, 512}, K in {1, 3,
128} with drawn dtypes and layouts (a seeded generator, so every run sees the same cases); values span many
binades and include zeros, infinities, NaNs and raw bit patterns. Results must match the reference bit for
bit (NaN by class), and no other byte of SBUF or PSUM may change.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from trnc.isa import AP, DType, Engine, Instruction, Mem, Program, get_target
from trnc.isa.verify import verify
from trnc.runtime.convert import bits_equal_or_both_nan, from_fp32
from trnc.runtime.jit import kernels_pe
from trnc.runtime.jit.codegen import Codegen
from trnc.runtime.jit.executor import JitProgram, Kernels
from trnc.runtime.jit.kernels import KernelSig, build_kernel, layout_of
from trnc.runtime.reference import Machine

pytestmark = pytest.mark.usefixtures("private_cache")

TARGET = "trn2"     # has fp8 double_row
HW = get_target(TARGET)
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=np.float32)
INPUT_DTYPES = (DType.BF16, DType.FP16, DType.FP8_E4M3, DType.FP8_E5M2)
FORMS = ("contiguous", "strided", "reversed", "split")
MOVING_AT = 8192    # SBUF byte offset of moving (stationary starts at 0)


def random_values(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """n storage values: normal values over many binades, some specials, some raw bit patterns."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-24, 24, n))).astype(np.float32)
    x = np.where(rng.random(n) < 0.03, rng.choice(SPECIALS, n), x)
    codes = from_fp32(x, dtype).view(UINT[dtype.itemsize])
    raw = rng.integers(0, 2 ** (8 * dtype.itemsize), n, dtype=np.uint64).astype(UINT[dtype.itemsize])
    return np.where(rng.random(n) < 0.05, raw, codes).view(dtype.storage)


def free_dims(count: int, form: str) -> tuple[tuple[int, int], ...]:
    """Element strides of `count` elements: contiguous, every other element, reversed, or two dims that
    do not merge (element (i, j) of [2, count/2] at i + 2 * j)."""
    if form == "split" and count % 2 == 0 and count > 2:
        return ((1, 2), (2, count // 2))
    return {"strided": ((2, count),), "reversed": ((-1, count),)}.get(form, ((1, count),))


def place(mem: Mem, dtype: DType, partitions: int, dims, lowest: int) -> AP:
    """An AP whose lowest byte is `lowest` (the offset moves up past any negative strides)."""
    back = sum(-s * (c - 1) for s, c in dims if s < 0)
    return AP(mem, dtype, partitions, tuple(dims), offset=lowest + back * dtype.itemsize)


def matmul(k: int, m: int, n: int, st_dtype: DType, mv_dtype: DType, accumulate: bool, double_row: bool,
           forms: tuple[str, str, str]) -> Instruction:
    st_form, mv_form, dst_form = forms
    st_dims, mv_dims = free_dims(m, st_form), free_dims(n, mv_form)
    if double_row:   # the row-group dim first, as [K, 2, X]
        st_span = max(abs(s) * (c - 1) for s, c in st_dims) + 1
        mv_span = max(abs(s) * (c - 1) for s, c in mv_dims) + 1
        st_dims, mv_dims = ((st_span, 2),) + st_dims, ((mv_span, 2),) + mv_dims
    dst_dims = free_dims(n, "contiguous" if dst_form == "strided" else dst_form)   # one PSUM bank: no gaps
    return Instruction.make("matmul", Engine.PE, dst=place(Mem.PSUM, DType.FP32, m, dst_dims, 0),
                            stationary=place(Mem.SBUF, st_dtype, k, st_dims, 0),
                            moving=place(Mem.SBUF, mv_dtype, k, mv_dims, MOVING_AT),
                            accumulate=accumulate, double_row=double_row)


def cases() -> list:
    """A seeded draw over the grid: per (K, M, N) fp32, any input dtypes, or fp8 (mostly double_row)."""
    rng = np.random.default_rng(2024)
    out = []
    for i, (k, m, n) in enumerate((k, m, n) for k in (1, 3, 128) for m in (1, 5, 64, 128) for n in (1, 7, 16, 100, 512)):
        if i % 3 == 0:
            st_dtype = mv_dtype = DType.FP32
        elif i % 3 == 1:
            st_dtype, mv_dtype = (INPUT_DTYPES[j] for j in rng.integers(0, len(INPUT_DTYPES), 2))
        else:
            st_dtype, mv_dtype = (INPUT_DTYPES[j] for j in rng.integers(2, len(INPUT_DTYPES), 2))
        double_row = st_dtype.is_fp8 and mv_dtype.is_fp8 and bool(rng.random() < 0.7)
        forms = tuple(str(f) for f in rng.choice(FORMS, 3))
        out.append(pytest.param(k, m, n, st_dtype, mv_dtype, bool(rng.random() < 0.5), double_row, forms,
                                int(rng.integers(0, 2**32)), id=f"k{k}-m{m}-n{n}-{st_dtype.text}-{mv_dtype.text}"
                                f"{'-dr' if double_row else ''}-{'-'.join(forms)}"))
    return out


_TABLES: dict[int, Kernels] = {}


@pytest.fixture(params=sorted(kernels_pe.BLOCKINGS), ids=lambda lanes: f"{lanes}lanes")
def kernel_table(request, monkeypatch) -> Kernels:
    """A kernel table whose matmul uses the blocking for `lanes` fp32 lanes, whatever the host's width: both
    are correct on any host (LLVM splits or joins the vectors), and CI may run on either kind."""
    lanes = request.param
    monkeypatch.setattr(kernels_pe, "blocking", lambda: kernels_pe.BLOCKINGS[lanes])
    if lanes not in _TABLES:
        _TABLES[lanes] = Kernels()
    return _TABLES[lanes]


@pytest.mark.parametrize("k, m, n, st_dtype, mv_dtype, accumulate, double_row, forms, seed", cases())
def test_matmul_matches_the_reference(k, m, n, st_dtype, mv_dtype, accumulate, double_row, forms, seed,
                                      kernel_table):
    ins = matmul(k, m, n, st_dtype, mv_dtype, accumulate, double_row, forms)
    rng = np.random.default_rng(seed)
    inputs = {name: random_values(rng, ins[name].dtype, ins[name].num_elements) for name in ("stationary", "moving", "dst")}
    assert_matches_the_reference(ins, inputs, kernel_table)


def assert_matches_the_reference(ins: Instruction, inputs: dict[str, np.ndarray], kernel_table: Kernels) -> np.ndarray:
    """The JIT's dst equals the reference's bit for bit (NaN by class), and no other byte differs; returns the
    reference's dst."""
    program = Program((), (ins,), TARGET)
    verify(program)
    ref = Machine(program)
    for name, values in inputs.items():
        ref.write(ins[name], values.reshape(ins[name].shape))
    jit = Machine(program)
    jit.sbuf, jit.psum = ref.sbuf.copy(), ref.psum.copy()
    ref.execute(ins)
    JitProgram(program, verified=True, table=kernel_table).execute(jit.sbuf, jit.psum, [])
    want, got = ref.read(ins["dst"]), jit.read(ins["dst"])
    same = bits_equal_or_both_nan(got, want, DType.FP32)
    assert same.all(), f"{int((~same).sum())} of {same.size} dst elements differ, first at {np.argwhere(~same)[0]}"
    jit.write(ins["dst"], want)      # NaN payloads may differ; every byte must agree after this
    assert np.array_equal(jit.psum, ref.psum) and np.array_equal(jit.sbuf, ref.sbuf)
    return want


def test_the_micro_kernel_keeps_its_accumulators_in_registers():
    """After O3, the micro-kernel's k loop carries MR x NR/L <L x float> accumulators (L the host's fp32 lanes)
    as phi nodes, advances each by one llvm.fma per k step, and stores nothing: no accumulator goes through
    memory inside the loop, and no product is rounded apart from its sum."""
    ins = matmul(128, 128, 512, DType.FP32, DType.FP32, True, False, ("contiguous",) * 3)
    sig = KernelSig("matmul", tuple((name, layout_of(ins[name], HW)) for name in ("dst", "stationary", "moving")),
                    (("accumulate", True), ("double_row", False)))
    text = str(Codegen().optimize(build_kernel(sig)))
    loop = re.search(r"\nkk\.body:.*?\n\n", text, re.S)
    assert loop is not None, "no micro-kernel loop in the optimized kernel"
    body = loop.group(0)
    bl = kernels_pe.blocking()
    accumulators = bl.mr * bl.nr // bl.lanes
    assert body.count(f"phi <{bl.lanes} x float>") == accumulators
    assert body.count(f"@llvm.fma.v{bl.lanes}f32(") == accumulators * kernels_pe.UNROLL
    assert " store " not in body and " fmul " not in body and " fadd " not in body


# -- one rounding per multiply-add ---------------------------------------------------------------------

def one_product(dtype: DType, s: float, v: float, acc: float) -> tuple[Instruction, dict[str, np.ndarray]]:
    """A K = 1 matmul of 1 x 16 accumulating s * v into acc, every column the same."""
    ins = matmul(1, 1, 16, dtype, dtype, True, False, ("contiguous",) * 3)
    return ins, {"stationary": from_fp32(np.array([s], np.float32), dtype),
                 "moving": from_fp32(np.full(16, v, np.float32), dtype),
                 "dst": np.full(16, acc, np.float32)}


@pytest.mark.parametrize("dtype, s, v, acc", [
    (DType.FP32, 1 + 2.0 ** -12, 1 + 2.0 ** -12, -1.0),   # s * v = 1 + 2^-11 + 2^-24 does not fit 24 bits
    (DType.BF16, 1.25 * 2.0 ** -74, 2.0 ** -75, 2.0 ** -125),   # s * v = 1.25 x 2^-149, below fp32's subnormals
    (DType.BF16, 2.0 ** 64, 2.0 ** 64, float(-np.finfo(np.float32).max)),   # s * v = 2^128, past fp32's range
], ids=["fp32-product", "subnormal-product", "overflowing-product"])
def test_products_that_do_not_fit_fp32_are_added_unrounded(dtype, s, v, acc, kernel_table):
    """Where fp32(s * v) is not s * v, rounding the product before the add would give other bits: the kernel
    must give the one rounding of acc + s * v (exact in float64 here), as the reference does."""
    with np.errstate(over="ignore"):
        separate = np.float32(np.float32(acc) + np.float32(np.float32(s) * np.float32(v)))
    fused = np.float32(np.float64(acc) + np.float64(s) * np.float64(v))
    assert not bits_equal_or_both_nan(np.array([separate]), np.array([fused]), DType.FP32).all()
    ins, inputs = one_product(dtype, s, v, acc)
    want = assert_matches_the_reference(ins, inputs, kernel_table)
    assert bits_equal_or_both_nan(want, np.full(16, fused), DType.FP32).all()
