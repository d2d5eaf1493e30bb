"""The llvmlite numerics backend: the algorithms of runtime/convert.py, fp32math.py and mx.py emitted as LLVM IR.

Each algorithm is written once against the backend interface of runtime/ops_numpy.py; `LLVMOps`
implements that interface on scalar IR values inside an `ir.IRBuilder`, emitting one instruction per
call, so a kernel computes exactly the numpy reference's operation sequence. The sequence is
branch-free (selects, no calls but the vectorizable `llvm.sqrt` and `llvm.rint`), so a kernel's
element loop vectorizes. Floating-point instructions carry no fast-math flags, hence no
contraction into FMA and no reassociation; LLVM keeps IEEE results exactly, and only NaN payloads
may differ from numpy (the spec compares NaN by class).

What a kernel author calls (`o = LLVMOps(builder)`; values are `Val`s, types are the numpy dtypes
F32, F64, I32, U32, U16, U8, I8, BOOL of runtime/ops_numpy.py):

    o.value(ir_value, dtype) -> Val            wrap a loaded IR scalar; `.ir` gives the IR value back
    ir_type(dtype) -> ir.Type                  the IR type of a backend type (U32 and I32 are both i32)
    convert.raw_type(dtype) -> dtype           the storage type of a DType element (FP32 u32, BF16 u16,
                                               fp8/fp4/e8m0/uint8 u8, int8 i8, int32 i32)
    convert.load(o, raw, dtype) -> F32         fp32(x) of one storage element (raw: raw_type(dtype))
    convert.store(o, x, dtype, rounding=RNE, rand=None) -> raw_type(dtype)
                                               convert(x, dtype); rand: U32 R of the element for SR
    convert.rand(o, seed, p, e) -> U32         the spec's SR hash R(S, p, e) of U32 seed, partition, element
    fp32math.activation(o, func, x) -> F32     ActFunc func of F32 x
    fp32math.alu(o, op, a, b) -> F32           AluOp op of F32 a, b
    fp32math.fold(o, op, acc, x) -> F32        one ReduceOp step acc = op(acc, x)
    mx.amax_fold(o, acc, x) -> U32             block amax step on |x| bits (F32 x, U32 acc from o.u32(0))
    mx.scale_code(o, amax, elem, mode) -> U8   the block's E8M0 scale from the amax bits, per ScaleMode
    mx.quantize_element(o, x, scale, elem) -> U8   one MX element code of F32 x under the U8 scale code
    mx.e8m0_round_up_code(o, d) -> U8          smallest E8M0 code >= |d| (F32 d)
    mx.block_factor(o, s_a, s_b) -> F64        matmul_mx's exact 2^(s_a + s_b - 254) (U8 codes), NaN on 0xFF
    o.narrow(o.mul(o.widen(acc, F64), factor), F32)   e.g. matmul_mx's one rounding of a scaled block sum

Kernels may also use the primitive operations directly (o.add, o.select, o.bitcast, ...; see
NumpyOps for their exact meaning): the same type rules apply (no implicit promotion, TypeError on
mixing), and what is poison in LLVM (shift amounts outside [0, bits), ftoi of NaN or out of range)
is the caller's duty, which the numpy reference checks on every run.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from trnc.runtime.ops_numpy import (
    BOOL, F32, F64, FLOATS, I8, I32, NP, U8, U16, U32, check_conversion, operand_type, type_name,
)

IR_TYPES = {F32: ir.FloatType(), F64: ir.DoubleType(), I32: ir.IntType(32), U32: ir.IntType(32),
            U16: ir.IntType(16), U8: ir.IntType(8), I8: ir.IntType(8), BOOL: ir.IntType(1)}
SIGNED = frozenset({I32, I8})


def ir_type(dtype) -> ir.Type:
    """The LLVM type of a backend value type (signedness lives in the backend type, not in LLVM's)."""
    return IR_TYPES[np.dtype(dtype)]


class Val:
    """A scalar IR value with its backend type (needed because i32 holds both I32 and U32)."""

    __slots__ = ("ir", "dtype")

    def __init__(self, value: ir.Value, dtype: np.dtype):
        self.ir = value
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"Val({type_name(self.dtype)}: {self.ir})"


class LLVMOps:
    """Backend emitting scalar LLVM IR through `builder`, one instruction (or intrinsic call) per operation."""

    def __init__(self, builder: ir.IRBuilder):
        self.b = builder

    def value(self, value: ir.Value, dtype) -> Val:
        dtype = np.dtype(dtype)
        if value.type != ir_type(dtype):
            raise TypeError(f"IR value of type {value.type} cannot be a {type_name(dtype)}")
        return Val(value, dtype)

    # ---- constants -----------------------------------------------------------------------------------

    def const(self, value: float | int | bool, dtype) -> Val:
        """A constant, rounded or range-checked exactly as the numpy backend does."""
        v = NP.const(value, dtype)
        dtype = v.dtype
        if dtype in FLOATS:
            return Val(ir.Constant(IR_TYPES[dtype], float(v)), dtype)
        n = int(v)
        if dtype != BOOL and n >= 1 << (dtype.itemsize * 8 - 1):  # unsigned constants as their signed pattern
            n -= 1 << (dtype.itemsize * 8)
        return Val(ir.Constant(IR_TYPES[dtype], n), dtype)

    def f32(self, value: float) -> Val:
        return self.const(value, F32)

    def f64(self, value: float) -> Val:
        return self.const(value, F64)

    def i32(self, value: int) -> Val:
        return self.const(value, I32)

    def u32(self, value: int) -> Val:
        return self.const(value, U32)

    # ---- arithmetic ----------------------------------------------------------------------------------

    def _arith(self, op: str, a: Val, b: Val, float_inst, int_inst) -> Val:
        t = operand_type(op, a.dtype, b.dtype)
        return Val((float_inst if t in FLOATS else int_inst)(a.ir, b.ir), t)

    def add(self, a: Val, b: Val) -> Val:
        return self._arith("add", a, b, self.b.fadd, self.b.add)

    def sub(self, a: Val, b: Val) -> Val:
        return self._arith("sub", a, b, self.b.fsub, self.b.sub)

    def mul(self, a: Val, b: Val) -> Val:
        return self._arith("mul", a, b, self.b.fmul, self.b.mul)

    def div(self, a: Val, b: Val) -> Val:
        return self._arith("div", a, b, self.b.fdiv, None)

    def neg(self, a: Val) -> Val:
        return Val(self.b.fneg(a.ir), operand_type("neg", a.dtype))

    def _intrinsic(self, op: str, name: str, a: Val) -> Val:
        t = operand_type(op, a.dtype)
        fn = self.b.module.declare_intrinsic(name, [IR_TYPES[t]])
        return Val(self.b.call(fn, [a.ir]), t)

    def sqrt(self, a: Val) -> Val:
        return self._intrinsic("sqrt", "llvm.sqrt", a)

    def rint(self, a: Val) -> Val:
        """llvm.rint: round to integral in the default (nearest-even) rounding mode."""
        return self._intrinsic("rint", "llvm.rint", a)

    # ---- bits and masks ------------------------------------------------------------------------------

    def and_(self, a: Val, b: Val) -> Val:
        return Val(self.b.and_(a.ir, b.ir), operand_type("and", a.dtype, b.dtype))

    def or_(self, a: Val, b: Val) -> Val:
        return Val(self.b.or_(a.ir, b.ir), operand_type("or", a.dtype, b.dtype))

    def xor(self, a: Val, b: Val) -> Val:
        return Val(self.b.xor(a.ir, b.ir), operand_type("xor", a.dtype, b.dtype))

    def not_(self, m: Val) -> Val:
        return Val(self.b.not_(m.ir), operand_type("not", m.dtype))

    def shl(self, a: Val, s: Val) -> Val:
        return Val(self.b.shl(a.ir, s.ir), operand_type("shl", a.dtype, s.dtype))

    def shr(self, a: Val, s: Val) -> Val:
        """lshr for unsigned types, ashr for signed ones."""
        t = operand_type("shr", a.dtype, s.dtype)
        return Val((self.b.ashr if t in SIGNED else self.b.lshr)(a.ir, s.ir), t)

    # ---- comparisons and select ----------------------------------------------------------------------

    def _cmp(self, op: str, sym: str, a: Val, b: Val, unordered: bool = False) -> Val:
        t = operand_type(op, a.dtype, b.dtype)
        if t in FLOATS:
            inst = self.b.fcmp_unordered if unordered else self.b.fcmp_ordered
        else:
            inst = self.b.icmp_signed if t in SIGNED else self.b.icmp_unsigned
        return Val(inst(sym, a.ir, b.ir), BOOL)

    def lt(self, a: Val, b: Val) -> Val:
        return self._cmp("lt", "<", a, b)

    def le(self, a: Val, b: Val) -> Val:
        return self._cmp("le", "<=", a, b)

    def gt(self, a: Val, b: Val) -> Val:
        return self._cmp("gt", ">", a, b)

    def ge(self, a: Val, b: Val) -> Val:
        return self._cmp("ge", ">=", a, b)

    def eq(self, a: Val, b: Val) -> Val:
        return self._cmp("eq", "==", a, b)

    def ne(self, a: Val, b: Val) -> Val:
        """une for floats (true on NaN, like numpy's !=)."""
        return self._cmp("ne", "!=", a, b, unordered=True)

    def isnan(self, a: Val) -> Val:
        operand_type("isnan", a.dtype)
        return Val(self.b.fcmp_unordered("uno", a.ir, a.ir), BOOL)

    def select(self, m: Val, a: Val, b: Val) -> Val:
        operand_type("select mask", m.dtype)
        return Val(self.b.select(m.ir, a.ir, b.ir), operand_type("select", a.dtype, b.dtype))

    # ---- conversions ---------------------------------------------------------------------------------

    def bitcast(self, a: Val, dtype) -> Val:
        dtype = np.dtype(dtype)
        check_conversion("bitcast", a.dtype, dtype)
        if IR_TYPES[dtype] == a.ir.type:  # I32 <-> U32: the same IR value
            return Val(a.ir, dtype)
        return Val(self.b.bitcast(a.ir, IR_TYPES[dtype]), dtype)

    def widen(self, a: Val, dtype) -> Val:
        dtype = np.dtype(dtype)
        check_conversion("widen", a.dtype, dtype)
        inst = self.b.fpext if a.dtype in FLOATS else self.b.sext if a.dtype in SIGNED else self.b.zext
        return Val(inst(a.ir, IR_TYPES[dtype]), dtype)

    def narrow(self, a: Val, dtype) -> Val:
        dtype = np.dtype(dtype)
        check_conversion("narrow", a.dtype, dtype)
        inst = self.b.fptrunc if a.dtype in FLOATS else self.b.trunc
        return Val(inst(a.ir, IR_TYPES[dtype]), dtype)

    def itof(self, a: Val, dtype) -> Val:
        dtype = np.dtype(dtype)
        check_conversion("itof", a.dtype, dtype)
        inst = self.b.sitofp if a.dtype in SIGNED else self.b.uitofp
        return Val(inst(a.ir, IR_TYPES[dtype]), dtype)

    def ftoi(self, a: Val, dtype) -> Val:
        """fptosi/fptoui: poison on NaN or out of range, which the algorithms exclude (checked by NumpyOps)."""
        dtype = np.dtype(dtype)
        check_conversion("ftoi", a.dtype, dtype)
        inst = self.b.fptosi if dtype in SIGNED else self.b.fptoui
        return Val(inst(a.ir, IR_TYPES[dtype]), dtype)
