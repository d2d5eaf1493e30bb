"""legalize rules of arg-reductions (issue 16): argmax, argmin, max/min with their indices;
built from the existing trnc ops (registered in passes/graph/legalize_table.py's `pm_legalize`).

Arg-reductions: the machine has no index-tracking reduction, so an index is found by compare and select. Over
the reduced axis, m = max(x) (NaN if the row holds one: the ALU's max propagates NaN), the hits are the
elements equal to m, or NaN (a NaN row's hits are its NaNs: NaN compares unequal to everything), each hit
selects its index from an iota constant and every other element the axis size, and the min of these is the
first index of the extreme value: torch's answer, ties to the first, a NaN the extreme and its first index
winning. Indices below 2^24 are exact in fp32, and the min of a select of exact values is exact.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_table import dim_of, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
EXACT_FP32 = 2 ** 24   # integers up to this magnitude are exact in fp32


def _iota(rw: Rewriter, size: int, axis: int, rank: int) -> ir.Node:
    """0, 1, ..., size - 1 along `axis` of a rank-`rank` fp32 constant, size 1 elsewhere (it broadcasts)."""
    shape = [1] * rank
    shape[axis] = size
    return rw.const(torch.arange(size, dtype=torch.float32).reshape(shape), FP32)


def _to_int(rw: Rewriter, x: ir.Node, dtype: DType) -> ir.Node:
    """x, whose values are integers within 2^24 by construction, converted to the integer `dtype`: exactly, so
    the kernels take it (attr `integral`), where a float-to-int cast of other values rounds where torch truncates."""
    return x if x.dtype is dtype else rw.emit("cast", (x,), x.shape, dtype, integral=True)


def _arg_extreme(rw: Rewriter, x: ir.Node, axis: int, op: str, keepdim: bool, index_dtype: DType):
    """(the extreme values with the reduced axis kept, the first index of each as `index_dtype`)."""
    size = x.shape[axis]
    if size > EXACT_FP32:
        rw.fail(f"over an axis of {size} elements is not supported: indices above 2^24 are not exact in fp32")
    m = rw.reduce(x, op, (axis,), True, x.dtype)
    hits = rw.binary("eq", x, m)
    if x.dtype.is_float:
        hits = rw.binary("or", hits, rw.binary("ne", x, x))
    shape = tuple(s for d, s in enumerate(x.shape) if keepdim or d != axis)
    if size == 1:
        return m, rw.filled(0, shape, index_dtype)
    candidates = rw.where(hits, _iota(rw, size, axis, len(x.shape)), rw.scalar_const(float(size), FP32), FP32)
    return m, _to_int(rw, rw.reduce(candidates, "min", (axis,), keepdim, FP32), index_dtype)


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
