"""Building blocks of the fp32 functions (runtime/fp32math.py, fp32pow.py): exact power-of-two scaling,
exponent splitting, Cody-Waite exp reduction and Horner evaluation, each on any numerics backend `o`.

Constants are Python floats rounded to fp32 by `o.f32` where used, so every backend sees the same
fp32 constant.
"""
from __future__ import annotations

from trnc.runtime.ops_numpy import F32, I32, U32

INF = float("inf")
LOG2E = 1.442695                # fp32(1 / ln 2)
LN2_HI = 0.693145751953125      # 0x3F317200, 16 significant bits: n * LN2_HI is exact for |n| < 256
LN2_LO = 1.4286068e-06          # fp32(ln 2 - LN2_HI)
SQRT2_MANT = 0x3504F3           # mantissa field of sqrt(2)
EXP_LO = -120.0                 # exp underflows to 0 below -103.98: arguments are clamped here

# (e^r - 1 - r) / r^2 on |r| <= 0.36, degree 4 in r; approximation error 0.07 ulp of e^r.
EXP_POLY = (0.4999999, 0.16666497, 0.04166867, 0.008371496, 0.0013808846)
# (2 atanh(s) - 2 s) / s^3 in z = s^2 <= 0.0295 (|s| <= 3 - 2 sqrt 2), degree 2; 0.014 ulp of log.
LOG_POLY = (0.66666776, 0.39977536, 0.29871866)


def horner(o, coeffs: tuple[float, ...], z):
    """c0 + z (c1 + z (c2 + ...)) in fp32 for constant coefficients."""
    return horner_values(o, [o.f32(c) for c in coeffs], z)


def horner_values(o, coeffs: list, z):
    """Horner's rule for f32 coefficient values (per element, e.g. picked by selects)."""
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = o.add(o.mul(acc, z), c)
    return acc


def pow2(o, k):
    """2^k as fp32 for an i32 k in [-126, 127], built from the exponent bits."""
    return o.bitcast(o.shl(o.bitcast(o.add(k, o.i32(127)), U32), o.u32(23)), F32)


def ldexp(o, v, n):
    """v * 2^n for an i32 n in [-252, 254]: two power-of-two factors, so only the last product rounds
    (overflow to Inf and gradual underflow happen there, once)."""
    n1 = o.shr(n, o.i32(1))  # arithmetic: floor(n / 2)
    return o.mul(o.mul(v, pow2(o, n1)), pow2(o, o.sub(n, n1)))


def fabs(o, x):
    """|x| by clearing the sign bit (NaN payload kept)."""
    return o.bitcast(o.and_(o.bitcast(x, U32), o.u32(0x7FFFFFFF)), F32)


def copysign(o, mag, x):
    bits = o.or_(o.and_(o.bitcast(mag, U32), o.u32(0x7FFFFFFF)), o.and_(o.bitcast(x, U32), o.u32(0x80000000)))
    return o.bitcast(bits, F32)


def no_nan(o, x):
    """x with NaN replaced by +0, so that later integer conversions stay defined (the result selects x back)."""
    return o.select(o.isnan(x), o.f32(0), x)


def exp_parts(o, hi, lo):
    """exp(hi + lo) = p * 2^n with p in [0.7, 1.42] and n an i32 (Cody-Waite reduction, then a polynomial).

    n = rint(hi log2 e); r = (hi - n LN2_HI) + (lo - n LN2_LO), where the first difference is exact;
    `lo` carries low-order bits of the argument when the caller has them. hi must be NaN-free with
    |hi log2 e| < 2^31.
    """
    nf = o.rint(o.mul(hi, o.f32(LOG2E)))
    r = o.add(o.sub(hi, o.mul(nf, o.f32(LN2_HI))), o.sub(lo, o.mul(nf, o.f32(LN2_LO))))
    p = o.add(o.f32(1), o.add(r, o.mul(o.mul(r, r), horner(o, EXP_POLY, r))))
    return p, o.ftoi(nf, I32)


def split_exponent(o, x):
    """x = 2^k m, m in [sqrt(1/2), sqrt(2)), for finite x > 0 (subnormals included): (k as i32, m as f32)."""
    sub = o.lt(x, o.f32(2.0 ** -126))
    xs = o.select(sub, o.mul(x, o.f32(2.0 ** 23)), x)
    u = o.bitcast(xs, U32)
    mant = o.and_(u, o.u32(0x7FFFFF))
    big = o.ge(mant, o.u32(SQRT2_MANT))
    k = o.sub(o.sub(o.bitcast(o.shr(u, o.u32(23)), I32), o.i32(127)), o.select(sub, o.i32(23), o.i32(0)))
    k = o.add(k, o.widen(big, I32))
    m = o.bitcast(o.or_(mant, o.select(big, o.u32(126 << 23), o.u32(127 << 23))), F32)
    return k, m



def log_reduce(o, x):
    """The shared start of the logarithms (fp32math.log, fp32special's log2 and log10): for finite x > 0 (other x
    read as 1), x = 2^k (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)), f exact; s = f / (2 + f), z = s^2 and
    hfsq = f^2 / 2. Returns (k, f, s, z, hfsq)."""
    one = o.f32(1)
    xs = o.select(o.and_(o.gt(x, o.f32(0)), o.lt(x, o.f32(INF))), x, one)
    k, m = split_exponent(o, xs)
    f = o.sub(m, one)
    s = o.div(f, o.add(o.f32(2), f))
    z = o.mul(s, s)
    return k, f, s, z, o.mul(o.mul(o.f32(0.5), f), f)


def float_max(o, x, limit: float):
    """max(x, limit) of a NaN-free f32 x."""
    return o.select(o.lt(x, o.f32(limit)), o.f32(limit), x)


def float_min(o, x, limit: float):
    """min(x, limit) of a NaN-free f32 x."""
    return o.select(o.gt(x, o.f32(limit)), o.f32(limit), x)

