"""Dtype conversions of the machine, bit for bit: reading any dtype into fp32 and writing fp32 back.

This is the executable form of the "Reading" and "Writing" rules of isa/spec_intro.md (Numerics) and
of ../shared/reference/precision.md 7.1/7.2. Each conversion is written once against the backend
interface of runtime/ops_numpy.py (`load`, `store`, `rand`: one element, any backend), working on the
integer bit pattern of fp32 (no library casts); `to_fp32`, `from_fp32` and `sr_rand` bind it to numpy,
and the llvmlite JIT runs the same sequence (runtime/jit/llvm_ops.py). ml_dtypes, numpy and torch
casts are only the test oracles.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding
from trnc.runtime.ops_numpy import F32, I8, I32, NP, U8, U16, U32

ABS32 = 0x7FFFFFFF
E8M0_NAN = 0xFF


@dataclass(frozen=True)
class SmallFloat:
    """Encoding parameters of a float narrower than fp32 (precision.md 7.2)."""

    mant: int        # stored mantissa bits m
    emin: int        # exponent of the smallest normal (1 - bias)
    max_code: int    # magnitude code of the largest finite value
    over_code: int   # magnitude code written on overflow and for +-Inf (Inf code, or max_code to saturate)
    nan_code: int | None  # magnitude code written for NaN, sign kept; None: no NaN code, NaN writes +0
    sign_bit: int    # position of the sign bit in the storage code
    has_inf: bool    # IEEE-style: the all-ones exponent holds Inf (mantissa 0) and NaNs


SMALL_FLOATS = {
    DType.BF16: SmallFloat(7, -126, 0x7F7F, 0x7F80, 0x7FC0, 15, True),
    DType.FP16: SmallFloat(10, -14, 0x7BFF, 0x7C00, 0x7E00, 15, True),
    DType.FP8_E4M3: SmallFloat(3, -6, 0x7E, 0x7E, 0x7F, 7, False),   # OCP e4m3fn: saturating, NaN S.1111.111
    DType.FP8_E5M2: SmallFloat(2, -14, 0x7B, 0x7C, 0x7F, 7, True),   # NaN 0x7F: torch's (ml_dtypes: 0x7E)
    DType.FP4_E2M1: SmallFloat(1, 0, 0x7, 0x7, None, 3, False),
}
INT_RANGE = {DType.INT8: (-128, 127), DType.UINT8: (0, 255), DType.INT32: (-(2 ** 31), 2 ** 31 - 1)}
RAW_TYPES = {DType.FP32: U32, DType.BF16: U16, DType.FP16: U16, DType.FP8_E4M3: U8, DType.FP8_E5M2: U8,
             DType.FP4_E2M1: U8, DType.E8M0: U8, DType.INT8: I8, DType.UINT8: U8, DType.INT32: I32}


def raw_type(dtype: DType) -> np.dtype:
    """The backend type of a storage element of `dtype`: what `load` takes and `store` returns."""
    return RAW_TYPES[dtype]


# ---- the algorithms (any backend `o`, one element) ------------------------------------------------------------

def load(o, raw, dtype: DType):
    """fp32(raw) by the spec's "Reading" rule; `raw` has type raw_type(dtype)."""
    if dtype is DType.FP32:
        return o.bitcast(raw, F32)
    if dtype.is_int:
        return o.itof(raw, F32)  # sitofp/uitofp: exact for 8-bit, RNE for int32
    code = o.widen(raw, U32)
    if dtype is DType.E8M0:
        return e8m0_to_fp32(o, code)
    if dtype is DType.BF16:
        return _widen_bf16(o, code)
    return _widen(o, code, SMALL_FLOATS[dtype])


def _widen_bf16(o, c):
    """bf16 is the top half of fp32: a shift, plus the quiet bit for a NaN. It gives the same bits as `_widen`
    without its subnormal multiply, whose subnormal constant is slow on x86 for every element."""
    u = o.u32
    quiet = o.select(o.gt(o.and_(c, u(0x7FFF)), u(0x7F80)), u(0x400000), u(0))
    return o.bitcast(o.or_(o.shl(c, u(16)), quiet), F32)


def _widen(o, c, f: SmallFloat):
    """Exact widening of a small-float code (u32): rebias normals, scale subnormals by a power of two.

    A NaN widens to a quiet fp32 NaN with its sign and its payload in the top mantissa bits.
    """
    u = o.u32
    sign = o.shl(o.shr(c, u(f.sign_bit)), u(31))
    mag = o.and_(c, u((1 << f.sign_bit) - 1))
    efield = o.shr(mag, u(f.mant))
    man = o.and_(mag, u((1 << f.mant) - 1))
    man_hi = o.shl(man, u(23 - f.mant))
    normal = o.or_(o.shl(o.add(efield, u(127 - (1 - f.emin))), u(23)), man_hi)
    # a subnormal is man * 2^(emin - m); the product is exact in fp32 for every small float
    sub = o.bitcast(o.mul(o.itof(man, F32), o.f32(2.0 ** (f.emin - f.mant))), U32)
    out = o.select(o.eq(efield, u(0)), sub, normal)
    if f.has_inf:
        quiet = o.select(o.ne(man, u(0)), u(0x400000), u(0))
        special = o.or_(o.or_(u(0x7F800000), man_hi), quiet)
        out = o.select(o.eq(efield, u((1 << (f.sign_bit - f.mant)) - 1)), special, out)
    elif f.nan_code is not None:  # e4m3fn: only S.1111.111 is NaN
        out = o.select(o.eq(mag, u(f.nan_code)), o.or_(u(0x7FC00000), man_hi), out)
    return o.bitcast(o.or_(out, sign), F32)


def e8m0_to_fp32(o, code):
    """2^(code - 127) for a u32 code: code 0 is the fp32 subnormal 2^-127 (0x00400000), 0xFF NaN (precision.md 7.4)."""
    u = o.u32
    out = o.select(o.eq(code, u(0)), u(0x00400000), o.shl(code, u(23)))
    return o.bitcast(o.select(o.eq(code, u(E8M0_NAN)), u(0x7FC00000), out), F32)


def store(o, x, dtype: DType, rounding: Rounding = Rounding.RNE, rand=None):
    """convert(x, dtype) by the spec's "Writing" rule: fp32 x -> a raw_type(dtype) storage element.

    Stochastic rounding (float targets only) takes `rand`, the u32 R of the element (see `rand`).
    """
    if dtype is DType.E8M0:
        raise ValueError("e8m0 is not a conversion target: it is only copied or written by quantize_mx")
    rounding = Rounding(rounding)
    if rounding is Rounding.SR:
        if not dtype.is_float:
            raise ValueError(f"stochastic rounding needs a float destination, not {dtype.text}")
        if rand is None:
            raise ValueError("stochastic rounding needs the rand array (sr_rand)")
    if dtype is DType.FP32:
        return o.bitcast(x, U32)
    if dtype.is_int:
        return _to_int(o, x, dtype)
    if dtype is DType.BF16 and rounding is Rounding.RNE:
        return o.narrow(_narrow_bf16(o, o.bitcast(x, U32)), U16)
    code = _narrow(o, o.bitcast(x, U32), SMALL_FLOATS[dtype], rand if rounding is Rounding.SR else None)
    return o.narrow(code, RAW_TYPES[dtype])


def _narrow(o, u, f: SmallFloat, rand):
    """fp32 bits -> small-float code (u32) by precision.md 7.2 with the spec's SR formula.

    |x| = M * 2^E exactly; the target ulp exponent is q = max(xe, emin) - m with xe = floor(log2 |x|);
    n = M / 2^(q - E) rounded; the code is ((max(xe, emin) - emin) << m) + n, which carries into the
    exponent field by itself. fp32 subnormals and zero use xe = -126 <= emin of every target, so only
    the fp32 exponent field is needed. Codes above max_code overflow (Inf and NaN inputs included).
    """
    i = o.i32
    efield = o.bitcast(o.and_(o.shr(u, o.u32(23)), o.u32(0xFF)), I32)
    emax1 = _imax(o, efield, i(1))
    hidden = o.select(o.gt(efield, i(0)), o.u32(0x800000), o.u32(0))
    big_m = o.or_(o.and_(u, o.u32(0x7FFFFF)), hidden)
    eb = _imax(o, o.sub(emax1, i(127)), i(f.emin))
    sh = o.add(o.sub(o.sub(eb, i(f.mant)), emax1), i(150))  # q - E >= 23 - m >= 13
    n = _round_rne(o, big_m, sh) if rand is None else _round_sr(o, big_m, sh, rand)
    code = o.add(o.shl(o.bitcast(o.sub(eb, i(f.emin)), U32), o.u32(f.mant)), n)
    code = o.select(o.gt(code, o.u32(f.max_code)), o.u32(f.over_code), code)
    sign = o.shl(o.shr(u, o.u32(31)), o.u32(f.sign_bit))
    nan = o.gt(o.and_(u, o.u32(ABS32)), o.u32(0x7F800000))
    nan_code = o.u32(0) if f.nan_code is None else o.or_(o.u32(f.nan_code), sign)
    return o.select(nan, nan_code, o.or_(code, sign))


def _narrow_bf16(o, u):
    """_narrow's code for bf16 with RNE, in a few integer operations instead of its general form (bf16 stores
    were 4x the cost of fp32 ones): bf16 has fp32's exponent field, so the code is the top 16 bits of u
    rounded half to even, u + 0x7FFF + (bit 16 of u), whose carry also makes the overflow to Inf (finite |x|
    rounding past 0x7F7F, and Inf itself) and never reaches the sign; NaN is 0x7FC0 with its sign."""
    u32 = o.u32
    rounded = o.shr(o.add(u, o.add(u32(0x7FFF), o.and_(o.shr(u, u32(16)), u32(1)))), u32(16))
    nan = o.gt(o.and_(u, u32(ABS32)), u32(0x7F800000))
    return o.select(nan, o.or_(u32(0x7FC0), o.shl(o.shr(u, u32(31)), u32(15))), rounded)


def _imax(o, a, b):
    return o.select(o.gt(a, b), a, b)


def _imin(o, a, b):
    return o.select(o.lt(a, b), a, b)


def _round_rne(o, big_m, sh):
    """M / 2^sh rounded half to even, in 32 bits: with M < 2^24, any sh >= 25 gives 0 like sh = 25."""
    u = o.u32
    s = o.bitcast(_imin(o, sh, o.i32(25)), U32)
    n = o.shr(big_m, s)
    low = o.and_(big_m, o.sub(o.shl(u(1), s), u(1)))
    half = o.shl(u(1), o.sub(s, u(1)))
    odd = o.eq(o.and_(n, u(1)), u(1))
    up = o.or_(o.gt(low, half), o.and_(o.eq(low, half), odd))
    return o.add(n, o.widen(up, U32))


def _round_sr(o, big_m, sh, rand):
    """The spec's SR: (M >> sh) + ((r + (R mod 2^t)) >> t), t = min(sh, 32), r the top t bits of M mod 2^sh.

    In 32 bits: r, R mod 2^t < 2^t, so the carry (r + (R mod 2^t)) >> t is one bit; for t = 32 it is the
    wrap-around of the 32-bit sum. Shifts are capped at 31 where M < 2^24 makes larger ones equal.
    """
    u, i = o.u32, o.i32
    s = o.bitcast(_imin(o, sh, i(31)), U32)
    t = _imin(o, sh, i(32))
    low = o.and_(big_m, o.sub(o.shl(u(1), s), u(1)))
    r = o.shr(low, o.bitcast(_imin(o, o.sub(sh, t), i(31)), U32))
    rmod = o.and_(rand, o.shr(u(0xFFFFFFFF), o.bitcast(o.sub(i(32), t), U32)))  # t >= 13
    total = o.add(r, rmod)
    t_is_32 = o.eq(t, i(32))
    carry = o.select(t_is_32, o.widen(o.lt(total, r), U32),
                     o.shr(total, o.bitcast(_imin(o, t, i(31)), U32)))
    return o.add(o.shr(big_m, s), carry)


def _to_int(o, x, dtype: DType):
    """Round half to even in fp32, clamp to the integer range, NaN -> 0 (the clamp is done in fp32)."""
    lo, hi = INT_RANGE[dtype]
    r = o.rint(x)
    over = o.ge(r, o.f32(hi + 1))  # hi + 1 is a power of two, exact in fp32
    under = o.lt(r, o.f32(lo))
    safe = o.select(o.or_(o.or_(over, under), o.isnan(x)), o.f32(0), r)
    out = o.ftoi(safe, I32)
    out = o.select(under, o.i32(lo), o.select(over, o.i32(hi), out))
    if dtype is DType.INT32:
        return out
    return o.narrow(out, RAW_TYPES[dtype])


def rand(o, seed, p, e):
    """The spec's counter-based R(S, p, e) (u32 in, u32 out): a linear hash of (S, p, e) mod 2^32,
    then murmur3's fmix32. Every product wraps mod 2^32, which is the spec's "mod 2^32"."""
    u = o.u32
    h = o.add(o.add(o.mul(seed, u(0x9E3779B1)), o.mul(p, u(0x85EBCA77))), o.mul(e, u(0xC2B2AE3D)))
    h = o.xor(h, o.shr(h, u(16)))
    h = o.mul(h, u(0x85EBCA6B))
    h = o.xor(h, o.shr(h, u(13)))
    h = o.mul(h, u(0xC2B2AE35))
    return o.xor(h, o.shr(h, u(16)))


def random_key(o, seed, stream):
    """The key of one `random` instruction (u32 in and out): R(seed, stream, 0)."""
    return rand(o, seed, stream, o.u32(0))


def uniform(o, key, counter):
    """The `random` opcode's draw for a u32 counter, fp32 in the open interval (0, 1): the top 23 bits k of
    R(key, 0, counter) as (2k + 1) 2^-24, exact in fp32 and symmetric about 1/2, so log(u) and log(1 - u) are
    finite (Box-Muller and the exponential draws need no guard)."""
    u = o.u32
    odd = o.or_(o.shl(o.shr(rand(o, key, u(0), counter), u(9)), u(1)), u(1))
    return o.mul(o.itof(odd, F32), o.f32(2.0 ** -24))


# ---- the numpy API --------------------------------------------------------------------------------------------

def f32_bits(x: np.ndarray) -> np.ndarray:
    """The uint32 pattern of an fp32 array (a view when x is already fp32)."""
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def bits_f32(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def _raw(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """The storage values as the backend's raw type (uint8 bytes are reinterpreted as the dtype first)."""
    raw = np.asarray(raw)
    if raw.dtype != dtype.storage:
        raw = np.ascontiguousarray(raw).view(dtype.storage)
    return raw.view(RAW_TYPES[dtype])


def to_fp32(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Read storage values into fp32 (spec "Reading"): floats widen exactly, ints round to nearest even.

    `raw` is an array of `dtype.storage`, or uint8 bytes viewable as it.
    """
    with np.errstate(all="ignore"):
        return np.array(load(NP, _raw(raw, dtype), dtype), dtype=np.float32)


def from_fp32(x: np.ndarray, dtype: DType, *, rounding: Rounding = Rounding.RNE,
              rand: np.ndarray | None = None) -> np.ndarray:
    """Write fp32 values as `dtype` (spec "Writing"); returns an array of `dtype.storage`.

    Stochastic rounding (float targets only) needs `rand`, the uint32 R of each element (see sr_rand).
    """
    x = np.asarray(x, dtype=np.float32)
    sr = Rounding(rounding) is Rounding.SR and rand is not None
    r = np.broadcast_to(np.asarray(rand, dtype=np.uint32), x.shape) if sr else None
    with np.errstate(all="ignore"):
        raw = store(NP, x, dtype, rounding, r)
    return np.array(raw, dtype=RAW_TYPES[dtype]).view(dtype.storage)


def sr_rand(seed: int, partitions: int, free: int) -> np.ndarray:
    """R(seed, p, e) for every partition p < partitions and element e < free, as a (partitions, free) uint32 array."""
    p = np.arange(partitions, dtype=np.uint32)[:, None]
    e = np.arange(free, dtype=np.uint32)[None, :]
    with np.errstate(all="ignore"):
        h = rand(NP, np.uint32(seed & 0xFFFFFFFF), p, e)
    return np.broadcast_to(h, (partitions, free)).copy()


def uniform_draws(seed: int, stream: int, counter: np.ndarray) -> np.ndarray:
    """The `random` opcode's draws for int32 counters (any shape), as fp32."""
    c = np.asarray(counter).astype(np.int64).astype(np.uint32)
    with np.errstate(all="ignore"):
        key = random_key(NP, np.uint32(seed & 0xFFFFFFFF), np.uint32(stream & 0xFFFFFFFF))
        return np.asarray(uniform(NP, key, c), dtype=np.float32)


def is_nan_code(codes: np.ndarray, dtype: DType) -> np.ndarray:
    """Which storage codes are NaN (by class: any payload, either sign)."""
    c = _raw(codes, dtype).astype(np.uint32)
    if dtype is DType.FP32:
        return (c & np.uint32(ABS32)) > np.uint32(0x7F800000)
    if dtype is DType.E8M0:
        return c == np.uint32(E8M0_NAN)
    if dtype.is_int or SMALL_FLOATS[dtype].nan_code is None:
        return np.zeros(c.shape, dtype=bool)
    f = SMALL_FLOATS[dtype]
    mag = c & np.uint32((1 << f.sign_bit) - 1)
    if f.has_inf:
        return mag > np.uint32(f.over_code)
    return mag == np.uint32(f.nan_code)


def bits_equal_or_both_nan(a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    """Elementwise: same storage bits, or both NaN of `dtype` (differential checks compare NaN by class)."""
    ca, cb = _raw(a, dtype), _raw(b, dtype)
    return (ca == cb) | (is_nan_code(ca, dtype) & is_nan_code(cb, dtype))
