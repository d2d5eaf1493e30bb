"""The machine's circular functions (isa/spec_intro.md, Numerics): sin, cos, tan, asin, acos, atan and the ALU atan2,
as fixed fp32 sequences on the backend interface of runtime/ops_numpy.py, like runtime/fp32math.py.

sin, cos and tan reduce x modulo pi/2 exactly for every finite fp32 x (Payne-Hanek without a table): 2/pi is a sum
of 16 pieces of 12 bits, |x| = x_hi + x_lo with 12 bits each, so every product x_part * piece is exact; each
product is taken modulo 4 (in units of a quarter turn) and split on the fixed grids 2^-20 and 2^-39 into three
accumulators, the first two of which add exactly. The reduced argument r (|r| <= 1/2 + 2^-16 quarter turns)
becomes y = r pi/2 as an unevaluated pair, then sin and cos polynomials on |y| <= 0.786.
Coefficients were fitted as in runtime/fp32math.py (near-minimax in the relative error, rounded to fp32 one at a
time with the rest refitted); each table notes its approximation error.
"""
from __future__ import annotations

from trnc.runtime.fp32pow import _fast_two_sum, _two_prod
from trnc.runtime.fp32util import INF, copysign, fabs, horner, no_nan
from trnc.runtime.ops_numpy import F32, U32

# 2/pi = sum of TWO_OVER_PI[i] * 2^-TWO_OVER_PI_SCALE to 2^-192: consecutive 12-bit pieces, scaled up so that all
# are normal fp32 (|x| is scaled down by the same power of two, exactly).
TWO_OVER_PI_SCALE = 70
TWO_OVER_PI = tuple(c * 2.0 ** TWO_OVER_PI_SCALE for c in (
    0.636474609375, 0.00014513731002807617, 2.5669578462839127e-08, 1.297451035497943e-11, 2.931682674400804e-16,
    5.412540532954979e-19, 3.25185378309909e-23, 2.5256170741555914e-26, 1.2088677074929802e-29,
    9.366338987351987e-34, 5.666250112948058e-37, 1.3066827920136054e-40, 2.6197712696322557e-44,
    6.31841577465795e-48, 7.053854129906405e-52, 1.035509742236094e-56))
PIO2_HI, PIO2_LO = 1.5707963705062866, -4.371138828673793e-08     # pi/2 = HI + LO to 2^-50
PI_HI, PI_LO = 3.1415927410125732, -8.742277657347586e-08
SMALL = 0.785                   # |x| below this (< pi/4) is its own reduced argument
# (sin y - y) / y^3 and (cos y - 1 + y^2/2) / y^4 in z = y^2 <= 0.786^2: 0.05 and 0.01 ulp of the result.
SIN_POLY = (-0.1666666716337204, 0.008333329111337662, -0.0001983932888833806, 2.7182545636605937e-06)
COS_POLY = (0.0416666679084301, -0.0013888883404433727, 2.4799513994366862e-05, -2.7209708264308574e-07)
# atan(t) = t + t z P(z), z = t^2 <= (7/16)^2: 1e-9 relative (0.01 ulp).
ATAN_POLY = (-0.3333333134651184, 0.19999803602695465, -0.14279219508171082, 0.1101127415895462,
             -0.08296116441488266, 0.043852802366018295)
# fdlibm's intervals of |x|: [0, 7/16) as is; [7/16, 11/16), [11/16, 19/16), [19/16, 39/16) around c = 1/2, 1, 3/2
# (t = (x - c) / (1 + c x)); beyond, t = -1/x around infinity. atan(c) as HI + LO.
ATAN_BREAKS = (0.4375, 0.6875, 1.1875, 2.4375)
ATAN_C = (0.5, 1.0, 1.5)
ATAN_HI = (0.46364760398864746, 0.7853981852531433, 0.9827937483787537, PIO2_HI)
ATAN_LO = (5.01215868808913e-09, -2.1855694143368964e-08, -2.5131424052915463e-08, PIO2_LO)
# asin(s) = s + s z R(z), z = s^2 <= 1/4: 3e-10 relative.
ASIN_POLY = (0.16666659712791443, 0.0750051960349083, 0.044514138251543045, 0.031830351799726486,
             0.014355700463056564, 0.037629712373018265)


def _mod_grid(o, v, unit: float):
    """v - unit * rint(v / unit): exact for an integer-valued v and a power of two unit."""
    return o.sub(v, o.mul(o.rint(o.mul(v, o.f32(1.0 / unit))), o.f32(unit)))


def _rem_pio2(o, a):
    """|x| = a (finite, >= 0) as (n + r) pi/2: r = (hi, lo) an fp32 pair with |r| <= 1/2 + 2^-16, n in {-2..2}.

    In quarter turns (units of pi/2), a * 2/pi = sum over the 32 exact products p = a_part * piece. A product
    of magnitude >= 2^26 has 24 significant bits, hence is a multiple of 4 and is dropped; the rest are cut at
    the grids 2^-20 (integers tA, summed modulo 2^22 exactly) and 2^-39 (integers tB, |tB| <= 2^18, whose sum
    stays below 2^24), and the remainders below 2^-39 are summed in fp32.
    """
    f = o.f32
    scaled = o.mul(a, f(2.0 ** -TWO_OVER_PI_SCALE))
    hi = o.bitcast(o.and_(o.bitcast(scaled, U32), o.u32(0xFFFFF000)), F32)
    parts = (hi, o.sub(scaled, hi))
    acc_a, acc_b, acc_c = f(0), f(0), f(0)
    for piece in TWO_OVER_PI:
        for part in parts:
            p = o.mul(part, f(piece))
            t = o.mul(o.select(o.lt(fabs(o, p), f(2.0 ** 26)), p, f(0)), f(2.0 ** 20))
            ta = o.rint(t)
            u = o.mul(o.sub(t, ta), f(2.0 ** 19))
            ub = o.rint(u)
            acc_a = o.add(acc_a, _mod_grid(o, ta, 2.0 ** 22))
            acc_b = o.add(acc_b, ub)
            acc_c = o.add(acc_c, o.sub(u, ub))
        acc_a = _mod_grid(o, acc_a, 2.0 ** 22)
    q = o.mul(acc_a, f(2.0 ** -20))
    n = o.rint(q)
    s, e = _two_sum(o, o.sub(q, n), o.mul(acc_b, f(2.0 ** -39)))
    return _fast_two_sum(o, s, o.add(e, o.mul(acc_c, f(2.0 ** -39)))), n


def _two_sum(o, a, b):
    s = o.add(a, b)
    bb = o.sub(s, a)
    return s, o.add(o.sub(a, o.sub(s, bb)), o.sub(b, bb))


def _reduce(o, x):
    """|x| = (q + y) pi/2 with y = (hi, lo) in radians, |hi| <= 0.786, and q in {0, 1, 2, 3} as fp32 (NaN-free x;
    infinities give garbage that the callers replace by NaN)."""
    f = o.f32
    a = fabs(o, no_nan(o, x))
    a = o.select(o.lt(a, f(INF)), a, f(0))
    (rh, rl), n = _rem_pio2(o, a)
    ph, pl = _two_prod(o, rh, f(PIO2_HI))
    yh, yl = _fast_two_sum(o, ph, o.add(pl, o.add(o.mul(rh, f(PIO2_LO)), o.mul(rl, f(PIO2_HI)))))
    small = o.lt(a, f(SMALL))
    q = o.select(o.lt(n, f(0)), o.add(n, f(4)), n)
    return o.select(small, a, yh), o.select(small, f(0), yl), o.select(small, f(0), q)


def _sin_kernel(o, yh, yl):
    """sin(yh + yl) = yh + (yh z S(z) + yl (1 - z/2)), z = yh^2."""
    z = o.mul(yh, yh)
    tail = o.add(o.mul(yh, o.mul(z, horner(o, SIN_POLY, z))), o.mul(yl, o.sub(o.f32(1), o.mul(o.f32(0.5), z))))
    return o.add(yh, tail)


def _cos_kernel(o, yh, yl):
    """cos(yh + yl) = w + (((1 - w) - z/2) + (z^2 C(z) - yh yl)) with w = 1 - z/2 (fdlibm's split)."""
    one = o.f32(1)
    z = o.mul(yh, yh)
    hz = o.mul(o.f32(0.5), z)
    w = o.sub(one, hz)
    tail = o.add(o.sub(o.sub(one, w), hz), o.sub(o.mul(o.mul(z, z), horner(o, COS_POLY, z)), o.mul(yh, yl)))
    return o.add(w, tail)


def _even(o, q):
    half = o.mul(q, o.f32(0.5))
    return o.eq(o.rint(half), half)


def _sign(o, x):
    """The sign bit of x as a mask."""
    return o.ne(o.and_(o.bitcast(x, U32), o.u32(0x80000000)), o.u32(0))


def _negate_if(o, v, m):
    return o.select(m, o.neg(v), v)


def _finish(o, x, v):
    """NaN for NaN and infinite x (a NaN x passes through)."""
    return o.select(o.isnan(x), x, o.select(o.lt(fabs(o, x), o.f32(INF)), v, o.f32(float("nan"))))


def sin(o, x):
    """sin(x) with exact argument reduction: max error 0.6 ulp; sin(+-0) = +-0, NaN for +-Inf."""
    yh, yl, q = _reduce(o, x)
    v = o.select(_even(o, q), _sin_kernel(o, yh, yl), _cos_kernel(o, yh, yl))
    return _finish(o, x, _negate_if(o, v, o.xor(o.ge(q, o.f32(2)), _sign(o, x))))


def cos(o, x):
    """cos(x) with exact argument reduction: max error 0.6 ulp; NaN for +-Inf."""
    yh, yl, q = _reduce(o, x)
    v = o.select(_even(o, q), _cos_kernel(o, yh, yl), _sin_kernel(o, yh, yl))
    flip = o.or_(o.eq(q, o.f32(1)), o.eq(q, o.f32(2)))
    return _finish(o, x, _negate_if(o, v, flip))


def tan(o, x):
    """tan(x) = sin / cos of the reduced argument (-cos / sin for odd quadrants): max error 1.6 ulp; odd."""
    yh, yl, q = _reduce(o, x)
    s, c = _sin_kernel(o, yh, yl), _cos_kernel(o, yh, yl)
    v = o.select(_even(o, q), o.div(s, c), o.neg(o.div(c, s)))
    return _finish(o, x, _negate_if(o, v, _sign(o, x)))


def _atan_pos(o, a):
    """atan(a) for a >= 0 (NaN-free, +Inf allowed): fdlibm's reduction to |t| < 7/16 and one polynomial."""
    f = o.f32
    k = [o.ge(a, f(b)) for b in ATAN_BREAKS]

    def pick(values, first):   # the value of a's interval: first below 7/16, values[i] from ATAN_BREAKS[i]
        v = first
        for m, val in zip(k, values):
            v = o.select(m, val, v)
        return v

    c = pick([f(v) for v in ATAN_C], f(0))
    num = o.select(k[3], f(-1), o.sub(a, c))
    den = o.select(k[3], a, o.add(f(1), o.mul(c, a)))
    t = o.select(k[0], o.div(num, den), a)
    z = o.mul(t, t)
    poly = o.mul(o.mul(t, z), horner(o, ATAN_POLY, z))
    hi, lo = pick([f(v) for v in ATAN_HI], f(0)), pick([f(v) for v in ATAN_LO], f(0))
    return o.select(k[0], o.sub(hi, o.sub(o.sub(o.neg(lo), poly), t)), o.add(t, poly))


def atan(o, x):
    """atan(x): max error 0.8 ulp; odd, atan(+-Inf) = +-pi/2."""
    return o.select(o.isnan(x), x, copysign(o, _atan_pos(o, fabs(o, no_nan(o, x))), x))


def _asin_parts(o, a):
    """For 0 <= a <= 1: (small, v, hi, lo) where asin(a) = v if small (a <= 1/2), else pi/2 - 2 (hi + lo) with
    hi + lo = asin(sqrt((1 - a) / 2)), hi the 12-bit head of that square root (fdlibm's split)."""
    f = o.f32
    small = o.le(a, f(0.5))
    z = o.mul(a, a)
    v = o.add(a, o.mul(o.mul(a, z), horner(o, ASIN_POLY, z)))
    w = o.mul(o.sub(f(1), a), f(0.5))
    s = o.sqrt(w)
    sh = o.bitcast(o.and_(o.bitcast(s, U32), o.u32(0xFFFFF000)), F32)
    corr = o.select(o.eq(s, f(0)), f(0), o.div(o.sub(w, o.mul(sh, sh)), o.add(s, sh)))
    lo = o.add(corr, o.mul(o.mul(s, w), horner(o, ASIN_POLY, w)))
    return small, v, sh, lo


def _clip1(o, a):
    return o.select(o.gt(a, o.f32(1)), o.f32(1), a)


def asin(o, x):
    """asin(x): max error 1 ulp; odd, NaN outside [-1, 1]."""
    f = o.f32
    a = fabs(o, no_nan(o, x))
    small, v, sh, lo = _asin_parts(o, _clip1(o, a))
    big = o.sub(o.sub(f(PIO2_HI), o.mul(f(2), sh)), o.sub(o.mul(f(2), lo), f(PIO2_LO)))
    res = copysign(o, o.select(small, v, big), x)
    return o.select(o.isnan(x), x, o.select(o.le(a, f(1)), res, f(float("nan"))))


def acos(o, x):
    """acos(x): max error 1 ulp; NaN outside [-1, 1]."""
    f = o.f32
    xn = no_nan(o, x)
    a = fabs(o, xn)
    small, v, sh, lo = _asin_parts(o, _clip1(o, a))
    neg = o.lt(xn, f(0))
    mid = o.sub(f(PIO2_HI), o.sub(copysign(o, v, xn), f(PIO2_LO)))          # pi/2 - asin(x), |x| <= 1/2
    twice = o.mul(f(2), o.add(sh, lo))                                         # 2 asin(s)
    far = o.select(neg, o.sub(f(PI_HI), o.sub(twice, f(PI_LO))), twice)      # x < -1/2: pi - 2 asin(s)
    res = o.select(small, mid, far)
    return o.select(o.isnan(x), x, o.select(o.le(a, f(1)), res, f(float("nan"))))


def atan2(o, y, x):
    """atan2(y, x) (ALU): the angle of (x, y), from atan of the smaller over the larger magnitude; max error 2 ulp.

    C99 Annex F special cases: atan2(+-0, +0) = +-0, atan2(+-0, -0) = +-pi, both infinite give +-pi/4 or
    +-3pi/4, NaN if either is NaN.
    """
    f = o.f32
    ay, ax = fabs(o, no_nan(o, y)), fabs(o, no_nan(o, x))
    both_inf = o.and_(o.eq(ay, f(INF)), o.eq(ax, f(INF)))
    swap = o.gt(ay, ax)
    num, den = o.select(swap, ax, ay), o.select(swap, ay, ax)
    t = o.select(o.or_(both_inf, o.eq(den, f(0))), o.select(both_inf, f(1), f(0)), o.div(num, den))
    a = _atan_pos(o, t)
    a = o.select(swap, o.sub(f(PIO2_HI), o.sub(a, f(PIO2_LO))), a)
    a = o.select(_sign(o, x), o.sub(f(PI_HI), o.sub(a, f(PI_LO))), a)   # -0 counts as negative
    res = copysign(o, a, y)
    return o.select(o.isnan(y), y, o.select(o.isnan(x), x, res))
