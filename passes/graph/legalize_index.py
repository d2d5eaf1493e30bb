"""legalize rules of arg-reductions, counts and scans (issue 16): argmax, argmin, max/min with their indices, histc,
cumsum, cummax, cummin, cumprod, logcumsumexp;
built from the existing trnc ops (registered in passes/graph/legalize_table.py's `pm_legalize`).

Arg-reductions: the machine has no index-tracking reduction, so an index is found by compare and select. Over
the reduced axis, m = max(x) (NaN if the row holds one: the ALU's max propagates NaN), the hits are the
elements equal to m, or NaN (a NaN row's hits are its NaNs: NaN compares unequal to everything), each hit
selects its index from an iota constant and every other element the axis size, and the min of these is the
first index of the extreme value: torch's answer, ties to the first, a NaN the extreme and its first index
winning. Indices below 2^24 are exact in fp32, and the min of a select of exact values is exact.

Scans: cumsum along the last axis is one matmul by an upper-triangular 0/1 constant U [n, n] (y[i] = sum over
k <= i of x[k]), on TensorE, exact products and fp32 accumulation; another axis is permuted to the end and
back. Eager's CPU kernel sums in float64 and rounds each output once; the machine sums in fp32, so the
difference is its rounding: |y_i - eager_i| <= gamma(i) sum_{k<=i} |x_k| + u |eager_i|, gamma(i) =
i u / (1 - i u), u = 2^-24 (Higham, Accuracy and Stability, 4.2: recursive summation in any order). A product
by U's zeros is an exact zero but for an infinite or NaN x, where it is NaN; so floats sum their finite part
by the matmul, count +inf and -inf (a NaN counting as both) by two more, and select inf, -inf or NaN where
the counts say eager's sum got there. An integer cumsum is exact in fp32 while every partial sum stays within
2^24: legalize takes it when a bound on |x| (a bool, 8-bit or compare-made value, a constant, an index) times
the length proves that, and refuses others (the machine has no integer adder). Past TRIANGLE_MAX terms the
cumsum adds in log steps instead (below), where infinities need no counting, within the same bound.

cummax, cummin, cumprod and logcumsumexp are not linear: they scan in log2(n) steps (Hillis and Steele), each
an elementwise combine of a slice with the slice s elements earlier and a cat, over (value, index) pairs for
cummax and cummin.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_table import COMPARE_OPS, dim_of, keep_fp32_inside, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
EXACT_FP32 = 2 ** 24   # integers up to this magnitude are exact in fp32
# a longer cumsum adds in log steps: the matmul's n^2 work and triangle bytes per row outgrow the log steps' n log2(n)
# passes. Modeled on trn2 (compiled stats, cycles of the matmul form over the log steps', 8 and 128 rows): n = 512
# 0.70 and 0.36, 1024 1.24 and 0.67, 2048 2.16 and 1.26; past 2048 the triangle would not even fold (FOLD_MAX_ELEMENTS)
TRIANGLE_MAX = 1024


def _iota(rw: Rewriter, size: int, axis: int, rank: int) -> ir.Node:
    """0, 1, ..., size - 1 along `axis` of a rank-`rank` fp32 constant, size 1 elsewhere (it broadcasts)."""
    shape = [1] * rank
    shape[axis] = size
    return rw.const(torch.arange(size, dtype=torch.float32).reshape(shape), FP32)


def _to_int(rw: Rewriter, x: ir.Node, dtype: DType, bound: int) -> ir.Node:
    """x, whose values are integers within +-bound <= 2^24 by construction, converted to the integer `dtype`:
    exactly, so the kernels take it (attr `integral`), where a float-to-int cast of other values rounds where torch
    truncates; `index_bound` tells later integer math the bound. The fp32 nodes x is made of (up to the first
    value of another dtype: a compare, an integer input) keep fp32 (`keep_fp32`): auto_cast="all" would store them
    in bf16, whose integers are exact only up to 256."""
    return rw.emit("cast", (exact_index(x),), x.shape, dtype, integral=True, index_bound=int(bound))


def exact_index(x: ir.Node) -> ir.Node:
    """x, an fp32 index or count (an integer within 2^24), with the fp32 nodes it is made of (up to the first value
    of another dtype) marked `keep_fp32`: auto_cast="all" would store them in bf16, exact only up to 256. The walk
    goes on through nodes marked already (it stopped at the prefix-sum matmul, and the cast of an int cumsum's
    operand before it was narrowed: the cumsum of argsort indices of 600 elements was off by 24)."""
    stack, seen = [x], set()
    while stack:
        n = stack.pop()
        if n.dtype is FP32 and n not in seen:
            seen.add(n)
            n.attrs["keep_fp32"] = True
            stack.extend(n.inputs)
    return x


def _arg_extreme(rw: Rewriter, x: ir.Node, axis: int, op: str, keepdim: bool, index_dtype: DType):
    """(the extreme values with the reduced axis kept, the first index of each as `index_dtype`)."""
    size = x.shape[axis]
    if size > EXACT_FP32:
        rw.fail(f"over an axis of {size} elements is not supported: indices above 2^24 are not exact in fp32")
    m = rw.reduce(x, op, (axis,), True, x.dtype)
    m.attrs["keep_fp32"] = True   # an element of x, as x holds it: narrowed to bf16 (auto_cast "all") it equalled
    hits = rw.binary("eq", x, m)  # none of x's fp32 elements, and argmax gave the axis size (fuzz seed 92000180)
    if x.dtype.is_float:
        hits = rw.binary("or", hits, rw.binary("ne", x, x))
    shape = tuple(s for d, s in enumerate(x.shape) if keepdim or d != axis)
    if size == 1:
        return m, rw.filled(0, shape, index_dtype)
    candidates = rw.where(hits, _iota(rw, size, axis, len(x.shape)), rw.scalar_const(float(size), FP32), FP32)
    return m, _to_int(rw, rw.reduce(candidates, "min", (axis,), keepdim, FP32), index_dtype, size)


def _flat(rw: Rewriter, x: ir.Node, dim) -> tuple[ir.Node, int]:
    """(x, the axis) of a reduction over `dim`; dim None (or a 0-d x) reduces the flattened tensor."""
    if dim is None or not x.shape:
        return rw.reshape(x, (x.numel,)), 0
    return x, dim_of(dim, len(x.shape))


@rule("aten.argmax.default", "aten.argmin.default")
def _argmax(rw: Rewriter, n, a):
    x, axis = _flat(rw, a["input"], a["dim"])
    _, index = _arg_extreme(rw, x, axis, "max" if n.op == "aten.argmax.default" else "min", False, n.dtype)
    return rw.reshape(index, n.shape)


@rule("aten.max.dim", "aten.min.dim")
def _extreme_with_index(rw: Rewriter, n, a):
    x, axis = _flat(rw, a["input"], a["dim"])
    (value_shape, value_dtype), (index_shape, index_dtype) = n.attrs["outputs"]
    m, index = _arg_extreme(rw, x, axis, n.op.split(".")[1], False, index_dtype)
    return [rw.reshape(rw.cast(m, value_dtype), value_shape), rw.reshape(index, index_shape)]


# -- scans ----------------------------------------------------------------------------------------------------
def _magnitude_bound(rw: Rewriter, x: ir.Node) -> float | None:
    """An upper bound on |x| known at compile time, or None: an 8-bit or compare-made value, a constant, an index
    legalize built (index_bound), or a cast of such a value."""
    while True:
        if x.op in ("binary", "scalar") and x.attrs.get("op") in COMPARE_OPS:
            return 1.0
        if x.dtype in (DType.UINT8, DType.INT8):
            return 255.0
        if "index_bound" in x.attrs:
            return float(x.attrs["index_bound"])
        if x.op == "const":
            return float(rw.torch_value(x, torch.float64).abs().max()) if x.numel else 0.0
        if x.op == "cast" and not x.dtype.is_float and x.inputs[0].dtype.is_float:
            return None   # a float converted to int saturates: no tighter bound than the int range
        if x.op != "cast" and (x.op not in ir.OPS_MOVEMENT or len(x.inputs) != 1):
            return None
        x = x.inputs[0]


def bound_integer_arith(rw: Rewriter, node: ir.Node) -> ir.Node:
    """`node`, an integer add, sub or mul (legalize_rules' arithmetic), marked `index_bound` when its operands' bounds
    prove its result within 2^24, where fp32 computes it exactly and the kernels take it: RoBERTa's position ids,
    (cumsum(mask) + past) * mask + padding_idx, stay on the device."""
    op = node.attrs.get("op")
    if node.dtype.is_float or node.op not in ("binary", "scalar") or op not in ("add", "sub", "mul") \
            or "index_bound" in node.attrs:
        return node
    bounds = [_magnitude_bound(rw, i) for i in node.inputs]
    if node.op == "scalar":
        value = node.attrs["value"]
        bounds.append(abs(value) if float(value).is_integer() else None)
    if None in bounds:
        return node
    bound = bounds[0] * bounds[1] if op == "mul" else bounds[0] + bounds[1]
    if bound <= EXACT_FP32:
        node.attrs["index_bound"] = int(bound)
    return node


@rule("aten.histc.default")
def _histc(rw: Rewriter, n, a):
    """torch.histc as its CPU kernel bins fp32 (checked against it bit for bit, bin edges included): bin =
    trunc((x - min) * bins / (max - min)) in fp32 steps, max itself in the last bin, values outside [min, max] and
    NaN in none; each bin's hits (a compare with an iota) summed in fp32, exact below 2^24 elements. min = max
    (torch then bins over the data's range) is refused. The counts are marked integral (index_bound), so their
    cumsum to an integer dtype (a mixture of experts' expert offsets, transformers' grouped matmul) stays on the
    device."""
    x, bins, lo, hi = a["input"], int(a["bins"]), float(a["min"]), float(a["max"])
    if rw.torch_dtype(x) is not torch.float32:
        rw.fail(f"of {rw.torch_dtype(x)} is not supported: torch bins it in that dtype's arithmetic (cast to float32)")
    if lo == hi:
        rw.fail(f"with min = max = {lo:g} is not supported: torch then bins over the data's range, known only at run "
                "time")
    lo32, hi32 = float(np.float32(lo)), float(np.float32(hi))
    size = math.prod(x.shape)
    if not (math.isfinite(lo32) and math.isfinite(hi32) and lo32 < hi32) or size >= EXACT_FP32:
        rw.fail(f"over [{lo}, {hi}] of {size} elements is not supported (a finite range, below 2^24 elements)")
    flat = rw.reshape(x, (size, 1))
    scaled = rw.scalar(rw.scalar(flat, "sub", lo32, dtype=FP32), "mul", float(bins), dtype=FP32)
    position = rw.unary(rw.scalar(scaled, "div", float(np.float32(hi32 - lo32)), dtype=FP32), "trunc", FP32)
    position = rw.scalar(position, "min", float(bins - 1), dtype=FP32)
    inside = rw.binary("and", rw.scalar(flat, "ge", lo32), rw.scalar(flat, "le", hi32))
    hits = rw.binary("and", rw.binary("eq", position, _iota(rw, bins, 1, 2)), inside)
    counts = rw.reduce(rw.cast(hits, FP32), "sum", (0,), keepdim=False, dtype=FP32)
    counts.attrs.update(index_bound=size, keep_fp32=True)   # bf16 (auto_cast "all") holds counts exactly only to 256
    return keep_fp32_inside(rw.cast(counts, n.dtype), x)


def _triangle(rw: Rewriter, size: int) -> ir.Node:
    """U [size, size] fp32, U[k, i] = 1 where k <= i: x @ U sums each row's prefixes. Built from two iotas, so fold
    computes it at compile time unless it is much larger than they are (then an elementwise kernel does)."""
    upper = rw.binary("le", _iota(rw, size, 0, 2), _iota(rw, size, 1, 2))
    return rw.cast(upper, FP32)


def _prefix_sums(rw: Rewriter, x: ir.Node, triangle: ir.Node) -> ir.Node:
    """x [..., n] (fp32) @ U: a matmul kept in fp32 (precision and quantize leave `keep_fp32` matmuls alone)."""
    rows = rw.reshape(x, (math.prod(x.shape[:-1]), x.shape[-1]))
    summed = rw.emit("matmul", (rows, triangle), rows.shape, FP32, keep_fp32=True)
    return rw.reshape(summed, x.shape)


def _cumsum_float(rw: Rewriter, x: ir.Node, triangle: ir.Node) -> ir.Node:
    """The prefix sums of fp32 x with eager's infinities and NaNs: the finite part by one matmul, and the counts of
    +inf and -inf so far (a NaN counts as both, as inf - inf is NaN) by two."""
    finite = rw.scalar(rw.unary(x, "abs", FP32), "lt", math.inf)
    nan = rw.binary("ne", x, x)
    counts = []
    for infinity in (math.inf, -math.inf):
        hit = rw.binary("or", rw.scalar(x, "eq", infinity), nan)
        counts.append(rw.scalar(_prefix_sums(rw, rw.cast(hit, FP32), triangle), "gt", 0.5))
    sums = _prefix_sums(rw, rw.where(finite, x, rw.scalar_const(0.0, FP32), FP32), triangle)
    positive, negative = counts
    special = rw.where(negative, rw.scalar_const(math.nan, FP32), rw.scalar_const(math.inf, FP32), FP32)
    return rw.where(positive, special, rw.where(negative, rw.scalar_const(-math.inf, FP32), sums, FP32), FP32)


def _last_axis_scan(rw: Rewriter, x: ir.Node, dim: int, build) -> ir.Node:
    """build(x) over the last axis; another dim is swapped to the end and back (a swap is its own inverse)."""
    rank = len(x.shape)
    if dim == rank - 1:
        return build(x)
    swap = list(range(rank))
    swap[dim], swap[-1] = rank - 1, dim
    return rw.permute(build(rw.permute(x, swap)), swap)


def _counts(x: ir.Node) -> bool:
    """Whether float x holds counts (histc's, marked index_bound), through views: integers within their bound, so
    torch's truncation to an integer dtype leaves them as they are."""
    while x.op in ir.OPS_MOVEMENT and len(x.inputs) == 1 or x.op == "cast" and x.dtype.is_float:
        x = x.inputs[0]
    return x.dtype.is_float and "index_bound" in x.attrs


@rule("aten.cumsum.default")
def _cumsum(rw: Rewriter, n, a):
    x = a["input"]
    if not x.shape:   # torch: the cumsum of a 0-d tensor is itself
        return rw.cast(x, n.dtype)
    dim = dim_of(a["dim"], len(x.shape))
    size = x.shape[dim]
    if x.dtype.is_float and not n.dtype.is_float and not _counts(x):
        rw.fail(f"of a float tensor to {n.dtype.text} is not supported: torch truncates each value first, which "
                "trnc does only for integral floats it knows (histc's counts); cast it to the integer dtype first")
    if not n.dtype.is_float:
        bound = _magnitude_bound(rw, x)
        if bound is None or bound * size > EXACT_FP32:
            known = "no bound on its values is known" if bound is None else f"|x| <= {bound:g} over {size} terms"
            rw.fail(f"of an integer tensor is not supported here: the machine adds in fp32, exact while partial "
                    f"sums stay within 2^24, and {known}; cast it to float32 (or to bool/int8) first")
    if size == 1:
        return rw.cast(x, n.dtype)

    def finish(summed: ir.Node) -> ir.Node:
        """One torch op: its intermediates stay fp32 under auto_cast "all" (the selects of x narrowed, a bf16 cumsum
        of two fp32 inputs was off by both roundings; fuzz seed 93000010)."""
        if n.dtype.is_float:
            return keep_fp32_inside(rw.cast(summed, n.dtype), x)
        return _to_int(rw, summed, n.dtype, bound * size)

    if size > TRIANGLE_MAX:
        add = lambda e, later: [rw.binary("add", e[0], later[0], FP32)]  # noqa: E731
        (summed,) = _log_step_scan(rw, [rw.cast(x, FP32)], dim, add)
        return finish(summed)
    triangle = _triangle(rw, size)
    if x.dtype.is_float:
        summed = _last_axis_scan(rw, rw.cast(x, FP32), dim, lambda t: _cumsum_float(rw, t, triangle))
    else:
        summed = _last_axis_scan(rw, rw.cast(x, FP32), dim, lambda t: _prefix_sums(rw, t, triangle))
    return finish(summed)


def _log_step_scan(rw: Rewriter, xs: list[ir.Node], dim: int, combine) -> list[ir.Node]:
    """The inclusive scan of tuples of tensors (xs, alike in shape) along `dim` by an associative `combine(earlier,
    later)`, in log2(n) steps (Hillis and Steele): at step s, element i >= s combines its partial with element
    i - s's, a slice and an elementwise pass, and the first s stay (one cat)."""
    size = xs[0].shape[dim]
    step = 1
    while step < size:
        earlier = [rw.slice(x, dim, 0, size - step) for x in xs]
        later = [rw.slice(x, dim, step, size) for x in xs]
        combined = combine(earlier, later)
        xs = [rw.cat([rw.slice(x, dim, 0, step), c], dim, x.dtype) for x, c in zip(xs, combined)]
        step *= 2
    return xs


@rule("aten.cummax.default", "aten.cummin.default")
def _cummax(rw: Rewriter, n, a):
    """Values and indices as torch's sequential loop gives them: a later element equal to the running extreme takes
    over its index (torch compares with >=, <=), and a NaN, once seen, is the value, the latest NaN its index. That
    update is associative on (value, index) pairs, so it scans in log steps."""
    x = a["input"]
    (value_shape, value_dtype), (index_shape, index_dtype) = n.attrs["outputs"]
    if not x.shape:
        return [rw.cast(x, value_dtype), rw.filled(0, index_shape, index_dtype)]
    dim = dim_of(a["dim"], len(x.shape))
    size = x.shape[dim]
    if size > EXACT_FP32:
        rw.fail(f"over an axis of {size} elements is not supported: indices above 2^24 are not exact in fp32")
    order = "ge" if n.op == "aten.cummax.default" else "le"

    def combine(earlier, later):
        (v0, i0), (v1, i1) = earlier, later
        takes_later = rw.binary(order, v1, v0)
        if x.dtype.is_float:
            takes_later = rw.binary("or", takes_later, rw.binary("ne", v1, v1))
        return [rw.where(takes_later, v1, v0, x.dtype), rw.where(takes_later, i1, i0, FP32)]

    index = rw.expand(_iota(rw, size, dim, len(x.shape)), x.shape)
    values, indices = _log_step_scan(rw, [x, index], dim, combine)
    return [keep_fp32_inside(rw.cast(values, value_dtype), x), _to_int(rw, indices, index_dtype, size)]


@rule("aten.cumprod.default")
def _cumprod(rw: Rewriter, n, a):
    """Products in log steps, in fp32: output i is a product of its i + 1 terms in a tree order, within (1 + u)^i - 1
    relative of the exact one where eager's float64 product rounds once (0 * inf is NaN in either order)."""
    x = a["input"]
    if not n.dtype.is_float:
        rw.fail("of an integer tensor is not supported: the machine multiplies in fp32, which loses integers above "
                "2^24; cast it to float32 first")
    if not x.shape:
        return rw.cast(x, n.dtype)
    dim = dim_of(a["dim"], len(x.shape))
    (product,) = _log_step_scan(rw, [rw.cast(x, FP32)], dim, lambda e, later: [rw.binary("mul", e[0], later[0], FP32)])
    return keep_fp32_inside(rw.cast(product, n.dtype), x)


@rule("aten.logcumsumexp.default")
def _logcumsumexp(rw: Rewriter, n, a):
    """log(sum of exp) in log steps, each combine max(a, b) + log(1 + exp(min - max)) in fp32 (ties, infinities of
    one sign included, take min - max as 0: -inf + log 2 is -inf; a NaN propagates through max). The combine is
    1-Lipschitz in its operands, so each output is off by at most its chain's ceil(log2 n) roundings of a few ulp
    of the partials' magnitude, where eager, summing in float64, rounds once."""
    x = a["input"]
    if not n.dtype.is_float:
        rw.fail(f"to {n.dtype.text} is not supported: give a float dtype")
    if not x.shape:
        return rw.cast(x, n.dtype)
    dim = dim_of(a["dim"], len(x.shape))

    def combine(earlier, later):
        (u,), (v,) = earlier, later
        high, low = rw.binary("max", u, v, FP32), rw.binary("min", u, v, FP32)
        gap = rw.where(rw.binary("eq", low, high), rw.scalar_const(0.0, FP32), rw.binary("sub", low, high, FP32),
                       FP32)
        tail = rw.unary(rw.scalar(rw.unary(gap, "exp", FP32), "add", 1.0, dtype=FP32), "log", FP32)
        return [rw.binary("add", high, tail, FP32)]

    (total,) = _log_step_scan(rw, [rw.cast(x, FP32)], dim, combine)
    return keep_fp32_inside(rw.cast(total, n.dtype), x)
