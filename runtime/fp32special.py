"""The machine's other transcendental functions (isa/spec_intro.md, Numerics): erf, erfc, the hyperbolic functions
and their inverses, exp2, log2 and log10, as fixed fp32 sequences on the backend interface of runtime/ops_numpy.py,
like runtime/fp32math.py (whose conventions and fitting method they share).
"""
from __future__ import annotations

from trnc.runtime.fp32pow import _two_prod
from trnc.runtime.fp32round import _ilogb
from trnc.runtime.fp32util import (
    EXP_LO, INF, LOG_POLY, copysign, exp_parts, fabs, float_max, float_min, horner, horner_values, ldexp, log_reduce,
    no_nan,
)
from trnc.runtime.ops_numpy import F32, I32, U32

NAN = float("nan")
LN2, LN2_LO = 0.6931471824645996, -1.9046542121259336e-09
# 1/ln 2, 1/ln 10 and log10(2) as a 12-bit head (products with 12-bit values are exact) and an fp32 tail.
IVLN2_HI, IVLN2_LO = 1.4423828125, 0.00031222839606925845
IVLN10_HI, IVLN10_LO = 0.4342041015625, 9.038033749675378e-05
LOG10_2_HI, LOG10_2_LO = 0.301025390625, 4.605039066518657e-06
# (sinh a - a) / (a z) in z = a^2 <= 1: 3e-10 relative.
SINH_POLY = (0.1666666716337204, 0.00833331048488617, 0.00019842895562760532, 2.7822131869470468e-06)
SINH_SMALL = 1.0
EXP_MAX = 90.0                  # sinh and cosh overflow above 89.42
# erf(x) = x + x Y(z) for |x| < ERF_SPLIT, z = x^2: 1e-9 relative.
ERF_SPLIT = 0.75
ERF_POLY = (0.12837916612625122, -0.3761262595653534, 0.11283520609140396, -0.02684531919658184,
            0.005150470416992903, -0.0007313998066820204, 3.315599315101281e-05)
# Tail: x e^(x^2) erfc(x) as a degree-8 polynomial in w = 1/x - center on [0.75, 1.5), [1.5, 3), [3, 10.1]; the
# constant term is an fp32 pair (head, tail): 7e-10 relative (0.01 ulp).
ERFC_BREAKS = (1.5, 3.0)
ERFC_MAX = 10.1                 # erfc(x) < 2^-150 beyond
ERFC_CENTER = (1.0, 0.5, 0.21617162227630615)
ERFC_C0 = ((0.42758357524871826, 9.070887374562631e-10), (0.5107913613319397, -8.710927978938798e-09),
           (0.5518379807472229, 1.6200486285811166e-08))
ERFC_POLY = (
    (-0.15437155961990356, 0.03553108498454094, 0.008164328522980213, -0.018368851393461227, 0.015847155824303627,
     -0.0101172449067235, 0.004693683702498674, -0.0009128102683462203),
    (-0.16721101105213165, -0.03663328289985657, 0.11896240711212158, -0.10875426977872849, 0.04256429150700569,
     0.04064016789197922, -0.108678437769413, 0.12085205316543579),
    (-0.10733900964260101, -0.19014261662960052, 0.21987515687942505, 0.025166327133774757, -0.35757526755332947,
     0.4063678979873657, 0.21985593438148499, -1.1779733896255493),
)
# erfcx beyond ERFC_MAX: x e^(x^2) erfc(x) in v = 1/x^2 <= 1/10.1^2, the constant an fp32 pair: 5e-10 relative.
ERFCX_FAR = (0.564189612865448, -2.9317691385699618e-08, -0.28209421038627625, 0.4227772653102875,
             -0.9922030568122864)
BIG = 4096.0                    # above, asinh(x) and acosh(x) are log(x) + ln 2 to within 2^-25
# erfinv's first guess (one Newton step follows): a P(a^2) for a = |x| < 3/4 (1e-6 relative), else Q(s) with
# s = sqrt(-log((1 - a)(1 + a))) in [0.909, 4] (8e-6 relative).
ERFINV_SPLIT = 0.75
ERFINV_POLY = (0.8862279057502747, 0.23185549676418304, 0.13172683119773865, 0.045982833951711655,
               0.24689525365829468, -0.340177446603775, 0.39423835277557373)
ERFINV_TAIL = (-0.012098826467990875, 0.9320091605186462, -0.06861583143472672, 0.06164269149303436,
               -0.019198130816221237, 0.002751033054664731, -0.00015276843623723835)
HALF_SQRT_PI = 0.886226925452758


# ---- logarithms ----------------------------------------------------------------------------------------------
# i0e and i1e (e^-|x| I0(x) and e^-|x| I1(x)): on [0, 2), [2, 4) and [4, 8], a polynomial in t = (a - mid) scale,
# a = |x| (i1e's as i1e(a) / a); beyond 8, sqrt(a) f(a) as a polynomial in t = 16 / a - 1. Fitted with numpy
# (Chebyshev least squares against torch's float64, degree 10 and 8, coefficients rounded to fp32).
BESSEL_MID = (1.0, 3.0, 6.0)
BESSEL_SCALE = (1.0, 1.0, 0.5)
I0E_NEAR = (
    (0.46575960516929626, -0.25784921646118164, 0.15389399230480194, -0.07626709342002869, 0.031211648136377335,
     -0.010762134566903114, 0.00319076981395483, -0.000824225484393537, 0.00019008464005310088,
     -4.318060746300034e-05, 8.059915671765339e-06),
    (0.2430003583431244, -0.046173639595508575, 0.013369188643991947, -0.004188109654933214, 0.0012842535506933928,
     -0.00036759459180757403, 9.620095806894824e-05, -2.2793037715018727e-05, 4.9329923967889044e-06,
     -1.0621537285260274e-06, 1.9138092000048346e-07),
    (0.1666574329137802, -0.029211949557065964, 0.007740077096968889, -0.002302724402397871, 0.0007284380844794214,
     -0.00024013512302190065, 8.087870810413733e-05, -2.6403367883176543e-05, 8.821723895380273e-06,
     -3.8560101529583335e-06, 1.2033384564347216e-06),
)
I1E_NEAR = (
    (0.207910418510437, -0.15797163546085358, 0.08306347578763962, -0.03448386490345001, 0.011893143877387047,
     -0.0035115645732730627, 0.0009061690652742982, -0.00020699261222034693, 4.265224197297357e-05,
     -8.61442276800517e-06, 1.4678699926662375e-06),
    (0.0656089037656784, -0.028348056599497795, 0.009717632085084915, -0.002922907005995512, 0.000789792975410819,
     -0.00019340716244187206, 4.3148116674274206e-05, -8.79056824487634e-06, 1.6507567579537863e-06,
     -3.064693032683863e-07, 4.9128676238296975e-08),
    (0.025341909378767014, -0.012025950476527214, 0.00472296355292201, -0.0017152645159512758, 0.0005932787898927927,
     -0.0001975296181626618, 6.336077058222145e-05, -1.9186869394616224e-05, 5.697953383787535e-06,
     -2.0176853468001354e-06, 5.499956046151055e-07),
)
I0E_FAR = (0.40217649936676025, 0.0033605522476136684, 0.0001362167822662741, 1.1139815796923358e-05,
           1.4780177934881067e-06, 3.073326126923348e-07, 1.0563608299207772e-07,
           3.161964556852581e-08, 1.521649917179957e-09)
I1E_FAR = (0.389398455619812, -0.0097495773807168, -0.00021923652093391865, -1.5035268006613478e-05,
           -1.8287265675098752e-06, -3.5843021350956406e-07, -1.1787488318759642e-07,
           -3.5774139206523614e-08, -2.428625078820801e-09)


def _log_specials(o, x, res):
    """log's special cases around a result for finite x > 0: -Inf at +-0, NaN below 0, +Inf at +Inf."""
    f = o.f32
    res = o.select(o.eq(x, f(0)), f(-INF), o.select(o.eq(x, f(INF)), f(INF), res))
    return o.select(o.isnan(x), x, o.select(o.lt(x, f(0)), f(NAN), res))


def _log_parts(o, x):
    """log(x) = k ln 2 + hi + lo for finite x > 0 (other x give log 1): hi the 12-bit head of f - f^2/2, where
    x = 2^k (1 + f) as in fp32math.log, and lo the rest (fdlibm's log2f / log10f split)."""
    k, f, s, z, hfsq = log_reduce(o, x)
    hi = o.bitcast(o.and_(o.bitcast(o.sub(f, hfsq), U32), o.u32(0xFFFFF000)), F32)
    lo = o.add(o.sub(o.sub(f, hi), hfsq), o.mul(s, o.add(hfsq, o.mul(z, horner(o, LOG_POLY, z)))))
    return o.itof(k, F32), hi, lo


def log2(o, x):
    """log2(x): max error 1 ulp; exact at powers of two; log's special cases."""
    kf, hi, lo = _log_parts(o, x)
    val_hi = o.mul(hi, o.f32(IVLN2_HI))
    val_lo = o.add(o.mul(o.add(lo, hi), o.f32(IVLN2_LO)), o.mul(lo, o.f32(IVLN2_HI)))
    w = o.add(kf, val_hi)
    val_lo = o.add(val_lo, o.add(o.sub(kf, w), val_hi))
    return _log_specials(o, x, o.add(val_lo, w))


def log10(o, x):
    """log10(x): max error 1 ulp; log's special cases."""
    f = o.f32
    kf, hi, lo = _log_parts(o, x)
    val_hi = o.mul(hi, f(IVLN10_HI))
    val_lo = o.add(o.add(o.mul(kf, f(LOG10_2_LO)), o.mul(o.add(lo, hi), f(IVLN10_LO))), o.mul(lo, f(IVLN10_HI)))
    y = o.mul(kf, f(LOG10_2_HI))
    w = o.add(y, val_hi)
    val_lo = o.add(val_lo, o.add(o.sub(y, w), val_hi))
    return _log_specials(o, x, o.add(val_lo, w))


def _log(o, x):
    """Natural log of finite x > 0 (no special cases): k ln 2 + hi + lo."""
    kf, hi, lo = _log_parts(o, x)
    return o.add(o.mul(kf, o.f32(LN2)), o.add(o.add(o.mul(kf, o.f32(LN2_LO)), lo), hi))


def log1p(o, y):
    """log(1 + y) for finite y > -1: log(u) for u = 1 + y, plus the rounding error of u over u."""
    u = o.add(o.f32(1), y)
    corr = o.div(o.sub(y, o.sub(u, o.f32(1))), u)
    return o.select(o.eq(u, o.f32(1)), y, o.add(_log(o, u), corr))


# ---- exponentials --------------------------------------------------------------------------------------------

def exp2(o, x):
    """2^x: max error 1 ulp; exact at integers; Inf from 128, 0 below -150."""
    f = o.f32
    xc = float_min(o, float_max(o, no_nan(o, x), -160.0), 130.0)
    n = o.rint(xc)
    r = o.sub(xc, n)
    hi, lo = _two_prod(o, r, f(LN2))
    p, k = exp_parts(o, hi, o.add(lo, o.mul(r, f(LN2_LO))))
    return o.select(o.isnan(x), x, ldexp(o, p, o.add(k, o.ftoi(n, I32))))


def _half_exps(o, a):
    """(e^a / 2, e^-a / 2) for NaN-free a >= 0 (Inf and 0 beyond 89.42)."""
    p, n = exp_parts(o, float_min(o, a, EXP_MAX), o.f32(0))
    return ldexp(o, p, o.sub(n, o.i32(1))), ldexp(o, o.div(o.f32(1), p), o.sub(o.i32(-1), n))


def sinh(o, x):
    """sinh(x): max error 2 ulp; odd; +-Inf beyond +-89.42."""
    a = fabs(o, no_nan(o, x))
    z = o.mul(a, a)
    small = o.add(a, o.mul(o.mul(a, z), horner(o, SINH_POLY, z)))
    e, ie = _half_exps(o, a)
    v = o.select(o.lt(a, o.f32(SINH_SMALL)), small, o.sub(e, ie))
    return o.select(o.isnan(x), x, copysign(o, v, x))


def cosh(o, x):
    """cosh(x) = e^|x| / 2 + e^-|x| / 2: max error 1.5 ulp; +Inf beyond 89.42."""
    e, ie = _half_exps(o, fabs(o, no_nan(o, x)))
    return o.select(o.isnan(x), x, o.add(e, ie))


# ---- inverse hyperbolic functions ----------------------------------------------------------------------------

def asinh(o, x):
    """asinh(x): log1p(a + a^2 / (1 + sqrt(1 + a^2))) below 2, log(2a + 1 / (a + sqrt(a^2 + 1))) below 4096, then
    log(a) + ln 2 (a = |x|): max error 2 ulp; odd."""
    f = o.f32
    a = fabs(o, no_nan(o, x))
    a = o.select(o.lt(a, f(INF)), a, f(1))
    ab = float_min(o, a, BIG)
    a2 = o.mul(ab, ab)
    root = o.sqrt(o.add(a2, f(1)))
    near = log1p(o, o.add(ab, o.div(a2, o.add(f(1), root))))
    mid = _log(o, o.add(o.mul(f(2), ab), o.div(f(1), o.add(ab, root))))
    far = o.add(_log(o, a), f(LN2))
    v = o.select(o.lt(ab, f(2)), near, o.select(o.lt(ab, f(BIG)), mid, far))
    v = o.select(o.eq(fabs(o, x), f(INF)), f(INF), v)
    return o.select(o.isnan(x), x, copysign(o, v, x))


def acosh(o, x):
    """acosh(x): log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact) below 2, log(2x - 1 / (x + sqrt(x^2 - 1))) below
    4096, then log(x) + ln 2: max error 2 ulp; NaN below 1, +Inf at +Inf."""
    f = o.f32
    xn = no_nan(o, x)
    xs = o.select(o.and_(o.ge(xn, f(1)), o.lt(xn, f(INF))), xn, f(1))
    xb = float_min(o, xs, BIG)
    t = o.sub(xb, f(1))
    near = log1p(o, o.add(t, o.sqrt(o.add(o.mul(f(2), t), o.mul(t, t)))))
    mid = _log(o, o.sub(o.mul(f(2), xb), o.div(f(1), o.add(xb, o.sqrt(o.sub(o.mul(xb, xb), f(1)))))))
    far = o.add(_log(o, xs), f(LN2))
    v = o.select(o.lt(xb, f(2)), near, o.select(o.lt(xb, f(BIG)), mid, far))
    v = o.select(o.eq(x, f(INF)), f(INF), o.select(o.lt(xn, f(1)), f(NAN), v))
    return o.select(o.isnan(x), x, v)


def atanh(o, x):
    """atanh(x) = log1p(2a / (1 - a)) / 2 (fdlibm's two forms, a = |x|): max error 2 ulp; odd, +-Inf at +-1, NaN
    beyond."""
    f = o.f32
    a = fabs(o, no_nan(o, x))
    ac = o.select(o.lt(a, f(1)), a, f(0))
    two_a = o.add(ac, ac)
    one_minus = o.sub(f(1), ac)
    arg = o.select(o.lt(ac, f(0.5)), o.add(two_a, o.div(o.mul(two_a, ac), one_minus)), o.div(two_a, one_minus))
    v = o.mul(f(0.5), log1p(o, arg))
    v = o.select(o.lt(a, f(1)), v, o.select(o.eq(a, f(1)), f(INF), f(NAN)))
    return o.select(o.isnan(x), x, copysign(o, v, x))


# ---- the error function --------------------------------------------------------------------------------------

def _erfc_scaled(o, a):
    """T(a) = a e^(a^2) erfc(a) for NaN-free a >= ERF_SPLIT, ERFC_MAX at most (and the clamped a)."""
    f = o.f32
    ac = float_min(o, float_max(o, a, ERF_SPLIT), ERFC_MAX)
    mid, far = o.ge(ac, f(ERFC_BREAKS[0])), o.ge(ac, f(ERFC_BREAKS[1]))

    def piece(values):
        return o.select(far, f(values[2]), o.select(mid, f(values[1]), f(values[0])))

    w = o.sub(o.div(f(1), ac), piece(ERFC_CENTER))
    rest = horner_values(o, [piece([ERFC_POLY[k][j] for k in range(3)]) for j in range(8)], w)
    return o.add(piece([c[0] for c in ERFC_C0]), o.add(piece([c[1] for c in ERFC_C0]), o.mul(w, rest))), ac


def _exp_neg_square(o, a):
    """e^(-a^2) = p 2^n for NaN-free a >= 0 (a^2 split exactly: a_hi with 12 significant bits, as in gelu)."""
    a_hi = o.bitcast(o.and_(o.bitcast(a, U32), o.u32(0xFFFFF000)), F32)
    d = o.mul(o.sub(a, a_hi), o.add(a, a_hi))
    return exp_parts(o, float_max(o, o.neg(o.mul(a_hi, a_hi)), EXP_LO), o.neg(d))


def _erfc_tail(o, a):
    """erfc(a) for NaN-free a >= ERF_SPLIT: T(a) e^(-a^2) / a."""
    tail, ac = _erfc_scaled(o, a)
    p, n = _exp_neg_square(o, ac)
    v = ldexp(o, o.div(o.mul(tail, p), ac), n)
    return o.select(o.gt(a, o.f32(ERFC_MAX)), o.f32(0), v)


def _erf_small(o, x):
    """x Y(x^2) for |x| < ERF_SPLIT: erf(x) = x + x Y."""
    xs = o.select(o.lt(fabs(o, x), o.f32(ERF_SPLIT)), x, o.f32(0))
    return xs, o.mul(xs, horner(o, ERF_POLY, o.mul(xs, xs)))


def erf(o, x):
    """erf(x): max error 1 ulp; odd, +-1 at +-Inf."""
    xn = no_nan(o, x)
    a = fabs(o, xn)
    xs, xy = _erf_small(o, xn)
    far = copysign(o, o.sub(o.f32(1), _erfc_tail(o, a)), xn)
    return o.select(o.isnan(x), x, o.select(o.lt(a, o.f32(ERF_SPLIT)), o.add(xs, xy), far))


def erfc(o, x):
    """erfc(x): 1 - erf(x) near 0 (as 1/2 - ((x - 1/2) + x Y) from 1/4, fdlibm's split), else the tail, 2 - tail
    for x < 0: max error 2 ulp, subnormal results included; 2 at -Inf, 0 at +Inf."""
    f = o.f32
    xn = no_nan(o, x)
    a = fabs(o, xn)
    xs, xy = _erf_small(o, xn)
    near = o.select(o.lt(xs, f(0.25)), o.sub(f(1), o.add(xs, xy)), o.sub(f(0.5), o.add(o.sub(xs, f(0.5)), xy)))
    t = _erfc_tail(o, a)
    far = o.select(o.lt(xn, f(0)), o.sub(f(2), t), t)
    return o.select(o.isnan(x), x, o.select(o.lt(a, f(ERF_SPLIT)), near, far))



# ---- binary functions (ALU) ----------------------------------------------------------------------------------

def hypot(o, a, b):
    """sqrt(a^2 + b^2) without overflow or underflow (ALU): both scaled by the power of two that brings the larger
    magnitude to [1, 2), exactly; max error 1 ulp. +Inf if either is infinite (even with a NaN), else NaN if
    either is NaN."""
    f = o.f32
    x, y = fabs(o, no_nan(o, a)), fabs(o, no_nan(o, b))
    m = o.select(o.gt(x, y), x, y)
    finite = o.lt(m, f(INF))
    ms = o.select(o.and_(finite, o.gt(m, f(0))), m, f(1))
    k = _ilogb(o, ms)
    nk = o.sub(o.i32(0), k)
    xs, ys = ldexp(o, o.select(finite, x, f(0)), nk), ldexp(o, o.select(finite, y, f(0)), nk)
    v = ldexp(o, o.sqrt(o.add(o.mul(xs, xs), o.mul(ys, ys))), k)
    any_nan = o.or_(o.isnan(a), o.isnan(b))
    return o.select(finite, o.select(any_nan, o.select(o.isnan(a), a, b), v), f(INF))


def logaddexp(o, a, b):
    """log(e^a + e^b) = max(a, b) + log1p(e^-|a - b|) (ALU, torch's formula): max error 2 ulp away from
    cancellation (the result's absolute error is 2^-24 at most plus max's ulp); a where a = b = +-Inf; NaN in, NaN
    out."""
    f = o.f32
    an, bn = no_nan(o, a), no_nan(o, b)
    m = o.select(o.gt(an, bn), an, bn)
    d = fabs(o, o.sub(an, bn))
    d = o.select(o.isnan(d), f(INF), d)           # inf - inf: the result is m (or a when a = b, below)
    p, n = exp_parts(o, float_max(o, o.neg(d), EXP_LO), f(0))
    v = o.add(m, log1p(o, ldexp(o, p, n)))
    v = o.select(o.and_(o.eq(an, bn), o.eq(fabs(o, an), f(INF))), an, v)
    return o.select(o.isnan(a), a, o.select(o.isnan(b), b, v))


def erfinv(o, x):
    """erfinv(x): a first guess y0, then one Newton step y0 - r sqrt(pi)/2 e^(y0^2) on the residual r = erf(y0) - a,
    taken as (1 - a) - erfc(y0) beyond 3/4 (1 - a is exact there, so the tail keeps its relative accuracy):
    max error 2 ulp; odd, +-Inf at +-1, NaN beyond."""
    f = o.f32
    a = fabs(o, no_nan(o, x))
    ac = o.select(o.lt(a, f(1)), a, f(0))
    near = o.lt(ac, f(ERFINV_SPLIT))
    one_minus = o.sub(f(1), ac)
    s = o.sqrt(o.neg(_log(o, o.mul(one_minus, o.add(f(1), ac)))))
    y0 = o.select(near, o.mul(ac, horner(o, ERFINV_POLY, o.mul(ac, ac))), horner(o, ERFINV_TAIL, s))
    xs, xy = _erf_small(o, y0)
    r = o.select(near, o.sub(o.select(o.lt(y0, f(ERF_SPLIT)), o.add(xs, xy), o.sub(f(1), _erfc_tail(o, y0))), ac),
                 o.sub(one_minus, _erfc_tail(o, y0)))
    p, n = exp_parts(o, o.mul(y0, y0), f(0))
    y = o.sub(y0, o.mul(o.mul(r, f(HALF_SQRT_PI)), ldexp(o, p, n)))
    y = o.select(o.lt(a, f(1)), y, o.select(o.eq(a, f(1)), f(INF), f(NAN)))
    return o.select(o.isnan(x), x, copysign(o, y, x))


def erfcx(o, x):
    """e^(x^2) erfc(x): T(x) / x from 3/4 (beyond 10.1 a polynomial in 1/x^2), e^(x^2) erfc(x) nearer 0, and
    2 e^(x^2) - erfcx(-x) below -3/4 (+Inf below -9.4): max error 2.5 ulp; +Inf at -Inf, 0 at +Inf."""
    f = o.f32
    xn = no_nan(o, x)
    a = fabs(o, xn)
    tail, _ = _erfc_scaled(o, a)
    af = float_max(o, a, ERFC_MAX)
    v = o.div(f(1), o.mul(af, af))
    g_far = o.add(f(ERFCX_FAR[0]), o.add(f(ERFCX_FAR[1]), o.mul(v, horner(o, ERFCX_FAR[2:], v))))
    scaled = o.select(o.gt(a, f(ERFC_MAX)), o.div(g_far, a), o.div(tail, float_max(o, a, ERF_SPLIT)))
    p, n = _exp_neg_square(o, float_min(o, a, 10.0))
    e2 = ldexp(o, o.div(f(1), p), o.sub(o.i32(0), n))                  # e^(a^2), a <= 10
    e2 = o.select(o.gt(a, f(10.0)), f(INF), e2)
    xs, xy = _erf_small(o, xn)
    near = o.select(o.lt(xs, f(0.25)), o.sub(f(1), o.add(xs, xy)), o.sub(f(0.5), o.add(o.sub(xs, f(0.5)), xy)))
    v = o.select(o.lt(a, f(ERF_SPLIT)), o.mul(e2, near),
                 o.select(o.lt(xn, f(0)), o.sub(o.mul(f(2), e2), scaled), scaled))
    return o.select(o.isnan(x), x, v)



def _bessel_scaled(o, x, near, far):
    """(a, the [0, 8] polynomial at a, the far form at a) for a = |x| (NaN taken as 0)."""
    f = o.f32
    a = fabs(o, no_nan(o, x))
    low, middle = o.lt(a, f(2.0)), o.lt(a, f(4.0))

    def pick(values):
        return o.select(low, f(values[0]), o.select(middle, f(values[1]), f(values[2])))
    t = o.mul(o.sub(a, pick(BESSEL_MID)), pick(BESSEL_SCALE))
    p = horner_values(o, [pick(c) for c in zip(*near)], t)
    af = float_max(o, a, 8.0)
    q = o.div(horner(o, far, o.sub(o.div(f(16.0), af), f(1.0))), o.sqrt(af))
    return a, p, q


def i0e(o, x):
    """e^-|x| I0(x): max error 2.6 ulp; 1 at 0, +0 at +-Inf."""
    a, p, q = _bessel_scaled(o, x, I0E_NEAR, I0E_FAR)
    return o.select(o.isnan(x), x, o.select(o.gt(a, o.f32(8.0)), q, p))


def i1e(o, x):
    """e^-|x| I1(x): odd, max error 3.1 ulp; +0 at +-0 (as torch), +-0 at +-Inf."""
    a, p, q = _bessel_scaled(o, x, I1E_NEAR, I1E_FAR)
    v = o.select(o.gt(a, o.f32(8.0)), q, o.mul(a, p))
    return o.select(o.isnan(x), x, o.select(o.lt(x, o.f32(0.0)), o.neg(v), v))
