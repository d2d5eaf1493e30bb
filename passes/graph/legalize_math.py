"""legalize rules of the math functions of tensors (issue 16): each aten op is one machine function where the
machine has it (ScalarE's sin ... sign, lgamma and digamma, the ALU's atan2, fmod, remainder, hypot and logaddexp:
runtime/fp32trig.py, fp32special.py, fp32gamma.py and fp32round.py, whose measured ulp errors isa/SPEC.md states), and
a few elementwise nodes otherwise: frac = x - trunc(x), round with decimals as torch's kernel (rint(x * 10^d) / 10^d in
fp32), xlogy and nan_to_num by selects, isnan / isinf / isfinite by comparisons (which are IEEE: NaN compares unequal
to itself). Intermediates are fp32 and only the result rounds to its dtype, as torch's kernels compute low-precision
floats.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph import legalize_zeta
from trnc.passes.graph.legalize_index import EXACT_FP32, _magnitude_bound, _to_int
from trnc.passes.graph.legalize_table import keep_fp32_inside, pm_legalize, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
# aten name -> ScalarE function (isa ActFunc)
FUNCS = {name: name for name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                                 "atanh", "erf", "erfc", "erfinv", "exp2", "log2", "log10", "lgamma", "digamma")}
ROUNDING = {"floor": "floor", "ceil": "ceil", "trunc": "trunc", "fix": "trunc", "round": "rint"}
SIGN = {"sign": "sign", "sgn": "sign"}
# aten name -> ALU op (isa AluOp)
BINARY = {"atan2": "atan2", "arctan2": "atan2", "fmod": "fmod", "remainder": "remainder", "hypot": "hypot",
          "logaddexp": "logaddexp"}


def _float_input(rw: Rewriter, n, name: str) -> None:
    if not n.dtype.is_float:
        rw.fail(f"with result dtype {n.dtype.text} is not supported (the machine computes {name} in fp32)")


def _func(func: str):
    def lower(rw: Rewriter, n, a):
        _float_input(rw, n, func)
        return rw.unary(a["input"], func)
    return lower


def _rounding(func: str):
    def lower(rw: Rewriter, n, a):
        if not rw.arg_dtypes[0].is_floating_point:   # integers are their own floor, ceil, trunc and round
            return a["input"]
        return rw.unary(a["input"], func)
    return lower


for _name, _f in FUNCS.items():
    pm_legalize[f"aten.{_name}.default"] = _func(_f)
pm_legalize["aten.special_erfcx.default"] = _func("erfcx")
pm_legalize["aten.special_i0e.default"] = _func("i0e")
pm_legalize["aten.special_i1e.default"] = _func("i1e")
for _name, _f in ROUNDING.items():
    pm_legalize[f"aten.{_name}.default"] = _rounding(_f)
for _name, _f in SIGN.items():
    pm_legalize[f"aten.{_name}.default"] = _func(_f)


def _binary(op: str):
    def lower(rw: Rewriter, n, a):
        if op in ("remainder", "fmod") and n.dtype is DType.INT32 and isinstance(a["input"], ir.Node):
            return _integer_remainder(rw, a["input"], a["other"], op)
        _float_input(rw, n, op)
        return rw.arith(op, a["input"], a["other"])
    return lower


for _name, _op in BINARY.items():
    for _overload in ("default", "Tensor", "Scalar", "Scalar_Tensor"):
        pm_legalize[f"aten.{_name}.{_overload}"] = _binary(_op)


@rule("aten.round.decimals")
def _round_decimals(rw: Rewriter, n, a):
    """torch's kernel: rint(x * 10^d) / 10^d, or rint(x / 10^-d) * 10^-d for d < 0, with 10^|d| rounded to fp32."""
    x, d = a["input"], int(a["decimals"])
    _float_input(rw, n, "round")
    if d == 0:
        return rw.unary(x, "rint")
    if abs(d) > 38:
        rw.fail(f"with decimals={d} is not supported (10^{abs(d)} overflows fp32)")
    ten = float(np.float32(10.0 ** abs(d)))
    first, last = ("mul", "div") if d > 0 else ("div", "mul")
    return rw.scalar(rw.unary(rw.scalar(x, first, ten, dtype=FP32), "rint", FP32), last, ten)


def _integer_quotient(rw: Rewriter, x: ir.Node, y, mode: str):
    """floor or trunc of int32 x / y, in fp32, for |x| known below 2^24 and y a nonzero constant: fl(x / y) rounded
    so is the exact quotient's, as a quotient that is no integer lies at least 1/|y| from one and fl errs by less
    than |x / y| 2^-24 < 1/|y|. A divisor computed at run time is refused: torch raises on a zero, the machine
    cannot. Returns (x in fp32, the quotient, y as an fp32 constant, the bound on |x|)."""
    divisor = rw.torch_value(y, torch.int64) if isinstance(y, ir.Node) and y.op == "const" else y
    if isinstance(divisor, float) or isinstance(divisor, torch.Tensor) and divisor.dtype.is_floating_point:
        rw.fail("of an integer tensor by a float is not supported (cast to float32)")
    if isinstance(y, ir.Node) and y.op != "const":
        rw.fail("of integer tensors is not supported: torch raises on a zero divisor, which the machine cannot "
                "check (divide by a constant, or cast to float32)")
    divisor = torch.as_tensor(divisor, dtype=torch.int64)
    if (divisor == 0).any() or (divisor.abs() >= EXACT_FP32).any():
        rw.fail(f"by {divisor.tolist()} is not supported (a zero divisor raises in torch)")
    bound = _magnitude_bound(rw, x)
    if bound is None or bound >= EXACT_FP32:
        rw.fail("of an integer tensor is not supported here: the machine divides in fp32, exact for values below "
                "2^24, and no such bound on its values is known; cast it to float32")
    x32, y32 = rw.cast(x, FP32), rw.const(divisor.float(), FP32)
    return x32, rw.unary(rw.binary("div", x32, y32, FP32), mode, FP32), y32, bound


def _integer_div(rw: Rewriter, x: ir.Node, y, mode: str) -> ir.Node:
    _, quotient, _, bound = _integer_quotient(rw, x, y, mode)
    return _to_int(rw, quotient, DType.INT32, bound)


def _integer_remainder(rw: Rewriter, x: ir.Node, y, op: str) -> ir.Node:
    """int32 remainder (the divisor's sign, Python's) or fmod (the dividend's): x - y * floor(x / y) or
    trunc(x / y), every step exact in fp32 for the values _integer_quotient takes."""
    x32, quotient, y32, bound = _integer_quotient(rw, x, y, "floor" if op == "remainder" else "trunc")
    rest = rw.binary("sub", x32, rw.binary("mul", quotient, y32, FP32), FP32)
    return _to_int(rw, rest, DType.INT32, bound)


@rule("aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.floor_divide.default", "aten.floor_divide.Scalar")
def _div_mode(rw: Rewriter, n, a):
    """Division rounded as torch's fp32 kernels round it: trunc(a / b), or the floor division of its vectorized
    kernel (Python's: (a - fmod(a, b)) / b, one less where the remainder's sign differs from b's, the floor moved
    up where the quotient lies more than half above it, a signed zero, and a / b for b = 0 or where a / b
    overflows). int32 divides as _integer_div can prove exact; bf16 and fp16 kernels round each step to their dtype
    (measured), which fp32 steps do not reproduce, and are refused."""
    mode = "floor" if n.op.startswith("aten.floor_divide") else a["rounding_mode"]
    if mode is None:
        return rw.arith("div", a["input"], a["other"])
    if n.dtype is DType.INT32:
        return _integer_div(rw, a["input"], a["other"], mode)
    if n.dtype is not FP32:
        rw.fail(f"with rounding_mode={mode!r} in {n.dtype.text} is not supported: the machine reproduces torch's "
                "float32 kernel only (cast the operands to float32)")
    x, y = (v if isinstance(v, ir.Node) else rw.scalar_const(float(v), FP32)
            for v in rw.in_common_dtype(a["input"], a["other"]))
    quotient = rw.binary("div", x, y, FP32)
    if mode == "trunc":
        return keep_fp32_inside(rw.cast(rw.unary(quotient, "trunc", FP32), n.dtype), x, y)
    mod = rw.binary("fmod", x, y, FP32)
    overflow = rw.binary("and", rw.scalar(rw.unary(quotient, "abs", FP32), "eq", math.inf),
                         rw.scalar(rw.unary(x, "abs", FP32), "ne", math.inf))
    div = rw.binary("div", rw.where(overflow, x, rw.binary("sub", x, mod, FP32), FP32), y, FP32)
    signs_differ = rw.binary("xor", rw.scalar(y, "lt", 0), rw.scalar(mod, "lt", 0))
    div = rw.where(rw.binary("and", rw.scalar(mod, "ne", 0), signs_differ), rw.scalar(div, "sub", 1.0, dtype=FP32),
                   div, FP32)
    floor = rw.unary(div, "floor", FP32)
    floor = rw.where(rw.scalar(rw.binary("sub", div, floor, FP32), "gt", 0.5), rw.scalar(floor, "add", 1.0, dtype=FP32),
                     floor, FP32)
    floor = rw.where(rw.scalar(div, "eq", 0), rw.scalar(quotient, "mul", 0.0, dtype=FP32), floor, FP32)  # signed 0
    result = rw.where(rw.scalar(y, "eq", 0), quotient, floor, FP32)
    return keep_fp32_inside(rw.cast(result, n.dtype), x, y)


@rule("aten.frac.default")
def _frac(rw: Rewriter, n, a):
    """x - trunc(x) (torch's formula: NaN for infinite x)."""
    _float_input(rw, n, "frac")
    x = a["input"]
    return rw.binary("sub", x, rw.unary(x, "trunc", FP32))


@rule("aten.isnan.default")
def _isnan(rw: Rewriter, n, a):
    x = a["input"]
    if not rw.arg_dtypes[0].is_floating_point:
        return rw.filled(0, n.shape, n.dtype)
    return rw.binary("ne", x, x)


def _finite_max(rw: Rewriter) -> float:
    return float(torch.finfo(rw.arg_dtypes[0]).max)


@rule("aten.isinf.default")
def _isinf(rw: Rewriter, n, a):
    """|x| > the dtype's largest finite value."""
    if not rw.arg_dtypes[0].is_floating_point:
        return rw.filled(0, n.shape, n.dtype)
    return rw.scalar(rw.unary(a["input"], "abs", FP32), "gt", _finite_max(rw))


@rule("aten.isfinite.default")
def _isfinite(rw: Rewriter, n, a):
    """|x| <= the dtype's largest finite value (false for NaN)."""
    if not rw.arg_dtypes[0].is_floating_point:
        return rw.filled(1, n.shape, n.dtype)
    return rw.scalar(rw.unary(a["input"], "abs", FP32), "le", _finite_max(rw))


@rule("aten.nan_to_num.default")
def _nan_to_num(rw: Rewriter, n, a):
    """NaN -> nan, +Inf -> posinf, -Inf -> neginf (defaults: 0 and the dtype's extremes), by three selects."""
    x = a["input"]
    if not rw.arg_dtypes[0].is_floating_point:
        return x
    big = _finite_max(rw)
    nan = 0.0 if a["nan"] is None else a["nan"]
    posinf = big if a["posinf"] is None else a["posinf"]
    neginf = -big if a["neginf"] is None else a["neginf"]
    y = rw.where(rw.binary("ne", x, x), rw.filled(nan, x.shape, n.dtype), x)
    y = rw.where(rw.scalar(x, "gt", big), rw.filled(posinf, x.shape, n.dtype), y)
    return rw.where(rw.scalar(x, "lt", -big), rw.filled(neginf, x.shape, n.dtype), y)


@rule("aten.xlogy.Tensor", "aten.xlogy.Scalar_Self", "aten.xlogy.Scalar_Other")
def _xlogy(rw: Rewriter, n, a):
    """x log(y) as torch's kernel: NaN where y is NaN, else 0 where x == 0, else x * log(y)."""
    _float_input(rw, n, "xlogy")
    x, y = a["input"], a["other"]
    if not isinstance(y, ir.Node):
        y = rw.scalar_const(float(y), FP32)
    prod = rw.arith("mul", x, rw.unary(y, "log", FP32), FP32)
    zero = rw.filled(0.0, prod.shape, FP32)
    if isinstance(x, ir.Node):
        prod = rw.where(rw.scalar(x, "eq", 0), zero, prod, FP32)
    elif x == 0:
        prod = zero
    return rw.where(rw.binary("ne", y, y), y, prod)


@rule("aten.isposinf.default", "aten.isneginf.default")
def _is_signed_inf(rw: Rewriter, n, a):
    """x > the dtype's largest finite value (x < its negative)."""
    if not rw.arg_dtypes[0].is_floating_point:
        return rw.filled(0, n.shape, n.dtype)
    big = _finite_max(rw)
    return rw.scalar(a["input"], "gt", big) if n.op == "aten.isposinf.default" else rw.scalar(a["input"], "lt", -big)


@rule("aten.special_ndtr.default")
def _ndtr(rw: Rewriter, n, a):
    """The normal CDF as torch's kernel: erfc(-x sqrt(1/2)) / 2."""
    _float_input(rw, n, "ndtr")
    return rw.scalar(rw.unary(rw.scalar(a["input"], "mul", -math.sqrt(0.5), dtype=FP32), "erfc", FP32), "mul", 0.5)


def _unscaled_bessel(func: str):
    """I0 and I1 from the scaled functions: e^(a/2) (e^(a/2) f(x)), a = |x| (finite up to where I0 and I1 are, past
    e^a's overflow at 88.7; NaN at +-Inf as torch): f's error plus two exp errors and two roundings."""
    def lower(rw: Rewriter, n, a):
        _float_input(rw, n, func)
        x = a["input"]
        half = rw.unary(rw.scalar(rw.unary(x, "abs", FP32), "mul", 0.5, dtype=FP32), "exp", FP32)
        return rw.binary("mul", half, rw.binary("mul", half, rw.unary(x, func, FP32), FP32))
    return lower


for _name, _f in (("i0", "i0e"), ("special_modified_bessel_i0", "i0e"), ("special_i1", "i1e"),
                  ("special_modified_bessel_i1", "i1e")):
    pm_legalize[f"aten.{_name}.default"] = _unscaled_bessel(_f)


@rule("aten.polygamma.default")
def _polygamma(rw: Rewriter, n, a):
    """The 0th polygamma function is digamma; n >= 1 is trigamma or n! zeta(n + 1, x) (legalize_zeta)."""
    if a["n"] != 0:
        return legalize_zeta.polygamma(rw, n, a["input"], a["n"])
    _float_input(rw, n, "digamma")
    return rw.unary(a["input"], "digamma")


@rule("aten.logaddexp2.default")
def _logaddexp2(rw: Rewriter, n, a):
    """log2(2^a + 2^b) = logaddexp(a ln 2, b ln 2) / ln 2 (the scalings add 1.5 ulp to logaddexp's error)."""
    _float_input(rw, n, "logaddexp2")
    x, y = (rw.arith("mul", v, math.log(2), FP32) for v in (a["input"], a["other"]))
    return rw.scalar(rw.binary("logaddexp", x, y, FP32), "div", math.log(2))


@rule("aten.angle.default")
def _angle(rw: Rewriter, n, a):
    """The angle of a real number as torch gives it: pi below 0, else 0; NaN stays NaN."""
    _float_input(rw, n, "angle")
    x = a["input"]
    turn = rw.where(rw.scalar(x, "lt", 0), rw.filled(math.pi, x.shape, FP32), rw.filled(0.0, x.shape, FP32), FP32)
    return rw.where(rw.binary("ne", x, x), x, turn) if rw.arg_dtypes[0].is_floating_point else rw.cast(turn, n.dtype)



@rule("aten.special_log_ndtr.default")
def _log_ndtr(rw: Rewriter, n, a):
    """log of the normal CDF as torch's kernel, with t = x sqrt(1/2): log(erfcx(-t) / 2) - t^2 below x = -1, else
    log1p(-erfc(t) / 2), log1p(y) as log(u) - ((u - 1) - y) / u with u = 1 + y (u - 1 exact for y >= -1/2; below,
    log(u) alone)."""
    _float_input(rw, n, "log_ndtr")
    x = a["input"]
    t = rw.scalar(x, "mul", math.sqrt(0.5), dtype=FP32)
    left = rw.binary("sub", rw.unary(rw.scalar(rw.unary(rw.unary(t, "neg", FP32), "erfcx", FP32), "mul", 0.5,
                                               dtype=FP32), "log", FP32), rw.unary(t, "square", FP32), FP32)
    y = rw.scalar(rw.unary(t, "erfc", FP32), "mul", -0.5, dtype=FP32)
    u = rw.scalar(y, "add", 1, dtype=FP32)
    error = rw.binary("div", rw.binary("sub", rw.scalar(u, "sub", 1, dtype=FP32), y, FP32), u, FP32)
    log_u = rw.unary(u, "log", FP32)
    right = rw.where(rw.scalar(y, "lt", -0.5), log_u, rw.binary("sub", log_u, error, FP32), FP32)
    return rw.where(rw.scalar(x, "lt", -1), left, right)
