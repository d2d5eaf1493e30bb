"""legalize rules of the orthogonal polynomials (issue 16): torch.special's Chebyshev T, U, V, W (and their shifted
forms, at y = 2x - 1) and Hermite H and He, each P(x, n) with n a tensor that torch truncates to int64.

The recurrence length is data dependent and the program is a static instruction stream, so the rules are
data-independent compositions of elementwise nodes that follow torch's CPU kernels (ATen/native/Math.h):

- Chebyshev: n < 0 gives 0 and |y| == 1 torch's special values (parity from n, exact for a float n). Up to n = 32
  an unrolled recurrence, torch's fp32 steps, each step's value selected where n equals it; above torch's own
  threshold (n > 6, 8, or 4 for shifted W) |y| < 1 takes trigonometric forms instead, as torch (cos(n t),
  sin((n + 1) t) / sin t, cos((n + 1/2) t) / cos(t / 2), sin((n + 1/2) t) / sin(t / 2)) but with t = acos|y| and
  the reflections to y < 0 (torch's t = acos y near pi loses V's and W's accuracy near y = -1), the angle
  (n + c) t as an fp32 pair, and for the shifted forms the rounding of y = 2x - 1 carried through acos (near
  |y| = 1 it moves t by up to 3%, which the float64 result sees and torch's fp32 does not). Beyond n = 32,
  |y| > 1 takes the hyperbolic forms with a = acosh|y|: cosh(n a), sinh((n + 1) a) / sinh a,
  cosh((n + 1/2) a) / cosh(a / 2), sinh((n + 1/2) a) / sinh(a / 2) (V and W swap and take (-1)^n below -1), as
  exp(z - log(2 d)) once the argument z passes 9, so a quotient of overflowing terms stays finite; a and z are fp32
  pairs, so the relative error is about z times log's ulp: at most 9.7e-6 measured (|y| in (1, 3], n = 33..1000),
  below eager's recurrence for T, V and W (its error grows as n ulps), but up to 3.6 times eager's for U at
  n = 33..100 (eager's U recurrence errs by only 1.3e-6 to 3.3e-6 there). The shifted forms carry y's rounding
  into |y| - 1 and rho. At fp32's overflow boundary (the last finite n of an x) torch's value may be Inf where
  this is finite or the reverse, and Inf where this gives NaN one step later or earlier (measured at y = 1.25, n = 129).
  Where torch's fp32 recurrence overflows it returns +-Inf for two steps, then Inf - Inf = NaN: the rule gives
  NaN where the closed form two steps back already overflows (z - 2a - log(2 d) > log of fp32's largest value),
  the boundary exact only to within the rounding of z. An infinite y gives NaN, as torch (n > 4), and a NaN y
  NaN (torch's U and W read an uninitialized value there).
- torch's kernels are compiled with FMA contraction (its results match fma(c, q, -(k p)): k p rounded, c q not):
  a step here rounds c q too, which costs an ulp or so per step, but halved and doubled (exact scalings) so that it
  overflows only where torch's fused step does, and k p is rounded alone as in torch (its overflow to Inf then
  gives torch's Inf - Inf = NaN).
- Hermite: torch returns NaN for n > 128 and runs the fp32 recurrence otherwise; |H_n| grows like sqrt(2^n n!),
  and from n = 60 (H) and 70 (He) torch's recurrence is NaN for every x (its intermediates overflow, and
  Inf - Inf or 0 * Inf follows: measured on 2.4 million x spanning every binade and +-0, +-Inf; for x beyond
  the largest zero all terms are positive and increasing, so the first overflow is followed by Inf - Inf). The
  rule unrolls the recurrence to that bound and gives NaN beyond it. Near overflow (n from about 50) whether torch
  gives +-Inf or NaN for an x depends on its rounding step by step, which the unfused steps here do not always
  reproduce.

Laguerre L and Legendre P stay bounded for every n (|x| <= 1 for Legendre), so no unroll bound covers them and no
data-independent method was found that is right for every n: they stay fallbacks (no rule).
An integer n tensor whose bound is unknown is refused: the machine holds it in fp32 for the parity and the
comparisons, exact only below 2^24 (cast n to float32: its values beyond 2^24 are even, as torch reads them).
Only float32 results are lowered (the machine computes in fp32).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_index import EXACT_FP32, _magnitude_bound
from trnc.passes.graph.legalize_table import keep_fp32_inside, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
LOG_MAX = math.log(float(torch.finfo(torch.float32).max))   # log of fp32's largest finite value, 88.72
HERMITE_NAN = {"h": 60, "he": 70}   # from these n on, torch's fp32 recurrence is NaN for every x (measured)
TORCH_HERMITE_LIMIT = 128           # torch returns NaN for n above this (getHermitianLimit<float>)
UNROLLED = 32   # Chebyshev: the recurrence up to this n (and |y| < 1 above torch's threshold the trigonometric form)


# -- shared pieces ------------------------------------------------------------------------------------------
def _operands(rw: Rewriter, n, a):
    """(x, n as an fp32 integer value, the valid mask n >= 0): a float n truncated as torch's cast to int64 (NaN,
    +-Inf and values beyond int64 give int64's minimum there, a negative n); an integer n only with a bound."""
    if n.dtype is not FP32 or any(d is not None and d not in (torch.float32,) and d.is_floating_point
                                  for d in rw.arg_dtypes):
        rw.fail(f"with result dtype {n.dtype.text} is not supported (the machine computes the polynomials in fp32)")
    x, order = a["x"], a["n"]
    x = x if isinstance(x, ir.Node) else rw.scalar_const(float(x), FP32)
    if not isinstance(order, ir.Node):
        order = rw.scalar_const(float(int(order)) if not isinstance(order, float) else order, FP32)
    elif not order.dtype.is_float:
        bound = _magnitude_bound(rw, order)
        if bound is None or bound >= EXACT_FP32:
            rw.fail("with an integer n of unknown bound is not supported: the machine holds n in fp32, exact below "
                    "2^24, and the result's sign depends on n's parity (cast n to float32)")
    x, order = rw.cast(x, FP32), rw.cast(order, FP32)
    nt = rw.unary(order, "trunc", FP32)
    valid = rw.binary("and", rw.scalar(nt, "ge", 0.0), rw.scalar(nt, "lt", 2.0 ** 63))
    return x, nt, valid


def _odd(rw: Rewriter, nt: ir.Node) -> ir.Node:
    """n odd (nt an fp32 integer: nt / 2 is exact, and fp32 values from 2^24 on are even)."""
    half = rw.scalar(nt, "mul", 0.5, dtype=FP32)
    return rw.binary("ne", rw.unary(half, "trunc", FP32), half)


def _nan(rw: Rewriter, like: ir.Node) -> ir.Node:
    return rw.filled(math.nan, like.shape, FP32)


def _select(rw: Rewriter, cond, a, b) -> ir.Node:
    return rw.where(cond, a, b, FP32)


def _fused(rw: Rewriter, c: ir.Node, q: ir.Node, p: ir.Node, k: float, finite_c: ir.Node | None = None) -> ir.Node:
    """torch's step 2c q - k p as its kernel computes it: compiled with FMA contraction, so the product k p rounds
    (and may overflow) alone while 2c q enters the sum unrounded (its results show this bit for bit). Here 2c q is
    rounded too, but halved: 2 (c q - (k p) / 2), the scalings exact, so that it overflows only where the sum
    does; where k p alone overflows and c, q are finite, the fused sum is -(k p), whatever the size of 2c q (given
    `finite_c`, the mask of finite c, for k != 1: with k = 1, p is an earlier value, never Inf beside a finite q)."""
    kp = p if k == 1 else rw.scalar(p, "mul", k, dtype=FP32)
    step = rw.scalar(rw.binary("sub", rw.binary("mul", c, q, FP32), rw.scalar(kp, "mul", 0.5, dtype=FP32), FP32),
                     "mul", 2.0, dtype=FP32)
    if k == 1:
        return step
    overflow = rw.binary("and", rw.binary("and", rw.scalar(rw.unary(kp, "abs", FP32), "eq", math.inf), finite_c),
                         rw.scalar(rw.unary(q, "abs", FP32), "lt", math.inf))
    return _select(rw, overflow, rw.unary(kp, "neg", FP32), step)


def _unrolled(rw: Rewriter, nt, first: ir.Node, step, stop: int, default: ir.Node) -> ir.Node:
    """torch's recurrence q_k = step(k, q_{k-1}, q_{k-2}) from q_0 = 1, q_1 = first, unrolled to k = stop, each
    q_k selected where n == k (`default` elsewhere)."""
    one = rw.filled(1.0, first.shape, FP32)
    out = _select(rw, rw.scalar(nt, "eq", 1.0), first, _select(rw, rw.scalar(nt, "eq", 0.0), one, default))
    p, q = one, first
    for k in range(2, stop + 1):
        p, q = q, step(k, q, p)
        out = _select(rw, rw.scalar(nt, "eq", float(k)), q, out)
    return out


# -- Chebyshev ------------------------------------------------------------------------------------------------
# kind -> (torch's threshold above which |y| < 1 takes the trigonometric form, shifted's threshold)
CHEBYSHEV = {"t": (6, 6), "u": (8, 6), "v": (8, 6), "w": (8, 4)}


def _chebyshev_first(rw: Rewriter, kind: str, y: ir.Node, y2: ir.Node) -> ir.Node:
    """q_1 as torch spells it: y, y + y, y + y - 1, y + y + 1."""
    return {"t": y, "u": y2, "v": rw.scalar(y2, "sub", 1.0, dtype=FP32),
            "w": rw.scalar(y2, "add", 1.0, dtype=FP32)}[kind]


def _chebyshev_edge(rw: Rewriter, kind: str, y, nt, odd) -> ir.Node:
    """torch's values at |y| == 1: +-1, +-(n + 1), 1 or +-(2n + 1), 2n + 1 or +-1."""
    one = rw.filled(1.0, y.shape, FP32)
    sign = _select(rw, rw.binary("and", rw.scalar(y, "lt", 0.0), odd), rw.filled(-1.0, y.shape, FP32), one)
    n1 = rw.scalar(nt, "add", 1.0, dtype=FP32)
    n21 = rw.scalar(rw.scalar(nt, "mul", 2.0, dtype=FP32), "add", 1.0, dtype=FP32)
    positive = rw.scalar(y, "gt", 0.0)
    if kind == "t":
        return sign
    if kind == "u":
        return rw.binary("mul", sign, n1, FP32)
    if kind == "v":
        return _select(rw, positive, one, rw.binary("mul", sign, n21, FP32))
    return _select(rw, positive, rw.binary("mul", one, n21, FP32), sign)


def _chebyshev_inside(rw: Rewriter, kind: str, y, nt, odd, y_lo: ir.Node | None = None) -> ir.Node:
    """|y| < 1, n above torch's threshold: the trigonometric forms in t = acos|y| <= pi/2, by the reflections
    P(-y) = (-1)^n P(y) for T and U, V(-y) = (-1)^n W(y) and W(-y) = (-1)^n V(y): torch's t = acos y near pi makes
    V's and W's quotients of two small, absolutely rounded values (and its guard, sin(t / 2) == 1, returns the
    limit 2n + 1 where the value is 2% off at n = 1000); the small angle's relative rounding keeps them right. The
    angle (n + c) t is a pair (Dekker's product, plus (n + c) times the shifted y's rounding error `y_lo` carried
    through acos), applied as cos(z + e) = cos z cos e - sin z sin e, sin(z + e) likewise."""
    t = rw.unary(rw.unary(y, "abs", FP32), "acos", FP32)
    negative = rw.scalar(y, "lt", 0.0)
    shift = {"t": 0.0, "u": 1.0}.get(kind, 0.5)
    m = rw.scalar(nt, "add", shift, dtype=FP32) if shift else nt
    z, z_lo = _two_prod(rw, m, t)
    if y_lo is not None:   # the shifted forms' y = 2x - 1 rounds: acos(|y| + e) = t - e / sin t for e = sign(y) y_lo
        dt = rw.binary("div", y_lo, rw.unary(t, "sin", FP32), FP32)
        dt = _select(rw, negative, dt, rw.unary(dt, "neg", FP32))
        z_lo = rw.binary("add", z_lo, rw.binary("mul", m, dt, FP32), FP32)
        t = rw.binary("add", t, dt, FP32)   # for the denominators
    cos_z, sin_z = rw.unary(z, "cos", FP32), rw.unary(z, "sin", FP32)
    cos_e, sin_e = rw.unary(z_lo, "cos", FP32), rw.unary(z_lo, "sin", FP32)
    cos_a = rw.binary("sub", rw.binary("mul", cos_z, cos_e, FP32), rw.binary("mul", sin_z, sin_e, FP32), FP32)
    sin_a = rw.binary("add", rw.binary("mul", sin_z, cos_e, FP32), rw.binary("mul", cos_z, sin_e, FP32), FP32)
    if kind == "t":
        value = cos_a
    elif kind == "u":
        value = rw.binary("div", sin_a, rw.unary(t, "sin", FP32), FP32)
    else:
        half = rw.scalar(t, "mul", 0.5, dtype=FP32)
        as_v = rw.binary("div", cos_a, rw.unary(half, "cos", FP32), FP32)
        as_w = rw.binary("div", sin_a, rw.unary(half, "sin", FP32), FP32)
        above, below = (as_v, as_w) if kind == "v" else (as_w, as_v)
        value = _select(rw, negative, below, above)
    return _select(rw, rw.binary("and", negative, odd), rw.unary(value, "neg", FP32), value)


def _two_prod(rw: Rewriter, u: ir.Node, v: ir.Node) -> tuple[ir.Node, ir.Node]:
    """(u v rounded, its rounding error) by Dekker's product with Veltkamp's splits (exact below 2^100 or so; a NaN
    error of an overflowing split is taken as 0)."""
    def split(w):
        c = rw.scalar(w, "mul", 4097.0, dtype=FP32)
        high = rw.binary("sub", c, rw.binary("sub", c, w, FP32), FP32)
        return high, rw.binary("sub", w, high, FP32)
    p = rw.binary("mul", u, v, FP32)
    (uh, ul), (vh, vl) = split(u), split(v)
    mul = lambda s, t: rw.binary("mul", s, t, FP32)   # noqa: E731
    e = rw.binary("add", rw.binary("add", rw.binary("add", rw.binary("sub", mul(uh, vh), p, FP32), mul(uh, vl), FP32),
                                   mul(ul, vh), FP32), mul(ul, vl), FP32)
    return p, _select(rw, rw.binary("ne", e, e), rw.filled(0.0, e.shape, FP32), e)


def _chebyshev_outside(rw: Rewriter, kind: str, y, nt, odd, y_lo: ir.Node | None = None) -> ir.Node:
    """|y| > 1, n above the threshold: sign * f(z) / d with a = acosh|y| = log(Y + sqrt((Y - 1)(Y + 1))), the root
    and the sum as fp32 pairs (so a errs by log's ulp alone), z = (n + c) a as a pair too, f cosh or sinh and d 1,
    sinh a = sqrt(Y^2 - 1), cosh(a / 2) = sqrt((Y + 1) / 2) or sinh(a / 2) = sqrt((Y - 1) / 2); f(z_hi + z_lo) =
    f(z_hi) + f'(z_hi) z_lo, and exp(z - log(2 d)) from z > 9 (e^-2z below 2^-25); NaN where torch's recurrence
    has overflowed two steps before n (Inf - Inf), and for infinite y."""
    big_y = rw.unary(y, "abs", FP32)
    negative = rw.scalar(y, "lt", 0.0)
    below = rw.scalar(big_y, "sub", 1.0, dtype=FP32)                     # exact
    move = None
    if y_lo is not None:   # the shifted y's rounding: |y| - 1 + e (e = sign(y) y_lo), e added to rho's low part too
        move = _select(rw, negative, rw.unary(y_lo, "neg", FP32), y_lo)
        below = rw.binary("add", below, move, FP32)
    above = rw.scalar(big_y, "add", 1.0, dtype=FP32)
    above_lo = rw.binary("sub", rw.filled(1.0, y.shape, FP32), rw.binary("sub", above, big_y, FP32), FP32)
    d_hi, d_lo = _two_prod(rw, below, above)
    d_lo = rw.binary("add", d_lo, rw.binary("mul", below, above_lo, FP32), FP32)
    root = rw.unary(d_hi, "sqrt", FP32)
    sq, sq_lo = _two_prod(rw, root, root)
    root_lo = rw.binary("div", rw.binary("add", rw.binary("sub", rw.binary("sub", d_hi, sq, FP32), sq_lo, FP32), d_lo,
                                         FP32), rw.scalar(root, "mul", 2.0, dtype=FP32), FP32)
    rho = rw.binary("add", big_y, root, FP32)
    rho_lo = rw.binary("add", rw.binary("sub", root, rw.binary("sub", rho, big_y, FP32), FP32), root_lo, FP32)
    if move is not None:
        rho_lo = rw.binary("add", rho_lo, move, FP32)
    a = rw.unary(rho, "log", FP32)
    a_lo = rw.binary("div", rho_lo, rho, FP32)
    shift = {"t": 0.0, "u": 1.0}.get(kind, 0.5)
    m = rw.scalar(nt, "add", shift, dtype=FP32) if shift else nt
    z, z_lo = _two_prod(rw, m, a)
    z_lo = rw.binary("add", z_lo, rw.binary("mul", m, a_lo, FP32), FP32)
    two_a = rw.scalar(a, "mul", 2.0, dtype=FP32)

    def magnitude(use_cosh, d):
        f, f_prime = (rw.unary(z, "cosh", FP32), rw.unary(z, "sinh", FP32))[::1 if use_cosh else -1]
        f = rw.binary("add", f, rw.binary("mul", f_prime, z_lo, FP32), FP32)
        direct = f if d is None else rw.binary("div", f, d, FP32)
        log2d = math.log(2.0) if d is None else rw.unary(rw.scalar(d, "mul", 2.0, dtype=FP32), "log", FP32)
        exponent = rw.arith("sub", z, log2d, FP32)
        scaled = rw.binary("mul", rw.unary(exponent, "exp", FP32), rw.scalar(z_lo, "add", 1.0, dtype=FP32), FP32)
        beyond = rw.scalar(rw.arith("sub", rw.binary("sub", z, two_a, FP32), log2d, FP32), "gt", LOG_MAX)
        return _select(rw, beyond, _nan(rw, y), _select(rw, rw.scalar(z, "gt", 9.0), scaled, direct))

    if kind == "t":
        mag = magnitude(True, None)
    elif kind == "u":
        mag = magnitude(False, root)
    else:   # V above 1 is the cosh form, below -1 (-1)^n W(|y|): the sinh form; W the other way round
        as_cosh = magnitude(True, rw.unary(rw.scalar(above, "mul", 0.5, dtype=FP32), "sqrt", FP32))
        as_sinh = magnitude(False, rw.unary(rw.scalar(below, "mul", 0.5, dtype=FP32), "sqrt", FP32))
        up, down = (as_cosh, as_sinh) if kind == "v" else (as_sinh, as_cosh)
        mag = _select(rw, negative, down, up)
    value = _select(rw, rw.binary("and", negative, odd), rw.unary(mag, "neg", FP32), mag)
    return _select(rw, rw.scalar(big_y, "eq", math.inf), _nan(rw, y), value)


def _chebyshev(kind: str, shifted: bool):
    def lower(rw: Rewriter, n, a):
        x, nt, valid = _operands(rw, n, a)
        y, y_lo = x, None
        if shifted:   # y = 2x - 1 and its rounding error (Knuth's two-sum; 2x is exact)
            x2 = rw.binary("add", x, x, FP32)
            y = rw.scalar(x2, "sub", 1.0, dtype=FP32)
            back = rw.scalar(y, "add", 1.0, dtype=FP32)
            y_lo = rw.binary("add", rw.binary("sub", x2, back, FP32),
                             rw.unary(rw.scalar(rw.binary("sub", back, y, FP32), "sub", 1.0, dtype=FP32), "neg", FP32),
                             FP32)
        y2 = rw.binary("add", y, y, FP32)
        odd = _odd(rw, nt)
        threshold = CHEBYSHEV[kind][1 if shifted else 0]
        ay = rw.unary(y, "abs", FP32)
        big = _select(rw, rw.scalar(ay, "lt", 1.0), _chebyshev_inside(rw, kind, y, nt, odd, y_lo),
                      _chebyshev_outside(rw, kind, y, nt, odd, y_lo))
        big = _select(rw, rw.binary("ne", y, y), _nan(rw, y), big)
        small = _unrolled(rw, nt, _chebyshev_first(rw, kind, y, y2),
                          lambda k, q, p: _fused(rw, y, q, p, 1), UNROLLED, big)
        inside = rw.binary("and", rw.scalar(ay, "lt", 1.0), rw.scalar(nt, "gt", float(threshold)))
        result = _select(rw, inside, big, small)
        result = _select(rw, rw.scalar(ay, "eq", 1.0), _chebyshev_edge(rw, kind, y, nt, odd), result)
        result = _select(rw, valid, result, rw.filled(0.0, result.shape, FP32))
        return keep_fp32_inside(result, x, nt)
    return lower


for _kind in CHEBYSHEV:
    for _shifted in (False, True):
        _name = f"aten.special_{'shifted_' if _shifted else ''}chebyshev_polynomial_{_kind}"
        rule(f"{_name}.default", f"{_name}.x_scalar", f"{_name}.n_scalar")(_chebyshev(_kind, _shifted))


# -- Hermite -------------------------------------------------------------------------------------------------
def _hermite(kind: str):
    """torch's fp32 recurrence unrolled to HERMITE_NAN[kind], NaN beyond (torch's own value there)."""
    def lower(rw: Rewriter, n, a):
        x, nt, valid = _operands(rw, n, a)
        nan = _nan(rw, x)
        finite = rw.scalar(rw.unary(x, "abs", FP32), "lt", math.inf)
        if kind == "h":   # (x + x) q - 2(k - 1) p
            first = rw.binary("add", x, x, FP32)
            step = lambda k, q, p: _fused(rw, x, q, p, float(2 * (k - 1)), finite)   # noqa: E731
        else:             # x q - (k - 1) p
            first, half = x, rw.scalar(x, "mul", 0.5, dtype=FP32)
            step = lambda k, q, p: _fused(rw, half, q, p, float(k - 1), finite)   # noqa: E731
        result = _unrolled(rw, nt, first, step, HERMITE_NAN[kind], nan)
        result = _select(rw, valid, result, rw.filled(0.0, result.shape, FP32))
        return keep_fp32_inside(result, x, nt)
    return lower


for _kind in HERMITE_NAN:
    _name = f"aten.special_hermite_polynomial_{_kind}"
    rule(f"{_name}.default", f"{_name}.x_scalar", f"{_name}.n_scalar")(_hermite(_kind))
