"""The numerics algorithms run on the llvmlite backend (runtime/jit/llvm_ops.py) give the numpy reference's bits.

Each case builds a one-loop LLVM function `void f(in0*, in1*, ..., out*, i64 n)` whose body is the
algorithm emitted by LLVMOps, compiles it at -O2 for the host (loop vectorizer on) and compares its
output over large inputs with the same algorithm on NumpyOps: fp32 results bit for bit with NaN
compared by class (LLVM does not fix NaN payloads), integer-only algorithms (loads, stores, the SR
hash, MX scale codes) bit for bit.
"""
from __future__ import annotations

import ctypes
import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from trnc.isa.dtypes import MX_FORMATS, DType
from trnc.isa.enums import ActFunc, AluOp, ReduceOp, Rounding, ScaleMode
from trnc.runtime import convert, fp32math, mx
from trnc.runtime.convert import bits_equal_or_both_nan
from trnc.runtime.jit.llvm_ops import LLVMOps, ir_type
from trnc.runtime.ops_numpy import F32, F64, NP, U8, U32

llvm.initialize_native_target()
llvm.initialize_native_asmprinter()

_TM = llvm.Target.from_default_triple().create_target_machine(
    cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
_COMPILED: dict[str, tuple] = {}  # name -> (engine kept alive, ctypes function, optimized IR text)


def _build(name: str, in_types, out_type, body) -> str:
    """IR text of `void name(ptr in..., ptr out, i64 n)`: out[i] = body(o, in0[i], ...) for i < n."""
    module = ir.Module(name=name)
    module.triple = llvm.get_process_triple()
    i64 = ir.IntType(64)
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * (len(in_types) + 1) + [i64]), name=name)
    for arg in fn.args[:-1]:
        arg.add_attribute("noalias")
    entry, loop, done = fn.append_basic_block("entry"), fn.append_basic_block("loop"), fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    n = fn.args[-1]
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(i64, name="i")
    i.add_incoming(ir.Constant(i64, 0), entry)
    o = LLVMOps(b)
    args = [o.value(b.load(b.gep(p, [i], source_etype=ir_type(t)), typ=ir_type(t)), t)
            for p, t in zip(fn.args, in_types)]
    out = body(o, *args)
    assert out.dtype == out_type, (name, out.dtype, out_type)
    b.store(out.ir, b.gep(fn.args[len(in_types)], [i], source_etype=ir_type(out_type)))
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return str(module)


def _compile(name: str, in_types, out_type, body):
    """The compiled function and its optimized IR, compiled once per name for the whole test module."""
    if name not in _COMPILED:
        mod = llvm.parse_assembly(_build(name, in_types, out_type, body))
        mod.data_layout = str(_TM.target_data)
        mod.verify()
        pto = llvm.PipelineTuningOptions(speed_level=2)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(_TM, pto)
        pb.getModulePassManager().run(mod, pb)
        mod.verify()
        engine = llvm.create_mcjit_compiler(mod, _TM)
        engine.finalize_object()
        cfn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (len(in_types) + 1), ctypes.c_int64)(
            engine.get_function_address(name))
        _COMPILED[name] = (engine, cfn, str(mod))
    return _COMPILED[name]


def _run(name: str, in_types, out_type, body, *inputs: np.ndarray) -> np.ndarray:
    _, cfn, _ = _compile(name, in_types, out_type, body)
    arrays = [np.ascontiguousarray(np.broadcast_to(a, inputs[0].shape), dtype=t) for a, t in zip(inputs, in_types)]
    out = np.empty(inputs[0].shape, out_type)
    cfn(*[a.ctypes.data for a in arrays], out.ctypes.data, out.size)
    return out


def _numpy(body, *inputs: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(body(NP, *inputs))


# ---- inputs ------------------------------------------------------------------------------------------------

RNG = np.random.default_rng(2024)
SPECIAL_BITS = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF,
                         1, 0x80000001, 0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF,
                         0x3F000000, 0x40000000, 0x4B000000, 0x4B000001, 0x3EFFFFFF], np.uint32)


def _f32_inputs() -> np.ndarray:
    """Random fp32 bit patterns (NaNs, infinities, subnormals), every bf16 pattern widened (so every exponent
    with the round-to-bf16 ties), the special values and dense values in the functions' working ranges."""
    parts = [RNG.integers(0, 2 ** 32, 150_000, dtype=np.uint64).astype(np.uint32),
             np.arange(2 ** 16, dtype=np.uint32) << np.uint32(16),
             (np.arange(2 ** 16, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x8000),  # bf16 ties
             SPECIAL_BITS]
    dense = [RNG.uniform(-20, 20, 60_000), RNG.uniform(-130, 100, 30_000), RNG.standard_normal(30_000) * 3,
             np.exp2(RNG.uniform(-149, 128, 30_000)) * RNG.choice([-1.0, 1.0], 30_000), RNG.uniform(0.5, 2, 20_000)]
    return np.concatenate([p.view(np.float32) for p in parts] + [d.astype(np.float32) for d in dense])


X = _f32_inputs()
Y = RNG.permutation(X)
SPECIAL_VALUES = SPECIAL_BITS.view(np.float32)
GRID_A, GRID_B = (g.ravel() for g in np.meshgrid(SPECIAL_VALUES, np.concatenate(
    [SPECIAL_VALUES, np.array([2, -2, 3, -3, 0.5, -0.5, 2.5, 16777216, -16777215], np.float32)])))
POW_A = np.concatenate([RNG.uniform(0, 4, 40_000), np.exp2(RNG.uniform(-149, 128, 40_000)),
                        RNG.uniform(-10, 10, 20_000), 1 + RNG.uniform(-0.01, 0.01, 20_000)]).astype(np.float32)
POW_B = np.concatenate([RNG.uniform(-4, 4, 40_000), RNG.uniform(-100, 100, 40_000),
                        RNG.integers(-40, 40, 20_000), RNG.uniform(-1e4, 1e4, 20_000)]).astype(np.float32)


def _assert_same_f32(got: np.ndarray, want: np.ndarray, inputs, what) -> None:
    ok = bits_equal_or_both_nan(got.view(np.uint32).view(np.float32), want, DType.FP32)
    if not ok.all():
        i = int(np.argmin(ok))
        raise AssertionError(f"{what}: {int((~ok).sum())} differ, first at inputs "
                             f"{[hex(int(np.asarray(a).view(np.uint32)[i])) for a in inputs]}: "
                             f"llvm {got.view(np.uint32)[i]:#x} numpy {want.view(np.uint32)[i]:#x}")


def _assert_same_bits(got: np.ndarray, want: np.ndarray, what) -> None:
    diff = got != want
    assert not diff.any(), f"{what}: {int(diff.sum())} differ, first at {int(np.argmax(diff))}"


# ---- fp32math -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("func", list(ActFunc), ids=lambda f: f.text)
def test_activation_matches_numpy(func):
    def body(o, x):
        return fp32math.activation(o, func, x)
    got = _run(f"act_{func.text}", [F32], F32, body, X)
    _assert_same_f32(got, _numpy(body, X), [X], func.text)


@pytest.mark.parametrize("op", list(AluOp), ids=lambda op: op.text)
def test_alu_matches_numpy(op):
    def body(o, a, b):
        return fp32math.alu(o, op, a, b)
    for a, b in ((X, Y), (GRID_A, GRID_B)) + (((POW_A, POW_B),) if op is AluOp.POW else ()):
        got = _run(f"alu_{op.text}", [F32, F32], F32, body, a, b)
        _assert_same_f32(got, _numpy(body, a, b), [a, b], op.text)


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda op: op.text)
def test_fold_matches_numpy(op):
    def body(o, acc, x):
        return fp32math.fold(o, op, acc, x)
    got = _run(f"fold_{op.text}", [F32, F32], F32, body, X, Y)
    _assert_same_f32(got, _numpy(body, X, Y), [X, Y], op.text)


def test_the_exp_loop_is_vectorized():
    """The element loop of a kernel using an activation vectorizes (selects, no branches, vector intrinsics)."""
    _compile("act_exp", [F32], F32, lambda o, x: fp32math.activation(o, ActFunc.EXP, x))
    text = _COMPILED["act_exp"][2]
    assert re.search(r"<(4|8|16) x float>", text), "no vector fp32 operations in the optimized exp loop"
    assert not re.search(r"\bfma\b|fmuladd|\b(fast|contract|reassoc)\b", text), "fp contraction or fast-math"


# ---- conversions ------------------------------------------------------------------------------------------

def _all_raw(dtype: DType) -> np.ndarray:
    """Every storage pattern of a dtype of at most 16 bits; random patterns and the specials for 32-bit ones."""
    t = convert.raw_type(dtype)
    if t.itemsize <= 2:
        return np.arange(2 ** (8 * t.itemsize), dtype=np.uint32).astype(np.dtype(f"u{t.itemsize}")).view(t)
    return np.concatenate([RNG.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32),
                           SPECIAL_BITS]).view(t)


def _store_inputs(dtype: DType) -> np.ndarray:
    """X plus the rounding ties of `dtype` (midpoints of neighbouring values) and their fp32 neighbours,
    and values past the largest finite one, so RNE ties, overflow and saturation are all exercised."""
    if dtype.is_int:
        lo, hi = convert.INT_RANGE[dtype]
        k = np.concatenate([np.arange(max(lo, -300) - 3, min(hi, 300) + 3),
                            RNG.integers(-(2 ** 24), 2 ** 24, 20_000)]).astype(np.float64)
        mids = np.concatenate([k + 0.5, np.array([lo - 0.5, hi + 0.5, 2.0 ** 31, -(2.0 ** 31), 2.0 ** 31 - 128])])
    elif dtype is DType.FP32:
        mids = np.zeros(0)
    else:
        with np.errstate(all="ignore"):
            v = np.asarray(convert.load(NP, _all_raw(dtype), dtype)).astype(np.float64)
        v = np.unique(v[np.isfinite(v)])
        top = v[-1] * np.array([1.0625, 1.125, 1.5, 2.0])
        mids = np.concatenate([(v[:-1] + v[1:]) / 2, top, -top])
    with np.errstate(over="ignore"):
        m = mids.astype(np.float32)
    near = np.concatenate([m, np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(-np.inf))])
    return np.concatenate([X, near, -near])


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.text)
def test_load_matches_numpy(dtype):
    raw = _all_raw(dtype)
    def body(o, r):
        return convert.load(o, r, dtype)
    got = _run(f"load_{dtype.text}", [convert.raw_type(dtype)], F32, body, raw)
    _assert_same_bits(got.view(np.uint32), _numpy(body, raw).view(np.uint32), dtype.text)


@pytest.mark.parametrize("dtype", [d for d in DType if d is not DType.E8M0], ids=lambda d: d.text)
def test_store_rne_matches_numpy(dtype):
    x = _store_inputs(dtype)
    def body(o, v):
        return convert.store(o, v, dtype)
    got = _run(f"store_{dtype.text}", [F32], convert.raw_type(dtype), body, x)
    _assert_same_bits(got, _numpy(body, x), dtype.text)


@pytest.mark.parametrize("dtype", [d for d in DType if d.is_float], ids=lambda d: d.text)
def test_store_sr_matches_numpy(dtype):
    x = _store_inputs(dtype)
    r = RNG.integers(0, 2 ** 32, x.size, dtype=np.uint64).astype(np.uint32)
    r[:3000] = np.resize(np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF], np.uint32), 3000)
    def body(o, v, rand):
        return convert.store(o, v, dtype, Rounding.SR, rand)
    got = _run(f"store_sr_{dtype.text}", [F32, U32], convert.raw_type(dtype), body, x, r)
    _assert_same_bits(got, _numpy(body, x, r), dtype.text)


def test_rand_matches_numpy_and_sr_rand():
    seed, p, e = (RNG.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    def body(o, s, pp, ee):
        return convert.rand(o, s, pp, ee)
    got = _run("rand", [U32, U32, U32], U32, body, seed, p, e)
    _assert_same_bits(got, _numpy(body, seed, p, e), "rand")
    pp, ee = (g.ravel().astype(np.uint32) for g in np.meshgrid(np.arange(128), np.arange(300), indexing="ij"))
    grid = _run("rand", [U32, U32, U32], U32, body, np.full(pp.size, 77, np.uint32), pp, ee)
    _assert_same_bits(grid, convert.sr_rand(77, 128, 300).ravel(), "sr_rand")


# ---- MX ---------------------------------------------------------------------------------------------------

AMAX = np.concatenate([
    RNG.integers(0, 2 ** 31, 50_000, dtype=np.uint64).astype(np.uint32),
    ((np.arange(256, dtype=np.uint32)[:, None] << np.uint32(23))
     | np.array([0, 1, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF], np.uint32)[None, :]).ravel()])


@pytest.mark.parametrize("mode", list(ScaleMode), ids=lambda m: m.text)
@pytest.mark.parametrize("elem", list(MX_FORMATS), ids=lambda d: d.text)
def test_mx_scale_code_matches_numpy(elem, mode):
    def body(o, amax):
        return mx.scale_code(o, amax, elem, mode)
    got = _run(f"scale_{elem.text}_{mode.text}", [U32], U8, body, AMAX)
    _assert_same_bits(got, _numpy(body, AMAX), f"{elem.text} {mode.text}")


@pytest.mark.parametrize("elem", list(MX_FORMATS), ids=lambda d: d.text)
def test_mx_quantize_element_matches_numpy(elem):
    scale = np.resize(np.arange(256, dtype=np.uint8), X.size)
    RNG.shuffle(scale)
    def body(o, x, s):
        return mx.quantize_element(o, x, s, elem)
    got = _run(f"quantize_{elem.text}", [F32, U8], U8, body, X, scale)
    _assert_same_bits(got, _numpy(body, X, scale), elem.text)


def test_mx_amax_fold_and_e8m0_round_up_match_numpy():
    acc = RNG.permutation(np.resize(AMAX, X.size))
    got = _run("amax_fold", [U32, F32], U32, mx.amax_fold, acc, X)
    _assert_same_bits(got, _numpy(mx.amax_fold, acc, X), "amax_fold")
    got = _run("e8m0_round_up", [F32], U8, mx.e8m0_round_up_code, X)
    _assert_same_bits(got, _numpy(mx.e8m0_round_up_code, X), "e8m0_round_up")


def test_mx_block_factor_matches_numpy():
    sa, sb = (g.ravel().astype(np.uint8) for g in np.meshgrid(np.arange(256), np.arange(256)))
    got = _run("block_factor", [U8, U8], F64, mx.block_factor, sa, sb)
    want = _numpy(mx.block_factor, sa, sb)
    same = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got) & np.isnan(want))
    assert same.all() and np.isnan(want).sum() == 511


# ---- the interface's type rules -------------------------------------------------------------------------

def test_both_backends_refuse_mixed_types_and_poison():
    b = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f").append_basic_block())
    for o in (NP, LLVMOps(b)):
        with pytest.raises(TypeError, match="mixes f32 and f64"):
            o.add(o.f32(1), o.f64(1))
        with pytest.raises(TypeError, match="mixes i32 and u32"):
            o.shr(o.i32(-8), o.u32(1))
        with pytest.raises(TypeError, match="widen cannot convert u32 to u8"):
            o.widen(o.u32(1), U8)
        with pytest.raises(ValueError, match="does not fit"):
            o.const(2 ** 32, U32)
    with pytest.raises(TypeError, match="not a backend value"):
        NP.mul(np.float32(2), 2.0)
    with pytest.raises(ValueError, match="poison"):
        NP.shl(np.uint32(1), np.uint32(32))
    with pytest.raises(ValueError, match="poison"):
        NP.ftoi(np.array([1.0, np.nan], np.float32), np.dtype(np.int32))
