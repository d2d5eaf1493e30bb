"""legalize rules of scatters and index updates (issue 16): scatter (src and value), scatter_add, scatter_reduce
(sum, prod, amax, amin, mean), index_put (with and without accumulate), index_add, index_copy, index_fill,
index_reduce, put and masked_scatter, built from the existing trnc ops (registered in
passes/graph/legalize_table.py's `pm_legalize`).

One scheme: a scatter along dim d of x [.., N, ..] by index [.., M, ..] compares the index with an iota over N,
a one-hot [.., M, N, ..] (bool), and reduces the source over M through it: a sum of the hits' values (the
others 0) for add, max or min (the others -inf or inf) for amax and amin, a product in log2(M) halving steps
(the others 1) for prod, and for a plain scatter the value of the last index that hits (torch's CPU loop
writes in order along M, so the last writer wins): the max over M of the hits' positions, then the one value at
it (a max of it and -infs, exact, signed zeros and NaN kept). Where any index hits, the result combines with x
(include_self) or replaces it; elsewhere x is kept unchanged. All in fp32, rounded once to the output dtype.
The one-hot is refused past MAX_ONEHOT elements.

Indices: each index passes through a row gather of a zero constant [N] whose value is added to it, so an index
outside [0, N) is the gather's execution fault, as torch raises (a constant index is checked at compile time);
tensor indexing (index_put, put) wraps negative indices first, as torch does. index_put's index tensors over
adjacent dims combine to one flat index of those dims. Integer tensors go through fp32, exact while every value
(and a sum's bound) stays within 2^24: a bound must be known (legalize_index's _magnitude_bound), else refused.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_index import EXACT_FP32, _log_step_scan, _magnitude_bound, _to_int, exact_index
from trnc.passes.graph.legalize_table import dim_of, index_tensor, rule, take

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
MAX_ONEHOT = 1 << 24   # elements of the one-hot [.., M, N, ..] past which a scatter is refused


def _position(rw: Rewriter, index: ir.Node, size: int, wrap: bool) -> ir.Node:
    """The index as fp32 values in [0, size): a constant checked now, else added to a gather of zeros by it, which
    faults on an index outside [0, size) (torch raises there)."""
    if size > EXACT_FP32:
        rw.fail(f"along a dim of {size} elements is not supported: indices above 2^24 are not exact in fp32")
    if index.op == "const":
        value = rw.torch_value(index, torch.int64)
        if wrap:
            value = torch.where(value < 0, value + size, value)
        if value.numel() and bool(((value < 0) | (value >= size)).any()):
            rw.fail(f"has an index out of range for a dim of size {size} (torch raises)")
        return exact_index(rw.const(value.to(torch.float32), FP32))
    index = index_tensor(rw, index, size, wrap)
    guard = take(rw, rw.const(torch.zeros(size), FP32), 0, index)
    return exact_index(rw.binary("add", rw.cast(index, FP32), guard, FP32))


def _bound(rw: Rewriter, x: ir.Node) -> float:
    """A bound on |x| of an integer tensor within 2^24, or refuse."""
    bound = _magnitude_bound(rw, x)
    if bound is None or bound > EXACT_FP32:
        rw.fail(f"of a {x.dtype.text} tensor is not supported: the machine moves and adds it in fp32, exact within "
                "2^24, and no such bound on its values is known; cast it to float32 first")
    return bound


def _product(rw: Rewriter, x: ir.Node, axis: int) -> ir.Node:
    """The product over `axis` (kept, size 1) in halving steps, fp32."""
    while x.shape[axis] > 1:
        size = x.shape[axis]
        half = size // 2
        prod = rw.binary("mul", rw.slice(x, axis, 0, half), rw.slice(x, axis, half, 2 * half), FP32)
        x = rw.cat([prod, rw.slice(x, axis, 2 * half, size)], axis, FP32) if size % 2 else prod
    return x


def _pad_to(rw: Rewriter, x: ir.Node, shape, value) -> ir.Node:
    """x grown to `shape` (no axis smaller) by `value` after its end along each axis."""
    for d, (have, want) in enumerate(zip(x.shape, shape)):
        if have < want:
            fill = rw.filled(value, x.shape[:d] + (want - have,) + x.shape[d + 1:], x.dtype)
            x = rw.cat([x, fill], d, x.dtype)
    return x


def _scatter(rw: Rewriter, x: ir.Node, dim: int, pos: ir.Node, src: ir.Node, mode: str, include_self: bool,
             dtype: DType) -> ir.Node:
    """x with src scattered along `dim` at fp32 positions `pos` (same rank as x, no axis larger; src at least as
    large): mode 'last' (plain scatter), 'sum', 'prod', 'amax', 'amin' or 'mean'."""
    rank = len(x.shape)
    if not dtype.is_float:
        if mode in ("prod", "mean"):
            rw.fail(f"with reduce {mode!r} of an integer tensor is not supported (fp32 products round; an integer "
                    "mean floors)")
        bound = _bound(rw, x) + (pos.shape[dim] if mode == "sum" else 1) * _bound(rw, src)
        if bound > EXACT_FP32:
            rw.fail(f"of an integer tensor is not supported: its sums reach {bound:g}, past 2^24 where fp32 is exact")
    if pos.numel == 0:
        return rw.cast(x, dtype)
    size, count = x.shape[dim], pos.shape[dim]
    hot_shape = pos.shape[:dim + 1] + (size,) + pos.shape[dim + 1:]
    if math.prod(hot_shape) > MAX_ONEHOT:
        rw.fail(f"is not supported at this size: its one-hot {list(hot_shape)} would pass {MAX_ONEHOT} elements")
    for d, s in enumerate(pos.shape):
        src = rw.slice(src, d, 0, s)
    src = rw.reshape(rw.cast(src, FP32), pos.shape[:dim + 1] + (1,) + pos.shape[dim + 1:])
    pos = exact_index(rw.reshape(pos, src.shape))
    iota_shape = [1] * (rank + 1)
    iota_shape[dim + 1] = size
    hot = rw.binary("eq", pos, exact_index(rw.const(torch.arange(size, dtype=torch.float32).reshape(iota_shape), FP32)))
    hits = rw.cast(hot, FP32)
    hit = rw.reduce(hits, "max", (dim,), False, FP32)
    zero = rw.scalar_const(0.0, FP32)
    if mode in ("sum", "mean"):
        got = rw.reduce(rw.where(hot, src, zero, FP32), "sum", (dim,), False, FP32)
    elif mode == "prod":
        got = rw.reshape(_product(rw, rw.where(hot, src, rw.scalar_const(1.0, FP32), FP32), dim), hit.shape)
    elif mode in ("amax", "amin"):
        far = rw.scalar_const(-math.inf if mode == "amax" else math.inf, FP32)
        got = rw.reduce(rw.where(hot, src, far, FP32), mode[1:], (dim,), False, FP32)
    else:   # last writer wins
        iota_m = [1] * (rank + 1)
        iota_m[dim] = count
        order = rw.const(torch.arange(count, dtype=torch.float32).reshape(iota_m), FP32)
        latest = rw.where(hot, order, rw.scalar_const(-1.0, FP32), FP32)
        last = exact_index(rw.reduce(latest, "max", (dim,), True, FP32))
        pick = rw.binary("and", hot, rw.binary("eq", order, last))
        got = rw.reduce(rw.where(pick, src, rw.scalar_const(-math.inf, FP32), FP32), "max", (dim,), False, FP32)
    hit = _pad_to(rw, rw.scalar(hit, "gt", 0.5), x.shape, 0)
    got = _pad_to(rw, got, x.shape, 0.0)
    xf = rw.cast(x, FP32)
    if mode == "mean":
        n = exact_index(_pad_to(rw, rw.reduce(hits, "sum", (dim,), False, FP32), x.shape, 0.0))
        if include_self:
            got, n = rw.binary("add", got, xf, FP32), rw.scalar(n, "add", 1.0, dtype=FP32)
        got = rw.binary("div", got, n, FP32)
    elif include_self and mode != "last":
        op = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}[mode]
        got = rw.binary(op, xf, got, FP32)
    out = rw.where(hit, got, xf, FP32)
    return rw.cast(out, dtype) if dtype.is_float else _to_int(rw, out, dtype, bound)


def _along(rw: Rewriter, n, x, dim, index, src, mode, include_self=True, wrap=False):
    """A scatter op of torch's form (index and src of x's rank) along `dim`."""
    if not x.shape:
        one = (1,)
        out = _along(rw, n, rw.reshape(x, one), 0, rw.reshape(index, one) if not index.shape else index,
                     rw.reshape(src, one) if not src.shape else src, mode, include_self, wrap)
        return rw.reshape(out, ())
    dim = dim_of(dim, len(x.shape))
    if not index.shape:
        index = rw.reshape(index, (1,) * len(x.shape))
    pos = _position(rw, index, x.shape[dim], wrap)
    return _scatter(rw, x, dim, pos, src, mode, include_self, n.dtype)


@rule("aten.scatter.src", "aten.scatter.value")
def _scatter_plain(rw: Rewriter, n, a):
    x, index = a["input"], a["index"]
    src = a["src"] if "src" in a else rw.filled(a["value"], index.shape, x.dtype)
    return _along(rw, n, x, a["dim"], index, src, "last")


@rule("aten.scatter.reduce", "aten.scatter.value_reduce")
def _scatter_legacy_reduce(rw: Rewriter, n, a):
    x, index = a["input"], a["index"]
    src = a["src"] if "src" in a else rw.filled(a["value"], index.shape, x.dtype)
    return _along(rw, n, x, a["dim"], index, src, {"add": "sum", "multiply": "prod"}[a["reduce"]])


@rule("aten.scatter_add.default")
def _scatter_add(rw: Rewriter, n, a):
    return _along(rw, n, a["input"], a["dim"], a["index"], a["src"], "sum")


@rule("aten.scatter_reduce.two")
def _scatter_reduce(rw: Rewriter, n, a):
    return _along(rw, n, a["input"], a["dim"], a["index"], a["src"], a["reduce"], a["include_self"])


def _index_along(rw: Rewriter, n, x, dim, index, source, mode, include_self=True):
    """index_add/index_copy/index_reduce: a 1-d index picks slices of x along dim; spread it over source's shape."""
    rank = len(x.shape)
    if not x.shape:
        x, source = rw.reshape(x, (1,)), rw.reshape(source, (1,))
        return rw.reshape(_index_along(rw, n, x, 0, index, source, mode, include_self), ())
    dim = dim_of(dim, rank)
    index = rw.reshape(index, tuple(index.shape[:1]) or (1,))
    if not source.shape:
        source = rw.reshape(source, (1,) * rank)
    shape = list(x.shape)   # torch: source is x's shape but along dim (index_fill's 0-d value spreads to it)
    shape[dim] = index.shape[0]
    spread = rw.reshape(index, [index.shape[0] if d == dim else 1 for d in range(rank)])
    if spread.op == "const":
        spread = rw.const(rw.torch_value(spread, torch.int64).expand(shape), DType.INT32)
    else:
        spread = rw.expand(spread, shape)
    pos = _position(rw, spread, x.shape[dim], False)
    return _scatter(rw, x, dim, pos, rw.expand(source, shape), mode, include_self, n.dtype)


@rule("aten.index_add.default")
def _index_add(rw: Rewriter, n, a):
    source = a["source"]
    if a.get("alpha", 1) != 1:
        source = rw.scalar(source, "mul", a["alpha"], dtype=source.dtype)
    return _index_along(rw, n, a["input"], a["dim"], a["index"], source, "sum")


@rule("aten.index_copy.default")
def _index_copy(rw: Rewriter, n, a):
    return _index_along(rw, n, a["input"], a["dim"], a["index"], a["source"], "last")


@rule("aten.index_reduce.default")
def _index_reduce(rw: Rewriter, n, a):
    return _index_along(rw, n, a["input"], a["dim"], a["index"], a["source"], a["reduce"], a["include_self"])


@rule("aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
def _index_fill(rw: Rewriter, n, a):
    x, value = a["input"], a["value"]
    value = value if isinstance(value, ir.Node) else rw.scalar_const(value, x.dtype)
    source = rw.reshape(value, ())
    return _index_along(rw, n, x, a["dim"], a["index"], source, "last")


def _unbounded_arithmetic(index: ir.Node) -> bool:
    """An integer add, sub or mul (through views and casts) that legalize could not bound (no index_bound): its
    kernel would refuse it later without naming the op, so the rule that reads it refuses now."""
    while index.op in ("reshape", "expand", "permute", "cast") and "index_bound" not in index.attrs:
        index = index.inputs[0]
    return (index.op in ("binary", "scalar") and index.attrs.get("op") in ("add", "sub", "mul")
            and not index.dtype.is_float and "index_bound" not in index.attrs)


@rule("aten.index_put.default")
def _index_put(rw: Rewriter, n, a):
    """x[indices] = values (accumulate: +=). Integer index tensors over adjacent dims (Nones before them) make one
    flat index of those dims; a single bool mask over x's leading dims with one value is a select."""
    x, values, accumulate = a["input"], a["values"], a["accumulate"]
    indices = list(a["indices"])
    while indices and indices[-1] is None:
        indices.pop()
    start = 0
    while start < len(indices) and indices[start] is None:
        start += 1
    used = indices[start:]
    if not used or any(i is None for i in used):
        rw.fail("with index tensors separated by None is not supported")
    if any(rw.torch_dtype(i) == torch.bool for i in used):
        mask = used[0]
        post = x.shape[start + len(mask.shape):]
        kept = tuple(values.shape)
        while kept and kept[0] == 1:
            kept = kept[1:]
        if len(used) != 1 or tuple(mask.shape) != x.shape[start:start + len(mask.shape)] or len(kept) > len(post) \
                or any(v not in (1, p) for v, p in zip(kept[::-1], post[::-1])):
            rw.fail("with a bool index is supported only as one mask over whole dims with values alike for every "
                    "masked element (else the shapes depend on the data)")
        mask = rw.reshape(mask, mask.shape + (1,) * len(post))
        value = rw.reshape(values, kept)
        if accumulate:
            value = rw.binary("add", x, value, FP32 if n.dtype.is_float else n.dtype)
        return rw.where(mask, value, x, n.dtype)
    if any(_unbounded_arithmetic(i) for i in used if i is not None):
        rw.fail("with indices computed by integer arithmetic trnc cannot bound within 2^24 is not supported: the "
                "engines compute integers in fp32, which loses them above 2^24 (max_unpool's flat indices)")
    sizes = x.shape[start:start + len(used)]
    batch = tuple(torch.broadcast_shapes(*(i.shape for i in used)))
    flat = None
    for i, (index, size) in enumerate(zip(used, sizes)):
        stride = math.prod(sizes[i + 1:])
        pos = _position(rw, rw.expand(index, batch) if index.op != "const" else
                        rw.const(rw.torch_value(index, torch.int64).expand(batch), DType.INT32), size, True)
        pos = rw.scalar(pos, "mul", stride, dtype=FP32) if stride != 1 else pos
        flat = exact_index(pos if flat is None else rw.binary("add", flat, pos, FP32))
    if math.prod(sizes) > EXACT_FP32:
        rw.fail("over indexed dims of more than 2^24 elements is not supported")
    pre, post = x.shape[:start], x.shape[start + len(used):]
    count, rows = math.prod(batch), math.prod(sizes)
    lead, tail = math.prod(pre), math.prod(post)
    target = pre + batch + post
    values = rw.reshape(rw.expand(values, target), (lead, count, tail))
    pos = rw.expand(rw.reshape(flat, (1, count, 1)), (lead, count, tail))
    out = _scatter(rw, rw.reshape(x, (lead, rows, tail)), 1, pos, values, "sum" if accumulate else "last", True,
                   n.dtype)
    return rw.reshape(out, x.shape)


@rule("aten.put.default")
def _put(rw: Rewriter, n, a):
    """x.flatten()[index] = source (accumulate: +=), negative indices wrapping."""
    x, index, source = a["input"], a["index"], a["source"]
    numel = math.prod(x.shape)
    count = math.prod(index.shape)
    pos = _position(rw, rw.reshape(index, (count,)), numel, True)
    out = _scatter(rw, rw.reshape(x, (numel,)), 0, pos, rw.reshape(source, (count,)),
                   "sum" if a["accumulate"] else "last", True, n.dtype)
    return rw.reshape(out, x.shape)


@rule("aten.masked_scatter.default")
def _masked_scatter(rw: Rewriter, n, a):
    """x with its masked elements (row-major order) taken from source's first elements in turn: element k's place in
    source is the count of masked elements before it, a prefix sum (log steps), gathered from the flat source (the
    gather faults where source runs short, as torch raises)."""
    x, mask, source = a["input"], a["mask"], a["source"]
    shape = tuple(torch.broadcast_shapes(x.shape, mask.shape))
    numel = math.prod(shape)
    if numel > EXACT_FP32 or math.prod(source.shape) > EXACT_FP32:
        rw.fail("of more than 2^24 elements is not supported: positions above 2^24 are not exact in fp32")
    if numel == 0:
        return rw.cast(rw.expand(x, shape), n.dtype)
    hits = rw.cast(rw.reshape(rw.expand(rw.binary("ne", mask, rw.scalar_const(0, mask.dtype)) if
                                        mask.dtype.is_float else mask, shape), (numel,)), FP32)
    (ends,) = _log_step_scan(rw, [hits], 0, lambda e, later: [rw.binary("add", e[0], later[0], FP32)])
    place = rw.where(rw.scalar(hits, "gt", 0.5), rw.binary("sub", ends, hits, FP32), rw.scalar_const(0.0, FP32), FP32)
    place = _to_int(rw, place, DType.INT32, numel)
    flat = rw.reshape(source, (math.prod(source.shape),))
    if not source.dtype.is_float and source.dtype is not DType.INT32:
        flat = rw.cast(flat, FP32)
    picked = rw.reshape(take(rw, flat, 0, place), shape)
    return rw.where(rw.reshape(rw.scalar(hits, "gt", 0.5), shape), picked, rw.expand(x, shape), n.dtype)
