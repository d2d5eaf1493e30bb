"""legalize rules of the Hurwitz zeta function and the polygamma functions of order n >= 1 (issue 16), as elementwise
fp32 nodes: the machine runs a static instruction stream, so every data-dependent loop of torch's algorithm
(include/ATen/native/Math.h: `zeta`, the float `trigamma`, `calc_polygamma`) becomes a fixed sequence.

zeta(x, q) for q > 0, as torch's cephes loop (which runs exactly 9 terms when q > 0): the ten terms (q + i)^-x,
i = 0..9, then the Euler-Maclaurin tail at w = q + 9 with torch's table A: b w / (x - 1) - b / 2 + the 12 terms
x (x+1) ... (x+2j) b / w^(2j+1) / A[j]. Differences from a transcription, all for accuracy in fp32 (torch sums in
double): q + i is an exact pair hi + lo (two-sum) and (hi + lo)^-x = hi^-x (1 - x lo / hi), so the rounding of
q + i is not amplified by x; each tail term is the previous one times ((x+2j+1)/w) ((x+2j+2)/w) A[j]/A[j+1], so
no intermediate overflows where torch's double product does not (x = 50, 1000); all terms are summed (torch stops
when they fall below its rounding), smallest first, the direct terms and the tail each in its own sum.

q < 0 not an integer with integer x = s (torch's loop then runs about 9 - q terms): with f = q - floor(q) in (0, 1)
and g = 1 - f as exact pairs (two-sums with the integer floor(q)), zeta(s, q) = zeta(s, f) + (-1)^s (zeta(s, g) -
zeta(s, 1 - q)), three evaluations at positive arguments. The two leading terms f^-s and (-1)^s g^-s are added
first. For odd s they cancel near f = 1/2: where |s atanh(2f - 1)| < 1 their difference is
-2^(s+1) (1 - u^2)^(-s/2) sinh(s atanh(u)), u = 2f - 1, with no cancellation; where one of them overflows fp32 it
is (a - b)(a + b)(a^2 + b^2)(a^4 + b^4), a = f^(-s/8), b = g^(-s/8), which overflows only where the result does.
(Beyond s = 1024 torch's double terms overflow to opposite infinities and give NaN; this gives the overflowed
difference, +-inf.) The remaining sums still cancel near the zeros of the result: the error there is a few ulps
of the terms' scale, sum |q + k|^-s, not of the result (torch's double loses its small terms likewise, by 1e-16
of that scale: for s = 41, q = -2.5 its 6e-8 is 1.5^-41 where the sum is 5e-23).

Special values as torch: x == 1 -> inf, x < 1 (and -inf) -> NaN, q <= 0 an integer (and -inf) -> inf, q < 0 with
x not an integer -> NaN, q = +inf -> NaN; for x beyond X_HUGE (where torch's double product of the 23 factors
x .. x + 22 overflows, times a b that underflowed to 0) torch gives NaN for q > 1, 1 for q == 1, inf below.

polygamma(1, x) is torch's float trigamma transcribed (reflection below 1/2 with sin(pi x), 6 recurrence steps,
the asymptotic series), equal to eager's up to the machine sin's ulp; polygamma(n, x), n >= 2, is
(-1)^(n+1) n! zeta(n + 1, x) with n! as eager computes it in float (exp(lgamma(n + 1)) rounded to fp32);
n > MAX_ORDER is refused (fp32 n! overflows).

Measured against float64 (torch's double zeta and polygamma; tests/test_legalize_zeta.py, 4096-point seeded grids),
in fp32 ulps: zeta, q in (1e-6, 50], x in (1, 40]: 2.44 (2.57 for q in [1e-6, 1.2e6], x - 1 in [4.5e-5, 90]);
q in (-20, 0), x an integer in [2, 40]: 2.11 ulps of the terms' scale; polygamma n = 2..5, x in (0, 10]: 3.34,
x in [1e-6, 1.2e6]: 4.04, x in (-10, 0): 3.52 ulps of the scale; trigamma 4.31 for x > 0, as eager's float
trigamma.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_bessel import Fp32
from trnc.passes.graph.legalize_table import keep_fp32_inside, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
TERMS = 9                                          # the direct terms after q^-x, as torch's loop for q > 0
A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
     -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
     -7.1661652561756670113e18)                    # torch's Euler-Maclaurin table
MAX_ORDER = 34                                     # fp32 n! overflows from n = 35 (eager then gives inf or NaN)


def _x_huge() -> float:
    """The least fp32 x whose product x (x+1) ... (x+22) overflows double (torch's `a` before its last term)."""
    lo, hi = 1e12, 1e14
    for _ in range(200):
        mid = float(np.float32((lo + hi) / 2))
        a = 1.0
        for k in range(23):
            a *= mid + k
        lo, hi = (lo, mid) if math.isinf(a) else (mid, hi)
        if float(np.nextafter(np.float32(lo), np.float32(np.inf))) >= hi:
            break
    return hi


X_HUGE = _x_huge()


class _Ops(Fp32):
    """legalize_bessel's fp32 arithmetic, on nodes or Python numbers (a compile-time x), every result rounded to
    fp32 as the machine rounds it; selects and comparisons fold when their condition is known."""

    def __init__(self, rw: Rewriter, shape):
        super().__init__(rw)
        self.shape = tuple(shape)

    def op(self, op: str, a, b):
        if isinstance(a, ir.Node) or isinstance(b, ir.Node):
            return self.rw.arith(op, a, b, FP32)
        fa, fb = np.float32(a), np.float32(b)
        with np.errstate(all="ignore"):
            return float({"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](fa, fb))

    def cmp(self, op: str, a, b):
        if isinstance(a, ir.Node) or isinstance(b, ir.Node):
            return self.rw.arith(op, a, b)
        return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]

    def both(self, op: str, c, d):
        """c and d (op "and") or c or d (op "or"), folding known conditions."""
        if not isinstance(c, ir.Node):
            c, d = d, c
        if not isinstance(d, ir.Node):
            return (c if d else False) if op == "and" else (True if d else c)
        return self.rw.binary(op, c, d)

    def tensor(self, v):
        return v if isinstance(v, ir.Node) else self.rw.filled(float(v), self.shape, FP32)

    def where(self, cond, a, b):
        if not isinstance(cond, ir.Node):
            return a if cond else b
        return self.rw.where(cond, self.tensor(a), self.tensor(b), FP32)

    def func(self, x, f: str):
        if isinstance(x, ir.Node):
            return self.rw.unary(x, f, FP32)
        return float(getattr(np, {"floor": "floor", "abs": "abs"}[f])(np.float32(x)))

    def pow(self, a: ir.Node, e):
        return self.rw.arith("pow", a, e, FP32)

    def pow2(self, e):
        if isinstance(e, ir.Node):
            return self.rw.unary(e, "exp2", FP32)
        return float(np.float32(2.0 ** e))


def _two_sum(o: _Ops, a, b):
    """a + b = hi + lo exactly (Knuth's branch-free two-sum)."""
    hi = o.add(a, b)
    bb = o.sub(hi, a)
    return hi, o.add(o.sub(a, o.sub(hi, bb)), o.sub(b, bb))


def _pow_pair(o: _Ops, hi, lo, negx, below_one: bool = False):
    """(hi + lo)^negx = hi^negx (1 + negx lo / hi) for |lo| <= ulp(hi) / 2 (an infinite power kept, where hi may
    be below 1: inf + inf * c would be NaN for c < 0)."""
    p = o.pow(hi, negx)
    if lo is None:
        return p
    out = o.add(p, o.mul(p, o.mul(o.div(lo, hi), negx)))
    return o.where(o.cmp("eq", p, math.inf), p, out) if below_one else out


def _zeta_terms(o: _Ops, x, negx, hi, lo):
    """zeta(x, q) for q = hi + lo > 0 as (q^-x, the rest): the 9 further direct terms and torch's tail. The last
    term b = w^-x is w^(1-x) / w, so the tail's leading b w / (x - 1) does not underflow with b (q = 1e30)."""
    first = _pow_pair(o, hi, lo, negx, below_one=True)
    terms = []
    for i in range(1, TERMS + 1):
        h, e = _two_sum(o, hi, float(i))
        e = e if lo is None else o.add(e, lo)
        if i < TERMS:
            terms.append(_pow_pair(o, h, e, negx))
    w, bw = h, _pow_pair(o, h, e, o.sub(1.0, x))
    terms.append(o.div(bw, w))
    tail = o.mul(bw, o.sub(o.div(1.0, o.sub(x, 1.0)), o.div(0.5, w)))
    t = o.div(o.div(o.mul(bw, o.div(x, w)), A[0]), w)
    series = [t]
    for j in range(len(A) - 1):
        t = o.mul(o.mul(o.mul(t, o.div(o.add(x, 2.0 * j + 1), w)), o.div(o.add(x, 2.0 * j + 2), w)),
                  float(np.float32(A[j] / A[j + 1])))
        series.append(t)
    rest = series[-1]
    for t in reversed(series[:-1]):
        rest = o.add(rest, t)
    rest = o.add(rest, tail)
    direct = terms[-1]
    for t in reversed(terms[:-1]):
        direct = o.add(direct, t)
    return first, o.add(direct, rest)   # the terms apart: added one by one into a larger tail, each would round


def _sinh_difference(o: _Ops, x, f_hi, f_lo):
    """f^-s - (1 - f)^-s for odd s near f = 1/2, without their cancellation: with u = 2f - 1 (exact but for one
    rounding), -2^(s+1) (1 - u^2)^(-s/2) sinh(s atanh(u)); 1 - u^2 by log1p's series, since it is used where
    |s atanh(u)| < 1, so u^2 < 1/9 (8 terms: 2e-9). Returns (the difference, s atanh(u))."""
    rw = o.rw
    u = o.mul(o.add(o.sub(f_hi, 0.5), f_lo), 2.0)
    y = o.mul(x, rw.unary(u, "atanh", FP32))
    v = o.mul(u, u)
    series = 1.0 / 8
    for k in range(7, 0, -1):
        series = o.add(float(np.float32(1.0 / k)), o.mul(v, series))
    log1p = o.mul(o.mul(v, series), -1.0)
    scale = rw.unary(o.mul(o.mul(x, -0.5), log1p), "exp", FP32)
    half = o.pow2(o.mul(o.add(x, 1.0), 0.5))
    return o.mul(o.mul(o.mul(half, o.mul(scale, rw.unary(y, "sinh", FP32))), half), -1.0), y


def _odd_difference(o: _Ops, f, g, negx):
    """f^-s - g^-s for f, g > 0 without overflowing before the result does: (a - b)(a + b)(a^2 + b^2)(a^4 + b^4),
    a = f^(-s/8), b = g^(-s/8); exactly 0 where f == g."""
    e = o.mul(negx, 0.125)
    a, b = o.pow(f, e), o.pow(g, e)
    a2, b2 = o.mul(a, a), o.mul(b, b)
    out = o.mul(o.mul(o.mul(o.sub(a, b), o.add(a, b)), o.add(a2, b2)), o.add(o.mul(a2, a2), o.mul(b2, b2)))
    return o.where(o.cmp("eq", f, g), 0.0, out)


def zeta(rw: Rewriter, x, q: ir.Node):
    """Hurwitz zeta(x, q) in fp32, elementwise over q (a node) and x (a node of q's shape or a Python number)."""
    o = _Ops(rw, q.shape)
    negx = o.mul(x, -1.0)
    positive = o.cmp("gt", q, 0.0)
    floor_q = o.func(q, "floor")
    # q < 0: with f = q - floor(q) and g = 1 - f as exact pairs, zeta(s, f) + (-1)^s (zeta(s, g) - zeta(s, 1 - q)),
    # leading terms f^-s + (-1)^s g^-s first; lanes of q > 0 compute it at q = -1/2 (finite, unused)
    qs = o.where(positive, -0.5, q)
    m = o.mul(o.func(qs, "floor"), -1.0)
    f_hi, f_lo = _two_sum(o, qs, m)
    g_hi, g_lo = _two_sum(o, qs, o.sub(m, 1.0))
    g_hi, g_lo = o.mul(g_hi, -1.0), o.mul(g_lo, -1.0)
    c_hi, c_lo = _two_sum(o, 1.0, o.mul(qs, -1.0))
    first_a, rest_a = _zeta_terms(o, x, negx, o.where(positive, q, f_hi), o.where(positive, 0.0, f_lo))
    result = o.add(first_a, rest_a)
    first_b, rest_b = _zeta_terms(o, x, negx, g_hi, g_lo)
    first_c, rest_c = _zeta_terms(o, x, negx, c_hi, c_lo)
    odd = o.cmp("eq", o.sub(x, o.mul(o.func(o.mul(x, 0.5), "floor"), 2.0)), 1.0)
    sign = o.where(odd, -1.0, 1.0)
    pair = o.add(first_a, o.mul(sign, first_b))
    overflow = o.both("or", o.cmp("eq", first_a, math.inf), o.cmp("eq", first_b, math.inf))
    pair = o.where(o.both("and", odd, overflow), _odd_difference(o, f_hi, g_hi, negx), pair)
    if not (isinstance(odd, bool) and not odd):
        near_half, y = _sinh_difference(o, x, f_hi, f_lo)
        pair = o.where(o.both("and", odd, o.cmp("lt", o.func(y, "abs"), 1.0)), near_half, pair)
    tail = o.sub(rest_b, o.add(first_c, rest_c))
    negative = o.add(pair, o.add(rest_a, o.mul(sign, tail)))
    result = o.where(positive, result, negative)
    # special values, the last select winning, as torch checks them
    fractional_x = o.cmp("ne", x, o.func(x, "floor"))               # NaN counts as fractional, as in torch
    huge = o.where(o.cmp("lt", q, 1.0), math.inf, o.where(o.cmp("eq", q, 1.0), 1.0, math.nan))
    result = o.where(o.cmp("ge", x, X_HUGE), huge, result)
    result = o.where(o.cmp("eq", q, math.inf), math.nan, result)
    result = o.where(o.both("and", o.cmp("lt", q, 0.0), fractional_x), math.nan, result)
    result = o.where(o.both("and", o.cmp("le", q, 0.0), o.cmp("eq", q, floor_q)), math.inf, result)
    result = o.where(o.cmp("lt", x, 1.0), math.nan, result)
    result = o.where(o.cmp("eq", x, 1.0), math.inf, result)
    return o.tensor(result)


def _float_operand(rw: Rewriter, v, shape):
    """A tensor operand as fp32 of the result's shape, or a Python number as fp32."""
    if isinstance(v, ir.Node):
        return rw.expand(rw.cast(v, FP32), shape)
    return float(np.float32(v))


@rule("aten.special_zeta.default", "aten.special_zeta.self_scalar", "aten.special_zeta.other_scalar")
def _zeta(rw: Rewriter, n, a):
    """torch.special.zeta(x, q), the Hurwitz zeta function (module docstring)."""
    if not n.dtype.is_float:
        rw.fail(f"with result dtype {n.dtype.text} is not supported (the machine computes zeta in fp32)")
    x, q = (_float_operand(rw, v, n.shape) for v in (a["input"], a["other"]))
    if not isinstance(q, ir.Node):
        q = rw.filled(q, n.shape, FP32)
    inputs = [v for v in (a["input"], a["other"]) if isinstance(v, ir.Node)]
    return keep_fp32_inside(rw.cast(zeta(rw, x, q), n.dtype), *inputs)


def trigamma(rw: Rewriter, x: ir.Node) -> ir.Node:
    """torch's float trigamma, operation for operation (Math.h): equal to eager's up to sin's ulp."""
    o = _Ops(rw, x.shape)
    pi = np.float32(math.pi)
    small = o.cmp("lt", x, 0.5)
    sin = rw.unary(o.mul(x, float(pi)), "sin", FP32)
    reflection = o.sub(0.0, o.div(float(pi * pi), o.mul(sin, sin)))
    result = o.where(small, reflection, 0.0)
    y = o.where(small, o.sub(1.0, x), x)
    for _ in range(6):
        result = o.add(result, o.div(1.0, o.mul(y, y)))
        y = o.add(y, 1.0)
    ixx = o.div(1.0, o.mul(y, y))
    inner = o.mul(ixx, o.sub(float(np.float32(1 / 6)), o.mul(ixx, o.sub(float(np.float32(1 / 30)),
                                                                         o.mul(ixx, float(np.float32(1 / 42)))))))
    result = o.add(result, o.div(o.add(o.add(1.0, o.div(1.0, o.mul(y, 2.0))), inner), y))
    return o.where(small, o.mul(result, -1.0), result)


def factorial_as_eager(n: int) -> float:
    """n! as eager's float polygamma computes it, exp(lgamma(n + 1)) in float (libm's lgammaf and expf where
    available, else the double value rounded to fp32)."""
    try:
        import ctypes
        import ctypes.util
        libm = ctypes.CDLL(ctypes.util.find_library("m"))
        libm.lgammaf.restype = libm.expf.restype = ctypes.c_float
        libm.lgammaf.argtypes = libm.expf.argtypes = [ctypes.c_float]
        return float(np.float32(libm.expf(libm.lgammaf(float(n + 1)))))
    except (OSError, AttributeError, TypeError):
        return float(np.float32(math.exp(math.lgamma(n + 1))))


def polygamma(rw: Rewriter, n, x: ir.Node, order: int) -> ir.Node:
    """polygamma(order, x) for order >= 1 (the caller, legalize_math's aten.polygamma rule, does order 0)."""
    if order < 0 or order > MAX_ORDER:
        rw.fail(f"with n={order} is not supported (the machine computes polygamma for 0 <= n <= {MAX_ORDER}: "
                "fp32 n! overflows beyond)")
    if not n.dtype.is_float:
        rw.fail(f"with result dtype {n.dtype.text} is not supported (the machine computes polygamma in fp32)")
    xf = rw.cast(x, FP32)
    if order == 1:
        out = trigamma(rw, xf)
    else:
        scale = factorial_as_eager(order) * (1.0 if order % 2 else -1.0)
        out = rw.scalar(zeta(rw, float(order + 1), xf), "mul", scale, dtype=FP32)
    return keep_fp32_inside(rw.cast(out, n.dtype), x)
