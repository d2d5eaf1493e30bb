"""The ALU `pow` of the machine (isa/spec_intro.md, ALU ops): a fixed fp32 sequence with the IEEE special cases.

a^b = 2^(b log2 a) with log2 a carried as an unevaluated pair of fp32 values (Dekker products and sums,
no FMA), so the exponent's rounding does not cost ulps; written once against the numerics backend
interface (runtime/ops_numpy.py) like the rest of runtime/fp32math.py.
"""
from __future__ import annotations

from trnc.runtime.fp32util import (
    EXP_POLY, INF, LOG2E, LOG_POLY, copysign, fabs, float_max, float_min, horner, ldexp, split_exponent,
)
from trnc.runtime.ops_numpy import F32, I32

LN2 = 0.6931472                 # fp32(ln 2)
LOG2E_LO = 1.925963e-08         # fp32(log2 e - LOG2E): the pair for pow's extended-precision log2
SPLIT = 4097.0                  # 2^12 + 1: Veltkamp split of an fp32 into two 12-bit halves
POW_Y_MAX = 300.0               # |b log2 a| beyond this is certainly 0 or Inf
POW_B_MAX = 2.0 ** 32           # |b| beyond this with a != 1 gives |b log2 a| > 369


def _split(o, a):
    c = o.mul(o.f32(SPLIT), a)
    hi = o.sub(c, o.sub(c, a))
    return hi, o.sub(a, hi)


def _two_prod(o, a, b):
    """a * b = p + e exactly (Dekker's product without FMA), barring overflow and underflow."""
    p = o.mul(a, b)
    ah, al = _split(o, a)
    bh, bl = _split(o, b)
    e = o.add(o.add(o.add(o.sub(o.mul(ah, bh), p), o.mul(ah, bl)), o.mul(al, bh)), o.mul(al, bl))
    return p, e


def _fast_two_sum(o, a, b):
    """a + b = s + e exactly, given |a| >= |b| (Dekker)."""
    s = o.add(a, b)
    return s, o.sub(b, o.sub(s, a))


def _log2_pair(o, a):
    """log2(a) = hi + lo to about 2^-30 relative, for finite a > 0.

    log(m) = 2 atanh(s), s = f / (2 + f): s is formed as s_hi + s_lo from the exact residual of the
    division, the series tail s^3 R(s^2) (under 1% of the total) is plain fp32, and the product by
    log2(e) and the sum with k are carried as pairs.
    """
    f32 = o.f32
    k, m = split_exponent(o, a)
    f = o.sub(m, f32(1))
    g_hi, g_lo = _fast_two_sum(o, f32(2), f)
    s_hi = o.div(f, g_hi)
    ph, pl = _two_prod(o, s_hi, g_hi)
    s_lo = o.div(o.sub(o.sub(o.sub(f, ph), pl), o.mul(s_hi, g_lo)), g_hi)
    z = o.mul(s_hi, s_hi)
    tail = o.mul(s_hi, o.mul(z, horner(o, LOG_POLY, z)))
    ln_hi, ln_lo = _fast_two_sum(o, o.mul(f32(2), s_hi), o.add(o.mul(f32(2), s_lo), tail))
    l2h, l2l = _two_prod(o, ln_hi, f32(LOG2E))
    l2l = o.add(l2l, o.add(o.mul(ln_hi, f32(LOG2E_LO)), o.mul(ln_lo, f32(LOG2E))))
    kf = o.itof(k, F32)
    sh = o.add(kf, l2h)  # TwoSum: |kf| and |l2h| are not ordered
    bb = o.sub(sh, kf)
    se = o.add(o.sub(kf, o.sub(sh, bb)), o.sub(l2h, bb))
    return _fast_two_sum(o, sh, o.add(se, l2l))


def _pow_core(o, a, b):
    """a^b for finite a > 0 and finite b: exp2 of b * log2(a) carried as a pair (y_hi, y_lo)."""
    f32 = o.f32
    lh, ll = _log2_pair(o, a)
    bc = float_min(o, float_max(o, b, -POW_B_MAX), POW_B_MAX)
    yh, yl = _two_prod(o, bc, lh)
    yh, yl = _fast_two_sum(o, yh, o.add(yl, o.mul(bc, ll)))
    big = o.gt(fabs(o, yh), f32(POW_Y_MAX))
    yh = o.select(big, o.select(o.gt(yh, f32(0)), f32(POW_Y_MAX), f32(-POW_Y_MAX)), yh)
    yl = o.select(big, f32(0), yl)
    nf = o.rint(yh)
    r = o.mul(o.add(o.sub(yh, nf), yl), f32(LN2))
    p = o.add(f32(1), o.add(r, o.mul(o.mul(r, r), horner(o, EXP_POLY, r))))
    return ldexp(o, p, o.ftoi(float_min(o, float_max(o, nf, -252.0), 254.0), I32))


def pow_(o, a, b):
    """a ** b with the IEEE-754 pow special cases; max error 4 ulp on finite results (tested).

    b == 0 or a == 1 give 1 (even for NaN); a < 0 needs an integer b (else NaN) and gives the sign
    of an odd b; zeros and infinities of a and b follow C99 Annex F. NaN inputs pass through.
    """
    f32 = o.f32
    aa = fabs(o, a)
    b_int = o.eq(o.rint(b), b)
    half_b = o.mul(b, f32(0.5))
    b_odd = o.and_(b_int, o.ne(o.rint(half_b), half_b))
    finite_a = o.and_(o.gt(aa, f32(0)), o.lt(aa, f32(INF)))
    finite_b = o.lt(fabs(o, b), f32(INF))
    core = _pow_core(o, o.select(finite_a, aa, f32(1)), o.select(finite_b, b, f32(0)))
    b_pos = o.gt(b, f32(0))
    mag = o.select(finite_a, core, o.select(o.eq(o.eq(aa, f32(0)), b_pos), f32(0), f32(INF)))  # a = 0 or +-Inf
    inf_b = o.select(o.eq(o.lt(aa, f32(1)), b_pos), f32(0), f32(INF))                          # b = +-Inf
    mag = o.select(o.or_(finite_b, o.isnan(aa)), mag, o.select(o.eq(aa, f32(1)), f32(1), inf_b))
    res = o.select(b_odd, copysign(o, mag, a), mag)
    invalid = o.and_(o.and_(o.and_(o.lt(a, f32(0)), finite_a), finite_b), o.not_(b_int))
    res = o.select(invalid, f32(float("nan")), res)
    res = o.select(o.isnan(b), b, res)
    res = o.select(o.isnan(a), a, res)
    return o.select(o.or_(o.eq(b, f32(0)), o.eq(a, f32(1))), f32(1), res)
