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
