"""legalize rules of the ops that address memory by strides, and scatters into views (issue 16): as_strided (and
as_strided_copy), as_strided_scatter, slice_scatter with any step, max_unpool1d/2d/3d (new_empty_strided is
legalize_rules.py's, with the other creation ops).

An IR value has no storage, only its elements in row-major order, so as_strided (which reads its input's storage)
needs the input's layout as eager had it: capture records each input's strides and storage offset from the fx
meta value for the LAYOUT_OPS (passes/graph/legalize_table.py). When that layout is dense (its elements fill
storage positions [offset, offset + numel) once each: contiguous, or any permutation of it), storage position p
holds the element whose layout position is p, so the result is a row gather of the flat input at a constant
index computed now with numpy-like torch index math (offset + sum_i idx_i * stride_i, overlaps allowed); a read
outside the input's elements (another view's storage, an unknown layout) is refused naming the op. The identity
is a reshape; of a constant (a parameter, whose layout may be a transpose), torch computes it now through the
same index (legalize does not evaluate these ops on the constant's contiguous copy). The layouts are the example
inputs': capture records the layout of each input such an op's argument derives from (but through a fresh tensor
with at most one dim above 1, whose layout is fixed: ConvNeXt's pooled features) (CaptureInfo.input_layouts,
kept in artifacts), and a call with other strides or storage offset is refused (trnc/api.py), as eager would read
other elements (the torch.compile backend never sees one: dynamo guards strides).

as_strided_scatter writes src at the same storage positions of a copy of the input, which in eager keeps the
input's strides and storage offset (measured: a transposed input, an input at offset 5); a dense layout maps
each position to an element as above: for each output element, a constant says whether a position writes it and
which src element, and the result is a select between the input and a gather of the flat src. A write outside
the input's elements (eager drops it in storage no element shows, or raises), a non-dense layout and overlapping
positions (eager's copy into an overlapping view has no defined order) are refused by name.

slice_scatter with step s: the span x[start : start + s * count] viewed [count, s] along the dim, its column 0
replaced by src (a cat), viewed back: movements only, exact for every dtype.

max_unpool: torch's decomposition spells the flat index in int64 arithmetic; taken whole instead, each (n, c)
plane is a scatter (passes/graph/legalize_scatter.py's one-hot scheme, mode 'last': torch's CPU loop writes in
order, the last duplicate wins) of the input plane into zeros of the output plane at the indices as they are;
an index outside the plane faults in the scatter's guard gather, as eager raises.

"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_scatter import _position, _scatter
from trnc.passes.graph.legalize_table import dim_of, rule, take

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter


def _positions(size, stride, offset: int) -> torch.Tensor:
    """The storage position of each element of a view (int64, of shape `size`): offset + sum_i idx_i * stride_i."""
    pos = torch.full(tuple(size), offset, dtype=torch.int64)
    for d, (s, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = s
        pos = pos + torch.arange(s, dtype=torch.int64).reshape(shape) * st
    return pos


def _element_at(rw: Rewriter, n, shape, layout) -> tuple[torch.Tensor, int]:
    """For a value of `shape` with `layout` (strides, storage offset): a table from storage position - offset to the
    element's row-major index, and the offset; refused when the layout is unknown or not dense."""
    if layout is None:
        rw.fail("of a value whose memory layout is unknown is not supported (it reads the value's storage)")
    strides, offset = layout
    numel = math.prod(shape)
    where = _positions(shape, strides, 0).reshape(-1)
    table = torch.full((numel,), -1, dtype=torch.int64)
    inside = bool(((where >= 0) & (where < numel)).all()) if numel else True
    if inside:
        table[where] = torch.arange(numel, dtype=torch.int64)
    if not inside or bool((table < 0).any()):
        rw.fail(f"of a value of shape {list(shape)} with strides {list(strides)} is not supported: its elements do "
                "not fill their storage once each, which a value of the IR cannot represent")
    return table, offset


def _layout(rw: Rewriter, n):
    layouts = n.attrs.get("layouts")
    return layouts[0] if layouts else None


@rule("aten.as_strided.default")
def _as_strided(rw: Rewriter, n, a):
    """The input's storage read at the view's positions: a gather of the flat input at a constant index."""
    x, size, stride = a["input"], tuple(a["size"]), tuple(a["stride"])
    table, base = _element_at(rw, n, x.shape, _layout(rw, n))
    offset = base if a.get("storage_offset") is None else a["storage_offset"]
    pos = _positions(size, stride, offset - base)
    numel = table.numel()
    if pos.numel() and bool(((pos < 0) | (pos >= numel)).any()):
        rw.fail(f"with size {list(size)}, stride {list(stride)}, storage offset {offset} of a {list(x.shape)} value "
                f"at storage offset {base} is not supported: it reads storage outside the value's elements")
    index = table[pos]
    if x.op == "const":   # computed now, exactly in the constant's own dtype (legalize leaves LAYOUT_OPS to the rule)
        return rw.const(rw.torch_value(x, rw.torch_dtype(x)).reshape(-1)[index], n.dtype)
    flat = rw.reshape(x, (numel,))
    if torch.equal(index.reshape(-1), torch.arange(index.numel())):   # the elements in order: a reshape
        return rw.reshape(rw.slice(flat, 0, 0, index.numel()), size)
    return take(rw, flat, 0, rw.const(index, DType.INT32))


@rule("aten.as_strided_scatter.default")
def _as_strided_scatter(rw: Rewriter, n, a):
    """A copy of the input (eager's keeps its strides and storage offset) with src written at the view's storage
    positions: select(written, gather(src), input), both constants saying where and which src element."""
    x, src, size, stride = a["input"], a["src"], tuple(a["size"]), tuple(a["stride"])
    table, base = _element_at(rw, n, x.shape, _layout(rw, n))
    offset = base if a.get("storage_offset") is None else a["storage_offset"]
    numel = table.numel()
    pos = _positions(size, stride, offset - base).reshape(-1)
    if pos.numel() and bool(((pos < 0) | (pos >= numel)).any()):
        rw.fail(f"with size {list(size)}, stride {list(stride)}, storage offset {offset} of a {list(x.shape)} input "
                f"at storage offset {base} is not supported: it writes storage outside the input's elements")
    if pos.unique().numel() != pos.numel():
        rw.fail(f"with size {list(size)}, stride {list(stride)} writes some elements twice: eager's copy into an "
                "overlapping view has no defined order")
    if not pos.numel():
        return rw.cast(x, n.dtype)
    element = table[pos]
    written = torch.zeros(numel, dtype=torch.bool)
    written[element] = True
    which = torch.zeros(numel, dtype=torch.int64)
    which[element] = torch.arange(pos.numel())
    if x.op == "const" and src.op == "const":
        out = rw.torch_value(x, rw.torch_dtype(x)).reshape(-1).clone()
        out[element] = rw.torch_value(src, rw.torch_dtype(src)).reshape(-1).to(out.dtype)
        return rw.const(out.reshape(x.shape), n.dtype)
    values = take(rw, rw.reshape(rw.cast(src, n.dtype), (pos.numel(),)), 0, rw.const(which, DType.INT32))
    mask = rw.const(written, DType.UINT8)
    return rw.reshape(rw.where(mask, values, rw.reshape(x, (numel,)), n.dtype), x.shape)


@rule("aten.slice_scatter.default")
def _slice_scatter(rw: Rewriter, n, a):
    """`input` with input[start:end:step] along `dim` replaced by `src`: the span viewed [count, step], column 0
    replaced by src (a cat), viewed back, between the slices around the span."""
    x, src = a["input"], rw.cast(a["src"], n.dtype)
    dim = dim_of(a["dim"], len(x.shape))
    size = x.shape[dim]
    start, end, step = slice(a["start"], a["end"], a["step"]).indices(size)   # clamped as Python slices are
    count = len(range(start, end, step))
    if count == 0:
        return rw.cast(x, n.dtype)
    x = rw.cast(x, n.dtype)
    span = min(size - start, step * count)
    rest = x.shape[dim + 1:]
    if step == 1:
        middle = src
    else:
        part = rw.slice(x, dim, start, start + span)
        if span < step * count:   # the last row of the [count, step] view runs past the end: pad, trim after
            pad = rw.filled(0, x.shape[:dim] + (step * count - span,) + rest, n.dtype)
            part = rw.cat([part, pad], dim, n.dtype)
        rows = rw.reshape(part, x.shape[:dim] + (count, step) + rest)
        first = rw.reshape(src, x.shape[:dim] + (count, 1) + rest)
        rows = rw.cat([first, rw.slice(rows, dim + 1, 1, step)], dim + 1, n.dtype)
        middle = rw.slice(rw.reshape(rows, x.shape[:dim] + (step * count,) + rest), dim, 0, span)
    pieces = [rw.slice(x, dim, 0, start), middle, rw.slice(x, dim, start + span, size)]
    return rw.cat([p for p in pieces if p.shape[dim]], dim, n.dtype)


@rule("aten.max_unpool2d.default", "aten.max_unpool3d.default", whole=True)
def _max_unpool(rw: Rewriter, n, a):
    """Each (n, c) plane's input scattered into zeros of the output plane at its flat indices (last one wins)."""
    x, indices = a["input"], a["indices"]
    spatial = 3 if n.op.startswith("aten.max_unpool3d") else 2
    out_shape = n.shape
    lead = x.shape[:-spatial]
    planes = math.prod(lead)
    size_in, size_out = math.prod(x.shape[-spatial:]), math.prod(out_shape[-spatial:])
    if tuple(indices.shape) != tuple(x.shape):
        rw.fail(f"with indices of shape {list(indices.shape)} for an input of shape {list(x.shape)} is not supported")
    if planes * size_in == 0:
        return rw.filled(0, out_shape, n.dtype)
    src = rw.reshape(x, (planes, size_in))
    pos = _position(rw, rw.reshape(indices, (planes, size_in)), size_out, False)
    zeros = rw.filled(0, (planes, size_out), n.dtype)
    out = _scatter(rw, zeros, 1, pos, src, "last", True, n.dtype)
    return rw.reshape(out, out_shape)
