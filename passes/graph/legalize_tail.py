"""legalize rules of the long tail of Core ATen (issue 16) that need no new machine op: vector norms, the sign
and step functions, and the structural ops (diagonals, flips, windows), lowered to the existing trnc op set
(registered in passes/graph/legalize_table.py's `pm_legalize`).

Norms: torch's CPU kernel computes a vector norm in fp32 (it overflows where |x|^p does, as here), so each is
one reduction in fp32 of |x|, of |x|^2 or of |x|^p and a root; 1, inf and -inf norms read |x| inside the
reduction (its `abs` attribute), no |x| tensor in HBM. Most losses, cosine_similarity, pairwise_distance and
normalize reach legalize already decomposed into these norms and elementwise ops.

Structure: the IR's views have no negative stride and no diagonal stride, so a diagonal is a slice with step
width + 1 of the flattened rows, a flip a gather of the rows in reverse (an exact move of floats; other dtypes
a cat of one-wide slices), and unfold a stack of strided slices, one per position in the window. All of these
move values exactly: no arithmetic touches them.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph import legalize_matmul as mm
from trnc.passes.graph.legalize_table import dim_of, dims_of, keep_fp32_inside, pm_legalize, rule, take

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
MAX_SLICES = 64   # a non-float flip or a wide unfold is at most this many slices; beyond, floats go through a gather


# -- norms -------------------------------------------------------------------------------------------------
def _reduce_abs(rw: Rewriter, x: ir.Node, op: str, axes, keepdim: bool) -> ir.Node:
    """op over |x|, |x| taken on each loaded tile by the reduction itself (no |x| tensor written). Over axes of
    size 1 only, the reduce kernel is a copy that skips `abs` (passes/tile/kernels/reduce.py), so |x| is a node."""
    if all(x.shape[d] == 1 for d in axes) or any(x.shape[d] == 0 for d in axes):   # no axes, size 1, empty
        return rw.reduce(rw.unary(x, "abs", FP32), op, axes, keepdim, FP32)
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape) if keepdim or d not in axes)
    return rw.emit("reduce", (x,), shape, FP32, op=op, axes=tuple(axes), keepdim=bool(keepdim), abs=True)


def _norm(rw: Rewriter, x: ir.Node, p: float, axes, keepdim: bool, dtype: DType) -> ir.Node:
    """(sum |x|^p)^(1/p) over `axes` as torch's kernel cases it: p = 2 sqrt of a sum of squares, 1 a sum of |x|,
    inf and -inf the largest and smallest |x|, 0 the count of nonzeros, any other p through pow (a negative p
    makes |0|^p inf and the norm 0, as in torch). fp32 inside; the result rounds once to `dtype`."""
    if p == math.inf or p == -math.inf:
        return keep_fp32_inside(rw.cast(_reduce_abs(rw, x, "max" if p > 0 else "min", axes, keepdim), dtype), x)
    if p == 1:
        return keep_fp32_inside(rw.cast(_reduce_abs(rw, x, "sum", axes, keepdim), dtype), x)
    if p == 0:
        return rw.reduce(rw.cast(rw.scalar(x, "ne", 0), FP32), "sum", axes, keepdim, dtype)
    if p == 2:
        total = rw.reduce(rw.unary(x, "square", FP32), "sum", axes, keepdim, FP32)
        return keep_fp32_inside(rw.unary(total, "sqrt", dtype), x)
    powers = rw.scalar(rw.unary(x, "abs", FP32), "pow", p, dtype=FP32)
    total = rw.reduce(powers, "sum", axes, keepdim, FP32)
    return keep_fp32_inside(rw.scalar(total, "pow", 1 / p, dtype=dtype), x)


def _float_result(rw: Rewriter, n) -> None:
    if not n.dtype.is_float:
        rw.fail(f"with result dtype {n.dtype.text} is not supported")


@rule("aten.linalg_vector_norm.default")
def _vector_norm(rw: Rewriter, n, a):
    _float_result(rw, n)
    x = a["input"]
    return _norm(rw, x, float(a["ord"]), dims_of(a["dim"], len(x.shape)), a["keepdim"], n.dtype)


@rule("aten.dist.default")
def _dist(rw: Rewriter, n, a):
    """The p-norm of the broadcast difference over every element."""
    _float_result(rw, n)
    diff = rw.binary("sub", a["input"], a["other"], FP32)
    return _norm(rw, diff, float(a["p"]), tuple(range(len(diff.shape))), False, n.dtype)


CDIST_MM_ELEMENTS = 1 << 22   # a [*, P, R, M] difference above this many elements: p = 2 through a matmul


@rule("aten._cdist_forward.default")
def _cdist(rw: Rewriter, n, a):
    """p-norms of the differences of every row of x1 [*, P, M] and x2 [*, R, M]: the broadcast difference
    [*, P, R, M] normed over M (more accurate than torch's matmul form, which it takes for p = 2 beyond 25 rows
    unless compute_mode is 2); p = 2 with compute_mode 1, or a difference too large to write, is torch's matmul
    form |x1|^2 + |x2|^2 - 2 x1 x2^T clamped at 0, with its cancellation."""
    _float_result(rw, n)
    x1, x2, p = a["x1"], a["x2"], float(a["p"])
    batch = tuple(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    rows, cols, m = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    if p == 2 and a["compute_mode"] != 2 and (a["compute_mode"] == 1 or
                                              math.prod(batch) * rows * cols * m > CDIST_MM_ELEMENTS):
        sq1 = rw.reduce(rw.unary(x1, "square", FP32), "sum", (len(x1.shape) - 1,), True, FP32)
        sq2 = rw.reduce(rw.unary(x2, "square", FP32), "sum", (len(x2.shape) - 1,), False, FP32)
        sq2 = rw.reshape(sq2, sq2.shape[:-1] + (1, cols))
        dots = mm._matmul(rw, rw.cast(x1, FP32), rw.permute(rw.cast(x2, FP32), _swap_last(len(x2.shape))), FP32)
        total = rw.binary("add", rw.binary("add", rw.scalar(dots, "mul", -2, dtype=FP32), sq1, FP32), sq2, FP32)
        return rw.unary(rw.scalar(total, "max", 0, dtype=FP32), "sqrt", n.dtype)
    left = rw.reshape(x1, x1.shape[:-1] + (1, m))
    right = rw.reshape(x2, x2.shape[:-2] + (1, cols, m))
    diff = rw.binary("sub", left, right, FP32)
    return _norm(rw, diff, p, (len(diff.shape) - 1,), False, n.dtype)


def _swap_last(rank: int) -> list[int]:
    return list(range(rank - 2)) + [rank - 1, rank - 2]


# -- sign and step functions -------------------------------------------------------------------------------
@rule("aten.copysign.Tensor", "aten.copysign.Scalar")
def _copysign(rw: Rewriter, n, a):
    """|x| with the sign of `other`. The sign of a tensor is read by comparisons: other is negative when
    min(other, 1 / other) < 0, which also holds for -0.0 (1 / -0.0 = -inf) and -inf (min is -inf); a NaN counts
    as positive (its sign bit is not observable here, where torch reads it)."""
    x, other = a["input"], a["other"]
    magnitude = rw.unary(x, "abs", FP32)
    if not isinstance(other, ir.Node):
        return rw.unary(magnitude, "neg") if math.copysign(1.0, other) < 0 else rw.cast(magnitude, n.dtype)
    inverse = rw.scalar(other, "div", 1, reverse=True, dtype=FP32)
    negative = rw.scalar(rw.binary("min", other, inverse, FP32), "lt", 0)
    return rw.where(negative, rw.unary(magnitude, "neg", FP32), magnitude, n.dtype)


@rule("aten.signbit.default")
def _signbit(rw: Rewriter, n, a):
    """x < 0, and -0.0 too, read as copysign reads a sign: min(x, 1 / x) < 0 (a NaN counts as positive)."""
    x = a["input"]
    if not rw.arg_dtypes[0].is_floating_point:
        return rw.scalar(x, "lt", 0)
    return rw.scalar(rw.binary("min", x, rw.scalar(x, "div", 1, reverse=True, dtype=FP32), FP32), "lt", 0)


@rule("aten.fmax.default", "aten.fmin.default")
def _fmax(rw: Rewriter, n, a):
    """max or min ignoring a NaN operand (NaN only if both are): the ALU's max and min propagate NaN, so a NaN
    operand selects the other one (a NaN is the value unequal to itself)."""
    x, y = a["input"], a["other"]
    op = "max" if n.op == "aten.fmax.default" else "min"
    if not n.dtype.is_float:
        return rw.binary(op, x, y)
    both = rw.binary(op, x, y, FP32)
    return rw.where(rw.binary("ne", x, x), y, rw.where(rw.binary("ne", y, y), x, both, FP32), n.dtype)


@rule("aten.heaviside.default", whole=True)
def _heaviside(rw: Rewriter, n, a):
    """`values` where x == 0, else x > 0 (NaN gives 0, as torch's kernel); torch's decomposition asks isnan."""
    x = a["input"]
    step = rw.cast(rw.scalar(x, "gt", 0), n.dtype)
    return rw.where(rw.scalar(x, "eq", 0), a["values"], step, n.dtype)


# -- structure ---------------------------------------------------------------------------------------------
@rule("aten.narrow_copy.default")
def _narrow_copy(rw: Rewriter, n, a):
    """narrow; the IR's values are never aliases, so the copy is the view."""
    x = a["input"]
    dim = dim_of(a["dim"], len(x.shape))
    start = a["start"] + x.shape[dim] if a["start"] < 0 else a["start"]
    return rw.slice(x, dim, start, start + a["length"])


COPY_VIEWS = ("alias_copy.default", "as_strided_copy.default", "expand_copy.default", "permute_copy.default",
              "split_with_sizes_copy.default", "squeeze_copy.default", "squeeze_copy.dim", "squeeze_copy.dims",
              "t_copy.default", "transpose_copy.int", "unsqueeze_copy.default", "view_copy.default")


def _as_view(view: str):
    def lower(rw: Rewriter, n, a):
        """The view's own rule (the `_copy` op has its schema; an IR value is never an alias)."""
        return pm_legalize[view](rw, n, a)
    return lower


for _op in COPY_VIEWS:
    base_rules = f"aten.{_op.replace('_copy.', '.')}"
    rule(f"aten.{_op}")(_as_view(base_rules))


@rule("aten.unbind_copy.int")
def _unbind_copy(rw: Rewriter, n, a):
    x = a["input"]
    dim = dim_of(a["dim"], len(x.shape))
    return [rw.reshape(rw.slice(x, dim, i, i + 1), shape) for i, (shape, _) in enumerate(n.attrs["outputs"])]


@rule("aten.prod.default", "aten.prod.dim_int")
def _prod(rw: Rewriter, n, a):
    """The product over the reduced dims, merged into one last axis: log2(n) steps each multiplying the first
    half by the second (an odd last element carried), in fp32 (the machine has no product reduction). The order
    differs from torch's, so an intermediate may overflow where torch's does not or the reverse (a product of
    huge and tiny values); a float result only (integer products exceed fp32's exact range)."""
    x = a["input"]
    if not n.dtype.is_float:
        rw.fail(f"with result dtype {n.dtype.text} is not supported: the machine multiplies in fp32")
    rank = len(x.shape)
    axes = dims_of(a.get("dim"), rank)
    if any(x.shape[d] == 0 for d in axes):
        return rw.filled(1.0, n.shape, n.dtype)
    if not axes:   # a 0-d tensor
        return rw.cast(x, n.dtype)
    kept = [d for d in range(rank) if d not in axes]
    merged = rw.reshape(rw.permute(x, kept + list(axes)),
                        tuple(x.shape[d] for d in kept) + (math.prod(x.shape[d] for d in axes),))
    last = len(merged.shape) - 1
    while merged.shape[last] > 1:
        size = merged.shape[last]
        half = size // 2
        paired = rw.binary("mul", rw.slice(merged, last, 0, half), rw.slice(merged, last, half, 2 * half), FP32)
        merged = rw.cat([paired, rw.slice(merged, last, 2 * half, size)], last, FP32) if size % 2 else paired
    return keep_fp32_inside(rw.reshape(rw.cast(merged, n.dtype), n.shape), x)


@rule("aten._pdist_forward.default")
def _pdist(rw: Rewriter, n, a):
    """p-norms of the differences of rows i < j, in torch's row-major order: the two rows of each pair gathered
    by constant indices, their difference normed over the last axis."""
    _float_result(rw, n)
    x = a["input"]
    first, second = torch.triu_indices(x.shape[0], x.shape[0], 1)
    diff = rw.binary("sub", take(rw, x, 0, rw.const(first, DType.INT32)),
                     take(rw, x, 0, rw.const(second, DType.INT32)), FP32)
    return _norm(rw, diff, float(a["p"]), (1,), False, n.dtype)


def _diagonal_view(rw: Rewriter, x: ir.Node, offset: int, dim1: int, dim2: int):
    """x with dim1 and dim2 moved last and cut to the rows and columns the diagonal crosses: (view, count), the
    diagonal running from the view's [0, 0] down and right."""
    rank = len(x.shape)
    d1, d2 = dim_of(dim1, rank), dim_of(dim2, rank)
    m = rw.permute(x, [d for d in range(rank) if d not in (d1, d2)] + [d1, d2])
    rows, cols = m.shape[-2:]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    count = max(0, min(rows - r0, cols - c0))
    return m, r0, c0, count


@rule("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(rw: Rewriter, n, a):
    """The rows the diagonal crosses, flattened: element i of the diagonal is at i * (width + 1), one slice
    with that step (the view has no diagonal stride)."""
    m, r0, c0, count = _diagonal_view(rw, a["input"], a["offset"], a["dim1"], a["dim2"])
    rank = len(m.shape)
    band = rw.slice(rw.slice(m, rank - 2, r0, r0 + count), rank - 1, c0, m.shape[-1])
    width = band.shape[-1]
    flat = rw.reshape(band, band.shape[:-2] + (count * width,))
    return rw.slice(flat, rank - 2, 0, (count - 1) * (width + 1) + 1, width + 1)


@rule("aten.diagonal_scatter.default")
def _diagonal_scatter(rw: Rewriter, n, a):
    """input with its diagonal replaced by src: a select by a constant diagonal mask between input and src's
    element i spread along row r0 + i (zero rows above and below), then the dims moved back."""
    x, src = a["input"], a["src"]
    m, r0, c0, count = _diagonal_view(rw, x, a["offset"], a["dim1"], a["dim2"])
    rows, cols = m.shape[-2:]
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    mask[torch.arange(count) + r0, torch.arange(count) + c0] = True
    batch = m.shape[:-2]
    spread = rw.expand(rw.reshape(src, batch + (count, 1)), batch + (count, cols))
    zeros = [rw.filled(0, batch + (k, cols), n.dtype) for k in (r0, rows - r0 - count)]
    placed = rw.cat([p for p in (zeros[0], spread, zeros[1]) if p.shape[-2]], len(m.shape) - 2, n.dtype)
    out = rw.where(rw.const(mask, DType.UINT8), placed, m, n.dtype)
    rank = len(x.shape)
    d1, d2 = dim_of(a["dim1"], rank), dim_of(a["dim2"], rank)
    order = [d for d in range(rank) if d not in (d1, d2)] + [d1, d2]
    return rw.permute(out, [order.index(d) for d in range(rank)])


def _reversed(rw: Rewriter, x: ir.Node, dim: int) -> ir.Node:
    """x along `dim` in reverse: a gather of the rows by a constant index for floats (exact moves), else a cat of
    one-wide slices (a view has no negative step)."""
    size = x.shape[dim]
    if x.dtype.is_float:
        return take(rw, x, dim, rw.const(torch.arange(size - 1, -1, -1), DType.INT32))
    if size > MAX_SLICES:
        rw.fail(f"of a {x.dtype.text} tensor along a dim of {size} is not supported: the gather moves float rows, "
                f"and a flip of {x.dtype.text} values is at most {MAX_SLICES} slices")
    return rw.cat([rw.slice(x, dim, i, i + 1) for i in range(size - 1, -1, -1)], dim, x.dtype)


@rule("aten.flip.default")
def _flip(rw: Rewriter, n, a):
    x = a["input"]
    for d in sorted({dim_of(d, len(x.shape)) for d in a["dims"]} if x.shape else ()):
        if x.shape[d] > 1:
            x = _reversed(rw, x, d)
    return x


@rule("aten.unfold.default", "aten.unfold_copy.default")
def _unfold(rw: Rewriter, n, a):
    """Windows of `size` every `step` along `dimension`, the window's positions a new last dim: position j of
    every window is one slice with step `step` from j; the slices stacked (a reshape when the windows tile the
    dim). Floats with wide overlapping windows are one gather of a constant [windows, size] index instead."""
    x, size, step = a["input"], a["size"], a["step"]
    if not x.shape:
        return rw.reshape(x, n.shape)
    d = dim_of(a["dimension"], len(x.shape))
    windows = n.shape[d]
    if step == size or windows == 1:
        cut = rw.slice(x, d, 0, (windows - 1) * step + size)
        split = rw.reshape(cut, x.shape[:d] + (windows, size) + x.shape[d + 1:])
        return rw.permute(split, [k for k in range(len(split.shape)) if k != d + 1] + [d + 1])
    if size > MAX_SLICES and x.dtype.is_float:
        index = torch.arange(windows)[:, None] * step + torch.arange(size)
        taken = take(rw, x, d, rw.const(index, DType.INT32))
        return rw.permute(taken, [k for k in range(len(taken.shape)) if k != d + 1] + [d + 1])
    if size > MAX_SLICES:
        rw.fail(f"of a {x.dtype.text} tensor with windows of {size} is not supported (at most {MAX_SLICES})")
    last = (windows - 1) * step
    shape = x.shape[:d] + (windows,) + x.shape[d + 1:] + (1,)
    return rw.cat([rw.reshape(rw.slice(x, d, j, j + last + 1, step), shape) for j in range(size)], len(x.shape),
                  x.dtype)


# -- products ----------------------------------------------------------------------------------------------
@rule("aten.addmv.default")
def _addmv(rw: Rewriter, n, a):
    """beta input + alpha mat @ vec: addmm's matmul and epilogue, with input as a column of the [n, 1] product."""
    bias = a["input"]
    if len(bias.shape) == 1:
        bias = rw.reshape(bias, bias.shape + (1,))
    scaled = a["alpha"] != 1 or a["beta"] not in (0, 1)
    out = mm._matmul(rw, a["mat"], rw.reshape(a["vec"], a["vec"].shape + (1,)), n.dtype,
                     lambda p, **arith: mm._scaled_add(rw, p, bias, a["beta"], a["alpha"], **arith), scaled)
    return rw.reshape(out, n.shape)


@rule("aten.addbmm.default")
def _addbmm(rw: Rewriter, n, a):
    """beta input + alpha sum over b of batch1[b] @ batch2[b]: one matmul contracting batch and k together,
    [n, B k] @ [B k, p] (the sum over the batch is part of the accumulation, as TensorE would do it)."""
    b1, b2 = a["batch1"], a["batch2"]
    batches, rows, k = b1.shape
    left = rw.reshape(rw.permute(b1, (1, 0, 2)), (rows, batches * k))
    right = rw.reshape(b2, (batches * k, b2.shape[-1]))
    scaled = a["alpha"] != 1 or a["beta"] not in (0, 1)
    return mm._matmul(rw, left, right, n.dtype,
                      lambda p, **arith: mm._scaled_add(rw, p, a["input"], a["beta"], a["alpha"], **arith), scaled)


@rule("aten._trilinear.default")
def _trilinear(rw: Rewriter, n, a):
    """F.bilinear's op: each input gets unit dims at its `expand` dims, the three broadcast products are summed
    over `sumdim` (fp32 products and sum, one rounding)."""
    factors = []
    for name, expand in (("i1", "expand1"), ("i2", "expand2"), ("i3", "expand3")):
        x = a[name]
        shape = list(x.shape)
        for d in sorted(a[expand]):
            shape.insert(d, 1)
        factors.append(rw.reshape(x, shape))
    product = rw.binary("mul", rw.binary("mul", factors[0], factors[1], FP32), factors[2], FP32)
    axes = tuple(dim_of(d, len(product.shape)) for d in a["sumdim"])   # none: no sum (not dims_of's "all")
    return keep_fp32_inside(rw.reduce(product, "sum", axes, False, n.dtype), product)


@rule("aten.repeat_interleave.Tensor")
def _repeat_interleave_index(rw: Rewriter, n, a):
    """The index that repeats i repeats[i] times, of a static length (output_size): index j is the count of
    running totals of repeats at most j. The totals are sums of a constant triangular mask times repeats, all in
    fp32 (exact below 2^24), so no scan is needed; the shape must be known, as torch's own output_size gives it."""
    repeats = a["repeats"]
    if len(repeats.shape) != 1:
        rw.fail("is supported for a 1-d repeats tensor only")
    size, out = repeats.shape[0], n.shape[0]
    if size * max(size, out) > 1 << 24:
        rw.fail(f"of {size} repeats into {out} is not supported: its [{out}, {size}] comparison is too large")
    upto = rw.const(torch.ones(size, size).tril().bool(), DType.UINT8)   # [i, k]: k <= i
    counts = rw.reshape(rw.cast(repeats, FP32), (1, size))
    totals = rw.reduce(rw.where(upto, counts, rw.filled(0.0, (size, size), FP32), FP32), "sum", (1,), False, FP32)
    positions = rw.const(torch.arange(out, dtype=torch.float32).reshape(out, 1), FP32)
    below = rw.binary("le", rw.reshape(totals, (1, size)), positions)
    return rw.reduce(rw.cast(below, FP32), "sum", (1,), False, n.dtype)


# -- gathers -----------------------------------------------------------------------------------------------
def _gather_along(rw: Rewriter, x: ir.Node, dim: int, index: ir.Node) -> ir.Node:
    """x[..., index[..., j, ...], ...] along `dim` (torch.gather): one gather of single elements of the flattened x
    by a flat index, index * stride(dim) plus a constant of the other coordinates' offsets (int32 index math,
    exact in fp32 below 2^24 elements; torch rejects negative indices, the gather faults on them)."""
    out_shape = index.shape
    if not x.shape:
        x, index = rw.reshape(x, (1,)), rw.reshape(index, (1,))
    rank, numel = len(x.shape), math.prod(x.shape)
    if numel > 1 << 24:
        rw.fail(f"of a tensor of {numel} elements is not supported: its flat index would pass 2^24, where the "
                "index math (in fp32) is no longer exact")
    dim = dim_of(dim, rank)
    strides = [math.prod(x.shape[d + 1:]) for d in range(rank)]
    offsets = sum(torch.arange(size).reshape([-1 if d == k else 1 for k in range(rank)]) * strides[d]
                  for d, size in enumerate(index.shape) if d != dim)
    flat = rw.scalar(rw.cast(index, DType.INT32), "mul", strides[dim], dtype=DType.INT32, index_bound=numel)
    if rank > 1:
        flat = rw.binary("add", flat, rw.const(torch.as_tensor(offsets).expand(index.shape), DType.INT32),
                         DType.INT32, index_bound=numel)
    return rw.reshape(take(rw, rw.reshape(x, (numel,)), 0, flat), out_shape)


@rule("aten.gather.default")
def _gather(rw: Rewriter, n, a):
    return _gather_along(rw, a["input"], a["dim"], a["index"])


@rule("aten.searchsorted.Tensor", "aten.searchsorted.Scalar", "aten.bucketize.Tensor", "aten.bucketize.Scalar")
def _search(rw: Rewriter, n, a):
    """The insertion points of values in sorted rows: the count of boundaries b with not(x <= b) (not(x < b) with
    right=True), as torch's binary search tests them, so a NaN value goes after every boundary; one broadcast
    compare and a sum over the boundaries (exact in fp32). In a sorted row that is the search's answer; a NaN
    boundary counts as below every value here, where torch's search counts it only when it reaches it (for values
    beyond the finite boundaries). `sorter` first sorts the rows by a gather."""
    bucketize = n.op.startswith("aten.bucketize")
    seq = a["boundaries"] if bucketize else a["sorted_sequence"]
    values = a["input"]
    if not isinstance(values, ir.Node):
        values = rw.scalar_const(float(values), FP32)
    if not bucketize and a["sorter"] is not None:
        seq = _gather_along(rw, seq, -1, a["sorter"])
    right = a["right"] or (not bucketize and a["side"] == "right")
    count = seq.shape[-1]
    column = rw.reshape(values, values.shape + (1,))
    rows = seq if len(seq.shape) == 1 else rw.reshape(seq, seq.shape[:-1] + (1, count))   # an n-d row per value row
    at_or_above = rw.binary("lt" if right else "le", column, rows)
    total = rw.reduce(rw.cast(at_or_above, FP32), "sum", (len(at_or_above.shape) - 1,), False, FP32)
    below = rw.scalar(total, "sub", count, reverse=True, dtype=FP32)
    return rw.reshape(rw.emit("cast", (below,), below.shape, n.dtype, integral=True), n.shape)   # a whole count
