"""The op table of the fuzzer: for every op kind, how it reads in forward's source, its parameters, and its
float64 reference with the local rounding bound of every step (for reference.py's perturbed lanes).

An op kind is one torch call (a few are two, such as `x @ x.transpose(-1, -2)`), spelled in one of several
ways (attr `form`), since trnc sees `x * x`, `x ** 2` and `torch.square(x)` differently. `render` writes the
call from the argument and parameter names; the same text runs as forward in eager, on meta tensors (to get
shapes and dtypes) and on float64 lanes (`ev` in the references below), so there is one copy of the meaning.

The reference of an op returns its value in one lane: `lane.store(y, dtype, ulps)` for a value that is rounded
once (plus `ulps` fp32 ulps of function error), `lane.acc` for a sum of n terms (error up to n * u_fp32 times
the sum of the terms' magnitudes: both eager and trnc accumulate in fp32), and decompositions for the fused ops
(softmax, norms, attention), step by step as both implementations compute them. Function errors are trnc's
documented maxima (runtime/fp32math.py: exp and log 1 ulp, tanh and sigmoid 2.5, silu and gelu 3, pow 4;
fp32trig.py, fp32special.py and fp32gamma.py for sin ... log10, hypot, lgamma and digamma), rounded up; eager's are
smaller, but for gelu's negative tail (see _gelu) and digamma (eager's float digamma is off by up to 100 ulps, and far
more at its zero: a program where that exceeds the bound is redrawn).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .program import Param

F32 = torch.float32


@dataclass(frozen=True)
class OpDef:
    render: Callable      # (args: list[str], params: list[str], attrs: dict) -> str
    reference: Callable   # (lane, ev, args, params, attrs, metas, out: Meta) -> float64 tensor
    params: Callable = lambda metas, a: []   # (metas of the args, attrs) -> list[Param]
    compare: bool = False  # a comparison: reference.py rejects near-ties of its operands
    nats: Callable | None = None   # (lane, args, params, attrs, metas) -> what decides the op in nats: the logits
                                   # of a softmax, the log of a layer norm's scale; reference.py keeps their
                                   # rounding errors below 1 / SAFETY nats
    magnified: Callable = lambda a: False   # (attrs) -> reference.py evaluates its noisy lanes at SAFETY times their
                                            # operands' deviations: an op with a flat piece (relu, clamp, maximum,
                                            # amax, ...) or exp, where SAFETY times its own deviation falls short
    order: Callable = lambda a, rank: None  # (attrs, rank of the first arg) -> the Order that decides its result:
                                            # reference.py rejects near-ties there (argmax, sort's indices, top-k)


@dataclass(frozen=True)
class Order:
    """The positions along `dim` of an op's first argument (all of them, flattened, for None) whose order by value
    decides its result: the first `k` (None: all), ranked descending or ascending; `ties_defined`: whether torch
    defines the result on an exact tie there (argmax's first index, a stable sort) or leaves it to the
    implementation (top-k)."""

    dim: int | None
    k: int | None
    descending: bool
    ties_defined: bool


def _spelled(spellings):
    def render(x, p, a):
        return spellings[a.get("form", 0) % len(spellings)].format(*x, *p, **a)
    return render


def _pointwise(ulps: float = 0.0):
    def reference(lane, ev, x, p, a, metas, out):
        return lane.store(ev(x, p), out.dtype, ulps)
    return reference


def _accumulated(terms: Callable, operands: bool = False):
    """A sum of `terms(metas, attrs)` terms: sum, mean, and (`operands`: in the matmul operand dtype) matmul and
    linear."""
    def reference(lane, ev, x, p, a, metas, out):
        if operands:
            x = [lane.operand(t, m.dtype) for t, m in zip(x, metas)]
            p = [lane.operand(t, t.dtype) for t in p]
        y = ev(x, p)
        if not lane.perturbed:
            return y
        return lane.acc(y, ev([t.abs() for t in x], [t.abs() for t in p]), terms(metas, a), out.dtype)
    return reference


OPS: dict[str, OpDef] = {}

# -- elementwise --------------------------------------------------------------------------------------------
UNARY = {   # name: (fp32 ulps of error, spellings)
    "relu": (0, ("F.relu({0})", "torch.relu({0})", "{0}.relu()")),
    "silu": (3, ("F.silu({0})",)),
    "sigmoid": (3, ("torch.sigmoid({0})", "{0}.sigmoid()")),
    "tanh": (3, ("torch.tanh({0})", "{0}.tanh()")),
    "exp": (1, ("torch.exp({0})", "{0}.exp()")),
    "log": (1, ("torch.log({0})", "{0}.log()")),
    "sqrt": (0, ("torch.sqrt({0})", "{0} ** 0.5")),
    "rsqrt": (1, ("torch.rsqrt({0})", "{0} ** -0.5")),
    "reciprocal": (0, ("torch.reciprocal({0})", "1 / {0}", "{0} ** -1")),
    "square": (0, ("torch.square({0})", "{0} * {0}", "{0} ** 2", "torch.pow({0}, 2)")),
    "abs": (0, ("torch.abs({0})", "{0}.abs()")),
    "neg": (0, ("-{0}", "torch.neg({0})")),
    # runtime/fp32trig.py and fp32special.py (their measured maxima, rounded up)
    "sin": (1, ("torch.sin({0})", "{0}.sin()")),
    "cos": (1, ("torch.cos({0})", "{0}.cos()")),
    "atan": (1, ("torch.atan({0})", "torch.arctan({0})")),
    "asin": (1, ("torch.asin({0})", "{0}.arcsin()")),
    "acos": (1, ("torch.acos({0})",)),
    "sinh": (2, ("torch.sinh({0})",)),
    "cosh": (2, ("torch.cosh({0})",)),
    "asinh": (2, ("torch.asinh({0})",)),
    "atanh": (2, ("torch.atanh({0})",)),
    "erf": (2, ("torch.erf({0})", "torch.special.erf({0})")),
    "erfc": (3, ("torch.erfc({0})", "torch.special.erfc({0})")),
    "exp2": (1, ("torch.exp2({0})", "2 ** {0}")),
    "log2": (1, ("torch.log2({0})", "{0}.log2()")),
    "log10": (1, ("torch.log10({0})",)),
    "i0e": (3, ("torch.special.i0e({0})",)),
    "i1e": (4, ("torch.special.i1e({0})",)),
    "i0": (7, ("torch.i0({0})", "torch.special.i0({0})", "torch.special.modified_bessel_i0({0})")),
    "i1": (7, ("torch.special.i1({0})", "torch.special.modified_bessel_i1({0})")),
    # runtime/fp32gamma.py for x > 0 (proposals.py draws positive operands: below 0 the error is bounded by the
    # reflection's larger term, not the result, near the negative zeros)
    "lgamma": (2, ("torch.lgamma({0})", "{0}.lgamma()", "torch.special.gammaln({0})")),
    "digamma": (2, ("torch.digamma({0})", "torch.special.psi({0})", "torch.polygamma(0, {0})")),
    # passes/graph/legalize_bessel.py and legalize_zeta.py for x > 0 (their measured maxima, rounded up; eager's
    # float trigamma is 4.3 ulps off too)
    "bessel_k0": (11, ("torch.special.modified_bessel_k0({0})",)),
    "bessel_k1": (7, ("torch.special.modified_bessel_k1({0})",)),
    "bessel_k0e": (11, ("torch.special.scaled_modified_bessel_k0({0})",)),
    "bessel_k1e": (6, ("torch.special.scaled_modified_bessel_k1({0})",)),
    "trigamma": (5, ("torch.polygamma(1, {0})", "torch.special.polygamma(1, {0})")),
    "spherical_j0": (2, ("torch.special.spherical_bessel_j0({0})",)),
    # random ops whose result the draws do not decide (u in (0, 1), p = 1, a range of one integer): they test
    # the random kernels, the per-call seed and the dtypes of the draws against eager, value for value
    "random": (0, ("{0} + torch.rand_like({0}).floor()", "torch.bernoulli(torch.ones_like({0})) * {0}",
                   "{0} - torch.randint_like({0}, 0, 1)")),
}
# a flat piece, and growths (or decays) that outrun a linear bound (reference.py)
MAGNIFIED_UNARY = ("relu", "exp", "exp2", "sinh", "cosh", "erfc", "i0", "i1", "bessel_k0", "bessel_k1")
for _name, (_ulps, _spellings) in UNARY.items():
    _magnified = _name in MAGNIFIED_UNARY
    OPS[_name] = OpDef(_spelled(_spellings), _pointwise(_ulps), magnified=lambda a, m=_magnified: m)


def _gelu(lane, ev, x, p, a, metas, out):
    """x Phi(x), 3 ulps in trnc; eager computes 0.5 x (1 + erf(x / sqrt 2)), whose 1 + erf cancels for x << 0:
    an absolute error of about |x| 2^-24 (measured: up to 400 ulps of eager's result near x = -3)."""
    return lane.store(ev(x, p), out.dtype, 3, absolute=x[0].abs() * 2.0 ** -24)


def _gelu_tanh(lane, ev, x, p, a, metas, out):
    """x sigmoid(s), s = 2 sqrt(2/pi) (x + 0.044715 x^3): trnc rounds s in fp32, which costs |s| * 2^-22
    relative (runtime/fp32math.py), so s is a step of its own; eager's 0.5 x (1 + tanh(s / 2)) cancels as the
    erf form does."""
    (x,) = x
    s = lane.store(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3), F32, 2)
    return lane.store(x * torch.sigmoid(s), out.dtype, 2, absolute=x.abs() * 2.0 ** -24)


OPS["gelu"] = OpDef(_spelled(("F.gelu({0})", "F.gelu({0}, approximate='none')")), _gelu)
OPS["gelu_tanh"] = OpDef(_spelled(("F.gelu({0}, approximate='tanh')",)), _gelu_tanh)
OPS["pow_scalar"] = OpDef(_spelled(("{0} ** {e}", "torch.pow({0}, {e})")), _pointwise(4))
OPS["scalar"] = OpDef(lambda x, p, a: (f"{a['c']!r} {a['fn']} {x[0]}" if a["flip"] else f"{x[0]} {a['fn']} {a['c']!r}"),
                      _pointwise())


def _clamp(x, p, a):
    lo, hi, form = a["lo"], a["hi"], a.get("form", 0) % 2
    if lo is not None and hi is not None:
        return (f"torch.clamp({x[0]}, min={lo!r}, max={hi!r})", f"F.hardtanh({x[0]}, {lo!r}, {hi!r})")[form]
    if lo is not None:
        return (f"{x[0]}.clamp(min={lo!r})", f"torch.clamp_min({x[0]}, {lo!r})")[form]
    return (f"{x[0]}.clamp(max={hi!r})", f"torch.clamp_max({x[0]}, {hi!r})")[form]


OPS["clamp"] = OpDef(_clamp, _pointwise(), magnified=lambda a: True)

BINARY = {   # name: (ulps, spellings)
    "add": (0, ("{0} + {1}", "torch.add({0}, {1})")),
    "sub": (0, ("{0} - {1}", "torch.sub({0}, {1})")),
    "mul": (0, ("{0} * {1}", "torch.mul({0}, {1})")),
    "div": (0, ("{0} / {1}", "torch.div({0}, {1})")),
    "maximum": (0, ("torch.maximum({0}, {1})", "{0}.maximum({1})")),
    "minimum": (0, ("torch.minimum({0}, {1})", "{0}.minimum({1})")),
    "pow": (4, ("torch.pow({0}, {1})", "{0} ** {1}")),
    "hypot": (2, ("torch.hypot({0}, {1})",)),
}


def _binary_render(x, p, a):
    operands = list(x) + list(p)
    if a["flip"]:
        operands.reverse()
    spellings = BINARY[a["fn"]][1]
    return spellings[a.get("form", 0) % len(spellings)].format(*operands)


def _binary_params(metas, a):
    """The `param` form's constant operand: the trailing dims of the tensor operand kept where `keep` says, 1
    elsewhere (broadcast); a denominator or a base of pow is positive."""
    if a["form_b"] != "param":
        return []
    shape = metas[0].shape
    keep = a["keep"][-len(shape):] if shape else ()
    pshape = tuple(s if k else 1 for s, k in zip(shape[len(shape) - len(keep):], keep))
    second = "second" if not a["flip"] else "first"
    positive = (a["fn"] == "div" and second == "second") or (a["fn"] == "pow" and second == "first")
    kind = "positive" if positive else a.get("pkind", "normal")
    return [Param(pshape, str(metas[0].dtype).removeprefix("torch."), kind, 0.5 if a["fn"] == "pow" else 1.0)]


def _binary_reference(lane, ev, x, p, a, metas, out):
    return lane.store(ev(x, p), out.dtype, BINARY[a["fn"]][0])


OPS["binary"] = OpDef(_binary_render, _binary_reference, _binary_params,
                     magnified=lambda a: a["fn"] in ("maximum", "minimum"))

COMPARE = {
    "eq": ("{0} == {1}", "torch.eq({0}, {1})"), "ne": ("{0} != {1}", "torch.ne({0}, {1})"),
    "lt": ("{0} < {1}", "torch.lt({0}, {1})", "{0}.lt({1})"), "le": ("{0} <= {1}", "torch.le({0}, {1})"),
    "gt": ("{0} > {1}", "torch.gt({0}, {1})"), "ge": ("{0} >= {1}", "torch.ge({0}, {1})", "{0}.ge({1})"),
}


def _compare_render(x, p, a):
    spellings = COMPARE[a["fn"]]
    second = x[1] if len(x) > 1 else repr(a["c"])
    return spellings[a.get("form", 0) % len(spellings)].format(x[0], second)


OPS["compare"] = OpDef(_compare_render, lambda lane, ev, x, p, a, metas, out: ev(x, p), compare=True)

LOGICAL = {"and": ("{0} & {1}", "torch.logical_and({0}, {1})"), "or": ("{0} | {1}", "torch.logical_or({0}, {1})"),
           "xor": ("{0} ^ {1}", "torch.logical_xor({0}, {1})"), "not": ("~{0}", "torch.logical_not({0})")}
OPS["logical"] = OpDef(lambda x, p, a: LOGICAL[a["fn"]][a.get("form", 0) % 2].format(*x),
                       lambda lane, ev, x, p, a, metas, out: ev(x, p))


def _where_render(x, p, a):
    if len(x) == 3:
        return f"torch.where({x[0]}, {x[1]}, {x[2]})"
    if a.get("form", 0) % 2:
        return f"{x[1]}.masked_fill({x[0]}, {a['s']!r})"
    return f"torch.where({x[0]}, {x[1]}, {a['s']!r})"


OPS["where"] = OpDef(_where_render, _pointwise())

# -- reductions ---------------------------------------------------------------------------------------------


def _reduced(metas, a) -> int:
    shape = metas[0].shape
    return math.prod(shape[d] for d in _axes(a["dims"], len(shape))) if shape else 1


def _reduce_render(x, p, a):
    fn, dims, keep, form = a["fn"], a["dims"], a["keepdim"], a.get("form", 0) % 2
    if fn in ("max", "min"):
        if dims is None:
            return f"{x[0]}.{fn}()"
        return (f"{x[0]}.{fn}(dim={dims}, keepdim={keep}).values", f"torch.{fn}({x[0]}, {dims}, {keep})[0]")[form]
    if dims is None:
        return (f"{x[0]}.{fn}()", f"torch.{fn}({x[0]})")[form]
    return (f"{x[0]}.{fn}(dim={dims!r}, keepdim={keep})", f"torch.{fn}({x[0]}, {dims!r}, keepdim={keep})")[form]


def _reduce_reference(lane, ev, x, p, a, metas, out):
    if a["fn"] in ("sum", "mean"):
        return _accumulated(_reduced)(lane, ev, x, p, a, metas, out)
    return lane.store(ev(x, p), out.dtype)


OPS["reduce"] = OpDef(_reduce_render, _reduce_reference, magnified=lambda a: a["fn"] in ("amax", "amin", "max", "min"))


def _axes(dims, rank: int) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(rank))
    return tuple(d % rank for d in (dims if isinstance(dims, tuple) else (dims,)))


def _var_render(x, p, a):
    fn, dims, keep, c = a["fn"], a["dims"], a["keepdim"], a["correction"]
    if dims is None:
        return f"torch.{fn}({x[0]}, correction={c})"
    return (f"torch.{fn}({x[0]}, dim={dims!r}, keepdim={keep}, correction={c})",
            f"{x[0]}.{fn}({dims!r}, correction={c}, keepdim={keep})")[a.get("form", 0) % 2]


def _var_reference(lane, ev, x, p, a, metas, out):
    """Two passes, as trnc lowers var/std (passes/graph/legalize_rules.py) and eager computes it: the mean, the
    centered squares, their sum; the intermediates are stored as lane.internal (bf16 under auto_cast="all")."""
    (x,) = x
    axes = _axes(a["dims"], x.dim()) if x.dim() else ()
    n = _reduced(metas, a)
    mean = lane.acc(x.mean(axes, keepdim=True), x.abs().mean(axes, keepdim=True), n, lane.internal)
    centered = lane.store(x - mean, lane.internal)
    squares = lane.store(centered * centered, lane.internal)
    count = max(n - a["correction"], 0)
    total = squares.sum(axes, keepdim=a["keepdim"] and a["dims"] is not None) / count
    var = lane.acc(total, total, n, out.dtype if a["fn"] == "var" else lane.internal)
    return var if a["fn"] == "var" else lane.store(var.sqrt(), out.dtype)


OPS["var"] = OpDef(_var_render, _var_reference)
OPS["count"] = OpDef(lambda x, p, a: f"{x[0]}.sum()" if a["dims"] is None else f"{x[0]}.sum(dim={a['dims']!r})",
                     lambda lane, ev, x, p, a, metas, out: ev(x, p))

# -- orderings: arg-reductions, sort, top-k, a gather by an ordering's indices, cumsum -------------------------
ARG = {"argmax": ("torch.argmax({0}, dim={dim}, keepdim={keep})", "{0}.argmax({dim}, {keep})",
                  "torch.max({0}, {dim}, {keep})[1]", "{0}.max(dim={dim}, keepdim={keep}).indices"),
       "argmin": ("torch.argmin({0}, dim={dim}, keepdim={keep})", "{0}.argmin({dim}, {keep})",
                  "torch.min({0}, {dim}, {keep})[1]", "{0}.min(dim={dim}, keepdim={keep}).indices")}


def _arg_render(x, p, a):
    if a["dim"] is None:
        return f"torch.{a['fn']}({x[0]})"
    return ARG[a["fn"]][a.get("form", 0) % 4].format(x[0], dim=a["dim"], keep=a["keepdim"])


def _exact(lane, ev, x, p, a, metas, out):
    return ev(x, p)


OPS["arg"] = OpDef(_arg_render, _exact, order=lambda a, rank: Order(a["dim"], 1, a["fn"] == "argmax", True))


def _sort_render(x, p, a):
    d, desc, pick = a["dim"], a["descending"], ("values", "indices").index(a["out"])
    if a["out"] == "indices" and a.get("form", 0) % 2:
        return f"{x[0]}.argsort(dim={d}, descending={desc}, stable=True)"
    return f"torch.sort({x[0]}, dim={d}, descending={desc}, stable=True)[{pick}]"


def _topk_render(x, p, a):
    pick = ("values", "indices").index(a["out"])
    return (f"torch.topk({x[0]}, {a['k']}, dim={a['dim']}, largest={a['largest']})[{pick}]",
            f"{x[0]}.topk({a['k']}, {a['dim']}, {a['largest']}).{a['out']}")[a.get("form", 0) % 2]


def _picked(lane, ev, x, p, a, metas, out):
    """Values an ordering picks: exact copies of the operand's elements, continuous in them like max."""
    y = ev(x, p)
    return lane.store(y, out.dtype) if out.is_float else y


OPS["sort"] = OpDef(_sort_render, _picked, magnified=lambda a: a["out"] == "values",
                    order=lambda a, rank: Order(a["dim"], None, a["descending"], True) if a["out"] == "indices"
                    else None)
OPS["topk"] = OpDef(_topk_render, _picked, magnified=lambda a: a["out"] == "values",
                    order=lambda a, rank: Order(a["dim"], a["k"], a["largest"], False) if a["out"] == "indices"
                    else None)
OPS["gather"] = OpDef(lambda x, p, a: (f"{x[0]}.gather({a['dim']}, {x[1]})",
                                       f"torch.take_along_dim({x[0]}, {x[1]}, dim={a['dim']})")[a.get("form", 0) % 2],
                      _picked, magnified=lambda a: True)
OPS["cumsum"] = OpDef(lambda x, p, a: (f"torch.cumsum({x[0]}, dim={a['dim']})", f"{x[0]}.cumsum({a['dim']})")[
                          a.get("form", 0) % 2],
                      _accumulated(lambda metas, a: metas[0].shape[a["dim"]] if metas[0].shape else 1))

# -- rows: softmax and norms --------------------------------------------------------------------------------
SOFTMAX = {"softmax": ("torch.softmax({0}, dim={dim})", "F.softmax({0}, dim={dim})", "{0}.softmax({dim})"),
           "log_softmax": ("torch.log_softmax({0}, dim={dim})", "F.log_softmax({0}, dim={dim})",
                           "{0}.log_softmax({dim})")}


def _softmax_reference(lane, ev, x, p, a, metas, out):
    """max, x - max, exp, the sum, then e / sum or (x - max) - log(sum): one fused trnc kernel in fp32."""
    (x,) = x
    dim = a["dim"] if x.dim() else None
    if dim is None:
        x = x.reshape(1)
        dim = 0
    shifted = lane.store(x - x.amax(dim, keepdim=True), F32)
    e = lane.store(shifted.exp(), F32, 1)
    total = lane.acc(e.sum(dim, keepdim=True), e.sum(dim, keepdim=True), x.shape[dim], F32)
    if a["fn"] == "softmax":
        y = lane.store(e / total, out.dtype, 0.5)
    else:
        y = lane.store(shifted - lane.store(total.log(), F32, 1), out.dtype, 0.5)
    return y.reshape(out.shape)


OPS["softmax"] = OpDef(lambda x, p, a: SOFTMAX[a["fn"]][a.get("form", 0) % 3].format(*x, dim=a["dim"]),
                       _softmax_reference, nats=lambda lane, x, p, a, metas: x[0])


def _norm_params(metas, a):
    shape, dtype = metas[0].shape[-a["k"]:], str(metas[0].dtype).removeprefix("torch.")
    affine = a["affine"]
    return [Param(shape, dtype, "normal", 1.0) for _ in range(("none", "weight", "both").index(affine))]


def _layer_norm_render(x, p, a):
    weight, bias = (p + [None, None])[:2]
    return f"F.layer_norm({x[0]}, {x[0]}.shape[-{a['k']}:], {weight}, {bias}, eps={a['eps']!r})"


def _layer_norm_reference(lane, ev, x, p, a, metas, out):
    """mean, centered, mean of squares, rsqrt(var + eps), scaled: trnc's one layer_norm kernel, in fp32."""
    (x,) = x
    axes = tuple(range(x.dim() - a["k"], x.dim()))
    n = math.prod(x.shape[d] for d in axes)
    mean = lane.acc(x.mean(axes, keepdim=True), x.abs().mean(axes, keepdim=True), n, F32)
    centered = lane.store(x - mean, F32)
    squares = centered * centered
    var = lane.acc(squares.mean(axes, keepdim=True), squares.mean(axes, keepdim=True), n + 1, F32)
    y = lane.store(centered * lane.store((var + a["eps"]).rsqrt(), F32, 1), F32)
    if len(p) >= 1:
        y = lane.store(y * lane.operand(p[0], F32), F32)
    if len(p) == 2:
        y = lane.store(y + lane.operand(p[1], F32), F32)
    return lane.store(y, out.dtype)


def _layer_norm_log_scale(lane, x, p, a, metas):
    """log sqrt(var + eps) per row: where rounding moves it by a good fraction, the row's spread is of the size of
    its roundings and rounding decides the normalized row's direction."""
    axes = tuple(range(x[0].dim() - a["k"], x[0].dim()))
    return 0.5 * torch.log(x[0].var(axes, correction=0) + a["eps"])


OPS["layer_norm"] = OpDef(_layer_norm_render, _layer_norm_reference, _norm_params, nats=_layer_norm_log_scale)


def _rms_norm_render(x, p, a):
    weight = f", {p[0]}" if p else ""
    return f"F.rms_norm({x[0]}, {x[0]}.shape[-{a['k']}:]{weight}, eps={a['eps']!r})"


def _rms_norm_reference(lane, ev, x, p, a, metas, out):
    """torch decomposes rms_norm before trnc sees it (in fp32 for a low-precision input, then cast back, then
    the weight): its steps are separate trnc nodes, stored as lane.internal."""
    (x,) = x
    axes = tuple(range(x.dim() - a["k"], x.dim()))
    n = math.prod(x.shape[d] for d in axes)
    squares = x * x
    mean = lane.acc(squares.mean(axes, keepdim=True), squares.mean(axes, keepdim=True), n + 1, lane.internal)
    y = lane.store(x * lane.store((mean + a["eps"]).rsqrt(), lane.internal, 1), out.dtype)
    return lane.store(y * lane.operand(p[0], out.dtype), out.dtype) if p else y


OPS["rms_norm"] = OpDef(_rms_norm_render, _rms_norm_reference,
                        lambda metas, a: _norm_params(metas, dict(a, affine="weight" if a["weight"] else "none")))

# -- contractions --------------------------------------------------------------------------------------------


def _contraction_render(call):
    def render(x, p, a):
        if a["form_b"] == "self":
            return call.format(x[0], f"{x[0]}.transpose(-1, -2)")
        if a.get("left"):
            return call.format(p[0], x[0])
        return call.format(x[0], (x + p)[1])
    return render


def _matmul_params(metas, a):
    """The `param` form's constant: [..., K, N] on the right of x, or [..., N, M] on its left (`left`), with the
    last `batch` batch dims of x."""
    if a["form_b"] != "param":
        return []
    shape = metas[0].shape
    batch = shape[:-2][len(shape[:-2]) - a["batch"]:] if a["batch"] and len(shape) > 2 else ()
    k = shape[-2] if a.get("left") else shape[-1]
    pshape = (*batch, a["n"], k) if a.get("left") else (*batch, k, a["n"])
    return [Param(pshape, str(metas[0].dtype).removeprefix("torch."), "normal", 1 / math.sqrt(k))]


def _inner(metas, a) -> int:
    return metas[0].shape[-2] if a.get("left") else metas[0].shape[-1]


for _name, _calls in (("matmul", ("{0} @ {1}", "torch.matmul({0}, {1})")), ("bmm", ("torch.bmm({0}, {1})",))):
    OPS[_name] = OpDef(lambda x, p, a, calls=_calls: _contraction_render(calls[a.get("form", 0) % len(calls)])(x, p, a),
                       _accumulated(_inner, operands=True), _matmul_params)


def _linear_params(metas, a):
    k, dtype = metas[0].shape[-1], str(metas[0].dtype).removeprefix("torch.")
    weight = Param((a["n"], k), dtype, "normal", 1 / math.sqrt(k))
    return [weight, Param((a["n"],), dtype, "normal", 0.5)] if a["bias"] else [weight]


OPS["linear"] = OpDef(lambda x, p, a: f"F.linear({x[0]}, {', '.join(p)})",
                      _accumulated(lambda metas, a: metas[0].shape[-1] + a["bias"], operands=True), _linear_params)


def _sdpa_operands(x, p, a):
    """(q, k, v, mask) texts or tensors, by the forms of k/v and of the mask."""
    q, rest, params = x[0], list(x[1:]), list(p)
    if a["kv"] == "self":
        k = v = q
    elif a["kv"] == "values":
        k, v = rest.pop(0), rest.pop(0)
    else:
        k, v = params.pop(0), params.pop(0)
    mask = rest.pop(0) if a["mask"] == "arg" else params.pop(0) if a["mask"] == "param" else None
    return q, k, v, mask


def _sdpa_render(x, p, a):
    q, k, v, mask = _sdpa_operands(x, p, a)
    extra = (f", attn_mask={mask}" if mask is not None else "") + (", is_causal=True" if a["causal"] else "")
    extra += f", scale={a['scale']!r}" if a["scale"] is not None else ""
    return f"F.scaled_dot_product_attention({q}, {k}, {v}{extra})"


def _sdpa_params(metas, a):
    q = metas[0]
    dtype = str(q.dtype).removeprefix("torch.")
    params = []
    if a["kv"] == "param":
        params += [Param((*q.shape[:-2], a["sk"], q.shape[-1]), dtype), Param((*q.shape[:-2], a["sk"], a["dv"]), dtype)]
    if a["mask"] == "param":
        sk = a["sk"] if a["kv"] == "param" else metas[1].shape[-2] if a["kv"] == "values" else q.shape[-2]
        params.append(Param((q.shape[-2], sk), dtype))
    return params


def _sdpa_logits(lane, x, p, a, metas):
    """scale q k^T (+ a float mask), from the operands as the machine feeds them."""
    q, k, _, mask = _sdpa_operands(x, p, a)
    q, k = lane.operand(q, metas[0].dtype), lane.operand(k, metas[0].dtype)
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-1, -2) * scale
    return scores + mask if mask is not None and mask.is_floating_point() else scores


def _sdpa_reference(lane, ev, x, p, a, metas, out):
    """scores (fp32 accumulation), scale, mask, softmax in fp32, P in the operand dtype, P v, / sum: the steps of
    trnc's attention kernel (passes/tile/kernels/attention.py). Where P is narrower than fp32, the error bound
    of its rounding is added whole to each output element: an implementation may round P after the division
    instead (a decomposed softmax does; so may eager), a different value from the lanes' own P (seed
    111001791: bf16 attention over three keys)."""
    q, k, v, mask = _sdpa_operands(x, p, a)
    low = metas[0].dtype
    q, k, v = (lane.operand(t, low) for t in (q, k, v))
    scores = lane.acc(q @ k.transpose(-1, -2), q.abs() @ k.abs().transpose(-1, -2), q.shape[-1], F32)
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    scores = lane.store(scores * scale, F32)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, -math.inf)
    elif mask is not None:
        scores = lane.store(scores + mask, F32)
    if a["causal"]:
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, -math.inf)
    e = lane.store((scores - scores.amax(-1, keepdim=True)).exp(), F32, 1)
    total = lane.acc(e.sum(-1, keepdim=True), e.sum(-1, keepdim=True), e.shape[-1], F32)
    rounding = lane.operand_bound(e, low) @ v.abs() / total   # of P in the operand dtype, normalized or not
    e = lane.operand(e, low)
    o = lane.acc(e @ v, e @ v.abs(), e.shape[-1], F32)
    return lane.store(o / total, out.dtype, 0.5, absolute=rounding)


OPS["sdpa"] = OpDef(_sdpa_render, _sdpa_reference, _sdpa_params, nats=_sdpa_logits)
OPS["embedding"] = OpDef(
    lambda x, p, a: (f"F.embedding({x[0]}, {(x + p)[1]})", f"{(x + p)[1]}[{x[0]}]")[a.get("form", 0) % 2],
    _pointwise(), lambda metas, a: [Param((a["rows"], a["d"]), a["dtype"])] if a["table"] == "param" else [])

# -- dtypes ------------------------------------------------------------------------------------------------
CASTS = ("{0}.to(torch.{dtype})", "{0}.to(dtype=torch.{dtype})", "{0}.{method}()")
METHODS = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}
OPS["cast"] = OpDef(lambda x, p, a: CASTS[a.get("form", 0) % 3].format(*x, dtype=a["dtype"],
                                                                        method=METHODS[a["dtype"]]),
                    lambda lane, ev, x, p, a, metas, out: lane.cast(x[0], out.dtype))

# -- movement ----------------------------------------------------------------------------------------------


def _index_render(x, p, a):
    """x[..., start:stop:step] or x[..., index] at dim (a negative dim counts from the end, after an ellipsis)."""
    dim = a["dim"]
    if a.get("index") is not None:
        item = str(a["index"])
    else:
        item = ":".join("" if v is None else str(v) for v in (a["start"], a["stop"], a["step"]))
    if dim >= 0:
        return f"{x[0]}[{':, ' * dim}{item}]"
    return f"{x[0]}[..., {item}{', :' * (-dim - 1)}]"


MOVEMENT = {
    "reshape": lambda x, p, a: ("{0}.reshape({s})", "{0}.view({s})", "torch.reshape({0}, {s})")[
        a.get("form", 0) % 3].format(x[0], s=a["shape"]),
    "flatten": lambda x, p, a: (f"{x[0]}.flatten({a['start']}, {a['end']})",
                                f"torch.flatten({x[0]}, {a['start']}, {a['end']})")[a.get("form", 0) % 2],
    "unflatten": lambda x, p, a: f"{x[0]}.unflatten({a['dim']}, {a['sizes']!r})",
    "permute": lambda x, p, a: (f"{x[0]}.permute{a['dims']!r}" if len(a["dims"]) > 1 else
                                f"{x[0]}.permute({a['dims']!r})"),
    "transpose": lambda x, p, a: (f"{x[0]}.transpose({a['d0']}, {a['d1']})",
                                  f"torch.transpose({x[0]}, {a['d0']}, {a['d1']})")[a.get("form", 0) % 2],
    "mT": lambda x, p, a: f"{x[0]}.mT",
    "slice": _index_render,
    "select": lambda x, p, a: (_index_render(x, p, a), f"{x[0]}.select({a['dim']}, {a['index']})")[a.get("form", 0) % 2],
    "narrow": lambda x, p, a: f"{x[0]}.narrow({a['dim']}, {a['start']}, {a['length']})",
    "cat": lambda x, p, a: (f"torch.cat([{', '.join(x)}], dim={a['dim']})", f"torch.cat(({', '.join(x)},), {a['dim']})",
                            f"torch.concat([{', '.join(x)}], dim={a['dim']})")[a.get("form", 0) % 3],
    "split": lambda x, p, a: (f"torch.split({x[0]}, {a['size']}, dim={a['dim']})[{a['index']}]",
                              f"{x[0]}.split({a['size']}, {a['dim']})[{a['index']}]")[a.get("form", 0) % 2],
    "chunk": lambda x, p, a: f"{x[0]}.chunk({a['chunks']}, {a['dim']})[{a['index']}]",
    "unbind": lambda x, p, a: f"{x[0]}.unbind({a['dim']})[{a['index']}]",
    "expand": lambda x, p, a: f"{x[0]}.expand{a['sizes']!r}" if len(a["sizes"]) > 1 else f"{x[0]}.expand({a['sizes']!r})",
    "squeeze": lambda x, p, a: f"{x[0]}.squeeze()" if a["dim"] is None else f"{x[0]}.squeeze({a['dim']})",
    "unsqueeze": lambda x, p, a: (f"{x[0]}.unsqueeze({a['dim']})", f"torch.unsqueeze({x[0]}, {a['dim']})")[
        a.get("form", 0) % 2],
    "copy": lambda x, p, a: (f"{x[0]}.clone()", f"{x[0]}.contiguous()")[a.get("form", 0) % 2],
}
for _name, _render in MOVEMENT.items():
    OPS[_name] = OpDef(_render, _pointwise())
