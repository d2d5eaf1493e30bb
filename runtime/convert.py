"""Dtype conversions of the machine, bit for bit: reading any dtype into fp32 and writing fp32 back.

This is the executable form of the "Reading" and "Writing" rules of isa/spec_intro.md (Numerics) and
of ../shared/reference/precision.md 7.1/7.2. Every float conversion works on the integer bit pattern
of fp32 (no library casts), so the llvmlite JIT lowers the same integer sequence and agrees bit for
bit; ml_dtypes, numpy and torch casts are only the test oracles.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding

U32 = np.uint32
ABS32 = U32(0x7FFFFFFF)
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
    DType.FP8_E5M2: SmallFloat(2, -14, 0x7B, 0x7C, 0x7E, 7, True),
    DType.FP4_E2M1: SmallFloat(1, 0, 0x7, 0x7, None, 3, False),
}
CODE_DTYPE = {1: np.uint8, 2: np.uint16}
INT_RANGE = {DType.INT8: (-128, 127), DType.UINT8: (0, 255), DType.INT32: (-(2 ** 31), 2 ** 31 - 1)}


def f32_bits(x: np.ndarray) -> np.ndarray:
    """The uint32 pattern of an fp32 array (a view when x is already fp32)."""
    return np.asarray(x, dtype=np.float32).view(U32)


def bits_f32(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, dtype=U32).view(np.float32)


def _codes(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """The raw storage codes as unsigned integers of the dtype's width (uint8 bytes are reinterpreted)."""
    raw = np.asarray(raw)
    if raw.dtype != dtype.storage:
        raw = np.ascontiguousarray(raw).view(dtype.storage)
    return raw.view({1: np.uint8, 2: np.uint16, 4: U32}[dtype.itemsize])


def to_fp32(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Read storage values into fp32 (spec "Reading"): floats widen exactly, ints round to nearest even.

    `raw` is an array of `dtype.storage`, or uint8 bytes viewable as it. A NaN widens to a quiet fp32
    NaN with its sign and its payload in the top mantissa bits.
    """
    if dtype is DType.FP32:
        return _codes(raw, dtype).view(np.float32).copy()
    if dtype.is_int:
        ints = np.asarray(raw)
        if ints.dtype != dtype.storage:
            ints = np.ascontiguousarray(ints).view(dtype.storage)
        return ints.astype(np.float32)  # sitofp/uitofp: exact for 8-bit, RNE for int32
    if dtype is DType.E8M0:
        return e8m0_to_fp32(_codes(raw, dtype))
    return _widen(_codes(raw, dtype).astype(U32), SMALL_FLOATS[dtype])


def _widen(c: np.ndarray, f: SmallFloat) -> np.ndarray:
    """Exact widening of a small-float code: rebias normals, scale subnormals by a power of two."""
    m = U32(f.mant)
    sign = (c >> U32(f.sign_bit)) << U32(31)
    mag = c & U32((1 << f.sign_bit) - 1)
    efield = mag >> m
    man = mag & U32((1 << f.mant) - 1)
    top_e = U32((1 << (f.sign_bit - f.mant)) - 1)
    normal = ((efield + U32(127 - (1 - f.emin))) << U32(23)) | (man << U32(23 - f.mant))
    # a subnormal is man * 2^(emin - m); the product is exact in fp32 for every small float
    sub = f32_bits(man.astype(np.float32) * np.float32(2.0 ** (f.emin - f.mant)))
    out = np.where(efield == 0, sub, normal)
    if f.has_inf:
        special = U32(0x7F800000) | (man << U32(23 - f.mant)) | np.where(man != 0, U32(0x400000), U32(0))
        out = np.where(efield == top_e, special, out)
    elif f.nan_code is not None:  # e4m3fn: only S.1111.111 is NaN
        out = np.where(mag == U32(f.nan_code), U32(0x7FC00000) | (man << U32(23 - f.mant)), out)
    return bits_f32(out | sign)


def e8m0_to_fp32(codes: np.ndarray) -> np.ndarray:
    """2^(code - 127): code 0 is the fp32 subnormal 2^-127 (0x00400000) and 0xFF is NaN (precision.md 7.4)."""
    c = np.asarray(codes).view(np.uint8).astype(U32)
    out = np.where(c == 0, U32(0x00400000), c << U32(23))
    return bits_f32(np.where(c == E8M0_NAN, U32(0x7FC00000), out))


def from_fp32(x: np.ndarray, dtype: DType, *, rounding: Rounding = Rounding.RNE,
              rand: np.ndarray | None = None) -> np.ndarray:
    """Write fp32 values as `dtype` (spec "Writing"); returns an array of `dtype.storage`.

    Stochastic rounding (float targets only) needs `rand`, the uint32 R of each element (see sr_rand).
    """
    x = np.asarray(x, dtype=np.float32)
    rounding = Rounding(rounding)
    if dtype is DType.E8M0:
        raise ValueError("e8m0 is not a conversion target: it is only copied or written by quantize_mx")
    if rounding is Rounding.SR:
        if not dtype.is_float:
            raise ValueError(f"stochastic rounding needs a float destination, not {dtype.text}")
        if rand is None:
            raise ValueError("stochastic rounding needs the rand array (sr_rand)")
    if dtype is DType.FP32:
        return x.copy()
    if dtype.is_int:
        return _to_int(x, dtype)
    f = SMALL_FLOATS[dtype]
    r = None if rounding is Rounding.RNE else np.broadcast_to(np.asarray(rand, dtype=U32), x.shape)
    codes = _narrow(f32_bits(x), f, r)
    return codes.astype(CODE_DTYPE[dtype.itemsize]).view(dtype.storage)


def _narrow(u: np.ndarray, f: SmallFloat, rand: np.ndarray | None) -> np.ndarray:
    """fp32 bits -> small-float code (uint32) by precision.md 7.2 with the spec's SR formula.

    |x| = M * 2^E exactly; the target ulp exponent is q = max(xe, emin) - m with xe = floor(log2 |x|);
    n = M / 2^(q - E) rounded; the code is ((max(xe, emin) - emin) << m) + n, which carries into the
    exponent field by itself. fp32 subnormals and zero use xe = -126 <= emin of every target, so only
    the fp32 exponent field is needed. Codes above max_code overflow (Inf and NaN inputs included).
    """
    efield = ((u >> U32(23)) & U32(0xFF)).astype(np.int32)
    emax1 = np.maximum(efield, 1)
    big_m = (u & U32(0x7FFFFF)) | np.where(efield > 0, U32(0x800000), U32(0))
    eb = np.maximum(emax1 - 127, f.emin)
    sh = eb - f.mant - emax1 + 150  # q - E >= 23 - m >= 13
    n = _round_rne(big_m, sh) if rand is None else _round_sr(big_m, sh, rand)
    code = ((eb - f.emin).astype(U32) << U32(f.mant)) + n
    code = np.where(code > U32(f.max_code), U32(f.over_code), code)
    sign = (u >> U32(31)) << U32(f.sign_bit)
    nan = (u & ABS32) > U32(0x7F800000)
    nan_code = U32(0) if f.nan_code is None else U32(f.nan_code) | sign
    return np.where(nan, nan_code, code | sign)


def _round_rne(big_m: np.ndarray, sh: np.ndarray) -> np.ndarray:
    """M / 2^sh rounded half to even, in 32 bits: with M < 2^24, any sh >= 25 gives 0 like sh = 25."""
    s = np.minimum(sh, 25).astype(U32)
    n = big_m >> s
    low = big_m & ((U32(1) << s) - U32(1))
    half = U32(1) << (s - U32(1))
    return n + ((low > half) | ((low == half) & ((n & U32(1)) == U32(1)))).astype(U32)


def _round_sr(big_m: np.ndarray, sh: np.ndarray, rand: np.ndarray) -> np.ndarray:
    """The spec's SR: (M >> sh) + ((r + (R mod 2^t)) >> t), t = min(sh, 32), r the top t bits of M mod 2^sh.

    In 64 bits, since r + (R mod 2^t) reaches 2^33; shifts are capped at 63 (M < 2^24 is gone by then).
    """
    m64 = big_m.astype(np.uint64)
    s = np.minimum(sh, 63).astype(np.uint64)
    t = np.minimum(sh, 32).astype(np.uint64)
    low = m64 & ((np.uint64(1) << s) - np.uint64(1))
    r = low >> np.minimum(sh - t.astype(np.int64), 63).astype(np.uint64)
    rmod = rand.astype(np.uint64) & ((np.uint64(1) << t) - np.uint64(1))
    return ((m64 >> s) + ((r + rmod) >> t)).astype(U32)


def _to_int(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Round half to even in fp32, clamp to the integer range, NaN -> 0 (the clamp is done in fp32)."""
    lo, hi = INT_RANGE[dtype]
    r = np.rint(x)
    over = r >= np.float32(hi + 1)  # hi + 1 is a power of two, exact in fp32
    under = r < np.float32(lo)
    safe = np.where(over | under | np.isnan(x), np.float32(0), r)
    out = safe.astype(dtype.storage)
    out = np.where(over, dtype.storage.type(hi), out)
    return np.where(under, dtype.storage.type(lo), out).astype(dtype.storage)


def sr_rand(seed: int, partitions: int, free: int) -> np.ndarray:
    """The spec's counter-based R(S, p, e): a linear hash of (seed, p, e) mod 2^32, then murmur3 fmix32."""
    mask = np.uint64(0xFFFFFFFF)
    p = np.arange(partitions, dtype=np.uint64)[:, None]
    e = np.arange(free, dtype=np.uint64)[None, :]
    h = (np.uint64((seed * 0x9E3779B1) & 0xFFFFFFFF) + p * np.uint64(0x85EBCA77) + e * np.uint64(0xC2B2AE3D)) & mask
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & mask
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & mask
    h ^= h >> np.uint64(16)
    return h.astype(U32)


def is_nan_code(codes: np.ndarray, dtype: DType) -> np.ndarray:
    """Which storage codes are NaN (by class: any payload, either sign)."""
    c = _codes(codes, dtype).astype(U32)
    if dtype is DType.FP32:
        return (c & ABS32) > U32(0x7F800000)
    if dtype is DType.E8M0:
        return c == U32(E8M0_NAN)
    if dtype.is_int or SMALL_FLOATS[dtype].nan_code is None:
        return np.zeros(c.shape, dtype=bool)
    f = SMALL_FLOATS[dtype]
    mag = c & U32((1 << f.sign_bit) - 1)
    if f.has_inf:
        return mag > U32(f.over_code)
    return mag == U32(f.nan_code)


def bits_equal_or_both_nan(a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    """Elementwise: same storage bits, or both NaN of `dtype` (differential checks compare NaN by class)."""
    ca, cb = _codes(a, dtype), _codes(b, dtype)
    return (ca == cb) | (is_nan_code(ca, dtype) & is_nan_code(cb, dtype))
