"""The machine's fp32 math: activation functions, ALU binary ops and reduction folds, as fixed fp32 op sequences.

isa/spec_intro.md (Numerics) defines every ScalarE function and the ALU `pow` as the exact sequence
of IEEE binary32 operations written here; the llvmlite JIT lowers the same sequence, so both agree
bit for bit. Only +, -, *, /, sqrt, rint, comparisons/selects and integer operations on the bit
pattern are used (no FMA, no library transcendental), all on float32 arrays with float32 constants.

Polynomial coefficients were fitted offline (float64 weighted least squares on Chebyshev nodes with
Lawson reweighting, i.e. near-minimax in the relative error of the final result) and rounded to fp32;
each table notes the approximation error of its rounded coefficients. Measured accuracy, over dense
sweeps against float64 references (tests/runtime/test_fp32math.py asserts these bounds), is given in
each function's docstring in ulps of the fp32 result (subnormal results: ulps of 2^-149).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trnc.isa.enums import ActFunc, AluOp, ReduceOp

F = np.float32
U32 = np.uint32
NAN = F(np.nan)
INF = F(np.inf)

LOG2E = F(1.442695)             # fp32(1 / ln 2)
LN2 = F(0.6931472)              # fp32(ln 2)
LN2_HI = F(0.693145751953125)   # 0x3F317200, 16 significant bits: n * LN2_HI is exact for |n| < 256
LN2_LO = F(1.4286068e-06)       # fp32(ln 2 - LN2_HI)
LOG2E_LO = F(1.925963e-08)      # fp32(log2 e - LOG2E): the pair for pow's extended-precision log2
SPLIT = F(4097.0)               # 2^12 + 1: Veltkamp split of an fp32 into two 12-bit halves
SQRT2_MANT = 0x3504F3           # mantissa field of sqrt(2)

# (e^r - 1 - r) / r^2 on |r| <= 0.36, degree 4 in r; approximation error 0.07 ulp of e^r.
EXP_POLY = (F(0.4999999), F(0.16666497), F(0.04166867), F(0.008371496), F(0.0013808846))
# (2 atanh(s) - 2 s) / s^3 in z = s^2 <= 0.0295 (|s| <= 3 - 2 sqrt 2), degree 2; 0.014 ulp of log.
LOG_POLY = (F(0.66666776), F(0.39977536), F(0.29871866))
# Normal CDF near 0: Phi(x) = 1/2 + x P(x^2) for |x| < GELU_SPLIT, degree 4 in x^2; 0.02 ulp of x Phi(x).
GELU_SPLIT = F(0.75)
PHI_POLY = (F(0.39894226), F(-0.06649016), F(0.009971508), F(-0.001179323), F(0.00010140814))
# Tail: u Q(u) e^(u^2/2), Q = 1 - Phi, as a degree-8 polynomial in w = 1/u - center, on three pieces
# [0.75, 1.5), [1.5, 3), [3, 16]; approximation error <= 0.05 ulp.
GELU_TAIL_BREAKS = (F(1.5), F(3.0))
GELU_TAIL_MAX = F(16.0)         # u Q(u) < 2^-150 beyond: the result is x or -0
GELU_TAIL_CENTER = (F(1.0), F(0.5), F(0.19791667))
GELU_TAIL_POLY = (
    (F(0.2615783), F(-0.12421432), F(0.048957467), F(-0.010719712), F(-0.0063225147), F(0.011835582),
     F(-0.011832925), F(0.010425916), F(-0.0068850913)),
    (F(0.336204), F(-0.17050177), F(0.019198207), F(0.099343255), F(-0.16700187), F(0.16980304),
     F(-0.10040036), F(-0.06140245), F(0.248806)),
    (F(0.38486597), F(-0.12889485), F(-0.20975141), F(0.42791444), F(-0.1796562), F(-0.8169016),
     F(2.1453052), F(-1.0665303), F(-5.206144)),
)
GELU_TANH_C = F(1.5957692)      # 2 sqrt(2/pi): 0.5 (1 + tanh(v)) = sigmoid(2 v)
GELU_TANH_K = F(0.044715)

EXP_LO, EXP_HI = F(-120.0), F(89.0)  # exp underflows to 0 below -103.98 and overflows above 88.73
TANH_SAT = F(9.5)                    # tanh(x) rounds to 1 for x > 9.01
POW_Y_MAX = F(300.0)                 # |b log2 a| beyond this is certainly 0 or Inf
POW_B_MAX = F(2.0 ** 32)             # |b| beyond this with a != 1 gives |b log2 a| > 369


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=F).view(U32)


def _float(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, dtype=U32).view(F)


def _horner(coeffs, z: np.ndarray) -> np.ndarray:
    acc = np.broadcast_to(coeffs[-1], np.shape(z)).astype(F)
    for c in reversed(coeffs[:-1]):
        acc = acc * z + c
    return acc


def _pow2(k: np.ndarray) -> np.ndarray:
    """2^k as fp32 for integer k in [-126, 127], built from the exponent bits."""
    return _float((k.astype(np.int32) + 127).astype(U32) << U32(23))


def _ldexp(v: np.ndarray, n: np.ndarray) -> np.ndarray:
    """v * 2^n for integer n in [-252, 254]: two power-of-two factors, so only the last product rounds
    (overflow to Inf and gradual underflow happen there, once)."""
    n = n.astype(np.int32)
    n1 = n >> 1
    return (v * _pow2(n1)) * _pow2(n - n1)


def _copysign(mag: np.ndarray, x: np.ndarray) -> np.ndarray:
    return _float((_bits(mag) & U32(0x7FFFFFFF)) | (_bits(x) & U32(0x80000000)))


def _no_nan(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x), F(0), x)


def _exp_parts(hi: np.ndarray, lo: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """exp(hi + lo) = p * 2^n with p in [0.7, 1.42] (Cody-Waite reduction, then a polynomial).

    n = rint(hi log2 e); r = (hi - n LN2_HI) + (lo - n LN2_LO), where the first difference is exact;
    `lo` carries low-order bits of the argument when the caller has them.
    """
    nf = np.rint(hi * LOG2E)
    r = (hi - nf * LN2_HI) + (lo - nf * LN2_LO)
    p = F(1) + (r + (r * r) * _horner(EXP_POLY, r))
    return p, nf.astype(np.int32)


def exp(x: np.ndarray) -> np.ndarray:
    """e^x: max error 1 ulp (subnormal results included); Inf above 88.72, 0 below -103.97."""
    p, n = _exp_parts(np.clip(_no_nan(x), EXP_LO, EXP_HI), F(0))
    return np.where(np.isnan(x), x, _ldexp(p, n))


def _expm1_nonpos(y: np.ndarray) -> np.ndarray:
    """e^y - 1 for y in [-19, 0]: (2^n - 1) + 2^n expm1(r), exact for n = 0 so tiny y keep full precision."""
    nf = np.rint(y * LOG2E)
    r = (y - nf * LN2_HI) - nf * LN2_LO
    em = r + (r * r) * _horner(EXP_POLY, r)
    s = _pow2(nf)
    return (s - F(1)) + s * em


def tanh(x: np.ndarray) -> np.ndarray:
    """tanh(x) = -m / (m + 2) with m = expm1(-2|x|), sign restored: max error 2.5 ulp; odd, tanh(+-0) = +-0."""
    a = np.minimum(np.abs(_no_nan(x)), TANH_SAT)
    m = _expm1_nonpos(F(-2) * a)
    return np.where(np.isnan(x), x, _copysign(-m / (m + F(2)), x))


def _mul_sigmoid(v: np.ndarray, s: np.ndarray) -> np.ndarray:
    """v * sigmoid(s) for NaN-free v >= -120 and s.

    With e^(-|s|) = p 2^n: s >= 0 gives v / (1 + e^-s); s < 0 gives (v p / (1 + e^s)) * 2^n, the power
    of two applied last so that tiny (subnormal) results round once.
    """
    neg = s < 0
    p, n = _exp_parts(np.maximum(-np.abs(s), EXP_LO), F(0))
    d = F(1) + _ldexp(p, n)
    q = np.where(neg, v * p, v) / d
    return _ldexp(q, np.where(neg, n, 0))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 (no overflow of e^-x): max error 2.5 ulp, subnormals included."""
    return np.where(np.isnan(x), x, _mul_sigmoid(np.ones_like(x, dtype=F), _no_nan(x)))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) with one division: max error 3 ulp, subnormal results included."""
    xs = np.maximum(_no_nan(x), EXP_LO)  # silu(x) underflows to -0 well before -120
    return np.where(np.isnan(x), x, _mul_sigmoid(xs, xs))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)).

    The cubic argument is rounded in fp32, so the error is bounded by 2 ulp plus the effect of a
    relative perturbation of 2^-22 of that argument (the formula's own conditioning): see the test.
    """
    xs = np.maximum(_no_nan(x), EXP_LO)  # the result underflows to -0 below about -11
    s = GELU_TANH_C * (xs + GELU_TANH_K * ((xs * xs) * xs))
    return np.where(np.isnan(x), x, _mul_sigmoid(xs, s))


def gelu(x: np.ndarray) -> np.ndarray:
    """x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): max error 3 ulp, including tiny negative results.

    Near 0: x (1/2 + x P(x^2)). Beyond GELU_SPLIT, with u = |x| and Q(u) = 1 - Phi(u) =
    T(u) e^(-u^2/2) / u: gelu(x) = x - T(u) e^(-u^2/2) for x > 0 and -T(u) e^(-u^2/2) for x < 0.
    e^(-u^2/2) is taken with u^2 split exactly (u_hi with 12 significant bits, u_hi^2 exact) so the
    argument's rounding does not cost ulps; the erf form's x / sqrt 2 never has to be rounded.
    """
    xn = _no_nan(x)
    u = np.abs(xn)
    near = u < GELU_SPLIT
    xs = np.where(near, xn, F(0))
    small = xs * (F(0.5) + xs * _horner(PHI_POLY, xs * xs))
    ut = np.clip(u, GELU_SPLIT, GELU_TAIL_MAX)
    piece = (ut >= GELU_TAIL_BREAKS[0]).astype(np.int32) + (ut >= GELU_TAIL_BREAKS[1])
    center = np.choose(piece, GELU_TAIL_CENTER).astype(F)
    coeffs = [np.choose(piece, [GELU_TAIL_POLY[k][j] for k in range(3)]).astype(F) for j in range(9)]
    tail = _horner(coeffs, F(1) / ut - center)
    u_hi = _float(_bits(ut) & U32(0xFFFFF000))
    d = (ut - u_hi) * (ut + u_hi)
    p, n = _exp_parts(-(u_hi * u_hi) * F(0.5), -d * F(0.5))
    upper = _ldexp(tail * p, n)
    far = np.where(xn < 0, -upper, x - upper)
    return np.where(np.isnan(x), x, np.where(near, small, far))


def log(x: np.ndarray) -> np.ndarray:
    """Natural log: max error 1 ulp; log(+-0) = -Inf, log(x < 0) = NaN, log(+Inf) = +Inf.

    x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23 first); f = m - 1 is exact;
    with s = f / (2 + f), log(1 + f) = f - f^2/2 + s (f^2/2 + s^2 R(s^2)); then + k ln 2 in two parts.
    """
    xs = np.where((x > 0) & (x < INF), x, F(1))
    k, m = _split_exponent(xs)
    f = m - F(1)
    s = f / (F(2) + f)
    z = s * s
    hfsq = F(0.5) * f * f
    kf = k.astype(F)
    lo = s * (hfsq + z * _horner(LOG_POLY, z)) + kf * LN2_LO
    res = kf * LN2_HI + (f - (hfsq - lo))
    res = np.where(x == 0, -INF, np.where(x == INF, INF, res))
    return np.where(np.isnan(x), x, np.where(x < 0, NAN, res))


def _split_exponent(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x = 2^k m, m in [sqrt(1/2), sqrt(2)), for finite x > 0 (subnormals included)."""
    sub = x < F(2.0 ** -126)
    xs = np.where(sub, x * F(2.0 ** 23), x)
    u = _bits(xs)
    mant = u & U32(0x7FFFFF)
    big = mant >= U32(SQRT2_MANT)
    k = (u >> U32(23)).astype(np.int32) - 127 - np.where(sub, 23, 0) + big
    m = _float(mant | np.where(big, U32(126 << 23), U32(127 << 23)))
    return k, m


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a * b = p + e exactly (Dekker's product without FMA), barring overflow and underflow."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _fast_two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a + b = s + e exactly, given |a| >= |b| (Dekker)."""
    s = a + b
    return s, b - (s - a)


def _log2_pair(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log2(a) = hi + lo to about 2^-30 relative, for finite a > 0.

    log(m) = 2 atanh(s), s = f / (2 + f): s is formed as s_hi + s_lo from the exact residual of the
    division, the series tail s^3 R(s^2) (under 1% of the total) is plain fp32, and the product by
    log2(e) and the sum with k are carried as pairs.
    """
    k, m = _split_exponent(a)
    f = m - F(1)
    g_hi, g_lo = _fast_two_sum(F(2), f)
    s_hi = f / g_hi
    ph, pl = _two_prod(s_hi, g_hi)
    s_lo = (((f - ph) - pl) - s_hi * g_lo) / g_hi
    z = s_hi * s_hi
    ln_hi, ln_lo = _fast_two_sum(F(2) * s_hi, F(2) * s_lo + s_hi * (z * _horner(LOG_POLY, z)))
    l2h, l2l = _two_prod(ln_hi, LOG2E)
    l2l = l2l + (ln_hi * LOG2E_LO + ln_lo * LOG2E)
    kf = k.astype(F)
    sh = kf + l2h  # TwoSum: |kf| and |l2h| are not ordered
    bb = sh - kf
    se = (kf - (sh - bb)) + (l2h - bb)
    return _fast_two_sum(sh, se + l2l)


def _pow_core(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a^b for finite a > 0 and finite b: exp2 of b * log2(a) carried as a pair (y_hi, y_lo)."""
    lh, ll = _log2_pair(a)
    bc = np.clip(b, -POW_B_MAX, POW_B_MAX)
    yh, yl = _two_prod(bc, lh)
    yh, yl = _fast_two_sum(yh, yl + bc * ll)
    big = np.abs(yh) > POW_Y_MAX
    yh = np.where(big, np.where(yh > 0, POW_Y_MAX, -POW_Y_MAX), yh)
    yl = np.where(big, F(0), yl)
    nf = np.rint(yh)
    r = ((yh - nf) + yl) * LN2
    p = F(1) + (r + (r * r) * _horner(EXP_POLY, r))
    return _ldexp(p, np.clip(nf, -252, 254).astype(np.int32))


def pow_(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a ** b with the IEEE-754 pow special cases; max error 4 ulp on finite results (tested).

    b == 0 or a == 1 give 1 (even for NaN); a < 0 needs an integer b (else NaN) and gives the sign
    of an odd b; zeros and infinities of a and b follow C99 Annex F. NaN inputs pass through.
    """
    a = np.asarray(a, dtype=F)
    b = np.asarray(b, dtype=F)
    a, b = np.broadcast_arrays(a, b)
    aa = np.abs(a)
    b_int = np.rint(b) == b
    b_odd = b_int & (np.rint(b * F(0.5)) != b * F(0.5))
    finite_a = (aa > 0) & (aa < INF)
    finite_b = np.abs(b) < INF
    core = _pow_core(np.where(finite_a, aa, F(1)), np.where(finite_b, b, F(0)))
    b_pos = b > 0
    mag = np.where(finite_a, core, np.where((aa == 0) == b_pos, F(0), INF))     # a = 0 or +-Inf
    inf_b = np.where((aa < 1) == b_pos, F(0), INF)                            # b = +-Inf
    mag = np.where(finite_b | np.isnan(aa), mag, np.where(aa == 1, F(1), inf_b))
    res = np.where(b_odd, _copysign(mag, a), mag)
    invalid = (a < 0) & finite_a & finite_b & ~b_int
    res = np.where(invalid, NAN, res)
    res = np.where(np.isnan(b), b, res)
    res = np.where(np.isnan(a), a, res)
    return np.where((b == 0) | (a == 1), F(1), res)


def _max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NaN if either is NaN (a's first), else a if a > b else b: max(-0, +0) is +0, max(+0, -0) is -0."""
    return np.where(np.isnan(a), a, np.where(np.isnan(b), b, np.where(a > b, a, b)))


def _min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(a), a, np.where(np.isnan(b), b, np.where(a < b, a, b)))


def _flag(c: np.ndarray) -> np.ndarray:
    return np.where(c, F(1), F(0))


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, +0) by the ALU max rule: NaN stays NaN, relu(-0) = +0."""
    return _max(x, np.zeros_like(x))


def _abs(x: np.ndarray) -> np.ndarray:
    return _float(_bits(x) & U32(0x7FFFFFFF))


def _quiet(f: Callable) -> Callable:
    """Wrap a vectorized function: float32 in, float32 out, no numpy floating-point warnings."""
    def run(*args):
        with np.errstate(all="ignore"):
            return np.asarray(f(*(np.asarray(a, dtype=F) for a in args)), dtype=F)
    run.__name__ = f.__name__
    run.__doc__ = f.__doc__
    return run


ACTIVATIONS: dict[ActFunc, Callable[[np.ndarray], np.ndarray]] = {k: _quiet(f) for k, f in {
    ActFunc.COPY: lambda x: x.copy(),
    ActFunc.RELU: relu,
    ActFunc.GELU: gelu,
    ActFunc.GELU_TANH: gelu_tanh,
    ActFunc.SILU: silu,
    ActFunc.SIGMOID: sigmoid,
    ActFunc.TANH: tanh,
    ActFunc.EXP: exp,
    ActFunc.LOG: log,
    ActFunc.SQRT: np.sqrt,
    ActFunc.RSQRT: lambda x: F(1) / np.sqrt(x),
    ActFunc.RECIPROCAL: lambda x: F(1) / x,
    ActFunc.SQUARE: lambda x: x * x,
    ActFunc.ABS: _abs,
}.items()}

ALU: dict[AluOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {k: _quiet(f) for k, f in {
    AluOp.BYPASS: lambda a, b: np.broadcast_arrays(a, b)[0].copy(),
    AluOp.ADD: lambda a, b: a + b,
    AluOp.SUB: lambda a, b: a - b,
    AluOp.MUL: lambda a, b: a * b,
    AluOp.DIV: lambda a, b: a / b,
    AluOp.MAX: _max,
    AluOp.MIN: _min,
    AluOp.POW: pow_,
    AluOp.EQ: lambda a, b: _flag(a == b),
    AluOp.NE: lambda a, b: _flag(a != b),
    AluOp.LT: lambda a, b: _flag(a < b),
    AluOp.LE: lambda a, b: _flag(a <= b),
    AluOp.GT: lambda a, b: _flag(a > b),
    AluOp.GE: lambda a, b: _flag(a >= b),
    AluOp.AND: lambda a, b: _flag((a != 0) & (b != 0)),
    AluOp.OR: lambda a, b: _flag((a != 0) | (b != 0)),
    AluOp.XOR: lambda a, b: _flag((a != 0) ^ (b != 0)),
}.items()}

REDUCE: dict[ReduceOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    ReduceOp.SUM: ALU[AluOp.ADD],
    ReduceOp.MAX: ALU[AluOp.MAX],
    ReduceOp.MIN: ALU[AluOp.MIN],
}
