"""Element values inside kernels: the numeric algorithms of runtime/convert.py, fp32math.py and mx.py, in IR.

Kernels hold plain llvmlite values (float for fp32, iN for storage bits); this module wraps them as the
typed values of runtime/jit/llvm_ops.py, runs the one shared algorithm (the same sequence the numpy
reference runs, hence bit-exact), and unwraps the result. It is the only place kernels meet the backend.
"""
from __future__ import annotations

from llvmlite import ir

from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc, AluOp, ReduceOp, Rounding, ScaleMode
from trnc.runtime import convert, fp32math, mx
from trnc.runtime.jit.kernels import KernelBuilder
from trnc.runtime.jit.llvm_ops import LLVMOps, Val
from trnc.runtime.ops_numpy import F32, I32, U8, U32


def _ops(kb: KernelBuilder) -> LLVMOps:
    return LLVMOps(kb.b)


def _f32(kb: KernelBuilder, x: ir.Value) -> Val:
    return _ops(kb).value(x, F32)


def load_f32(kb: KernelBuilder, base, offset, dtype: DType) -> ir.Value:
    """fp32(x) of the element at base + offset bytes (spec "Reading")."""
    o = _ops(kb)
    raw = o.value(kb.load_bits(base, offset, dtype), convert.raw_type(dtype))
    return convert.load(o, raw, dtype).ir


def store_f32(kb: KernelBuilder, x: ir.Value, base, offset, dtype: DType, rounding: Rounding = Rounding.RNE,
              rand: Val | None = None) -> None:
    """Store convert(x, dtype) at base + offset bytes (spec "Writing"); `rand` is R of the element for SR."""
    raw = convert.store(_ops(kb), _f32(kb, x), dtype, rounding, rand)
    kb.store_bits(raw.ir, base, offset, dtype)


def sr_rand(kb: KernelBuilder, seed: ir.Value, p: ir.Value, e: ir.Value) -> Val:
    """The spec's R(seed, p, e) from i64 seed, partition and free element index (each taken mod 2^32)."""
    return convert.rand(_ops(kb), *(_u32(kb, v) for v in (seed, p, e)))


def _u32(kb: KernelBuilder, v: ir.Value) -> Val:
    """An integer value taken mod 2^32, as a U32 backend value."""
    return _ops(kb).value(kb.b.trunc(v, ir.IntType(32)) if v.type != ir.IntType(32) else v, U32)


def random_key(kb: KernelBuilder, seed: ir.Value, stream: ir.Value) -> Val:
    """The `random` instruction's key R(seed, stream, 0)."""
    return convert.random_key(_ops(kb), _u32(kb, seed), _u32(kb, stream))


def uniform(kb: KernelBuilder, key: Val, counter: ir.Value) -> ir.Value:
    """The uniform draw (fp32) of an i32 counter under `key`."""
    return convert.uniform(_ops(kb), key, _u32(kb, counter)).ir


def int32_to_f32(kb: KernelBuilder, v: ir.Value) -> ir.Value:
    """fp32 of an i32 value, as reading an int32 element (round to nearest even above 2^24)."""
    o = _ops(kb)
    return convert.load(o, o.value(v, I32), DType.INT32).ir


def alu(kb: KernelBuilder, op: int, a: ir.Value, b: ir.Value) -> ir.Value:
    return fp32math.alu(_ops(kb), AluOp(op), _f32(kb, a), _f32(kb, b)).ir


def activation(kb: KernelBuilder, func: int, x: ir.Value) -> ir.Value:
    return fp32math.activation(_ops(kb), ActFunc(func), _f32(kb, x)).ir


def fold(kb: KernelBuilder, op: int, acc: ir.Value, x: ir.Value) -> ir.Value:
    return fp32math.fold(_ops(kb), ReduceOp(op), _f32(kb, acc), _f32(kb, x)).ir


def add(kb: KernelBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    return _ops(kb).add(_f32(kb, a), _f32(kb, b)).ir


def mul(kb: KernelBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    return _ops(kb).mul(_f32(kb, a), _f32(kb, b)).ir


def nonzero(kb: KernelBuilder, x: ir.Value) -> ir.Value:
    """x != 0 as i1, true for NaN (numpy's !=)."""
    o = _ops(kb)
    return o.ne(_f32(kb, x), o.f32(0.0)).ir


def f32(kb: KernelBuilder, value: float) -> ir.Value:
    return _ops(kb).f32(value).ir


def u32(kb: KernelBuilder, value: int) -> ir.Value:
    return _ops(kb).u32(value).ir


def amax_fold(kb: KernelBuilder, acc: ir.Value, x: ir.Value) -> ir.Value:
    o = _ops(kb)
    return mx.amax_fold(o, o.value(acc, U32), _f32(kb, x)).ir


def scale_code(kb: KernelBuilder, amax: ir.Value, elem: DType, mode: int) -> ir.Value:
    o = _ops(kb)
    return mx.scale_code(o, o.value(amax, U32), elem, ScaleMode(mode)).ir


def quantize_element(kb: KernelBuilder, x: ir.Value, scale: ir.Value, elem: DType) -> ir.Value:
    o = _ops(kb)
    return mx.quantize_element(o, _f32(kb, x), o.value(scale, U8), elem).ir


def scaled_block_sum(kb: KernelBuilder, part: ir.Value, s_a: ir.Value, s_b: ir.Value) -> ir.Value:
    """matmul_mx's fp32(f64(part) * 2^(s_a + s_b - 254)) for u8 scale codes, NaN when either is 0xFF."""
    o = _ops(kb)
    factor = mx.block_factor(o, o.value(s_a, U8), o.value(s_b, U8))
    return o.narrow(o.mul(o.widen(_f32(kb, part), factor.dtype), factor), F32).ir
