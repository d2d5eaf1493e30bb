"""legalize's rules for convolution, pooling and batch norm in inference (registered in legalize_table.py).

A convolution becomes one `conv` node (docs/ir.md) over [N, C, H, W]: a 1-d one with H = 1, a 3-d one with
the output depths as batch rows whose channels are the input planes each depth tap reads (so the sum over the
taps is the conv's sum over channels, in PSUM), a transposed one as the equivalent convolution over its input
with zeros between the elements (`input_dilation`, which the kernel places in SBUF, never in HBM; zero planes
along a depth) and the weight flipped. The weight is laid out [C_in / groups, KH, KW, C_out], so that a tile of
input channels is a tile of its rows; for a constant weight fold does this at compile time. The bias is an
`add` after it, which fuse puts into the kernel's PSUM evacuation.

Batch norm in inference is x * scale + shift per channel, scale and shift computed as torch's kernel computes
them (invstd = 1 / sqrt(var + eps), scale = invstd * weight, shift = bias - mean * scale, in fp32); after a
convolution the two steps fuse into its evacuation as one instruction with per-partition operands, the cost of a
bias alone, so folding them into the weights would save no engine time and would round differently from eager.

Pooling is a `pool` node: max (padding -inf) or sum (padding 0); an average is that sum divided by torch's
divisor (count_include_pad, divisor_override, the windows ceil_mode cuts short), which fuses into the
evacuation. A 3-d pool is two: over (H, W) with the depths as channels, then over the depths. Adaptive pooling
with windows of one size is a plain pool; otherwise it is separable, a reduction per output row and then per
output column (and depth).
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_index import _to_int
from trnc.passes.graph.legalize_table import keep_fp32_inside, rule, take

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

MAX_ADAPTIVE_REDUCTIONS = 256   # output rows + columns of a separable adaptive pool (a node each)


def _pair(v, rank: int = 2) -> tuple[int, ...]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(int(x) for x in (v * rank if len(v) == 1 else v))


def _batched(rw: Rewriter, x: ir.Node, rank: int) -> ir.Node:
    """A pooling's input as [N, C, *spatial] over `rank` spatial dims: an unbatched one gets N = 1 (torch's 1-d
    pools call the 2-d ones with H = 1 already)."""
    if len(x.shape) not in (rank + 1, rank + 2):
        rw.fail(f"of a {len(x.shape)}-d input: [C, *spatial] or [N, C, *spatial] with {rank} spatial dims expected")
    return rw.reshape(x, (1, *x.shape) if len(x.shape) == rank + 1 else x.shape)


@rule("aten.convolution.default")
def _convolution(rw: Rewriter, n, a):
    x, weight = a["input"], a["weight"]
    rank = len(x.shape) - 2   # 1 to 3 (aten's convolutions)
    if rank == 1:
        x = rw.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        shape = weight.shape[:2] + (1, weight.shape[2])
        weight = rw.const(rw.torch_value(weight, torch.float64).reshape(shape), weight.dtype) \
            if weight.op == "const" else rw.reshape(weight, shape)
    stride, dilation, pad = (_pair(a[k], rank) for k in ("stride", "dilation", "padding"))
    if rank == 1:
        stride, dilation, pad = (1,) + stride, (1,) + dilation, (0,) + pad
    groups = int(a["groups"])
    if a["transposed"]:
        out_pad = _pair(a["output_padding"], rank)
        out = _transposed(rw, n, x, weight, stride, dilation, pad, (0,) * (rank == 1) + out_pad, groups)
    elif rank == 3:
        layout = rw.permute(weight, (2, 1, 3, 4, 0))
        out = _conv3d(rw, n, x, layout, stride, (pad[0], pad[0]), (pad[1], pad[1], pad[2], pad[2]), dilation,
                      groups, (1, 1))
    else:
        layout = rw.permute(weight, (1, 2, 3, 0))
        out = _conv(rw, n, x, layout, stride, (pad[0], pad[0], pad[1], pad[1]), dilation, groups, (1, 1))
    if a["bias"] is not None:
        out = rw.binary("add", out, rw.reshape(a["bias"], (out.shape[1],) + (1,) * (len(out.shape) - 2)))
    return rw.reshape(out, n.shape)


def _conv(rw: Rewriter, n, x, layout, stride, padding, dilation, groups, input_dilation) -> ir.Node:
    sizes = tuple(ir.window_out_size(x.shape[2 + d], layout.shape[1 + d], stride[d], padding[2 * d:2 * d + 2],
                                     dilation[d], input_dilation[d]) for d in (0, 1))
    if min(sizes) < 1:
        rw.fail(f"gives an empty output {list(sizes)}")
    return rw.emit("conv", (x, layout), (x.shape[0], layout.shape[3], *sizes), n.dtype, stride=tuple(stride),
                   padding=tuple(padding), dilation=tuple(dilation), groups=groups,
                   input_dilation=tuple(input_dilation))


def _conv3d(rw: Rewriter, n, x, layout, stride, depth_pad, padding, dilation, groups, input_dilation) -> ir.Node:
    """A convolution over [N, C, D, H, W] by `layout` [KD, C_in / groups, KH, KW, C_out] as one 2-d `conv`: each
    output depth is a batch row whose channels are the KD input planes its window reads, per group (zero planes
    where it reads the padding), so the sum over the depth taps is the conv's own sum over channels (in PSUM, in
    fp32, never rounded between taps). `depth_pad` (before, after); the rest as `_conv`'s, over (H, W)."""
    batch, channels, depth, height, width = x.shape
    kd, per_group = layout.shape[:2]
    out_depth = ir.window_out_size(depth, kd, stride[0], depth_pad, dilation[0])
    if out_depth < 1:
        rw.fail(f"gives an empty output depth {out_depth}")
    span = (out_depth - 1) * stride[0] + 1   # from a tap's first plane to its last
    after = max(0, dilation[0] * (kd - 1) + span - depth_pad[0] - depth)   # the planes the last window reaches
    before = [rw.filled(0, (batch, channels, depth_pad[0], height, width), x.dtype)] if depth_pad[0] else []
    beyond = [rw.filled(0, (batch, channels, after, height, width), x.dtype)] if after else []
    padded = rw.cat(before + [x] + beyond, 2, x.dtype)
    taps = [rw.reshape(rw.slice(padded, 2, t * dilation[0], t * dilation[0] + span, stride[0]),
                       (batch, groups, 1, per_group, out_depth, height, width)) for t in range(kd)]
    stacked = rw.permute(rw.cat(taps, 2, x.dtype), (0, 4, 1, 2, 3, 5, 6))   # [N, OD, groups, KD, C_in/groups, ..]
    folded = rw.reshape(stacked, (batch * out_depth, groups * kd * per_group, height, width))
    out = _conv(rw, n, folded, rw.reshape(layout, (kd * per_group, *layout.shape[2:])), stride[1:], padding,
                dilation[1:], groups, input_dilation)
    return rw.permute(rw.reshape(out, (batch, out_depth, *out.shape[1:])), (0, 2, 1, 3, 4))


def _transposed(rw: Rewriter, n, x, weight, stride, dilation, pad, out_pad, groups) -> ir.Node:
    """conv_transpose as a convolution of the input with stride - 1 zeros between its elements, padded by
    dilation * (K - 1) - padding (plus output_padding after), by the flipped weight with its channel axes
    swapped per group; a negative padding crops the result. The zeros are the conv's `input_dilation` over
    (H, W), zero planes over a 3-d one's depth."""
    cin, cout_g, *kernel = weight.shape
    rank = len(kernel)
    w = rw.reshape(weight, (groups, cin // groups, cout_g, *kernel))
    for d, k in enumerate(kernel):   # flipped: the taps in reverse order (a constant weight folds)
        w = rw.cat([rw.slice(w, 3 + d, t, t + 1) for t in reversed(range(k))], 3 + d, weight.dtype)
    # [groups, C_in/groups, C_out/groups, *K] -> [(KD,) C_in/groups, KH, KW, groups, C_out/groups]
    order = (3, 1, 4, 5, 0, 2) if rank == 3 else (1, 3, 4, 0, 2)
    layout = rw.permute(w, order)
    layout = rw.reshape(layout, (*layout.shape[:-2], groups * cout_g))
    lo = [dilation[d] * (k - 1) - pad[d] for d, k in enumerate(kernel)]
    hi = [lo[d] + out_pad[d] for d in range(rank)]
    padding = tuple(p for d in range(rank) for p in (max(lo[d], 0), max(hi[d], 0)))
    if rank == 3:
        out = _conv3d(rw, n, _spread_depth(rw, x, stride[0]), layout, (1, 1, 1), padding[:2], padding[2:], dilation,
                      groups, stride[1:])
    else:
        out = _conv(rw, n, x, layout, (1, 1), padding, dilation, groups, stride)
    for d in range(rank):
        out = rw.slice(out, 2 + d, max(-lo[d], 0), out.shape[2 + d] - max(-hi[d], 0))
    return out


def _spread_depth(rw: Rewriter, x: ir.Node, step: int) -> ir.Node:
    """x [N, C, D, H, W] with step - 1 zero planes between its depths."""
    if step == 1:
        return x
    batch, channels, depth, height, width = x.shape
    planes = rw.reshape(x, (batch, channels, depth, 1, height, width))
    spread = rw.cat([planes, rw.filled(0, (batch, channels, depth, step - 1, height, width), x.dtype)], 3, x.dtype)
    return rw.slice(rw.reshape(spread, (batch, channels, depth * step, height, width)), 2, 0, (depth - 1) * step + 1)


@rule("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(rw: Rewriter, n, a):
    x, eps = a["input"], float(a["eps"])
    c = x.shape[1]
    per_channel = (c,) + (1,) * (len(x.shape) - 2)
    stats = [a[k] for k in ("weight", "bias", "running_mean", "running_var")]
    if all(s is None or s.op == "const" for s in stats):
        weight, bias, mean, var = (torch.ones(c) if s is None and k == 0 else torch.zeros(c) if s is None
                                   else rw.torch_value(s, torch.float32) for k, s in enumerate(stats))
        invstd = 1 / torch.sqrt(var + torch.tensor(eps, dtype=torch.float32))
        scale = invstd * weight
        scale_node = rw.const(scale.reshape(per_channel), DType.FP32)
        shift_node = rw.const((bias - mean * scale).reshape(per_channel), DType.FP32)
    else:
        weight, bias, mean, var = (s and rw.reshape(rw.cast(s, DType.FP32), per_channel) for s in stats)
        invstd = rw.unary(rw.unary(rw.scalar(var, "add", eps, dtype=DType.FP32), "sqrt", DType.FP32), "reciprocal",
                          DType.FP32)
        scale_node = invstd if weight is None else rw.binary("mul", invstd, weight, DType.FP32)
        shift_node = rw.scalar(rw.binary("mul", mean, scale_node, DType.FP32), "mul", -1.0, dtype=DType.FP32)
        if bias is not None:
            shift_node = rw.binary("add", bias, shift_node, DType.FP32)
    out = rw.binary("add", rw.binary("mul", x, scale_node), shift_node)
    return [out] + [rw.filled(0, shape, dtype) for shape, dtype in n.attrs["outputs"][1:]]   # empty in inference


def _pool(rw: Rewriter, n, x, op: str, kernel, stride, pad, dilation, out_size, dtype: DType) -> ir.Node:
    """A pool node over [N, C, H, W] giving `out_size`: the padding after the input is what the last window
    reaches (more than `pad` under ceil_mode, or none), so the node's shape rule holds. Over [N, C, D, H, W], two:
    over (H, W) with the depths as channels, then over (D, OH * OW) with windows (KD, 1)."""
    if len(x.shape) == 5:
        batch, channels, depth = x.shape[:3]
        planes = _pool(rw, n, rw.reshape(x, (batch, channels * depth, *x.shape[3:])), op, kernel[1:], stride[1:],
                       pad[1:], dilation[1:], out_size[1:], dtype)
        columns = rw.reshape(planes, (batch, channels, depth, out_size[1] * out_size[2]))
        out = _pool(rw, n, columns, op, (kernel[0], 1), (stride[0], 1), (pad[0], 0), (dilation[0], 1),
                    (out_size[0], out_size[1] * out_size[2]), dtype)
        out = rw.reshape(out, (batch, channels, *out_size))
        if op == "sum":   # the partial sums and their views stay fp32 (auto_cast "all"), as eager's
            keep_fp32_inside(out, x).attrs["keep_fp32"] = True
        return out
    after = [max(0, (out_size[d] - 1) * stride[d] + dilation[d] * (kernel[d] - 1) + 1 - x.shape[2 + d] - pad[d])
             for d in (0, 1)]
    return rw.emit("pool", (x,), (*x.shape[:2], *out_size), dtype, op=op, kernel=tuple(kernel), stride=tuple(stride),
                   padding=(pad[0], after[0], pad[1], after[1]), dilation=tuple(dilation), keep_fp32=op == "sum")


def _pool_args(a, rank: int):
    kernel = _pair(a["kernel_size"], rank)
    stride = _pair(a["stride"], rank) if a["stride"] else kernel
    return kernel, stride, _pair(a["padding"], rank)


def _rank(n) -> int:
    """The spatial dims of a pooling op: 3 for the *3d ops, else 2."""
    return 3 if "3d" in n.op else 2


@rule("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def _max_pool(rw: Rewriter, n, a):
    rank = _rank(n)
    x = _batched(rw, a["input"], rank)
    kernel, stride, pad = _pool_args(a, rank)
    dilation = _pair(a["dilation"], rank)
    (out_shape, _), (index_shape, index_dtype) = n.attrs["outputs"][:2]
    out = _pool(rw, n, x, "max", kernel, stride, pad, dilation, out_shape[-rank:], x.dtype)
    taps = []
    for d in range(rank):
        starts = torch.arange(out_shape[-rank + d]) * stride[d] - pad[d]
        positions = [starts + t * dilation[d] for t in range(kernel[d])]
        taps.append([(i, (i >= 0) & (i < x.shape[2 + d])) for i in positions])
    indices = _window_argmax(rw, x, taps)
    return [rw.reshape(out, out_shape), rw.reshape(rw.cast(indices, index_dtype), index_shape)]


def _window_argmax(rw: Rewriter, x: ir.Node, taps) -> ir.Node:
    """The indices output of a max pool over [N, C, *spatial], as torch's CPU loop finds them: the flat position
    (d * H * W + h * W + w) of the first element of each window that is greater than all before it, or NaN (so the
    last NaN), starting from the window's first element. Windows are given per spatial axis as taps (input
    position of each output along that axis, and whether it lies in that output's window), visited in the loop's
    order, the last axis fastest; each tap is a gather by constant positions per axis, a compare and two selects.
    int32 (index_bound), exact in fp32 for a volume within 2^24."""
    spatial = x.shape[2:]
    rank = len(spatial)

    def along(d: int, t: torch.Tensor) -> torch.Tensor:   # a per-axis vector, broadcast over the output's axes
        return t.reshape([-1 if e == d else 1 for e in range(rank)])

    def placed(tap) -> tuple[torch.Tensor, torch.Tensor]:   # (flat input position, inside the window) per output
        flat = sum(along(d, pos) * math.prod(spatial[d + 1:]) for d, (pos, _) in enumerate(tap))
        inside = functools.reduce(torch.logical_and, (along(d, m) for d, (_, m) in enumerate(tap)))
        return flat.float(), inside

    window = list(itertools.product(*taps))
    first = None
    for tap in reversed(window):
        here, inside = placed(tap)
        first = here if first is None else torch.where(inside, here, first)
    best_value = rw.filled(-math.inf, (*x.shape[:2], *first.shape), x.dtype)
    best = rw.const(first, DType.FP32)
    for tap in window:
        here, inside = placed(tap)
        if not inside.any():
            continue
        value = x
        for d, (pos, _) in enumerate(tap):
            value = take(rw, value, 2 + d, rw.const(pos.clamp(0, spatial[d] - 1), DType.INT32))
        better = rw.binary("or", rw.binary("gt", value, best_value), rw.binary("ne", value, value))
        if not inside.all():
            better = rw.binary("and", better, rw.const(inside, DType.UINT8))
        best_value = rw.where(better, value, best_value, x.dtype)
        best = rw.where(better, rw.const(here, DType.FP32), best, DType.FP32)
    return keep_fp32_inside(_to_int(rw, best, DType.INT32, math.prod(spatial)), x)   # compares as eager's, in fp32


@rule("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(rw: Rewriter, n, a):
    rank = _rank(n)
    x = _batched(rw, a["input"], rank)
    kernel, stride, pad = _pool_args(a, rank)
    out_size = n.shape[-rank:]
    total = _pool(rw, n, x, "sum", kernel, stride, pad, (1,) * rank, out_size, DType.FP32)
    divisor = _avg_divisors(x.shape[2:], out_size, kernel, stride, pad, a["count_include_pad"],
                            a["divisor_override"])
    return rw.reshape(_divided(rw, total, divisor, n.dtype), n.shape)


def _avg_divisors(size, out_size, kernel, stride, pad, include_pad: bool, override) -> torch.Tensor:
    """torch's avg_pool2d/3d divisor of each output: the window clipped to the padded input (count_include_pad)
    or to the input itself, unless divisor_override."""
    if override:
        return torch.full(tuple(out_size), float(override), dtype=torch.float64)

    def counts(d: int) -> torch.Tensor:
        start = torch.arange(out_size[d]) * stride[d] - pad[d]
        end = torch.clamp(start + kernel[d], max=size[d] + pad[d])
        if include_pad:
            return (end - start).double()
        return (torch.clamp(end, max=size[d]) - torch.clamp(start, min=0)).double()
    return _outer([counts(d) for d in range(len(size))])


def _outer(vectors: list[torch.Tensor]) -> torch.Tensor:
    """The product of one vector per axis, over all their axes."""
    rank = len(vectors)
    return math.prod(v.reshape([-1 if e == d else 1 for e in range(rank)]) for d, v in enumerate(vectors))


def _divided(rw: Rewriter, total: ir.Node, divisor: torch.Tensor, dtype: DType) -> ir.Node:
    """total / divisor (one value, or one per output position), then in `dtype`."""
    if bool((divisor == divisor.flatten()[0]).all()):
        out = rw.scalar(total, "div", float(divisor.flatten()[0]), dtype=DType.FP32)
    else:
        out = rw.binary("div", total, rw.const(divisor, DType.FP32), DType.FP32)
    return rw.cast(out, dtype)


@rule("aten._adaptive_avg_pool2d.default", "aten.adaptive_max_pool2d.default", "aten._adaptive_avg_pool3d.default",
      "aten.adaptive_max_pool3d.default")
def _adaptive_pool(rw: Rewriter, n, a):
    rank = _rank(n)
    x = _batched(rw, a["input"], rank)
    op = "max" if "max" in n.op else "sum"
    size, out_size = x.shape[2:], _pair(a["output_size"], rank)
    out_shape = n.attrs["outputs"][0][0] if op == "max" else n.shape
    dtype = x.dtype if op == "max" else DType.FP32
    if all(size[d] % out_size[d] == 0 for d in range(rank)):
        kernel = tuple(size[d] // out_size[d] for d in range(rank))
        out = _pool(rw, n, x, op, kernel, kernel, (0,) * rank, (1,) * rank, out_size, dtype)
    elif sum(out_size) <= MAX_ADAPTIVE_REDUCTIONS:
        out = x
        for d in range(rank):
            parts = [rw.reduce(rw.slice(out, 2 + d, *_adaptive_window(i, size[d], out_size[d])), op, (2 + d,), True,
                               dtype) for i in range(out_size[d])]
            out = rw.cat(parts, 2 + d, dtype)
            for node in [*parts, out]:
                node.attrs["keep_fp32"] = op == "sum"
    else:
        rw.fail(f"to {list(out_size)} from {list(size)}: windows of several sizes and more than "
                f"{MAX_ADAPTIVE_REDUCTIONS} output rows and columns")
    windows = [[_adaptive_window(i, size[d], out_size[d]) for i in range(out_size[d])] for d in range(rank)]
    if op == "sum":
        counts = [torch.tensor([float(hi - lo) for lo, hi in windows[d]], dtype=torch.float64) for d in range(rank)]
        return rw.reshape(_divided(rw, out, _outer(counts), n.dtype), out_shape)
    taps = []
    for d in range(rank):
        start, end = (torch.tensor(v) for v in zip(*windows[d]))
        taps.append([(start + t, start + t < end) for t in range(int((end - start).max()))])
    index_shape, index_dtype = n.attrs["outputs"][1]
    return [rw.reshape(out, out_shape), rw.reshape(rw.cast(_window_argmax(rw, x, taps), index_dtype), index_shape)]


def _adaptive_window(i: int, size: int, out: int) -> tuple[int, int]:
    """torch's adaptive pooling window of output i: [floor(i * size / out), ceil((i + 1) * size / out))."""
    return i * size // out, -(-(i + 1) * size // out)
