"""The numerics backend interface and its numpy implementation, the reference every other backend must match.

runtime/convert.py, fp32math.py and mx.py write each algorithm once, as a sequence of calls on a
backend object `o`; this backend runs the sequence on numpy arrays (elementwise, broadcasting) and
runtime/jit/llvm_ops.py emits the same sequence as LLVM IR on scalars, so the two agree bit for bit
by construction. The operations are exactly the ones whose IEEE/two's-complement results are fully
defined in both worlds:

- value types are numpy dtypes: F32, F64, I32, U32, U16, U8, I8 and BOOL (masks); an operation takes
  operands of one type and never promotes (mixing types raises TypeError), so no float64 or integer
  promotion can slip into an algorithm;
- arithmetic is the one IEEE or modular operation named, nothing fused; integer signedness lives in
  the type (U32 shifts and compares are unsigned, I32 ones signed), as LLVM's lshr/ashr, icmp u/s;
- float comparisons are ordered (false on NaN) except `ne`, which is unordered (true on NaN), as in
  numpy; `isnan` is the unordered self-comparison;
- whatever LLVM leaves undefined (poison) is refused here with ValueError: a shift amount outside
  [0, bits), a float-to-int conversion of NaN or of a value outside the target range. So a reference
  run over an input also proves that the JIT's run of the same sequence is defined on it.
"""
from __future__ import annotations

import numpy as np

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I32 = np.dtype(np.int32)
U32 = np.dtype(np.uint32)
U16 = np.dtype(np.uint16)
U8 = np.dtype(np.uint8)
I8 = np.dtype(np.int8)
BOOL = np.dtype(np.bool_)

FLOATS = frozenset({F32, F64})
INTS = frozenset({I32, U32, U16, U8, I8})
TYPES = FLOATS | INTS | {BOOL}

# The value types each operation accepts; all operands of one operation have one type.
OPERAND_TYPES = {
    "add": FLOATS | INTS, "sub": FLOATS | INTS, "mul": FLOATS | INTS, "div": FLOATS,
    "neg": FLOATS, "sqrt": FLOATS, "rint": FLOATS,
    "and": INTS | {BOOL}, "or": INTS | {BOOL}, "xor": INTS | {BOOL}, "not": {BOOL}, "shl": INTS, "shr": INTS,
    "lt": FLOATS | INTS, "le": FLOATS | INTS, "gt": FLOATS | INTS, "ge": FLOATS | INTS, "eq": TYPES, "ne": TYPES,
    "isnan": FLOATS, "select": TYPES, "select mask": {BOOL},
}


def operand_type(op: str, *dtypes: np.dtype) -> np.dtype:
    """The one type of an operation's operands; raises TypeError on mixed or unsupported types (both backends)."""
    first = dtypes[0]
    if any(d != first for d in dtypes):
        raise TypeError(f"{op} mixes {' and '.join(type_name(d) for d in dtypes)}: convert explicitly")
    if first not in OPERAND_TYPES[op]:
        raise TypeError(f"{op} does not apply to {type_name(first)}")
    return first


def check_conversion(op: str, src: np.dtype, dst: np.dtype) -> None:
    """The conversion rules of both backends (see NumpyOps.bitcast .. ftoi); raises TypeError when broken."""
    if dst not in TYPES:
        raise TypeError(f"{dst} is not a backend value type")
    ok = {
        "bitcast": src != BOOL and dst != BOOL and src.itemsize == dst.itemsize,
        "widen": (src in INTS | {BOOL} and dst in INTS and (src == BOOL or src.itemsize < dst.itemsize))
        or (src == F32 and dst == F64),
        "narrow": (src in INTS and dst in INTS and src.itemsize > dst.itemsize) or (src == F64 and dst == F32),
        "itof": src in INTS and dst in FLOATS,
        "ftoi": src in FLOATS and dst in INTS,
    }[op]
    if not ok:
        raise TypeError(f"{op} cannot convert {type_name(src)} to {type_name(dst)}")


def type_name(dtype: np.dtype) -> str:
    """The short name used in messages and in the LLVM backend: f32, u32, bool, ..."""
    return "bool" if dtype == BOOL else f"{dtype.kind}{dtype.itemsize * 8}"


class NumpyOps:
    """Backend on numpy arrays: values are ndarrays or numpy scalars of one of TYPES."""

    # ---- constants -----------------------------------------------------------------------------------

    def const(self, value: float | int | bool, dtype: np.dtype):
        """A constant of `dtype`: floats round to the type (RNE), integers must fit it."""
        dtype = np.dtype(dtype)
        if dtype not in TYPES:
            raise TypeError(f"{dtype} is not a backend value type")
        if dtype in INTS:
            info = np.iinfo(dtype)
            if isinstance(value, float) or not info.min <= int(value) <= info.max:
                raise ValueError(f"integer constant {value!r} does not fit {type_name(dtype)}")
        return dtype.type(value)

    def f32(self, value: float):
        return self.const(value, F32)

    def f64(self, value: float):
        return self.const(value, F64)

    def i32(self, value: int):
        return self.const(value, I32)

    def u32(self, value: int):
        return self.const(value, U32)

    # ---- arithmetic ----------------------------------------------------------------------------------

    def add(self, a, b):
        _check("add", a, b)
        return a + b

    def sub(self, a, b):
        _check("sub", a, b)
        return a - b

    def mul(self, a, b):
        """Product; integers wrap modulo 2^bits."""
        _check("mul", a, b)
        return a * b

    def div(self, a, b):
        _check("div", a, b)
        return a / b

    def neg(self, a):
        """Float negation: flips the sign bit (-(+0) = -0), unlike 0 - a."""
        _check("neg", a)
        return -a

    def sqrt(self, a):
        _check("sqrt", a)
        return np.sqrt(a)

    def rint(self, a):
        """Round to an integral value, ties to even."""
        _check("rint", a)
        return np.rint(a)

    # ---- bits and masks ------------------------------------------------------------------------------

    def and_(self, a, b):
        _check("and", a, b)
        return a & b

    def or_(self, a, b):
        _check("or", a, b)
        return a | b

    def xor(self, a, b):
        _check("xor", a, b)
        return a ^ b

    def not_(self, m):
        _check("not", m)
        return ~m

    def shl(self, a, s):
        _check_shift("shl", a, s)
        return a << s

    def shr(self, a, s):
        """Logical shift right for unsigned types, arithmetic for signed ones."""
        _check_shift("shr", a, s)
        return a >> s

    # ---- comparisons and select ----------------------------------------------------------------------

    def lt(self, a, b):
        _check("lt", a, b)
        return a < b

    def le(self, a, b):
        _check("le", a, b)
        return a <= b

    def gt(self, a, b):
        _check("gt", a, b)
        return a > b

    def ge(self, a, b):
        _check("ge", a, b)
        return a >= b

    def eq(self, a, b):
        _check("eq", a, b)
        return a == b

    def ne(self, a, b):
        """Not equal; for floats true when either is NaN (unordered)."""
        _check("ne", a, b)
        return a != b

    def isnan(self, a):
        _check("isnan", a)
        return np.isnan(a)

    def select(self, m, a, b):
        """a where m else b, elementwise; both arms are always computed (branch-free)."""
        _check("select mask", m)
        _check("select", a, b)
        return np.where(m, a, b)

    # ---- conversions ---------------------------------------------------------------------------------

    def bitcast(self, a, dtype: np.dtype):
        """Reinterpret the bits as another type of the same width."""
        dtype = _convert("bitcast", a, dtype)
        return a.view(dtype)

    def widen(self, a, dtype: np.dtype):
        """Integer zero/sign extension by the source's signedness (masks give 0/1), or f32 -> f64 (exact)."""
        return a.astype(_convert("widen", a, dtype))

    def narrow(self, a, dtype: np.dtype):
        """Integer truncation to the low bits, or f64 -> f32 rounded to nearest even."""
        return a.astype(_convert("narrow", a, dtype))

    def itof(self, a, dtype: np.dtype):
        """Integer -> float by the source's signedness, rounded to nearest even."""
        return a.astype(_convert("itof", a, dtype))

    def ftoi(self, a, dtype: np.dtype):
        """Float -> integer, truncating; the value must be a number inside the target range."""
        dtype = _convert("ftoi", a, dtype)
        info = np.iinfo(dtype)
        inside = (a > np.float64(info.min) - 1) & (a < np.float64(info.max) + 1)  # False for NaN
        if not np.all(inside):
            raise ValueError(f"ftoi to {type_name(dtype)} of a NaN or out-of-range value (poison in LLVM)")
        return a.astype(dtype)


def _type(a) -> np.dtype:
    dtype = getattr(a, "dtype", None)
    if not isinstance(a, (np.ndarray, np.generic)) or dtype not in TYPES:
        raise TypeError(f"operand {a!r} is not a backend value (make constants with o.const)")
    return dtype


def _check(op: str, *values) -> np.dtype:
    return operand_type(op, *(_type(v) for v in values))


def _convert(op: str, a, dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    check_conversion(op, _type(a), dtype)
    return dtype


def _check_shift(op: str, a, s) -> None:
    bits = _check(op, a, s).itemsize * 8
    if np.any((s < 0) | (s >= bits)):
        raise ValueError(f"{op} amount outside [0, {bits}) (poison in LLVM)")


NP = NumpyOps()
