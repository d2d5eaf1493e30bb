"""recognize: an op the model spells out op by op becomes the trnc op that computes it whole.

RMS norm.

transformers' LlamaRMSNorm (and torch's own nn.RMSNorm, which export decomposes) reaches the IR as
square -> sum over the last axis -> * 1/C -> + eps -> rsqrt -> x * that [-> weight * that]: three kernels
(the squares and the product each go through HBM) where one row-wise kernel reads x once. This pass rewrites
each match into `rms_norm(x [, weight])` (docs/ir.md), after simplify, whose CSE may have merged the mean of two
norms of one x (each match recomputes it; the shared nodes go once unused).

The match keeps where eager rounds: the statistic in fp32 (the reduce keeps fp32; the kernel scales the sum by
fp32(1/C), which can differ in its last bit from a division by C), the product x * rstd rounded once, then the
weight product rounded once. An fp32 cast of a bf16 or
fp16 x (LlamaRMSNorm's `.to(torch.float32)`) is exact, so the norm reads x itself. Anything else (another
reader of the product, a weight that is not one value per feature) leaves the nodes as they are.

GELU, tanh form. GPT-2's `gelu_new` is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in nine elementwise ops;
the `gelu_tanh` activation (runtime/fp32math.py: x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), within 2 ulp
plus the formula's own conditioning) computes it in one pass. It differs from eager's nine roundings by a few
ulp, and is the more accurate where 1 + tanh cancels (x below about -3, where eager's relative error reaches
1e-4 of a result below 1e-3 of |x|); the absolute difference stays below 1e-6 |x|.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.simplify import replace_uses

WIDENS_EXACTLY = (DType.FP32, DType.BF16, DType.FP16)
GELU_C, GELU_K = 0.7978845608028654, 0.044715   # sqrt(2/pi), the cubic's coefficient


def _f32(value: float) -> np.float32:
    return np.float32(value)


def _other(n: ir.Node, one: ir.Node) -> ir.Node | None:
    """The operand of binary n besides `one`, or None when `one` is not an operand."""
    a, b = n.inputs
    return b if a is one else a if b is one else None


def _rstd_of(r: ir.Node) -> tuple[ir.Node, float] | None:
    """(x, eps) when r is rsqrt(sum(square(x)) over x's last axis, kept, * 1/C + eps), all fp32; else None."""
    if r.op != "unary" or r.attrs.get("func") != "rsqrt" or r.dtype != DType.FP32:
        return None
    add = r.inputs[0]
    mean = _scalar_of(add, "add")
    if mean is None or mean.attrs.get("op") not in ("mul", "div"):
        return None
    total = _scalar_of(mean, mean.attrs["op"])
    if total is None or total.op != "reduce" or total.attrs.get("op") != "sum" or total.attrs.get("abs") \
            or not total.attrs.get("keepdim"):
        return None
    square = total.inputs[0]
    if square.op != "unary" or square.attrs.get("func") != "square" or square.dtype != DType.FP32:
        return None
    x = square.inputs[0]
    c = x.shape[-1] if x.shape else 0
    if total.dtype != DType.FP32 or tuple(total.attrs.get("axes", ())) != (len(x.shape) - 1,) or c == 0:
        return None
    expected = 1 / c if mean.attrs["op"] == "mul" else c   # the scalar of "* 1/C" or "/ C"
    return (x, float(add.attrs["value"])) if _f32(mean.attrs["value"]) == _f32(expected) else None


def _norm_of(n: ir.Node) -> tuple[ir.Node, float] | None:
    """(x, eps) when n = x * rstd(x) (either order), fp32 and of x's shape; else None."""
    if n.op != "binary" or n.attrs.get("op") != "mul" or n.dtype != DType.FP32:
        return None
    for r in n.inputs:
        found = _rstd_of(r)
        if found is not None and _other(n, r) is found[0] and n.shape == found[0].shape:
            return found
    return None


def _weight_of(n: ir.Node, norm: ir.Node, users: dict) -> ir.Node | None:
    """The weight w when n = w * norm (either order) with w one fp32 value per feature and n norm's only reader."""
    w = _binary_with(n, "mul", norm) if users[norm] == [n] else None
    if w is None or w is norm or w.dtype != DType.FP32 or n.shape != norm.shape:
        return None
    return w if w.shape == norm.shape[-1:] else None


def _unwidened(x: ir.Node) -> ir.Node:
    """x's source when x only widens it to fp32 exactly (bf16 or fp16 to fp32), else x."""
    if x.op == "cast" and x.dtype == DType.FP32 and x.inputs[0].dtype in WIDENS_EXACTLY:
        return x.inputs[0]
    return x


def _scalar_of(n: ir.Node, op: str, value: float | None = None) -> ir.Node | None:
    """x when n = x op v (fp32, not reversed; v equal to `value` in fp32 when one is given), else None."""
    if n.op != "scalar" or n.attrs.get("op") != op or n.attrs.get("reverse") or n.dtype != DType.FP32 \
            or (value is not None and _f32(n.attrs["value"]) != _f32(value)):
        return None
    return n.inputs[0]


def _binary_with(n: ir.Node, op: str, one: ir.Node) -> ir.Node | None:
    """The other operand when n = one op other or other op one (fp32), else None."""
    if n.op != "binary" or n.attrs.get("op") != op or n.dtype != DType.FP32:
        return None
    return _other(n, one)


def _is_cube(n: ir.Node, x: ir.Node) -> bool:
    """Whether n = (x * x) * x or x * (x * x), x * x possibly square(x)."""
    sq = _binary_with(n, "mul", x)
    return sq is not None and (_binary_with(sq, "mul", x) is x or
                               (sq.op == "unary" and sq.attrs.get("func") == "square" and sq.inputs[0] is x))


def _gelu_tanh_of(n: ir.Node) -> ir.Node | None:
    """x when n = (0.5 x) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), either order of each product and
    sum, all fp32; else None."""
    if n.op != "binary" or n.attrs.get("op") != "mul" or n.dtype != DType.FP32:
        return None
    for half in n.inputs:
        x = _scalar_of(half, "mul", 0.5)
        t = _scalar_of(_other(n, half), "add", 1.0) if x is not None else None
        if t is None or t.op != "unary" or t.attrs.get("func") != "tanh" or t.dtype != DType.FP32:
            continue
        inner = _scalar_of(t.inputs[0], "mul", GELU_C)
        k = _binary_with(inner, "add", x) if inner is not None else None
        cube = _scalar_of(k, "mul", GELU_K) if k is not None else None
        if cube is not None and _is_cube(cube, x) and n.shape == x.shape:
            return x
    return None


def _gelus(graph: ir.Graph) -> int:
    """Rewrite every spelled-out tanh GELU into unary gelu_tanh; count them."""
    found = 0
    for n in list(graph.nodes):
        x = _gelu_tanh_of(n)
        if x is not None:
            gelu = ir.Node("unary", (x,), n.shape, n.dtype, {"func": "gelu_tanh"}, name=n.name, source=n.source,
                           module=n.module)
            graph.nodes.insert(graph.nodes.index(n), gelu)
            replace_uses(graph, n, gelu)
            found += 1
    return found


def recognize(graph: ir.Graph) -> dict:
    """Rewrite every spelled-out RMS norm into an rms_norm node and every tanh GELU into gelu_tanh; count them."""
    gelus = _gelus(graph)
    users = graph.users()
    found = 0
    for n in list(graph.nodes):
        match = _norm_of(n)
        if match is None:
            continue
        x, eps = match
        reader = users[n][0] if len(users[n]) == 1 and n not in graph.outputs else None
        weight = _weight_of(reader, n, users) if reader is not None else None
        last = reader if weight is not None else n
        inputs = (_unwidened(x),) + ((weight,) if weight is not None else ())
        norm = ir.Node("rms_norm", inputs, last.shape, last.dtype, {"eps": eps, "has_weight": weight is not None},
                       name=last.name, source=last.source, module=last.module)
        graph.nodes.insert(graph.nodes.index(last), norm)
        replace_uses(graph, last, norm)
        found += 1
        users = graph.users()
    graph.prune()
    return {"rms_norms": found, "gelu_tanh": gelus}


@dataclass(frozen=True)
class Recognize:
    """Spelled-out RMS norms into the row-wise rms_norm op, spelled-out tanh GELUs into gelu_tanh."""

    name: str = "recognize"

    def run(self, state) -> dict:
        return recognize(state.graph)
