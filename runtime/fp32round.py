"""The machine's exact functions (isa/spec_intro.md, Numerics): rounding to integers, sign, and the ALU's fmod and
remainder, as fixed fp32 sequences on the backend interface of runtime/ops_numpy.py. Every result here is exact
(the correctly rounded value is representable), so they agree with C's floorf, ceilf, truncf, rintf and fmodf
bit for bit.
"""
from __future__ import annotations

from trnc.runtime.fp32util import INF, copysign, fabs, ldexp, no_nan
from trnc.runtime.ops_numpy import F32, I32, U32

FMOD_STEPS = 13                 # each step closes 22 of the at most 276 binades between |a| and |b|
FLT_MAX = 3.4028234663852886e38


def rint(o, x):
    """Round to nearest, ties to even (IEEE roundToIntegralTiesToEven): -0.5 -> -0, 2.5 -> 2."""
    return o.rint(x)


def floor(o, x):
    """Largest integer <= x: rint(x), minus 1 where that is above x; the sign of x kept (floor(-0) = -0)."""
    r = o.rint(x)
    return copysign(o, o.select(o.gt(r, x), o.sub(r, o.f32(1)), r), x)


def ceil(o, x):
    """Smallest integer >= x; ceil(-0.5) = -0."""
    r = o.rint(x)
    return copysign(o, o.select(o.lt(r, x), o.add(r, o.f32(1)), r), x)


def trunc(o, x):
    """Round toward zero: floor(|x|) with the sign of x."""
    return copysign(o, floor(o, fabs(o, x)), x)


def sign(o, x):
    """1 for x > 0, -1 for x < 0, +0 for +-0 and NaN (torch.sign)."""
    f = o.f32
    return o.select(o.gt(x, f(0)), f(1), o.select(o.lt(x, f(0)), f(-1), f(0)))


def _ilogb(o, x):
    """floor(log2 x) as i32 for finite x > 0, subnormals included (x = 0 gives -150)."""
    sub = o.lt(x, o.f32(2.0 ** -126))
    xs = o.select(sub, o.mul(x, o.f32(2.0 ** 23)), x)
    e = o.sub(o.bitcast(o.shr(o.bitcast(xs, U32), o.u32(23)), I32), o.i32(127))
    return o.sub(e, o.select(sub, o.i32(23), o.i32(0)))


def _two_prod_masked(o, a, b):
    """a * b = p + e exactly for finite a, b whose product is finite and whose partial products do not lose bits:
    Dekker's product with 12-bit halves cut by masking (no Veltkamp constant, so no overflow for large b)."""
    def halves(v):
        hi = o.bitcast(o.and_(o.bitcast(v, U32), o.u32(0xFFFFF000)), F32)
        return hi, o.sub(v, hi)
    p = o.mul(a, b)
    ah, al = halves(a)
    bh, bl = halves(b)
    e = o.add(o.add(o.add(o.sub(o.mul(ah, bh), p), o.mul(ah, bl)), o.mul(al, bh)), o.mul(al, bl))
    return p, e


def _fmod_abs(o, x, y):
    """fmod(x, y) for finite x >= 0 and finite y > 0, exactly.

    Each step divides by y_k = y 2^k, k = max(0, ilogb(x) - ilogb(y) - 22), so the quotient q < 2^23; q is the
    floor of the rounded quotient (at most one too large, never too small), q y_k is an exact pair (one step back
    if it overflows), and x - q y_k (exact: |x - q y_k| < y_k, on y_k's grid) plus y_k where it is negative is
    the step's exact remainder. Every partial product is a multiple of 2^-149, so subnormals lose no bits.
    """
    f = o.f32
    ey = _ilogb(o, y)
    for _ in range(FMOD_STEPS):
        k = o.sub(o.sub(_ilogb(o, x), ey), o.i32(22))
        k = o.select(o.lt(k, o.i32(0)), o.i32(0), k)
        yk = ldexp(o, y, k)
        v = o.div(x, yk)
        q = o.rint(v)
        q = o.select(o.gt(q, v), o.sub(q, f(1)), q)
        q = o.select(o.gt(o.mul(q, yk), f(FLT_MAX)), o.sub(q, f(1)), q)
        p, e = _two_prod_masked(o, q, yk)
        r = o.sub(o.sub(x, p), e)
        x = o.select(o.lt(r, f(0)), o.add(r, yk), r)
    return x


def fmod(o, a, b):
    """C's fmodf (ALU): a - trunc(a / b) b exactly, with the sign of a; NaN for b = 0 or infinite a, a for infinite
    b, NaN inputs pass through (torch.fmod)."""
    f = o.f32
    x, y = fabs(o, no_nan(o, a)), fabs(o, no_nan(o, b))
    valid = o.and_(o.lt(x, f(INF)), o.and_(o.gt(y, f(0)), o.lt(y, f(INF))))
    r = _fmod_abs(o, o.select(valid, x, f(0)), o.select(valid, y, f(1)))
    res = o.select(o.eq(y, f(INF)), x, r)
    res = o.select(o.or_(valid, o.and_(o.eq(y, f(INF)), o.lt(x, f(INF)))), copysign(o, res, a), f(float("nan")))
    return o.select(o.isnan(a), a, o.select(o.isnan(b), b, res))


def remainder(o, a, b):
    """torch.remainder (ALU): r = fmod(a, b), plus b where r is nonzero and its sign differs from b's (one
    rounding, as torch's kernel)."""
    r = fmod(o, a, b)
    f = o.f32
    fix = o.and_(o.ne(r, f(0)), o.xor(o.lt(b, f(0)), o.lt(r, f(0))))
    return o.select(fix, o.add(r, b), r)
