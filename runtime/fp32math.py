"""The machine's fp32 math: activation functions, ALU binary ops and reduction folds, as fixed fp32 op sequences.

isa/spec_intro.md (Numerics) defines every ScalarE function and the ALU `pow` as the exact sequence
of IEEE binary32 operations written here, once, against the backend interface of runtime/ops_numpy.py:
`activation(o, func, x)`, `alu(o, op, a, b)` and `fold(o, op, acc, x)` take f32 values of any backend.
ACTIVATIONS, ALU and REDUCE bind them to numpy; the llvmlite JIT runs the same sequence on
runtime/jit/llvm_ops.py, so both agree bit for bit. Only +, -, *, /, sqrt, rint, comparisons/selects
and integer operations on the bit pattern are used (no FMA, no library transcendental).

Polynomial coefficients were fitted offline (float64 weighted least squares on Chebyshev nodes with
Lawson reweighting, i.e. near-minimax in the relative error of the final result) and rounded to fp32;
each table notes the approximation error of its rounded coefficients. Measured accuracy, over dense
sweeps against float64 references (tests/runtime/test_fp32math.py asserts these bounds), is given in
each function's docstring in ulps of the fp32 result (subnormal results: ulps of 2^-149).
The circular functions are in runtime/fp32trig.py, the other transcendentals (erf, hyperbolic, exp2, log2,
log10, hypot, logaddexp) in runtime/fp32special.py, lgamma and digamma in runtime/fp32gamma.py, the exact ones
(rounding, sign, fmod) in runtime/fp32round.py.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trnc.isa.enums import ActFunc, AluOp, ReduceOp
from trnc.runtime import fp32gamma, fp32round, fp32special, fp32trig
from trnc.runtime.fp32pow import pow_
from trnc.runtime.fp32util import (
    EXP_LO, EXP_POLY, INF, LN2_HI, LN2_LO, LOG2E, LOG_POLY, copysign, exp_parts, fabs, float_max, float_min, horner,
    horner_values, ldexp, log_reduce, no_nan, pow2,
)
from trnc.runtime.ops_numpy import F32, I32, NP, U32

# Normal CDF near 0: Phi(x) = 1/2 + x P(x^2) for |x| < GELU_SPLIT, degree 4 in x^2; 0.02 ulp of x Phi(x).
GELU_SPLIT = 0.75
PHI_POLY = (0.39894226, -0.06649016, 0.009971508, -0.001179323, 0.00010140814)
# Tail: u Q(u) e^(u^2/2), Q = 1 - Phi, as a degree-8 polynomial in w = 1/u - center, on three pieces
# [0.75, 1.5), [1.5, 3), [3, 16]; approximation error <= 0.05 ulp.
GELU_TAIL_BREAKS = (1.5, 3.0)
GELU_TAIL_MAX = 16.0            # u Q(u) < 2^-150 beyond: the result is x or -0
GELU_TAIL_CENTER = (1.0, 0.5, 0.19791667)
GELU_TAIL_POLY = (
    (0.2615783, -0.12421432, 0.048957467, -0.010719712, -0.0063225147, 0.011835582,
     -0.011832925, 0.010425916, -0.0068850913),
    (0.336204, -0.17050177, 0.019198207, 0.099343255, -0.16700187, 0.16980304,
     -0.10040036, -0.06140245, 0.248806),
    (0.38486597, -0.12889485, -0.20975141, 0.42791444, -0.1796562, -0.8169016,
     2.1453052, -1.0665303, -5.206144),
)
GELU_TANH_C = 1.5957692         # 2 sqrt(2/pi): 0.5 (1 + tanh(v)) = sigmoid(2 v)
GELU_TANH_K = 0.044715

EXP_HI = 89.0                   # exp overflows above 88.73 (EXP_LO: underflow to 0 below -103.98)
TANH_SAT = 9.5                  # tanh(x) rounds to 1 for x > 9.01


def exp(o, x):
    """e^x: max error 1 ulp (subnormal results included); Inf above 88.72, 0 below -103.97."""
    p, n = exp_parts(o, float_min(o, float_max(o, no_nan(o, x), EXP_LO), EXP_HI), o.f32(0))
    return o.select(o.isnan(x), x, ldexp(o, p, n))


def _expm1_nonpos(o, y):
    """e^y - 1 for y in [-19, 0]: (2^n - 1) + 2^n expm1(r), exact for n = 0 so tiny y keep full precision."""
    nf = o.rint(o.mul(y, o.f32(LOG2E)))
    r = o.sub(o.sub(y, o.mul(nf, o.f32(LN2_HI))), o.mul(nf, o.f32(LN2_LO)))
    em = o.add(r, o.mul(o.mul(r, r), horner(o, EXP_POLY, r)))
    s = pow2(o, o.ftoi(nf, I32))
    return o.add(o.sub(s, o.f32(1)), o.mul(s, em))


def tanh(o, x):
    """tanh(x) = -m / (m + 2) with m = expm1(-2|x|), sign restored: max error 2.5 ulp; odd, tanh(+-0) = +-0."""
    a = float_min(o, fabs(o, no_nan(o, x)), TANH_SAT)
    m = _expm1_nonpos(o, o.mul(o.f32(-2), a))
    return o.select(o.isnan(x), x, copysign(o, o.div(o.neg(m), o.add(m, o.f32(2))), x))


def _mul_sigmoid(o, v, s):
    """v * sigmoid(s) for NaN-free v >= -120 and s.

    With e^(-|s|) = p 2^n: s >= 0 gives v / (1 + e^-s); s < 0 gives (v p / (1 + e^s)) * 2^n, the power
    of two applied last so that tiny (subnormal) results round once.
    """
    neg = o.lt(s, o.f32(0))
    p, n = exp_parts(o, float_max(o, o.neg(fabs(o, s)), EXP_LO), o.f32(0))
    d = o.add(o.f32(1), ldexp(o, p, n))
    q = o.div(o.select(neg, o.mul(v, p), v), d)
    return ldexp(o, q, o.select(neg, n, o.i32(0)))


def sigmoid(o, x):
    """1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 (no overflow of e^-x): max error 2.5 ulp, subnormals included."""
    return o.select(o.isnan(x), x, _mul_sigmoid(o, o.f32(1), no_nan(o, x)))


def silu(o, x):
    """x * sigmoid(x) with one division: max error 3 ulp, subnormal results included."""
    xs = float_max(o, no_nan(o, x), EXP_LO)  # silu(x) underflows to -0 well before -120
    return o.select(o.isnan(x), x, _mul_sigmoid(o, xs, xs))


def gelu_tanh(o, x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)).

    The cubic argument is rounded in fp32, so the error is bounded by 2 ulp plus the effect of a
    relative perturbation of 2^-22 of that argument (the formula's own conditioning): see the test.
    """
    xs = float_max(o, no_nan(o, x), EXP_LO)  # the result underflows to -0 below about -11
    cube = o.mul(o.mul(xs, xs), xs)
    s = o.mul(o.f32(GELU_TANH_C), o.add(xs, o.mul(o.f32(GELU_TANH_K), cube)))
    return o.select(o.isnan(x), x, _mul_sigmoid(o, xs, s))


def gelu(o, x):
    """x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): max error 3 ulp, including tiny negative results.

    Near 0: x (1/2 + x P(x^2)). Beyond GELU_SPLIT, with u = |x| and Q(u) = 1 - Phi(u) =
    T(u) e^(-u^2/2) / u: gelu(x) = x - T(u) e^(-u^2/2) for x > 0 and -T(u) e^(-u^2/2) for x < 0.
    e^(-u^2/2) is taken with u^2 split exactly (u_hi with 12 significant bits, u_hi^2 exact) so the
    argument's rounding does not cost ulps; the erf form's x / sqrt 2 never has to be rounded.
    The tail piece's center and coefficients are picked by selects (no table lookup).
    """
    f = o.f32
    xn = no_nan(o, x)
    u = fabs(o, xn)
    near = o.lt(u, f(GELU_SPLIT))
    xs = o.select(near, xn, f(0))
    small = o.mul(xs, o.add(f(0.5), o.mul(xs, horner(o, PHI_POLY, o.mul(xs, xs)))))
    ut = float_min(o, float_max(o, u, GELU_SPLIT), GELU_TAIL_MAX)
    mid, far_piece = o.ge(ut, f(GELU_TAIL_BREAKS[0])), o.ge(ut, f(GELU_TAIL_BREAKS[1]))

    def piece(values):
        return o.select(far_piece, f(values[2]), o.select(mid, f(values[1]), f(values[0])))

    coeffs = [piece([GELU_TAIL_POLY[k][j] for k in range(3)]) for j in range(9)]
    tail = horner_values(o, coeffs, o.sub(o.div(f(1), ut), piece(GELU_TAIL_CENTER)))
    u_hi = o.bitcast(o.and_(o.bitcast(ut, U32), o.u32(0xFFFFF000)), F32)
    d = o.mul(o.sub(ut, u_hi), o.add(ut, u_hi))
    p, n = exp_parts(o, o.mul(o.neg(o.mul(u_hi, u_hi)), f(0.5)), o.mul(o.neg(d), f(0.5)))
    upper = ldexp(o, o.mul(tail, p), n)
    far = o.select(o.lt(xn, f(0)), o.neg(upper), o.sub(x, upper))
    return o.select(o.isnan(x), x, o.select(near, small, far))


def log(o, x):
    """Natural log: max error 1 ulp; log(+-0) = -Inf, log(x < 0) = NaN, log(+Inf) = +Inf.

    x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23 first); f = m - 1 is exact;
    with s = f / (2 + f), log(1 + f) = f - f^2/2 + s (f^2/2 + s^2 R(s^2)); then + k ln 2 in two parts.
    """
    k, f, s, z, hfsq = log_reduce(o, x)
    kf = o.itof(k, F32)
    lo = o.add(o.mul(s, o.add(hfsq, o.mul(z, horner(o, LOG_POLY, z)))), o.mul(kf, o.f32(LN2_LO)))
    res = o.add(o.mul(kf, o.f32(LN2_HI)), o.sub(f, o.sub(hfsq, lo)))
    res = o.select(o.eq(x, o.f32(0)), o.f32(-INF), o.select(o.eq(x, o.f32(INF)), o.f32(INF), res))
    return o.select(o.isnan(x), x, o.select(o.lt(x, o.f32(0)), o.f32(np.nan), res))


def fmax(o, a, b):
    """NaN if either is NaN (a's first), else a if a > b else b: max(-0, +0) is +0, max(+0, -0) is -0."""
    return o.select(o.isnan(a), a, o.select(o.isnan(b), b, o.select(o.gt(a, b), a, b)))


def fmin(o, a, b):
    return o.select(o.isnan(a), a, o.select(o.isnan(b), b, o.select(o.lt(a, b), a, b)))


def _flag(o, m):
    return o.select(m, o.f32(1), o.f32(0))


def _nonzero(o, a):
    return o.ne(a, o.f32(0))  # NaN is nonzero


ACT_FUNCS: dict[ActFunc, Callable] = {
    ActFunc.COPY: lambda o, x: x,
    ActFunc.RELU: lambda o, x: fmax(o, x, o.f32(0)),  # NaN stays NaN, relu(-0) = +0
    ActFunc.GELU: gelu,
    ActFunc.GELU_TANH: gelu_tanh,
    ActFunc.SILU: silu,
    ActFunc.SIGMOID: sigmoid,
    ActFunc.TANH: tanh,
    ActFunc.EXP: exp,
    ActFunc.LOG: log,
    ActFunc.SQRT: lambda o, x: o.sqrt(x),
    ActFunc.RSQRT: lambda o, x: o.div(o.f32(1), o.sqrt(x)),
    ActFunc.RECIPROCAL: lambda o, x: o.div(o.f32(1), x),
    ActFunc.SQUARE: lambda o, x: o.mul(x, x),
    ActFunc.ABS: fabs,
    ActFunc.SIN: fp32trig.sin,
    ActFunc.COS: fp32trig.cos,
    ActFunc.TAN: fp32trig.tan,
    ActFunc.ASIN: fp32trig.asin,
    ActFunc.ACOS: fp32trig.acos,
    ActFunc.ATAN: fp32trig.atan,
    ActFunc.SINH: fp32special.sinh,
    ActFunc.COSH: fp32special.cosh,
    ActFunc.ASINH: fp32special.asinh,
    ActFunc.ACOSH: fp32special.acosh,
    ActFunc.ATANH: fp32special.atanh,
    ActFunc.ERF: fp32special.erf,
    ActFunc.ERFC: fp32special.erfc,
    ActFunc.EXP2: fp32special.exp2,
    ActFunc.LOG2: fp32special.log2,
    ActFunc.LOG10: fp32special.log10,
    ActFunc.FLOOR: fp32round.floor,
    ActFunc.CEIL: fp32round.ceil,
    ActFunc.TRUNC: fp32round.trunc,
    ActFunc.RINT: fp32round.rint,
    ActFunc.SIGN: fp32round.sign,
    ActFunc.ERFINV: fp32special.erfinv,
    ActFunc.ERFCX: fp32special.erfcx,
    ActFunc.I0E: fp32special.i0e,
    ActFunc.I1E: fp32special.i1e,
    ActFunc.LGAMMA: fp32gamma.lgamma,
    ActFunc.DIGAMMA: fp32gamma.digamma,
}

ALU_OPS: dict[AluOp, Callable] = {
    AluOp.BYPASS: lambda o, a, b: a,
    AluOp.ADD: lambda o, a, b: o.add(a, b),
    AluOp.SUB: lambda o, a, b: o.sub(a, b),
    AluOp.MUL: lambda o, a, b: o.mul(a, b),
    AluOp.DIV: lambda o, a, b: o.div(a, b),
    AluOp.MAX: fmax,
    AluOp.MIN: fmin,
    AluOp.POW: pow_,
    AluOp.EQ: lambda o, a, b: _flag(o, o.eq(a, b)),
    AluOp.NE: lambda o, a, b: _flag(o, o.ne(a, b)),
    AluOp.LT: lambda o, a, b: _flag(o, o.lt(a, b)),
    AluOp.LE: lambda o, a, b: _flag(o, o.le(a, b)),
    AluOp.GT: lambda o, a, b: _flag(o, o.gt(a, b)),
    AluOp.GE: lambda o, a, b: _flag(o, o.ge(a, b)),
    AluOp.AND: lambda o, a, b: _flag(o, o.and_(_nonzero(o, a), _nonzero(o, b))),
    AluOp.OR: lambda o, a, b: _flag(o, o.or_(_nonzero(o, a), _nonzero(o, b))),
    AluOp.XOR: lambda o, a, b: _flag(o, o.xor(_nonzero(o, a), _nonzero(o, b))),
    AluOp.ATAN2: fp32trig.atan2,
    AluOp.FMOD: fp32round.fmod,
    AluOp.REMAINDER: fp32round.remainder,
    AluOp.HYPOT: fp32special.hypot,
    AluOp.LOGADDEXP: fp32special.logaddexp,
}

REDUCE_ALU = {ReduceOp.SUM: AluOp.ADD, ReduceOp.MAX: AluOp.MAX, ReduceOp.MIN: AluOp.MIN}


def activation(o, func: ActFunc, x):
    """func(x) for an f32 value x of backend o."""
    return ACT_FUNCS[ActFunc(func)](o, x)


def alu(o, op: AluOp, a, b):
    """op(a, b) for f32 values a, b of backend o."""
    return ALU_OPS[AluOp(op)](o, a, b)


def fold(o, op: ReduceOp, acc, x):
    """One reduction step acc = op(acc, x) (f32): reductions fold from the first element, in order."""
    return alu(o, REDUCE_ALU[ReduceOp(op)], acc, x)


# ---- the numpy API --------------------------------------------------------------------------------------------

def _numpy(fn: Callable, name: str, doc: str | None) -> Callable:
    """Bind an algorithm to numpy: float32 arrays in (broadcast together), a new float32 array out, no warnings."""
    def run(*args):
        arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float32) for a in args))
        with np.errstate(all="ignore"):
            return np.array(fn(NP, *arrays), dtype=np.float32)
    run.__name__ = name
    run.__doc__ = doc
    return run


ACTIVATIONS: dict[ActFunc, Callable[[np.ndarray], np.ndarray]] = {
    k: _numpy(f, k.text, f.__doc__) for k, f in ACT_FUNCS.items()}
ALU: dict[AluOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    k: _numpy(f, k.text, f.__doc__) for k, f in ALU_OPS.items()}
REDUCE: dict[ReduceOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {k: ALU[v] for k, v in REDUCE_ALU.items()}
