"""legalize rules of the Hurwitz zeta function and the polygamma functions of order n >= 1 (issue 16), as elementwise
fp32 nodes: the machine runs a static instruction stream, so every data-dependent loop of torch's algorithm
(include/ATen/native/Math.h: `zeta`, the float `trigamma`, `calc_polygamma`) becomes a fixed sequence.

zeta(x, q) for q > 0, as torch's cephes loop (which runs exactly 9 terms when q > 0): the ten terms (q + i)^-x,
i = 0..9, then the Euler-Maclaurin tail at w = q + 9 with torch's table A: b w / (x - 1) - b / 2 + the 12 terms
x (x+1) ... (x+2j) b / w^(2j+1) / A[j]. Differences from a transcription, all for accuracy in fp32 (torch sums in
double): q + i is an exact pair hi + lo (two-sum) and (hi + lo)^-x = hi^-x (1 - x lo / hi), so the rounding of
q + i is not amplified by x; each tail term is the previous one times ((x+2j+1)/w) ((x+2j+2)/w) A[j]/A[j+1], so
no intermediate overflows where torch's double product does not (x = 50, 1000); all terms are summed (torch stops
when they fall below its rounding), smallest first.

q < 0 not an integer with integer x = s (torch's loop then runs about 9 - q terms): with f = q - floor(q) in (0, 1)
(exact), zeta(s, q) = zeta(s, f) + (-1)^s (zeta(s, 1 - f) - zeta(s, 1 - q)), three evaluations at positive
arguments (1 - f and 1 - q as exact pairs). Its two leading terms f^-s and (-1)^s (1 - f)^-s are added first;
where one overflows fp32 for odd s their difference is (a - b)(a + b)(a^2 + b^2)(a^4 + b^4) with a = f^(-s/8),
b = (1 - f)^(-s/8), which overflows only where the result does, and gives NaN (inf - inf) only from
s log2(1 / max(f, 1 - f)) > 1024, where torch's double terms overflow to opposite infinities and give NaN too.
Near f = 1/2 with odd s the two leading terms cancel: the error is then a few ulps of the larger term, not of the
result (inherent to fp32 terms; torch's are double).

Special values as torch: x == 1 -> inf, x < 1 (and -inf) -> NaN, q <= 0 an integer (and -inf) -> inf, q < 0 with
x not an integer -> NaN, q = +inf -> NaN; for x beyond X_HUGE (where torch's double product of the 23 factors
x .. x + 22 overflows, times a b that underflowed to 0) torch gives NaN for q > 1, 1 for q == 1, inf below.

polygamma(1, x) is torch's float trigamma transcribed (reflection below 1/2 with sin(pi x), 6 recurrence steps,
the asymptotic series), equal to eager's up to the machine sin's ulp; polygamma(n, x), n >= 2, is
(-1)^(n+1) n! zeta(n + 1, x) with n! as eager computes it in float (exp(lgamma(n + 1)) rounded to fp32);
n > MAX_ORDER is refused (fp32 n! overflows).

Measured against float64 (torch's double zeta and polygamma), see tests/test_legalize_zeta.py: for q > 0 zeta is
within ZETA_ULPS ulps (4 from the machine pow on the leading terms, the sums and the tail a few more), polygamma
n >= 2 for x > 0 likewise, trigamma within eager's error plus sin's; for q < 0 within a few ulps of the largest
leading term.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from trnc import ir
from trnc.isa.dtypes import DType
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


class _Ops:
    """fp32 arithmetic on nodes or Python numbers (a compile-time x), every result rounded to fp32 as the machine
    rounds it; selects and comparisons fold when their condition is known."""

    def __init__(self, rw: Rewriter, shape):
        self.rw, self.shape = rw, tuple(shape)

    def op(self, op: str, a, b):
        if isinstance(a, ir.Node) or isinstance(b, ir.Node):
            return self.rw.arith(op, a, b, FP32)
        fa, fb = np.float32(a), np.float32(b)
        with np.errstate(all="ignore"):
            return float({"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](fa, fb))

    def add(self, a, b):
        return self.op("add", a, b)

    def sub(self, a, b):
        return self.op("sub", a, b)

    def mul(self, a, b):
        return self.op("mul", a, b)

    def div(self, a, b):
        return self.op("div", a, b)

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
    """zeta(x, q) for q = hi + lo > 0 as (q^-x, the rest): the 9 further direct terms and torch's tail."""
    first = _pow_pair(o, hi, lo, negx, below_one=True)
    terms = []
    for i in range(1, TERMS + 1):
        h, e = _two_sum(o, hi, float(i))
        terms.append(_pow_pair(o, h, e if lo is None else o.add(e, lo), negx))
    w, b = h, terms[-1]
    tail = [o.mul(b, o.sub(o.div(w, o.sub(x, 1.0)), 0.5))]
    t = o.div(o.mul(b, o.div(x, w)), A[0])
    series = [t]
    for j in range(len(A) - 1):
        t = o.mul(o.mul(o.mul(t, o.div(o.add(x, 2.0 * j + 1), w)), o.div(o.add(x, 2.0 * j + 2), w)),
                  float(np.float32(A[j] / A[j + 1])))
        series.append(t)
    rest = series[-1]
    for t in reversed(series[:-1]):
        rest = o.add(rest, t)
    rest = o.add(rest, tail[0])
    for t in reversed(terms):
        rest = o.add(rest, t)
    return first, rest


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
    f = o.sub(q, floor_q)                                          # exact, in [0, 1)
    base = o.where(positive, q, f)
    first_a, rest_a = _zeta_terms(o, x, negx, base, None)
    result = o.add(first_a, rest_a)
    # q < 0: zeta(s, f) + (-1)^s (zeta(s, 1 - f) - zeta(s, 1 - q)), leading terms f^-s + (-1)^s (1 - f)^-s first
    safe = o.where(positive, 0.5, f)                               # keeps the unused lanes finite
    g_hi, g_lo = _two_sum(o, 1.0, o.mul(safe, -1.0))
    c_hi, c_lo = _two_sum(o, 1.0, o.mul(o.where(positive, -1.0, q), -1.0))
    first_b, rest_b = _zeta_terms(o, x, negx, g_hi, g_lo)
    first_c, rest_c = _zeta_terms(o, x, negx, c_hi, c_lo)
    odd = o.cmp("eq", o.sub(x, o.mul(o.func(o.mul(x, 0.5), "floor"), 2.0)), 1.0)
    sign = o.where(odd, -1.0, 1.0)
    pair = o.add(first_a, o.mul(sign, first_b))
    overflow = o.both("or", o.cmp("eq", first_a, math.inf), o.cmp("eq", first_b, math.inf))
    pair = o.where(o.both("and", odd, overflow), _odd_difference(o, safe, g_hi, negx), pair)
    tail = o.sub(rest_b, o.add(first_c, rest_c))
    negative = o.add(pair, o.add(rest_a, o.mul(sign, tail)))
    result = o.where(positive, result, negative)
    # special values, the last select winning, as torch checks them
    fractional_x = o.cmp("ne", x, o.func(x, "floor"))               # NaN counts as fractional, as in torch
    huge = o.where(o.cmp("gt", q, 1.0), math.nan, o.where(o.cmp("eq", q, 1.0), 1.0, math.inf))
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
