"""legalize rules of sorting (issue 16): sort, argsort, msort, topk, kthvalue, median, nanmedian and mode; built
from the existing trnc ops (registered in passes/graph/legalize_table.py's `pm_legalize`).

Rank counting: along the sorted axis (another axis is swapped to the end and back), element i's place is the
number of elements j that sort before it, one broadcast comparison of the row with itself ([..., n, n]) and a
sum, exact in fp32. j sorts before i when its key is smaller (larger descending) or the keys tie and j's tie
key is smaller; the key is x with NaN read as +inf, the tie key the index plus n for a NaN (ascending: NaN
after +inf; descending: before it, the index plus n for a non-NaN), so the order is torch's: NaN the largest,
equal elements in input order (stable; eager's CPU sort is stable in practice, and every order is a valid
answer of an unstable sort). The ranks are a permutation, so output place r takes the one element of rank r:
a one-hot compare of the ranks with an iota and a max over the row of the selected value (-inf elsewhere) and of
its index. The max selects, it computes nothing: values move exactly (-0.0 keeps its sign, a NaN stays NaN),
in fp32, where int32 values within 2^24 (the call refuses larger ones), bf16 and 8-bit values are exact.
topk and kthvalue take the first k places (or the k-th) of the sorted order, so only [.., k, n] one-hots.

Bitonic network: rank counting is n^2 work per row in one pass of a few fused kernels; past RANK_MAX elements
(or a comparison of more than MAX_PAIRS elements) the rows sort by a bitonic network instead, n log2(n)^2 / 4
compare-exchanges in log2(N)(log2(N) + 1) / 2 passes (N the row padded to a power of two): each pass views the
row as [..., N / 2j, 2, j], compares the two halves' (key, tie key) pairs, and puts back the smaller and the
larger by two selects and a cat; the same order (tie keys are distinct, so it is total). Rows past
MAX_NETWORK elements are refused.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_index import EXACT_FP32, _to_int
from trnc.passes.graph.legalize_table import dim_of, keep_fp32_inside, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
RANK_MAX = 256              # rank counting up to this many elements along the axis, the bitonic network past it
MAX_PAIRS = 1 << 22         # and while its [..., n, n] comparison holds at most this many elements
MAX_NETWORK = 1 << 16       # the network's row (padded to a power of two)
MAX_NETWORK_ELEMENTS = 1 << 24
MAX_MODE_PAIRS = 1 << 24     # mode's [..., n, n] comparison of equal elements


def _to_last(rw: Rewriter, x: ir.Node, dim: int) -> tuple[ir.Node, list[int]]:
    """x with `dim` swapped with the last axis, and the swap (its own inverse)."""
    swap = list(range(len(x.shape)))
    swap[dim], swap[-1] = swap[-1], swap[dim]
    return rw.permute(x, swap), swap


def _ranked(rw: Rewriter, x: ir.Node, descending: bool) -> ir.Node:
    """The place of each element of x [..., n] (fp32) in its row's sorted order, fp32 [..., n]."""
    n = x.shape[-1]
    index = torch.arange(n, dtype=torch.float32)
    if x.dtype.is_float:
        nan = rw.binary("ne", x, x)
        key = rw.where(nan, rw.scalar_const(math.inf, FP32), x, FP32)
        late, early = rw.const(index + n, FP32), rw.const(index, FP32)
        tie = rw.where(nan, early, late, FP32) if descending else rw.where(nan, late, early, FP32)
    else:
        key, tie = x, rw.const(index, FP32)
    shape = x.shape[:-1]
    key_i, key_j = rw.reshape(key, shape + (n, 1)), rw.reshape(key, shape + (1, n))
    tie_i, tie_j = rw.reshape(tie, tie.shape[:-1] + (n, 1)), rw.reshape(tie, tie.shape[:-1] + (1, n))
    first = rw.binary("gt" if descending else "lt", key_j, key_i)
    before = rw.binary("or", first, rw.binary("and", rw.binary("eq", key_j, key_i), rw.binary("lt", tie_j, tie_i)))
    return rw.reduce(rw.cast(before, FP32), "sum", (len(shape) + 1,), False, FP32)


def _places(rw: Rewriter, x: ir.Node, rank: ir.Node, places: list[int]):
    """(values, indices) fp32 [..., len(places)]: the elements of x [..., n] whose ranks are `places`."""
    n = x.shape[-1]
    shape = x.shape[:-1]
    wanted = rw.const(torch.tensor(places, dtype=torch.float32).reshape(len(places), 1), FP32)
    hit = rw.binary("eq", rw.reshape(rank, shape + (1, n)), wanted)
    axis = (len(shape) + 1,)
    values = rw.reduce(rw.where(hit, rw.reshape(x, shape + (1, n)), rw.scalar_const(-math.inf, FP32), FP32), "max",
                       axis, False, FP32)
    iota = rw.const(torch.arange(n, dtype=torch.float32), FP32)
    indices = rw.reduce(rw.where(hit, iota, rw.scalar_const(-1.0, FP32), FP32), "max", axis, False, FP32)
    return values, indices


def _pair_before(rw: Rewriter, key_a, tie_a, key_b, tie_b, descending: bool) -> ir.Node:
    """a sorts before b: its key smaller (larger descending), or the keys equal and its tie key smaller."""
    first = rw.binary("gt" if descending else "lt", key_a, key_b)
    return rw.binary("or", first, rw.binary("and", rw.binary("eq", key_a, key_b), rw.binary("lt", tie_a, tie_b)))


def _bitonic(rw: Rewriter, x: ir.Node, descending: bool):
    """(values, indices) fp32 [..., n] of x [..., n] (fp32) sorted by a bitonic network: the row padded to N = 2^m
    with elements that sort after every other (key +inf, -inf descending, tie keys from 2n), then for each block
    size k = 2, 4, ..., N and distance j = k/2, ..., 1 a compare-exchange of elements i and i + j (the row viewed
    as [..., N / 2j, 2, j]), in ascending order where i & k is 0 and descending elsewhere. Only (key, tie key)
    travel: the tie key says which elements were NaN and their index."""
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    size = 1 << (n - 1).bit_length()
    if size > MAX_NETWORK or rows * size > MAX_NETWORK_ELEMENTS:
        rw.fail(f"over an axis of {n} elements ({rows} rows) is not supported: trnc's sorting network takes rows "
                f"up to {MAX_NETWORK} elements and {MAX_NETWORK_ELEMENTS} elements in all")
    shape = x.shape[:-1]
    index = torch.arange(n, dtype=torch.float32)
    if x.dtype.is_float:
        nan = rw.binary("ne", x, x)
        key = rw.where(nan, rw.scalar_const(math.inf, FP32), x, FP32)
        late, early = rw.const(index + n, FP32), rw.const(index, FP32)
        tie = rw.where(nan, early, late, FP32) if descending else rw.where(nan, late, early, FP32)
    else:
        key, tie = x, rw.expand(rw.const(index, FP32), x.shape)
    if size > n:
        pad = shape + (size - n,)
        key = rw.cat([key, rw.filled(-math.inf if descending else math.inf, pad, FP32)], len(shape), FP32)
        tie = rw.cat([tie, rw.expand(rw.const(torch.arange(2 * n, 2 * n + size - n, dtype=torch.float32), FP32),
                                     pad)], len(shape), FP32)
    axis = len(shape) + 1
    k = 2
    while k <= size:
        j = k // 2
        while j >= 1:
            view = shape + (size // (2 * j), 2, j)
            key, tie = rw.reshape(key, view), rw.reshape(tie, view)
            ka, kb = rw.slice(key, axis, 0, 1), rw.slice(key, axis, 1, 2)
            ta, tb = rw.slice(tie, axis, 0, 1), rw.slice(tie, axis, 1, 2)
            swap = _pair_before(rw, kb, tb, ka, ta, descending)
            if k < size:   # the blocks whose bit k is set sort the other way
                pos = torch.arange(size).reshape(size // (2 * j), 2, j)[:, :1, :]
                swap = rw.binary("xor", swap, rw.const((pos & k) != 0, DType.UINT8))
            key = rw.cat([rw.where(swap, kb, ka, FP32), rw.where(swap, ka, kb, FP32)], axis, FP32)
            tie = rw.cat([rw.where(swap, tb, ta, FP32), rw.where(swap, ta, tb, FP32)], axis, FP32)
            j //= 2
        k *= 2
    key, tie = rw.reshape(key, shape + (size,)), rw.reshape(tie, shape + (size,))
    key, tie = rw.slice(key, len(shape), 0, n), rw.slice(tie, len(shape), 0, n)
    late = rw.scalar(tie, "ge", float(n))
    idx = rw.where(late, rw.scalar(tie, "sub", float(n), dtype=FP32), tie, FP32)
    if not x.dtype.is_float:
        return key, idx
    nan = rw.scalar(tie, "lt", float(n)) if descending else late   # the NaNs' tie keys: below n descending
    return rw.where(nan, rw.scalar_const(math.nan, FP32), key, FP32), idx


def _select(rw: Rewriter, x: ir.Node, dim, descending: bool, places, value_dtype, index_dtype, keepdim: bool = True):
    """(values as value_dtype, indices as index_dtype) of the elements at `places` (a list, or None for all) of x's
    sorted order along `dim`, in their place order along `dim` (keepdim False with one place drops the axis). A
    None dtype skips that output. Rank counting for rows up to RANK_MAX elements, else the bitonic network."""
    rank = len(x.shape)
    if rank == 0:
        x = rw.reshape(x, (1,))
    dim = dim_of(dim, max(rank, 1))
    size = x.shape[dim]
    places = list(range(size)) if places is None else places
    if size == 1 or not places:   # nothing to compare: the row itself (or nothing)
        vals = rw.slice(x, dim, 0, len(places))
        idx = rw.filled(0, vals.shape, index_dtype) if index_dtype is not None else None
    else:
        if x.dtype is DType.INT32 and x.op == "const" and \
                bool((rw.torch_value(x, torch.int64).abs() > 2 ** 24).any()):
            rw.fail("of an int32 constant with values beyond 2^24 is not supported: the machine compares in fp32")
        moved, swap = _to_last(rw, rw.cast(x, FP32), dim)
        rows = math.prod(moved.shape[:-1])
        if size <= RANK_MAX and rows * size * size <= MAX_PAIRS:
            vals, idx = _places(rw, moved, _ranked(rw, moved, descending), places)
        else:
            vals, idx = _bitonic(rw, moved, descending)
            if places != list(range(size)):
                last = len(moved.shape) - 1
                vals = rw.cat([rw.slice(vals, last, p, p + 1) for p in places], last, FP32)
                idx = rw.cat([rw.slice(idx, last, p, p + 1) for p in places], last, FP32)
        vals, idx = rw.permute(vals, swap), rw.permute(idx, swap)
        if value_dtype is not None:   # integers move exactly in fp32 (within 2^24), and convert back exactly
            vals = keep_fp32_inside(rw.cast(vals, x.dtype), x) if x.dtype.is_float else \
                _to_int(rw, keep_fp32_inside(vals, x), x.dtype, EXACT_FP32)
        if index_dtype is not None:
            idx = _to_int(rw, keep_fp32_inside(idx, x), index_dtype, size)
    out_shape = x.shape[:dim] + ((len(places),) if keepdim else ()) + x.shape[dim + 1:]
    if rank == 0:
        out_shape = ()
    vals = rw.reshape(rw.cast(vals, value_dtype), out_shape) if value_dtype is not None else None
    idx = rw.reshape(idx, out_shape) if index_dtype is not None else None
    return vals, idx


@rule("aten.sort.default", "aten.sort.stable")
def _sort(rw: Rewriter, n, a):
    (_, value_dtype), (_, index_dtype) = n.attrs["outputs"]
    return list(_select(rw, a["input"], a["dim"], bool(a["descending"]), None, value_dtype, index_dtype))


@rule("aten.argsort.default", "aten.argsort.stable")
def _argsort(rw: Rewriter, n, a):
    return _select(rw, a["input"], a["dim"], bool(a["descending"]), None, None, n.dtype)[1]


@rule("aten.msort.default")
def _msort(rw: Rewriter, n, a):
    return _select(rw, a["input"], 0, False, None, n.dtype, None)[0]


@rule("aten.topk.default")
def _topk(rw: Rewriter, n, a):
    """The k largest (smallest) in sorted order; sorted=False may return them in any order, so sorted it is."""
    x = a["input"]
    (_, value_dtype), (_, index_dtype) = n.attrs["outputs"]
    return list(_select(rw, x, a["dim"], bool(a["largest"]), list(range(a["k"])), value_dtype, index_dtype))


@rule("aten.kthvalue.default")
def _kthvalue(rw: Rewriter, n, a):
    (_, value_dtype), (_, index_dtype) = n.attrs["outputs"]
    return list(_select(rw, a["input"], a["dim"], False, [a["k"] - 1], value_dtype, index_dtype,
                        bool(a["keepdim"])))


def _median(rw: Rewriter, n, x: ir.Node, dim, keepdim: bool, skip_nan: bool):
    """(values, indices) fp32 of the lower median along `dim` as torch's CPU kernel picks it: place (m - 1) // 2 of
    the stably sorted row; median with a NaN in the row takes its first NaN (place n - count of NaNs), nanmedian
    the median of the m non-NaN elements (of all of them, NaNs, when there are none)."""
    if not x.shape:
        x = rw.reshape(x, (1,))
    dim = dim_of(dim, len(x.shape))
    size = x.shape[dim]
    if size == 0:
        rw.fail("of an empty axis is not supported: torch raises")
    if x.dtype is DType.INT32 and x.op == "const" and bool((rw.torch_value(x, torch.int64).abs() > 2 ** 24).any()):
        rw.fail("of an int32 constant with values beyond 2^24 is not supported: the machine compares in fp32")
    moved, swap = _to_last(rw, rw.cast(x, FP32), dim)
    rows = math.prod(moved.shape[:-1])
    if size <= RANK_MAX and rows * size * size <= MAX_PAIRS:
        vals, idx = _places(rw, moved, _ranked(rw, moved, False), list(range(size)))
    else:
        vals, idx = _bitonic(rw, moved, False)
    place = torch.arange(size, dtype=torch.float32)
    middle = rw.const(place == (size - 1) // 2, DType.UINT8)
    if x.dtype.is_float:
        count = rw.reduce(rw.cast(rw.binary("ne", moved, moved), FP32), "sum", (len(moved.shape) - 1,), True, FP32)
        if skip_nan:   # place (m - 1) // 2: 2 place <= m - 1 < 2 place + 2
            m1 = rw.scalar(count, "sub", float(size - 1), reverse=True, dtype=FP32)
            at = rw.binary("and", rw.binary("le", rw.const(2 * place, FP32), m1),
                           rw.binary("gt", rw.const(2 * place + 2, FP32), m1))
            some = rw.scalar(count, "lt", size - 0.5)
        else:
            at = rw.binary("eq", rw.const(place, FP32), rw.scalar(count, "sub", float(size), reverse=True, dtype=FP32))
            some = rw.scalar(count, "gt", 0.5)
        hit = rw.binary("or", rw.binary("and", some, at), rw.binary("and", rw.scalar(some, "eq", 0.0), middle))
    else:
        hit = middle
    last = (len(moved.shape) - 1,)
    value = rw.reduce(rw.where(hit, vals, rw.scalar_const(-math.inf, FP32), FP32), "max", last, True, FP32)
    index = rw.reduce(rw.where(hit, idx, rw.scalar_const(-1.0, FP32), FP32), "max", last, True, FP32)
    return rw.permute(value, swap), rw.permute(index, swap), x, dim, size


def _median_outputs(rw: Rewriter, n, a, skip_nan: bool):
    x = a["input"]
    whole = "dim" not in a
    if whole:
        x = rw.reshape(x, (x.numel,))
    value, index, x1, dim, size = _median(rw, n, x, 0 if whole else a["dim"], False, skip_nan)
    outputs = n.attrs.get("outputs") or [(n.shape, n.dtype)]
    (value_shape, value_dtype) = outputs[0]
    if x1.dtype.is_float:
        value = keep_fp32_inside(rw.cast(value, value_dtype), x1)
    else:
        value = _to_int(rw, keep_fp32_inside(value, x1), value_dtype, EXACT_FP32)
    value = rw.reshape(value, value_shape)
    if whole:
        return value
    (index_shape, index_dtype) = outputs[1]
    return [value, rw.reshape(_to_int(rw, keep_fp32_inside(index, x1), index_dtype, size), index_shape)]


@rule("aten.median.default", "aten.median.dim")
def _median_rule(rw: Rewriter, n, a):
    return _median_outputs(rw, n, a, False)


@rule("aten.nanmedian.default", "aten.nanmedian.dim")
def _nanmedian_rule(rw: Rewriter, n, a):
    return _median_outputs(rw, n, a, True)


@rule("aten.mode.default")
def _mode(rw: Rewriter, n, a):
    """The most frequent value and its last index, as torch's CPU kernel finds them in the sorted row: counts of
    equal elements by one [..., n, n] compare and a sum, the smallest value of the largest count (its first run),
    the last index holding it, and the value read back at that index (so the sign of a tied zero is that element's).
    A NaN is a run of its own after every number (a row of NaNs gives its first); eager's std::sort of a row with
    NaN, whose compares are no strict weak order, may order such rows otherwise."""
    x = a["input"]
    (value_shape, value_dtype), (index_shape, index_dtype) = n.attrs["outputs"]
    if not x.shape:
        return [rw.cast(x, value_dtype), rw.filled(0, index_shape, index_dtype)]
    dim = dim_of(a["dim"], len(x.shape))
    size = x.shape[dim]
    if x.dtype is DType.INT32 and x.op == "const" and bool((rw.torch_value(x, torch.int64).abs() > 2 ** 24).any()):
        rw.fail("of an int32 constant with values beyond 2^24 is not supported: the machine compares in fp32")
    moved, swap = _to_last(rw, rw.cast(x, FP32), dim)
    shape = moved.shape[:-1]
    rows = math.prod(shape)
    if rows * size * size > MAX_MODE_PAIRS:
        rw.fail(f"over an axis of {size} elements ({rows} rows) is not supported: trnc counts equal elements by "
                f"n^2 comparisons per row, up to {MAX_MODE_PAIRS} in all")
    last = (len(shape),)
    same = rw.binary("eq", rw.reshape(moved, shape + (1, size)), rw.reshape(moved, shape + (size, 1)))
    count = rw.reduce(rw.cast(same, FP32), "sum", (len(shape) + 1,), False, FP32)
    iota = rw.const(torch.arange(size, dtype=torch.float32), FP32)
    if x.dtype.is_float:
        nan = rw.binary("ne", moved, moved)
        count = rw.binary("add", count, rw.cast(nan, FP32), FP32)
        number = rw.scalar(nan, "eq", 0.0)
    best = rw.reduce(count, "max", last, True, FP32)
    chosen = rw.binary("eq", count, best)
    if x.dtype.is_float:
        chosen = rw.binary("and", chosen, number)
    value = rw.reduce(rw.where(chosen, moved, rw.scalar_const(math.inf, FP32), FP32), "min", last, True, FP32)
    index = rw.reduce(rw.where(rw.binary("eq", moved, value), iota, rw.scalar_const(-1.0, FP32), FP32), "max",
                      last, True, FP32)
    if x.dtype.is_float:   # no number chosen: a row of NaNs, index 0
        index = rw.where(rw.reduce(chosen, "max", last, True, DType.UINT8), index, rw.scalar_const(0.0, FP32), FP32)
    value = rw.reduce(rw.where(rw.binary("eq", iota, index), moved, rw.scalar_const(-math.inf, FP32), FP32), "max",
                      last, True, FP32)
    value, index = rw.permute(value, swap), rw.permute(index, swap)
    if x.dtype.is_float:
        value = keep_fp32_inside(rw.cast(value, value_dtype), x)
    else:
        value = _to_int(rw, keep_fp32_inside(value, x), value_dtype, EXACT_FP32)
    index = _to_int(rw, keep_fp32_inside(index, x), index_dtype, size)
    return [rw.reshape(value, value_shape), rw.reshape(index, index_shape)]
