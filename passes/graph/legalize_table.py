"""legalize's rule table: `rule` registers a rule for aten ops (and the few custom ops models ship, such as
transformers' grouped matmul) in `pm_legalize`; the rule modules
(passes/graph/legalize_rules.py and the ones it imports) fill it. Shared by them: the axis helpers, the
keep_fp32 marking of one op's intermediates and the row gather.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from trnc import ir
from trnc.dtypes import DTYPES
from trnc.isa.dtypes import DType

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

COMPARE_OPS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor"})
pm_legalize: dict[str, Callable] = {}
# The ops whose rule lowers them whole, to one fused trnc op, where torch's core decompositions would spell them
# out in smaller ops: capture keeps every overload of these out of its decomposition table.
pm_whole: set[str] = set()
# The ops that read their input's storage (as_strided): capture records each tensor input's layout for them
LAYOUT_OPS = frozenset({"aten.as_strided.default", "aten.as_strided_copy.default", "aten.as_strided_scatter.default"})


@dataclass(frozen=True)
class Unusable:
    """An output of a multi-output op that trnc does not compute; using it is an error."""

    what: str


def lowered(target) -> bool:
    """Whether capture takes an fx call target as an op: every aten operator (legalize refuses the ones without a
    rule by name), and the custom operators that have a rule."""
    return isinstance(target, torch._ops.OpOverload) and (target.namespace == "aten" or str(target) in pm_legalize)


def rule(*ops: str, whole: bool = False):
    def register(fn):
        for op in ops:
            pm_legalize[op] = fn
        if whole:
            pm_whole.update(ops)
        return fn
    return register


def dim_of(d: int, rank: int) -> int:
    return d + max(rank, 1) if d < 0 else d


def dims_of(dims, rank: int) -> tuple[int, ...]:
    """Normalized reduction axes; None or [] means every axis (torch's convention). A 0-d tensor has none: torch
    takes dim 0 or -1 of it as the tensor itself, so reducing over it is the identity."""
    if rank == 0:
        return ()
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return tuple(range(rank))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return tuple(sorted({dim_of(d, rank) for d in dims}))


# -- helpers several rule modules share ------------------------------------------------------------------
def keep_fp32_inside(result: ir.Node, *starts: ir.Node) -> ir.Node:
    """Mark the fp32 nodes between `starts` and `result` (all left out) `keep_fp32`: one torch op's intermediates,
    which auto_cast "all" would otherwise store in the low dtype, rounding where torch does not (the mean of a
    std over one fp16 value rounded to bf16 made x - mean nonzero; a mean rounded its sum, then the quotient)."""
    stack, seen = list(result.inputs), set(starts)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.dtype is DType.FP32:
            n.attrs["keep_fp32"] = True
        stack.extend(n.inputs)
    return result


# the integer dtypes a float converts to as torch converts (truncated), by width; int64 is held as int32, which
# cannot hold what torch gives beyond int32's range
TRUNCATED_BITS = {torch.int32: 32, torch.int16: 16, torch.int8: 8, torch.uint8: 8}


def truncated(rw: Rewriter, x: ir.Node, target: torch.dtype) -> ir.Node:
    """Float x converted to integer `target` as torch converts on the CPU (measured on x86, scalar and vector
    paths alike): toward zero through int32, NaN and values outside int32 giving INT_MIN, then the low bits for
    the narrower types (int16, int8 and uint8 wrap). Every step is exact in fp32: trunc, a compare, fmod by 2^k."""
    fp32 = DType.FP32
    t = rw.unary(x, "trunc", fp32)
    outside = rw.binary("or", rw.binary("ne", t, t),
                        rw.binary("or", rw.scalar(t, "ge", 2.0 ** 31), rw.scalar(t, "lt", -2.0 ** 31)))
    bits = TRUNCATED_BITS[target]
    if bits == 32:
        v = rw.where(outside, rw.scalar_const(-2.0 ** 31, fp32), t, fp32)
    else:
        m = 2.0 ** bits
        low = 0.0 if target is torch.uint8 else -m / 2
        inside = rw.where(outside, rw.scalar_const(0.0, fp32), t, fp32)       # INT_MIN's low bits are 0
        r = rw.scalar(inside, "fmod", m, dtype=fp32)
        v = rw.where(rw.scalar(r, "lt", low), rw.scalar(r, "add", m, dtype=fp32),
                     rw.where(rw.scalar(r, "ge", low + m), rw.scalar(r, "sub", m, dtype=fp32), r, fp32), fp32)
    return keep_fp32_inside(rw.emit("cast", (v,), v.shape, DTYPES[target], integral=True), x)   # auto_cast "all"


def index_tensor(rw: Rewriter, index: ir.Node, size: int, wrap: bool) -> ir.Node:
    """An int32 index. `wrap`: negative indices count from the end, as tensor indexing (x[i], take) does in torch;
    else they stay negative, and the gather faults on them as embedding and index_select raise in torch."""
    if index.op == "const":
        value = rw.torch_value(index, torch.int64)
        return rw.const(torch.where(value < 0, value + size, value) if wrap else value, DType.INT32)
    index = rw.cast(index, DType.INT32)
    if not wrap:
        return index
    wrapped = rw.scalar(index, "add", size, dtype=DType.INT32, index_bound=size)
    return rw.where(rw.scalar(index, "lt", 0), wrapped, index, DType.INT32)


def _exact_in_fp32(rw: Rewriter, x: ir.Node) -> bool:
    return x.op == "const" and bool((rw.torch_value(x, torch.int64).abs() <= 2 ** 24).all())


def take(rw: Rewriter, x: ir.Node, dim: int, index: ir.Node, wrap: bool = False) -> ir.Node:
    """x with axis `dim` replaced by the axes of `index` (x.index_select generalized): one row gather."""
    rank = len(x.shape)
    rows = rw.permute(x, (dim,) + tuple(d for d in range(rank) if d != dim))
    rest = rows.shape[1:]
    table = rw.reshape(rows, (rows.shape[0], math.prod(rest)))
    if not table.dtype.is_float:   # gather tables are float: 8-bit values, and int32 up to 2^24, convert exactly
        if table.dtype is DType.INT32 and not _exact_in_fp32(rw, x):
            rw.fail("is not supported on an int32 tensor unless it is a constant of values within +-2^24 "
                    "(the row gather moves float rows)")
        table = rw.cast(table, DType.FP32)
    index = index_tensor(rw, index, x.shape[dim], wrap)
    gathered = rw.emit("gather", (table, index), index.shape + table.shape[1:], table.dtype)
    out = rw.cast(rw.reshape(gathered, index.shape + rest), x.dtype)
    b = len(index.shape)
    return rw.permute(out, tuple(range(b, b + dim)) + tuple(range(b)) + tuple(range(b + dim, b + len(rest))))
