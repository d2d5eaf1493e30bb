"""Accuracy and special values of runtime/fp32math.py against float64 references.

Errors are in ulps of the correctly rounded fp32 result: ulp(y) = 2^(floor(log2 |y|) - 23) for normal y,
2^-149 for subnormal y (so gradual underflow is judged in absolute terms), and a result beyond fp32 max
must be Inf exactly when y rounds to Inf.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trnc.isa.enums import ActFunc, AluOp, ReduceOp
from trnc.runtime.fp32math import ACTIVATIONS, ALU, REDUCE

F = np.float32
FMAX = float(np.finfo(np.float32).max)
ROUNDS_TO_INF = FMAX + 2.0 ** 103
erf = np.frompyfunc(math.erf, 1, 1)
erfc = np.frompyfunc(math.erfc, 1, 1)


def ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    ref = np.asarray(ref, np.float64)
    with np.errstate(all="ignore"):
        mag = np.minimum(np.abs(ref), FMAX)
        ulp = np.exp2(np.floor(np.log2(np.maximum(mag, 2.0 ** -126))) - 23)
        err = np.abs(got.astype(np.float64) - ref) / ulp
        to_inf = np.isinf(got) & (np.abs(ref) >= ROUNDS_TO_INF) & (np.sign(got) == np.sign(ref))
    return np.where(to_inf, 0.0, err)


def lin(lo: float, hi: float, n: int = 1_000_001) -> np.ndarray:
    return np.linspace(lo, hi, n).astype(F)


def pow2s(lo: float, hi: float, n: int = 400_001, signs=(1.0, -1.0)) -> np.ndarray:
    mag = np.exp2(np.linspace(lo, hi, n)).astype(F)
    return np.concatenate([s * mag for s in signs]).astype(F)


def phi(x: np.ndarray) -> np.ndarray:
    """Normal CDF in float64, with erfc on the left so the tail keeps its relative accuracy."""
    left = 0.5 * erfc(-x / math.sqrt(2)).astype(np.float64)
    return np.where(x < 0, left, 0.5 + 0.5 * erf(x / math.sqrt(2)).astype(np.float64))


def erfinv64(x: np.ndarray) -> np.ndarray:
    return torch.erfinv(torch.from_numpy(x)).numpy()   # float64, within 2^-50 relative


X0 = (1.4616321449683622, 9.549995429965697e-17)   # the positive zero of digamma as a float64 pair


def digamma64(x: np.ndarray) -> np.ndarray:
    """digamma in float64: torch's, except within 2^-10 of its zero x0, where torch's float64 loses relative accuracy
    (2e-8 at the fp32 nearest x0): there the Taylor series about x0 to d^4 (d = x - x0 as a pair, the next term
    below 2^-50 relative)."""
    t = torch.from_numpy(x)
    d = (t - X0[0]) - X0[1]
    series = sum(torch.polygamma(k, torch.tensor(X0[0], dtype=torch.float64)) * d ** k / math.factorial(k)
                 for k in range(1, 5))
    return torch.where(d.abs() < 2.0 ** -10, series, torch.digamma(t)).numpy()


def sigmoid64(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# function, float64 reference, inputs, asserted max ulp
SWEEPS = {
    ActFunc.EXP: (np.exp, lambda: np.concatenate([lin(-104, 89), pow2s(-30, 7), lin(88.5, 88.8, 100_001),
                                                  lin(-104, -87, 100_001)]), 1.0),
    ActFunc.LOG: (np.log, lambda: np.concatenate([pow2s(-149, 127.9999, signs=(1.0,)), lin(0.5, 2),
                                                  F(1) + lin(-2 ** -10, 2 ** -10, 100_001)]), 1.0),
    ActFunc.TANH: (np.tanh, lambda: np.concatenate([lin(-10, 10), pow2s(-149, 4)]), 2.5),
    ActFunc.SIGMOID: (sigmoid64, lambda: np.concatenate([lin(-104, 30), pow2s(-149, 7)]), 2.5),
    ActFunc.SILU: (lambda x: x * sigmoid64(x), lambda: np.concatenate([lin(-110, 30), pow2s(-149, 7)]), 3.0),
    ActFunc.GELU: (lambda x: x * phi(x), lambda: np.concatenate([lin(-15, 15), pow2s(-149, 4)]), 3.0),
    # runtime/fp32trig.py: sin, cos and tan over every binade (the argument reduction is exact), plus random bits
    ActFunc.SIN: (np.sin, lambda: np.concatenate([lin(-10, 10), pow2s(-149, 127.99), random_bits(400_000)]), 0.8),
    ActFunc.COS: (np.cos, lambda: np.concatenate([lin(-10, 10), pow2s(-149, 127.99), random_bits(400_000)]), 0.8),
    ActFunc.TAN: (np.tan, lambda: np.concatenate([lin(-10, 10), pow2s(-149, 127.99), random_bits(400_000)]), 2.2),
    ActFunc.ASIN: (np.arcsin, lambda: np.concatenate([lin(-1, 1), pow2s(-149, 0)]), 0.7),
    ActFunc.ACOS: (np.arccos, lambda: np.concatenate([lin(-1, 1), pow2s(-149, 0)]), 1.0),
    ActFunc.ATAN: (np.arctan, lambda: np.concatenate([lin(-5, 5), pow2s(-149, 127.99)]), 0.9),
    # runtime/fp32special.py
    ActFunc.SINH: (np.sinh, lambda: np.concatenate([lin(-90, 90), pow2s(-149, 7)]), 1.6),
    ActFunc.COSH: (np.cosh, lambda: np.concatenate([lin(-90, 90), pow2s(-149, 7)]), 1.4),
    ActFunc.ASINH: (np.arcsinh, lambda: np.concatenate([lin(-10, 10), pow2s(-149, 127.99)]), 1.9),
    ActFunc.ACOSH: (np.arccosh, lambda: np.concatenate([lin(1, 10), pow2s(0, 127.99, signs=(1.0,))]), 2.1),
    ActFunc.ATANH: (np.arctanh, lambda: np.concatenate([lin(-1, 1), pow2s(-149, 0)]), 1.9),
    ActFunc.ERF: (lambda x: erf(x).astype(np.float64), lambda: np.concatenate([lin(-6, 6), pow2s(-149, 3)]), 1.3),
    ActFunc.ERFC: (lambda x: erfc(x).astype(np.float64), lambda: np.concatenate([lin(-6, 11), pow2s(-149, 3.4)]),
                   3.0),
    ActFunc.ERFINV: (erfinv64, lambda: np.concatenate([lin(-1, 1), pow2s(-149, 0),
                                                       (1 - np.exp2(-np.linspace(1, 24, 200_001))).astype(F)]), 2.5),
    ActFunc.ERFCX: (lambda x: torch.special.erfcx(torch.from_numpy(x)).numpy(),
                    lambda: np.concatenate([lin(-10, 30), pow2s(-149, 127.99)]), 2.5),
    ActFunc.I0E: (lambda x: torch.special.i0e(torch.from_numpy(x)).numpy(),
                  lambda: np.concatenate([lin(-30, 30), pow2s(-149, 127.99)]), 2.6),
    ActFunc.I1E: (lambda x: torch.special.i1e(torch.from_numpy(x)).numpy(),
                  lambda: np.concatenate([lin(-30, 30), pow2s(-149, 127.99)]), 3.1),
    # runtime/fp32gamma.py for x > 0 (test_gamma_functions_below_zero checks x < 0), around the zeros too
    ActFunc.LGAMMA: (lambda x: torch.lgamma(torch.from_numpy(x)).numpy(),
                     lambda: np.concatenate([lin(0, 30), pow2s(-149, 127.99, signs=(1.0,)), lin(0.99, 1.01, 200_001),
                                             lin(1.99, 2.01, 200_001)]), 1.9),
    ActFunc.DIGAMMA: (digamma64, lambda: np.concatenate([lin(0, 30), pow2s(-149, 127.99, signs=(1.0,)),
                                                         lin(1.46, 1.47, 200_001)]), 1.7),
    ActFunc.EXP2: (np.exp2, lambda: np.concatenate([lin(-151, 129), pow2s(-149, 8)]), 1.0),
    ActFunc.LOG2: (np.log2, lambda: np.concatenate([pow2s(-149, 127.9999, signs=(1.0,)), lin(0.5, 2)]), 0.8),
    ActFunc.LOG10: (np.log10, lambda: np.concatenate([pow2s(-149, 127.9999, signs=(1.0,)), lin(0.5, 2)]), 0.8),
}


def random_bits(n: int) -> np.ndarray:
    """n random fp32 bit patterns (seeded), the finite ones."""
    x = np.random.default_rng(8).integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(F)
    return x[np.isfinite(x)]


@pytest.mark.parametrize("func", list(SWEEPS), ids=lambda f: f.text)
def test_accuracy_sweep(func):
    ref_fn, inputs, bound = SWEEPS[func]
    x = inputs()
    got = ACTIVATIONS[func](x)
    assert got.dtype == np.float32 and got.shape == x.shape
    with np.errstate(all="ignore"):
        err = ulps(got, ref_fn(x.astype(np.float64)))
    i = int(np.argmax(err))
    assert err[i] <= bound, f"{func.text}: {err[i]:.3f} ulp at x={x[i]!r} (got {got[i]!r})"


@pytest.mark.parametrize("func, bound", [(ActFunc.LGAMMA, 3.2), (ActFunc.DIGAMMA, 4.4)], ids=["lgamma", "digamma"])
def test_gamma_functions_below_zero(func, bound):
    """x = -a < 0 by the reflection formulas, lgamma(x) = log(pi / (a |sin(pi a)|)) - lgamma(a) and digamma(x) =
    digamma(1 + a) + pi cot(pi a), whose terms cancel near the functions' negative zeros: the error is bounded in
    ulps of the larger term (elsewhere it is that many ulps of the result or fewer). Results beyond fp32 are Inf; at the
    negative integers lgamma is Inf and digamma NaN, as torch."""
    x = -np.concatenate([lin(2.0 ** -20, 30), pow2s(-149, 22.99, signs=(1.0,)), lin(30, 1e4)])
    a = -x.astype(np.float64)
    r = a - np.rint(a)
    with np.errstate(all="ignore"):
        if func is ActFunc.LGAMMA:
            t1, t2 = np.log(np.pi / (a * np.abs(np.sin(np.pi * r)))), -torch.lgamma(torch.from_numpy(a)).numpy()
        else:
            t1, t2 = torch.digamma(torch.from_numpy(1 + a)).numpy(), np.pi / np.tan(np.pi * r)
        want = t1 + t2
        scale = np.minimum(np.maximum(np.abs(t1), np.abs(t2)), FMAX)
        ulp = np.exp2(np.floor(np.log2(np.maximum(scale, 2.0 ** -126))) - 23)
    got = ACTIVATIONS[func](x)
    pole = r == 0
    assert (got[pole] == INF).all() if func is ActFunc.LGAMMA else np.isnan(got[pole]).all()
    huge = ~pole & (np.abs(want) >= ROUNDS_TO_INF)
    assert (got[huge] == np.sign(want[huge]) * INF).all()
    fin = ~pole & ~huge
    err = np.abs(got[fin] - want[fin]) / ulp[fin]
    i = int(np.argmax(err))
    assert err[i] <= bound, f"{func.text}: {err[i]:.3f} ulp of the larger term at x={x[fin][i]!r} (got {got[fin][i]!r})"


def test_gelu_tanh_accuracy_up_to_the_conditioning_of_its_cubic_argument():
    """gelu_tanh(x) = x sigmoid(s), s = 2 sqrt(2/pi) (x + 0.044715 x^3) formed in fp32 with five roundings
    (relative error below 2^-22). Any fp32 evaluation of the formula inherits |dy/ds * s| 2^-22 from
    that, which dominates for x < -3 (hundreds of ulps of a tiny result); beyond it we allow 2 ulp."""
    x = np.concatenate([lin(-12, 12), pow2s(-149, 3)])
    got = ACTIVATIONS[ActFunc.GELU_TANH](x)
    x64 = x.astype(np.float64)
    s = 2 * math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)
    sg = sigmoid64(s)
    ref = x64 * sg
    allowed = np.abs(x64 * sg * (1 - sg) * s) * 2.0 ** -22
    with np.errstate(all="ignore"):
        ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(ref), 2.0 ** -126))) - 23)
    excess = (np.abs(got - ref) - allowed) / ulp
    i = int(np.argmax(excess))
    assert excess[i] <= 2.0, f"{excess[i]:.3f} ulp beyond the argument's error at x={x[i]!r}"


@pytest.mark.parametrize("func", [ActFunc.SQRT, ActFunc.RSQRT, ActFunc.RECIPROCAL, ActFunc.SQUARE],
                         ids=lambda f: f.text)
def test_ieee_functions_are_correctly_rounded(func):
    """float64 then one rounding to fp32 is the correctly rounded result for sqrt, 1/x and x*x
    (53 >= 2*24 + 2); rsqrt is the two-rounding 1/fp32(sqrt x)."""
    rng = np.random.default_rng(5)
    with np.errstate(all="ignore"):
        x = np.concatenate([rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32).view(F),
                            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3e38, -1.0], F)])
        x64 = x.astype(np.float64)
        want = {ActFunc.SQRT: lambda: np.sqrt(x64).astype(F),
                ActFunc.RSQRT: lambda: (1.0 / np.sqrt(x64).astype(F).astype(np.float64)).astype(F),
                ActFunc.RECIPROCAL: lambda: (1.0 / x64).astype(F),
                ActFunc.SQUARE: lambda: (x64 * x64).astype(F)}[func]()
    got = ACTIVATIONS[func](x)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all()


NAN = math.nan
INF = math.inf
SPECIALS = {   # x -> f(x), exact; -0.0 and +0.0 are distinct
    ActFunc.EXP: [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (1e-45, 1.0), (-1e-45, 1.0),
                  (89.0, INF), (-104.0, 0.0), (3e38, INF), (-3e38, 0.0), (1.0, float(F(math.e)))],
    ActFunc.LOG: [(0.0, -INF), (-0.0, -INF), (INF, INF), (-INF, NAN), (NAN, NAN), (-1.0, NAN), (1.0, 0.0),
                  (1e-45, float(F(math.log(2.0 ** -149)))), (2.0, float(F(math.log(2)))),
                  (3.4028235e38, float(F(math.log(3.4028234663852886e38))))],
    ActFunc.TANH: [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (1e-45, 1e-45), (-1e-45, -1e-45),
                   (3e38, 1.0), (-3e38, -1.0), (10.0, 1.0)],
    ActFunc.SIGMOID: [(0.0, 0.5), (-0.0, 0.5), (INF, 1.0), (-INF, 0.0), (NAN, NAN), (1e-45, 0.5), (200.0, 1.0),
                      (-200.0, 0.0), (-3e38, 0.0)],
    ActFunc.SILU: [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -0.0), (NAN, NAN), (3e38, 3e38), (-3e38, -0.0),
                   (-200.0, -0.0)],
    ActFunc.GELU: [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -0.0), (NAN, NAN), (3e38, 3e38), (-3e38, -0.0),
                   (-20.0, -0.0), (20.0, 20.0)],
    ActFunc.GELU_TANH: [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -0.0), (NAN, NAN), (3e38, 3e38),
                        (-3e38, -0.0), (-20.0, -0.0), (20.0, 20.0)],
    ActFunc.RELU: [(0.0, 0.0), (-0.0, 0.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (-1e-45, 0.0), (2.5, 2.5)],
    ActFunc.ABS: [(-0.0, 0.0), (-INF, INF), (NAN, NAN), (-1e-45, 1e-45), (-2.5, 2.5)],
    ActFunc.COPY: [(-0.0, -0.0), (-INF, -INF), (NAN, NAN), (1e-45, 1e-45)],
    ActFunc.SQRT: [(-0.0, -0.0), (INF, INF), (-1.0, NAN), (4.0, 2.0)],
    ActFunc.RSQRT: [(0.0, INF), (-0.0, -INF), (INF, 0.0), (-1.0, NAN), (4.0, 0.5)],
    ActFunc.RECIPROCAL: [(0.0, INF), (-0.0, -INF), (-INF, -0.0), (4.0, 0.25)],
    ActFunc.SQUARE: [(-0.0, 0.0), (-INF, INF), (1e-30, 0.0), (-3.0, 9.0)],
    ActFunc.SIN: [(0.0, 0.0), (-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-45, 1e-45), (-1e-20, -1e-20),
                  (float(F(math.pi)), -8.742278e-08), (3e38, 0.8749049)],
    ActFunc.COS: [(0.0, 1.0), (-0.0, 1.0), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-45, 1.0), (1e-20, 1.0),
                  (3e38, -0.48429477), (1e22, 0.67906135)],
    ActFunc.TAN: [(0.0, 0.0), (-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-45, 1e-45), (-1e-20, -1e-20)],
    ActFunc.ASIN: [(0.0, 0.0), (-0.0, -0.0), (1.0, 1.5707964), (-1.0, -1.5707964), (1.0000001, NAN), (INF, NAN),
                   (NAN, NAN), (1e-45, 1e-45)],
    ActFunc.ACOS: [(1.0, 0.0), (-1.0, 3.1415927), (0.0, 1.5707964), (-0.0, 1.5707964), (2.0, NAN), (-INF, NAN),
                   (NAN, NAN)],
    ActFunc.ATAN: [(0.0, 0.0), (-0.0, -0.0), (INF, 1.5707964), (-INF, -1.5707964), (NAN, NAN), (1e-45, 1e-45),
                   (1.0, 0.7853982), (3e38, 1.5707964)],
    ActFunc.SINH: [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN), (1e-45, 1e-45), (90.0, INF),
                   (-90.0, -INF)],
    ActFunc.COSH: [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, INF), (NAN, NAN), (1e-45, 1.0), (90.0, INF),
                   (-90.0, INF)],
    ActFunc.ASINH: [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN), (1e-45, 1e-45), (3e38, 89.28999),
                    (-3e38, -89.28999)],
    ActFunc.ACOSH: [(1.0, 0.0), (0.5, NAN), (-1.0, NAN), (INF, INF), (-INF, NAN), (NAN, NAN), (3e38, 89.28999)],
    ActFunc.ATANH: [(0.0, 0.0), (-0.0, -0.0), (1.0, INF), (-1.0, -INF), (1.5, NAN), (INF, NAN), (NAN, NAN),
                    (1e-45, 1e-45)],
    ActFunc.ERF: [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (1e-45, 1e-45), (4.0, 1.0),
                  (-4.0, -1.0)],
    ActFunc.ERFC: [(0.0, 1.0), (-0.0, 1.0), (INF, 0.0), (-INF, 2.0), (NAN, NAN), (10.0, 1e-45), (11.0, 0.0),
                   (-11.0, 2.0)],
    ActFunc.EXP2: [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (128.0, INF), (-149.0, 1e-45),
                   (-150.0, 0.0), (10.0, 1024.0), (0.5, 1.4142135)],
    ActFunc.LOG2: [(0.0, -INF), (-0.0, -INF), (INF, INF), (-INF, NAN), (-1.0, NAN), (NAN, NAN), (1.0, 0.0),
                   (1024.0, 10.0), (1e-45, -149.0)],
    ActFunc.LOG10: [(0.0, -INF), (-0.0, -INF), (INF, INF), (-INF, NAN), (-1.0, NAN), (NAN, NAN), (1.0, 0.0),
                    (10.0, 1.0), (1000.0, 3.0)],
    ActFunc.ERFINV: [(0.0, 0.0), (-0.0, -0.0), (1.0, INF), (-1.0, -INF), (1.0000001, NAN), (INF, NAN), (NAN, NAN),
                     (1e-45, 1e-45)],
    ActFunc.ERFCX: [(0.0, 1.0), (-0.0, 1.0), (INF, 0.0), (-INF, INF), (NAN, NAN), (-9.5, INF), (1e-45, 1.0)],
    ActFunc.I0E: [(0.0, 1.0), (-0.0, 1.0), (INF, 0.0), (-INF, 0.0), (NAN, NAN), (1e-45, 1.0), (-1e-45, 1.0)],
    ActFunc.I1E: [(0.0, 0.0), (-0.0, 0.0), (INF, 0.0), (-INF, -0.0), (NAN, NAN), (-1e-45, -0.0), (1e-45, 0.0)],
    # runtime/fp32gamma.py: torch's values (lgamma finite up to 4.085e36, where eager's float lgamma is Inf from 4.037e36)
    ActFunc.LGAMMA: [(0.0, INF), (-0.0, INF), (INF, INF), (-INF, INF), (NAN, NAN), (1.0, 0.0), (2.0, 0.0), (-1.0, INF),
                     (-2.0, INF), (-8388608.0, INF), (-3e38, INF), (1e-45, 103.27893), (-1e-45, 103.27893),
                     (-0.5, 1.2655121), (-2.5, -0.056243718), (4.08e36, 3.3986057e+38), (4.086e36, INF), (3e38, INF)],
    ActFunc.DIGAMMA: [(0.0, -INF), (-0.0, INF), (INF, INF), (-INF, NAN), (NAN, NAN), (-1.0, NAN), (-2.0, NAN),
                      (-8388608.0, NAN), (-3e38, NAN), (1e-45, -INF), (-1e-45, INF), (1.0, -0.5772157),
                      (2.0, 0.42278433), (1e30, 69.07755), (3e38, 88.59685), (-2.5, 1.1031567)],
    # runtime/fp32round.py: exact, ties to even, the sign of x kept on zero results
    ActFunc.FLOOR: [(-0.5, -1.0), (0.5, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN), (-1e-45, -1.0),
                    (2.5, 2.0), (8388609.0, 8388609.0), (-8388607.5, -8388608.0)],
    ActFunc.CEIL: [(-0.5, -0.0), (0.5, 1.0), (-0.0, -0.0), (-INF, -INF), (NAN, NAN), (1e-45, 1.0), (-2.5, -2.0),
                   (8388607.5, 8388608.0)],
    ActFunc.TRUNC: [(-0.5, -0.0), (0.5, 0.0), (-2.7, -2.0), (2.7, 2.0), (INF, INF), (-INF, -INF), (NAN, NAN),
                    (-8388607.5, -8388607.0)],
    ActFunc.RINT: [(0.5, 0.0), (-0.5, -0.0), (1.5, 2.0), (2.5, 2.0), (-2.5, -2.0), (0.49999997, 0.0),
                   (8388607.5, 8388608.0), (INF, INF), (NAN, NAN)],
    ActFunc.SIGN: [(0.0, 0.0), (-0.0, 0.0), (NAN, 0.0), (INF, 1.0), (-INF, -1.0), (1e-45, 1.0), (-1e-45, -1.0)],
}


@pytest.mark.parametrize("func", [ActFunc.FLOOR, ActFunc.CEIL, ActFunc.TRUNC, ActFunc.RINT, ActFunc.SIGN],
                         ids=lambda f: f.text)
def test_rounding_and_sign_are_torchs_bit_for_bit(func):
    """Exact functions: the same bits as torch (floor, ceil, trunc, round, sign) on random patterns and halves."""
    rng = np.random.default_rng(9)
    x = np.concatenate([rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32).view(F),
                        (np.arange(-4000, 4000) / 4).astype(F), rng.uniform(-2 ** 24, 2 ** 24, 10_000).astype(F)])
    fn = {ActFunc.FLOOR: torch.floor, ActFunc.CEIL: torch.ceil, ActFunc.TRUNC: torch.trunc,
          ActFunc.RINT: torch.round, ActFunc.SIGN: torch.sign}[func]
    want = fn(torch.from_numpy(x)).numpy()
    got = ACTIVATIONS[func](x)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), list(zip(x[~same][:5], got[~same][:5], want[~same][:5]))


def test_every_enum_member_is_implemented():
    assert set(ACTIVATIONS) == set(ActFunc) == set(SPECIALS)
    assert set(ALU) == set(AluOp)
    assert set(REDUCE) == set(ReduceOp)


@pytest.mark.parametrize("func", list(SPECIALS), ids=lambda f: f.text)
def test_special_values(func):
    x = np.array([p[0] for p in SPECIALS[func]], F)
    want = np.array([p[1] for p in SPECIALS[func]], F)
    got = ACTIVATIONS[func](x.reshape(-1, 1)).ravel()
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), list(zip(x[~same], got[~same], want[~same]))


def test_nan_inputs_keep_their_bits_through_activations():
    x = np.array([0x7FC00001, 0xFFC12345], np.uint32).view(F)
    for func in ActFunc:
        if func not in (ActFunc.ABS, ActFunc.SIGN):   # sign(NaN) = 0, as torch
            assert np.isnan(ACTIVATIONS[func](x)).all(), func
    assert ACTIVATIONS[ActFunc.ABS](x).view(np.uint32).tolist() == [0x7FC00001, 0x7FC12345]


# ---- ALU -------------------------------------------------------------------------------------------------------

def test_pow_accuracy():
    rng = np.random.default_rng(6)
    n = 400_000
    a = np.exp2(rng.uniform(-149, 128, n)).astype(F)
    b = (rng.uniform(-160, 135, n) / np.log2(a.astype(np.float64))).astype(F)  # results over the whole range
    a2 = (1 + rng.uniform(-0.01, 0.01, n)).astype(F)
    b2 = rng.uniform(-1e4, 1e4, n).astype(F)
    a3 = rng.uniform(-10, 10, n).astype(F)
    b3 = rng.integers(-40, 40, n).astype(F)
    a4 = rng.uniform(0, 4, n).astype(F)
    b4 = rng.uniform(-4, 4, n).astype(F)
    a, b = np.concatenate([a, a2, a3, a4]), np.concatenate([b, b2, b3, b4])
    got = ALU[AluOp.POW](a, b)
    with np.errstate(all="ignore"):
        ref = np.power(a.astype(np.float64), b.astype(np.float64))
    err = ulps(got, ref)
    i = int(np.argmax(err))
    assert err[i] <= 4.0, f"{err[i]:.3f} ulp at a={a[i]!r} b={b[i]!r}"


def test_pow_special_cases_follow_c99():
    """Every pair from a grid of special operands against C99 pow (float64 numpy, exact on this grid except for
    the few non-dyadic results, which must be within 1 ulp)."""
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, INF, -INF, NAN, 1e-45, -1e-45,
            3e38, -3e38, 16777216.0, -16777215.0]
    a, b = (g.ravel().astype(F) for g in np.meshgrid(vals, vals))
    got = ALU[AluOp.POW](a, b)
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64))
        want32 = want.astype(F)
    both_nan = np.isnan(got) & np.isnan(want)
    exact = (got == want32) & (np.signbit(got) == np.signbit(want))
    close = np.isfinite(want) & (want != 0) & (ulps(got, want) <= 1.0)
    ok = both_nan | exact | close
    assert ok.all(), list(zip(a[~ok], b[~ok], got[~ok], want[~ok]))


def test_max_min_nan_and_signed_zero_rules():
    a = np.array([NAN, 1.0, -0.0, 0.0, 2.0, -INF], F)
    b = np.array([1.0, NAN, 0.0, -0.0, 3.0, INF], F)
    mx, mn = ALU[AluOp.MAX](a, b), ALU[AluOp.MIN](a, b)
    assert np.isnan(mx[:2]).all() and np.isnan(mn[:2]).all()
    # a if a > b else b: the second operand wins every tie, including -0 / +0
    assert mx[2:].view(np.uint32).tolist() == np.array([0.0, -0.0, 3.0, INF], F).view(np.uint32).tolist()
    assert mn[2:].view(np.uint32).tolist() == np.array([0.0, -0.0, 2.0, -INF], F).view(np.uint32).tolist()
    assert REDUCE[ReduceOp.MAX](a, b).view(np.uint32)[2:].tolist() == mx.view(np.uint32)[2:].tolist()
    assert REDUCE[ReduceOp.MIN](a, b).view(np.uint32)[2:].tolist() == mn.view(np.uint32)[2:].tolist()


def test_comparisons_logic_and_bypass():
    a = np.array([1.0, NAN, 2.0, 0.0, -0.0, NAN, 3.0], F)
    b = np.array([1.0, 1.0, 1.0, -0.0, 5.0, NAN, 0.0], F)
    table = {AluOp.EQ: [1, 0, 0, 1, 0, 0, 0], AluOp.NE: [0, 1, 1, 0, 1, 1, 1], AluOp.LT: [0, 0, 0, 0, 1, 0, 0],
             AluOp.LE: [1, 0, 0, 1, 1, 0, 0], AluOp.GT: [0, 0, 1, 0, 0, 0, 1], AluOp.GE: [1, 0, 1, 1, 0, 0, 1],
             AluOp.AND: [1, 1, 1, 0, 0, 1, 0], AluOp.OR: [1, 1, 1, 0, 1, 1, 1], AluOp.XOR: [0, 0, 0, 0, 1, 0, 1]}
    for op, want in table.items():
        got = ALU[op](a, b)
        assert got.dtype == np.float32 and got.tolist() == want, op
    assert ALU[AluOp.BYPASS](a, b).view(np.uint32).tolist() == a.view(np.uint32).tolist()


def test_arithmetic_is_ieee_fp32():
    rng = np.random.default_rng(7)
    with np.errstate(all="ignore"):
        a = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(F)
        b = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(F)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        want = {AluOp.ADD: a64 + b64, AluOp.SUB: a64 - b64, AluOp.MUL: a64 * b64, AluOp.DIV: a64 / b64}
        for op, w in want.items():
            w32, got = w.astype(F), ALU[op](a, b)
            same = (got.view(np.uint32) == w32.view(np.uint32)) | (np.isnan(got) & np.isnan(w32))
            assert same.all(), op
    folded = F(0)
    for v in np.array([1e8, 1.0, -1e8, 3.0], F):
        folded = REDUCE[ReduceOp.SUM](folded, v)
    assert folded == F(3.0)  # (1e8 + 1) rounds back to 1e8: the fold is in fp32, in order


def test_any_shape_gives_the_same_values():
    """0-d, 1-d and strided 2-d inputs give elementwise the same bits (the interpreter passes [P, F] views)."""
    x = np.linspace(-5, 5, 48).astype(F).reshape(6, 8)[:, ::2]
    y = np.linspace(-3, 3, 48).astype(F).reshape(6, 8)[:, 1::2]
    for func, fn in ACTIVATIONS.items():
        flat = fn(x.ravel())
        assert np.array_equal(fn(x).view(np.uint32).ravel(), flat.view(np.uint32)), func
        assert fn(x[1, 1]).shape == () and fn(x[1, 1]).view(np.uint32) == flat.view(np.uint32)[5], func
    for op, fn in ALU.items():
        flat = fn(x.ravel(), y.ravel())
        assert np.array_equal(fn(x, y).view(np.uint32).ravel(), flat.view(np.uint32)), op
        assert fn(x[0, 2], y[0, 2]).view(np.uint32) == flat.view(np.uint32)[2], op


# ---- ALU: atan2, hypot, logaddexp (float64 references), fmod and remainder (exact) ------------------------------

def _alu_operands(seed: int):
    """Random bit patterns, moderate values, and every pair of special operands (seeded)."""
    rng = np.random.default_rng(seed)
    special = np.array([0.0, -0.0, INF, -INF, NAN, 1e-45, -1e-45, 0.5, -1.5, 3e38, -3e38, 1.0, -1.0, 100.0, 1e-30], F)
    bits = [rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(F) for _ in range(2)]
    mid = [rng.uniform(-10, 10, 200_000).astype(F) for _ in range(2)]
    return (np.concatenate([bits[0], mid[0], np.repeat(special, special.size)]),
            np.concatenate([bits[1], mid[1], np.tile(special, special.size)]))


@pytest.mark.parametrize("op, ref, bound", [(AluOp.ATAN2, np.arctan2, 1.5), (AluOp.HYPOT, np.hypot, 1.2)],
                         ids=["atan2", "hypot"])
def test_atan2_and_hypot_accuracy_and_specials(op, ref, bound):
    """Measured: atan2 1.45 ulp, hypot 1.16 ulp; NaN, infinities and signed zeros as C99 (numpy's float64)."""
    a, b = _alu_operands(10)
    got = ALU[op](a, b)
    with np.errstate(all="ignore"):
        want = ref(a.astype(np.float64), b.astype(np.float64))
    assert (np.isnan(got) == np.isnan(want)).all()
    fin = np.isfinite(want)
    assert (got[~fin & ~np.isnan(want)] == want[~fin & ~np.isnan(want)]).all()
    with np.errstate(all="ignore"):
        err = ulps(got[fin], want[fin])
    i = int(np.argmax(err))
    assert err[i] <= bound, f"{op.text}: {err[i]:.3f} ulp at {a[fin][i]!r}, {b[fin][i]!r}"
    zeros = want == 0
    assert (np.signbit(got[zeros]) == np.signbit(want[zeros])).all()


def test_logaddexp_accuracy():
    """max(a, b) + L, L = log1p(e^-|a - b|) in (0, ln 2] to 2 ulp of L: within 2.5 ulp of the result plus 2^-23 (2 ulp
    of ln 2), which matters only where a + b cancels toward 0 (eager's formula has the same cancellation); a where
    a = b = +-Inf."""
    a, b = _alu_operands(11)
    got = ALU[AluOp.LOGADDEXP](a, b)
    with np.errstate(all="ignore"):
        want = np.logaddexp(a.astype(np.float64), b.astype(np.float64))
    assert (np.isnan(got) == np.isnan(want)).all()
    fin = np.isfinite(want)
    assert (got[~fin & ~np.isnan(want)] == want[~fin & ~np.isnan(want)]).all()
    ulp = np.maximum(np.spacing(np.abs(want[fin]).astype(F)).astype(np.float64), 2.0 ** -149)
    excess = (np.abs(got[fin] - want[fin]) - 2.0 ** -23) / ulp
    assert excess.max() <= 2.5


def test_fmod_is_exact_and_remainder_is_torchs_formula():
    """fmod is C's fmodf bit for bit (numpy's float32 fmod); remainder is fmod plus b where the signs differ, one
    rounding, as torch's kernel (whose vectorized fmod gives NaN where a / b overflows: there we differ)."""
    a, b = _alu_operands(12)
    got = ALU[AluOp.FMOD](a, b)
    with np.errstate(all="ignore"):
        want = np.fmod(a, b)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), list(zip(a[~same][:5], b[~same][:5], got[~same][:5], want[~same][:5]))
    rem = ALU[AluOp.REMAINDER](a, b)
    with np.errstate(all="ignore"):
        fix = (want != 0) & ((b < 0) != (want < 0))
        want_rem = np.where(fix, want + b, want).astype(F)
    same = (rem.view(np.uint32) == want_rem.view(np.uint32)) | (np.isnan(rem) & np.isnan(want_rem))
    assert same.all()
    with np.errstate(all="ignore"):
        ordinary = np.abs(a.astype(np.float64) / b) < 1e30
    torch_rem = torch.remainder(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    same = (rem.view(np.uint32) == torch_rem.view(np.uint32)) | (np.isnan(rem) & np.isnan(torch_rem))
    assert same[ordinary].all()
