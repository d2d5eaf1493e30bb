"""legalize rules of segment reductions and embedding bags (issue 16): aten.segment_reduce (by lengths or offsets;
sum, mean, max, min, prod; `initial`, `axis`, `unsafe`) and aten._embedding_bag / _embedding_bag_forward_only
(modes sum, mean, max; offsets, include_last_offset, per_sample_weights, padding_idx), built from the existing
trnc ops (registered in passes/graph/legalize_table.py's `pm_legalize`).

The segment boundaries are data, but the number of segments (bags) is static, so one scheme serves both: the
segment starts and ends as fp32 [.., S] (offsets as they are; lengths through their prefix sums, one matmul by
the 0/1 triangle), a membership mask M[.., s, j] = start_s <= j < end_s from a compare with an iota, and a
reduction over j of the data selected by M (the others the reduction's identity: 0, 1, -inf or inf; a sum
selects, never multiplies by the mask, as a NaN or inf of another segment times 0 would be NaN). Boundaries are
integers within the reduced axis's size, exact in fp32 (2^24). Each one passes through a row gather of zeros of
size + 1 whose value is added to it, so a negative length, an offset or end outside the axis, offsets that go
back (torch raises there) are the gather's execution fault, as is, without `unsafe`, lengths whose sum is not
the axis size (torch's check). The mask is refused past MAX_MASK elements.

Numerics: everything is fp32, rounded once to the output dtype. Max, min and NaN are exact (eager's loops keep a
NaN once met, as the machine's max and min do); sums and means add in another order than eager's left-to-right
loop (eager adds `initial` first, we last), so they differ by the summation error, |error| <= (m + 1) u
sum |x| for a segment of m elements, u = 2^-24 (and eager's own rounding at bf16 / fp16); prod multiplies in
halving steps, the same bound relative to the product.

Embedding bags gather the rows (the gather faults on an index outside the table, as torch raises) and reduce them
per bag with the same mask, less the entries equal to padding_idx. torch's CPU kernels (float, half, bfloat16;
measured) put the indices after the last offset with include_last_offset into the last bag for its count and
its max, but leave them out of the sum when no padding_idx is given (its fast path); mean divides that sum by
the count that includes them. Both are reproduced. A max bag is eager's loop `if first or w > cur: cur = w`: the
first entry if it is NaN, else the max of the entries that are not NaN; an empty bag gives 0 in every mode.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_index import EXACT_FP32, _iota, _prefix_sums, _to_int, _triangle, exact_index
from trnc.passes.graph.legalize_scatter import _product
from trnc.passes.graph.legalize_table import Unusable, dim_of, keep_fp32_inside, rule, take

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
MAX_MASK = 1 << 24   # elements of the selected data [.., S, N, ..] past which a segment reduction is refused
IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


def _guarded(rw: Rewriter, value: ir.Node, size: int) -> ir.Node:
    """fp32 `value` (integers, exact when in range) plus a row gather of zeros [size + 1] by it: the gather faults
    where a value lies outside [0, size], as torch raises on such lengths or offsets."""
    index = value if not value.dtype.is_float else _to_int(rw, value, DType.INT32, size)
    guard = take(rw, rw.const(torch.zeros(size + 1), FP32), 0, index)
    return exact_index(rw.binary("add", rw.cast(value, FP32), guard, FP32))


def _members(rw: Rewriter, starts: ir.Node, ends: ir.Node, size: int) -> ir.Node:
    """The mask [.., S, size]: start_s <= j < end_s (starts and ends fp32 [.., S], exact integers)."""
    rank = len(starts.shape) + 1
    j = exact_index(_iota(rw, size, rank - 1, rank))
    starts = rw.reshape(starts, starts.shape + (1,))
    ends = rw.reshape(ends, ends.shape + (1,))
    return rw.binary("and", rw.binary("le", starts, j), rw.binary("lt", j, ends))


def _check_size(rw: Rewriter, shape) -> None:
    if math.prod(shape) > MAX_MASK:
        rw.fail(f"is not supported at this size: its masked data {list(shape)} would pass {MAX_MASK} elements")


# -- segment_reduce ----------------------------------------------------------------------------------------
def _bounds(rw: Rewriter, a, lead: tuple, size: int):
    """(starts, ends, lengths), fp32 [*lead, S], from the lengths or the offsets (guarded as the docstring says)."""
    if a["lengths"] is not None:
        lengths = a["lengths"]
        if tuple(lengths.shape[:-1]) != lead:
            rw.fail(f"takes lengths of shape {list(lead)} + [segments]; got {list(lengths.shape)}")
        count = lengths.shape[-1]
        if count * size > EXACT_FP32:
            rw.fail(f"with {count} segments over an axis of {size} is not supported: the ends would pass 2^24")
        lengths = _guarded(rw, rw.cast(lengths, DType.INT32), size)
        ends = exact_index(_guarded(rw, _prefix_sums(rw, lengths, _triangle(rw, count)), size))
        starts = exact_index(rw.binary("sub", ends, lengths, FP32))
        if not a["unsafe"] and count:   # torch checks that the lengths sum to the axis size
            total = rw.slice(ends, len(lead), count - 1, count)
            short = _to_int(rw, rw.scalar(total, "sub", float(size), reverse=True, dtype=FP32), DType.INT32, size)
            ends = rw.binary("add", ends, take(rw, rw.const(torch.zeros(1), FP32), 0, short), FP32)
        return starts, exact_index(ends), lengths
    offsets = a["offsets"]
    if offsets is None:
        rw.fail("needs lengths or offsets (indices are not supported, as in torch)")
    if tuple(offsets.shape[:-1]) != lead or offsets.shape[-1] < 1:
        rw.fail(f"takes offsets of shape {list(lead)} + [segments + 1]; got {list(offsets.shape)}")
    offsets = _guarded(rw, rw.cast(offsets, DType.INT32), size)
    count = offsets.shape[-1] - 1
    starts = rw.slice(offsets, len(lead), 0, count)
    ends = rw.slice(offsets, len(lead), 1, count + 1)
    lengths = _guarded(rw, rw.binary("sub", ends, starts, FP32), size)   # offsets that go back fault
    return starts, rw.binary("add", starts, lengths, FP32), lengths


@rule("aten.segment_reduce.default")
def _segment_reduce(rw: Rewriter, n, a):
    x, reduce = a["data"], a["reduce"]
    if reduce not in IDENTITY:
        rw.fail(f"with reduce {reduce!r} is not supported")
    if not n.dtype.is_float:
        rw.fail("is supported on floating tensors only (as in torch)")
    if a.get("indices") is not None:
        rw.fail("with indices is not supported (torch implements lengths and offsets only)")
    axis = dim_of(a["axis"], len(x.shape))
    lead, size, rest = x.shape[:axis], x.shape[axis], x.shape[axis + 1:]
    if size > EXACT_FP32:
        rw.fail(f"over an axis of {size} elements is not supported: positions above 2^24 are not exact in fp32")
    starts, ends, lengths = _bounds(rw, a, tuple(lead), size)
    count = starts.shape[-1]
    _check_size(rw, lead + (count, size) + rest)
    ones = (1,) * len(rest)
    mask = rw.reshape(_members(rw, starts, ends, size), lead + (count, size) + ones)
    data = rw.reshape(rw.cast(x, FP32), lead + (1, size) + rest)
    picked = rw.where(mask, data, rw.scalar_const(IDENTITY[reduce], FP32), FP32)
    if reduce == "prod":
        got = rw.reshape(_product(rw, picked, axis + 1), lead + (count,) + rest)
    else:
        got = rw.reduce(picked, "sum" if reduce == "mean" else reduce, (axis + 1,), False, FP32)
    initial = a["initial"]
    if initial is not None:   # torch converts it to the data's dtype first
        initial = torch.tensor(float(initial), dtype=torch.float64).to(rw.torch_dtype(x)).item()
        op = {"sum": "add", "mean": "add", "prod": "mul", "max": "max", "min": "min"}[reduce]
        got = rw.scalar(got, op, initial, dtype=FP32)
    if reduce == "mean":
        lengths = rw.reshape(lengths, lead + (count,) + ones)
        empty = math.nan if initial is None else initial
        got = rw.where(rw.scalar(lengths, "gt", 0.5), rw.binary("div", got, lengths, FP32),
                       rw.scalar_const(empty, FP32), FP32)
    return keep_fp32_inside(rw.cast(got, n.dtype), x)


# -- embedding_bag -----------------------------------------------------------------------------------------
@rule("aten._embedding_bag_forward_only.default", "aten._embedding_bag.default")
def _embedding_bag(rw: Rewriter, n, a):
    weight, indices, offsets = a["weight"], a["indices"], a["offsets"]
    mode, psw, last, padding = a["mode"], a["per_sample_weights"], a["include_last_offset"], a["padding_idx"]
    if mode not in (0, 1, 2):
        rw.fail(f"with mode {mode} is not supported")
    if psw is not None and mode != 0:
        rw.fail("takes per_sample_weights in mode 'sum' only (as in torch)")
    if len(indices.shape) != 1 or len(offsets.shape) != 1 or len(weight.shape) != 2:
        rw.fail("takes 1-d indices and offsets and a 2-d weight")
    (shape, dtype) = n.attrs["outputs"][0]
    count, width = indices.shape[0], weight.shape[1]
    bags = offsets.shape[0] - 1 if last else offsets.shape[0]
    if count > EXACT_FP32:
        rw.fail(f"with {count} indices is not supported: positions above 2^24 are not exact in fp32")
    _check_size(rw, (bags, count, width))
    unused = [Unusable("offset2bag"), Unusable("bag_size"), Unusable("max_indices")]
    if bags == 0:
        return [rw.filled(0, shape, dtype)] + unused
    bounds = _guarded(rw, rw.cast(offsets, DType.INT32), count)
    starts = rw.slice(bounds, 0, 0, bags)
    end = rw.scalar_const(float(count), FP32)
    ends = rw.cat([rw.slice(bounds, 0, 1, bags), rw.reshape(end, (1,))], 0, FP32)
    ends = exact_index(rw.binary("add", starts, _guarded(rw, rw.binary("sub", ends, starts, FP32), count), FP32))
    members = _members(rw, starts, ends, count)   # [bags, count]
    if last and padding is not None and padding < 0 and mode != 2:   # the sum leaves out the tail (see above)
        value_ends = rw.slice(bounds, 0, 1, bags + 1)
        summed = _members(rw, starts, value_ends, count)
    else:
        summed = members
    if padding is not None and padding >= 0:
        valid = rw.reshape(rw.scalar(rw.cast(indices, FP32), "ne", float(padding)), (1, count))
        members, summed = rw.binary("and", members, valid), rw.binary("and", summed, valid)
    rows = rw.cast(take(rw, weight, 0, indices), FP32)   # [count, width]
    if psw is not None:
        rows = rw.binary("mul", rows, rw.reshape(rw.cast(psw, FP32), (count, 1)), FP32)
    rows = rw.reshape(rows, (1, count, width))
    sizes = rw.reduce(rw.cast(members, FP32), "sum", (1,), True, FP32)   # [bags, 1]
    nonempty = rw.scalar(exact_index(sizes), "gt", 0.5)
    zero = rw.scalar_const(0.0, FP32)
    members3, summed3 = rw.reshape(members, (bags, count, 1)), rw.reshape(summed, (bags, count, 1))
    if mode == 2:
        nan = rw.binary("ne", rows, rows)
        plain = rw.where(rw.binary("and", members3, rw.scalar(nan, "eq", 0)), rows,
                         rw.scalar_const(-math.inf, FP32), FP32)
        best = rw.reduce(plain, "max", (1,), False, FP32)
        position = exact_index(_iota(rw, count, 1, 3))
        beyond = rw.scalar_const(float(count), FP32)
        first = rw.reduce(rw.where(members3, position, beyond, FP32), "min", (1,), False, FP32)
        first_nan = rw.reduce(rw.where(rw.binary("and", members3, nan), position, beyond, FP32), "min", (1,), False,
                              FP32)
        got = rw.where(rw.binary("eq", exact_index(first), exact_index(first_nan)),
                       rw.scalar_const(math.nan, FP32), best, FP32)
    else:
        got = rw.reduce(rw.where(summed3, rows, zero, FP32), "sum", (1,), False, FP32)
        if mode == 1:
            got = rw.binary("div", got, rw.scalar(sizes, "max", 1.0, dtype=FP32), FP32)
    out = rw.where(nonempty, got, zero, FP32)
    return [keep_fp32_inside(rw.cast(out, dtype), weight)] + unused
