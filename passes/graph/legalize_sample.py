"""legalize rules of data-dependent window sampling (issue 16): fractional max pooling (2-d and 3-d) and the grid
samplers (grid_sampler_2d, grid_sampler_3d), built from the existing trnc ops (registered in
passes/graph/legalize_table.py's `pm_legalize`).

Fractional max pooling: the windows start where the `random_samples` input u says, per (batch, channel, axis), as
torch's CPU kernel computes them in the input's scalar type: alpha = float(in - k) / float(out - 1) (a compile-time
fp32 division), start_i = int((i + u) * alpha) - int(u * alpha) for i < out - 1 and start = in - k for the last
window (so for out == 1 the only one). On the device the same fp32 add, multiply and truncation round as the C++
does, so the starts are the same bit for bit (checked against eager on random u in the tests); they are only
taken for a float32 input (at bf16 or fp16 torch rounds each step to that type). Each start passes through a
gather of zeros [in - k + 1], so one outside [0, in - k] faults, as torch's assert does. The max is then eager's
loop over the window taps, last axis fastest: the first element greater than all before it, or NaN (so the last
NaN), starting from the window's first element (legalize_conv's _window_argmax, with the positions data): each tap
an element gather from the flattened input at ((n C + c) * in-volume + flat position), a compare and two selects.
Values and indices are exact (selects of the input's values; positions below 2^24 in fp32).

Grid samplers: per spatial axis the source coordinate from the grid in fp32 as torch's CPU kernels round it (the
vectorized 2-d kernel: (g + 1) * f, less 1/2 unaligned, f = (size - 1) / 2 or size / 2; the scalar 3-d kernel:
((g + 1) / 2) * (size - 1) or ((g + 1) * size - 1) / 2), then clipped to [0, size - 1] (border) or reflected and
clipped (reflection: torch's reflect_coordinates, |c - low| fmod span, flipped on odd floor(|c - low| / span)).
Bilinear: the 2^rank corners floor(c) and floor(c) + 1 with weights c - floor(c) and its complement, multiplied and
added in torch's order (nw, ne, sw, se; t.. before b.. in 3-d); nearest: rint (half to even, torch's nearbyint).
Each corner is a row gather of the input laid out [N * volume, C] at an fp32 flat position (exact below 2^24);
a corner outside the input (and a NaN coordinate) gathers row 0 and is masked to 0 (zeros padding; border and
reflection keep corners inside, but the weight-0 corner past the last). Nearest is bit for bit; bilinear within
(2^rank + 4 S) 2^-24 max|x| of eager (S the largest input size: the products' roundings and the weights', whose
factors the 3-d kernel forms in another order). Bicubic (2-d, as torch): the 4 x 4 neighbours floor(c) - 1 .. + 2
of the unpadded coordinate, each integer position padded (clipped or reflected) and masked as above, weighted by
torch's cubic convolution coefficients (A = -0.75) of the fraction, along W first, then along H, in torch's order;
within 2.25 (16 + 4 S) 2^-24 max|x| (the coefficients' absolute sum is at most 1.375 per axis). Refused by name:
non-float32 input, more than MAX_POINTS sampled points.
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_conv import _batched, _pair
from trnc.passes.graph.legalize_index import EXACT_FP32, _to_int, exact_index
from trnc.passes.graph.legalize_segments import _guarded
from trnc.passes.graph.legalize_table import keep_fp32_inside, rule, take

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
MAX_TAPS = 512   # window elements of a fractional max pool (a gather each)
# which component of random_samples drives each spatial axis, as torch's CPU kernels read them
SAMPLE_OF_AXIS = {2: (1, 0), 3: (0, 1, 2)}


def _starts(rw: Rewriter, u: ir.Node, size: int, kernel: int, out: int) -> ir.Node:
    """The window starts [N, C, out] (fp32 integers) along one axis from u [N, C, 1], as torch computes them."""
    batch = u.shape[:2]
    last = rw.filled(float(size - kernel), batch + (1,), FP32)
    if out == 1:
        return last
    alpha = float(np.float32(size - kernel) / np.float32(out - 1))
    steps = rw.const(torch.arange(out - 1, dtype=torch.float32).reshape(1, 1, out - 1), FP32)
    scaled = rw.unary(rw.scalar(rw.binary("add", u, steps, FP32), "mul", alpha, dtype=FP32), "trunc", FP32)
    base = rw.unary(rw.scalar(u, "mul", alpha, dtype=FP32), "trunc", FP32)
    starts = rw.cat([rw.binary("sub", scaled, base, FP32), last], 2, FP32)
    return exact_index(_guarded(rw, starts, size - kernel))


@rule("aten.fractional_max_pool2d.default", "aten.fractional_max_pool3d.default")
def _fractional_max_pool(rw: Rewriter, n, a):
    rank = 3 if "3d" in n.op else 2
    x = _batched(rw, a["input"], rank)
    if x.dtype is not FP32 or rw.torch_dtype(a["input"]) is not torch.float32:
        rw.fail("is supported for float32 only: torch computes the window starts in the input's dtype")
    kernel, out_size = _pair(a["kernel_size"], rank), _pair(a["output_size"], rank)
    batch, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    volume = math.prod(spatial)
    if batch * channels * volume > EXACT_FP32:
        rw.fail(f"of {batch * channels * volume} elements is not supported: positions past 2^24 are not exact in fp32")
    if math.prod(kernel) > MAX_TAPS:
        rw.fail(f"with a window of {math.prod(kernel)} elements is not supported (past {MAX_TAPS})")
    (out_shape, out_dtype), (index_shape, index_dtype) = n.attrs["outputs"][:2]
    u = rw.cast(rw.reshape(a["random_samples"], (batch, channels, rank)), FP32)
    u.attrs["keep_fp32"] = True
    rank_out = len(out_size)
    starts = []   # per axis, [N, C, 1.., out_d, 1..] fp32
    for d in range(rank):
        s = _starts(rw, rw.slice(u, 2, SAMPLE_OF_AXIS[rank][d], SAMPLE_OF_AXIS[rank][d] + 1), spatial[d], kernel[d],
                    out_size[d])
        shape = [batch, channels] + [out_size[e] if e == d else 1 for e in range(rank_out)]
        starts.append(rw.reshape(s, shape))
    plane = rw.const(torch.arange(batch * channels, dtype=torch.float32).reshape(
        [batch, channels] + [1] * rank) * volume, FP32)
    table = rw.reshape(x, (batch * channels * volume, 1))
    full = (batch, channels) + tuple(out_size)
    best_value = rw.filled(-math.inf, full, FP32)
    best = None
    for tap in itertools.product(*(range(k) for k in kernel)):
        flat = None
        for d, t in enumerate(tap):
            term = rw.scalar(starts[d], "add", float(t), dtype=FP32) if t else starts[d]
            stride = math.prod(spatial[d + 1:])
            term = rw.scalar(term, "mul", float(stride), dtype=FP32) if stride != 1 else term
            flat = term if flat is None else rw.binary("add", flat, term, FP32)
        flat = exact_index(rw.expand(flat, full) if flat.shape != full else flat)
        if best is None:
            best = flat   # eager's index starts at the window's first element
        index = _to_int(rw, rw.binary("add", flat, plane, FP32), DType.INT32, batch * channels * volume)
        value = rw.reshape(take(rw, table, 0, index), full)
        better = rw.binary("or", rw.binary("gt", value, best_value), rw.binary("ne", value, value))
        best_value = rw.where(better, value, best_value, FP32)
        best = rw.where(better, flat, best, FP32)
    values = keep_fp32_inside(rw.cast(best_value, out_dtype), x)
    indices = keep_fp32_inside(_to_int(rw, best, DType.INT32, volume), x)
    return [rw.reshape(values, out_shape), rw.reshape(rw.cast(indices, index_dtype), index_shape)]


# -- grid sampling -------------------------------------------------------------------------------------------
MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
# sampled points (N * output positions) past which a grid sampler is refused: each point is a row gather per corner,
# and compile time grows faster than they do (a 3-d sampler: 53k points 6.7 s, 212k points 70 s)
MAX_POINTS = 1 << 18
PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def _unnormalized(rw: Rewriter, g: ir.Node, size: int, align: bool, rank: int) -> ir.Node:
    """The source coordinate from grid values g in [-1, 1], as torch's CPU kernels round it: the vectorized 2-d
    kernel (g + 1) * f (- 0.5), f = (size - 1) / 2 or size / 2 in fp32; the scalar 3-d one ((g + 1) / 2) * (size - 1)
    or ((g + 1) * size - 1) / 2."""
    g1 = rw.scalar(g, "add", 1.0, dtype=FP32)
    if rank == 2:
        factor = float(np.float32(size - 1) / np.float32(2)) if align else float(np.float32(size) / np.float32(2))
        scaled = rw.scalar(g1, "mul", factor, dtype=FP32)
        return scaled if align else rw.scalar(scaled, "sub", 0.5, dtype=FP32)
    if align:
        return rw.scalar(rw.scalar(g1, "div", 2.0, dtype=FP32), "mul", float(size - 1), dtype=FP32)
    return rw.scalar(rw.scalar(rw.scalar(g1, "mul", float(size), dtype=FP32), "sub", 1.0, dtype=FP32), "div", 2.0,
                     dtype=FP32)


def _clipped(rw: Rewriter, c: ir.Node, size: int) -> ir.Node:
    return rw.scalar(rw.scalar(c, "max", 0.0, dtype=FP32), "min", float(size - 1), dtype=FP32)


def _reflected(rw: Rewriter, c: ir.Node, size: int, align: bool) -> ir.Node:
    """torch's reflect_coordinates over [-1/2, size - 1/2] (or [0, size - 1] aligned), then clipped."""
    twice_low, twice_high = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
    if twice_low == twice_high:
        return rw.filled(0.0, c.shape, FP32)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    a = rw.unary(rw.scalar(c, "sub", low, dtype=FP32), "abs", FP32)
    extra = rw.scalar(a, "fmod", span, dtype=FP32)
    flips = rw.unary(rw.scalar(a, "div", span, dtype=FP32), "floor", FP32)
    even = rw.scalar(rw.scalar(flips, "fmod", 2.0, dtype=FP32), "eq", 0.0)
    back = rw.scalar(rw.scalar(extra, "sub", span, reverse=True, dtype=FP32), "add", low, dtype=FP32)
    return _clipped(rw, rw.where(even, rw.scalar(extra, "add", low, dtype=FP32), back, FP32), size)


def _padded(rw: Rewriter, c: ir.Node, size: int, padding: str, align: bool) -> ir.Node:
    """A source coordinate under the padding mode: as it is (zeros), clipped (border) or reflected."""
    if padding == "border":
        return _clipped(rw, c, size)
    return _reflected(rw, c, size, align) if padding == "reflection" else c


def _channel(rw: Rewriter, w: ir.Node) -> ir.Node:
    return rw.reshape(w, w.shape + (1,))


CUBIC_A = -0.75


def _cubic_coefficients(rw: Rewriter, t: ir.Node) -> list[ir.Node]:
    """torch's cubic convolution weights of the 4 neighbours at offsets -1, 0, 1, 2 for a fraction t, A = -0.75:
    ((A + 2) v - (A + 3)) v v + 1 for |v| <= 1, ((A v - 5A) v + 8A) v - 4A for 1 < |v| < 2, in its order."""
    def inner(v):
        p = rw.scalar(rw.scalar(v, "mul", CUBIC_A + 2, dtype=FP32), "sub", CUBIC_A + 3, dtype=FP32)
        return rw.scalar(rw.binary("mul", rw.binary("mul", p, v, FP32), v, FP32), "add", 1.0, dtype=FP32)

    def outer(v):
        p = rw.scalar(rw.scalar(v, "mul", CUBIC_A, dtype=FP32), "sub", 5 * CUBIC_A, dtype=FP32)
        p = rw.scalar(rw.binary("mul", p, v, FP32), "add", 8 * CUBIC_A, dtype=FP32)
        return rw.scalar(rw.binary("mul", p, v, FP32), "sub", 4 * CUBIC_A, dtype=FP32)

    u = rw.scalar(t, "sub", 1.0, reverse=True, dtype=FP32)
    return [outer(rw.scalar(t, "add", 1.0, dtype=FP32)), inner(t), inner(u),
            outer(rw.scalar(u, "add", 1.0, dtype=FP32))]


@rule("aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default")
def _grid_sampler(rw: Rewriter, n, a):
    x, grid = a["input"], a["grid"]
    rank = 3 if "3d" in n.op else 2
    mode, padding, align = MODES.get(a["interpolation_mode"]), PADDINGS.get(a["padding_mode"]), a["align_corners"]
    if mode is None or (mode == "bicubic" and rank != 2):
        rw.fail(f"with interpolation mode {a['interpolation_mode']} is not supported")
    if padding is None:
        rw.fail(f"with padding mode {a['padding_mode']} is not supported")
    if x.dtype is not FP32 or grid.dtype is not FP32 or rw.torch_dtype(x) is not torch.float32:
        rw.fail("is supported for float32 only: torch rounds the source coordinates in the input's dtype")
    batch, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    # the output positions as one axis (then size-1 axes): the elementwise kernels tile [N, P, 1..] over all
    # partitions, where [N, D, H, W] left most idle (a 3-d sampler of 53k points compiled in 6.7 s, not 55 s)
    out = (math.prod(grid.shape[1:-1]),) + (1,) * (rank - 1)
    grid = rw.reshape(grid, (batch, *out, rank))
    volume = math.prod(spatial)
    if batch * volume > EXACT_FP32:
        rw.fail(f"of {batch * volume} input positions is not supported: positions past 2^24 are not exact in fp32")
    if batch * math.prod(out) > MAX_POINTS:
        rw.fail(f"is not supported at this size: {batch * math.prod(out)} sampled points, past {MAX_POINTS} (a row "
                "gather per point and corner)")
    coords = []   # per spatial axis, [N, *out] fp32 source coordinates
    for d in range(rank):
        g = rw.reshape(rw.slice(grid, rank + 1, rank - 1 - d, rank - d), (batch, *out))
        c = _unnormalized(rw, g, spatial[d], align, rank)
        coords.append(c if mode == "bicubic" else _padded(rw, c, spatial[d], padding, align))
    table = rw.reshape(rw.permute(x, (0, *range(2, rank + 2), 1)), (batch * volume, channels))
    plane = rw.const(torch.arange(batch, dtype=torch.float32).reshape([batch] + [1] * rank) * volume, FP32)
    zero = rw.scalar_const(0.0, FP32)

    def corner(indices) -> ir.Node:
        """The input's rows at integer fp32 positions per axis [N, *out]: [N, *out, C], 0 where out of bounds."""
        inside, flat = None, plane
        for d, i in enumerate(indices):
            ok = rw.binary("and", rw.scalar(i, "ge", 0.0), rw.scalar(i, "le", float(spatial[d] - 1)))
            inside = ok if inside is None else rw.binary("and", inside, ok)
        for d, i in enumerate(indices):
            safe = rw.where(inside, i, zero, FP32)   # NaN and far coordinates gather row 0, then are masked
            stride = math.prod(spatial[d + 1:])
            term = rw.scalar(safe, "mul", float(stride), dtype=FP32) if stride != 1 else safe
            flat = rw.binary("add", flat, term, FP32)
        rows = take(rw, table, 0, _to_int(rw, exact_index(flat), DType.INT32, batch * volume))
        return rw.where(rw.reshape(inside, inside.shape + (1,)), rows, zero, FP32)

    if mode == "nearest":
        got = corner([rw.unary(c, "rint", FP32) for c in coords])
    elif mode == "bicubic":   # torch pads the 4 x 4 neighbours' integer positions, not the coordinate
        lows = [rw.unary(c, "floor", FP32) for c in coords]
        coeffs = [_cubic_coefficients(rw, rw.binary("sub", c, f, FP32)) for c, f in zip(coords, lows)]
        near = [[_padded(rw, rw.scalar(f, "add", float(k - 1), dtype=FP32) if k != 1 else f, spatial[d], padding,
                         align) for k in range(4)] for d, f in enumerate(lows)]
        got = None
        for j in range(4):   # rows (H), each the cubic along W first, as torch's kernel
            line = None
            for i in range(4):
                term = rw.binary("mul", corner([near[0][j], near[1][i]]), _channel(rw, coeffs[1][i]), FP32)
                line = term if line is None else rw.binary("add", line, term, FP32)
            term = rw.binary("mul", line, _channel(rw, coeffs[0][j]), FP32)
            got = term if got is None else rw.binary("add", got, term, FP32)
    else:
        lows = [rw.unary(c, "floor", FP32) for c in coords]
        highs = [rw.scalar(f, "add", 1.0, dtype=FP32) for f in lows]
        ups = [rw.binary("sub", c, f, FP32) for c, f in zip(coords, lows)]   # the weight of the upper neighbour
        downs = [rw.scalar(u, "sub", 1.0, reverse=True, dtype=FP32) for u in ups]
        got = None
        for pick in itertools.product((0, 1), repeat=rank):   # nw, ne, sw, se (t.. then b.. in 3-d), as torch adds
            weight = None
            for d, p in enumerate(pick):
                w = ups[d] if p else downs[d]
                weight = w if weight is None else rw.binary("mul", weight, w, FP32)
            value = corner([highs[d] if p else lows[d] for d, p in enumerate(pick)])
            term = rw.binary("mul", value, rw.reshape(weight, weight.shape + (1,)), FP32)
            got = term if got is None else rw.binary("add", got, term, FP32)
    result = rw.reshape(rw.permute(got, (0, rank + 1, *range(1, rank + 1))), n.shape)
    return keep_fp32_inside(rw.cast(result, n.dtype), x, a["grid"])
