"""legalize's rules for convolution, pooling and batch norm in inference (registered in legalize_table.py).

A convolution becomes one `conv` node (docs/ir.md) over [N, C, H, W]: a 1-d one with H = 1, a transposed one as
the equivalent convolution over its input with zeros between the elements (`input_dilation`, which the kernel
places in SBUF, never in HBM) and the weight flipped. The weight is laid out [C_in / groups, KH, KW, C_out], so
that a tile of input channels is a tile of its rows; for a constant weight fold does this at compile time.
The bias is an `add` after it, which fuse puts into the kernel's PSUM evacuation.

Batch norm in inference is x * scale + shift per channel, scale and shift computed as torch's kernel computes
them (invstd = 1 / sqrt(var + eps), scale = invstd * weight, shift = bias - mean * scale, in fp32); after a
convolution the two steps fuse into its evacuation as one instruction with per-partition operands, the cost of a
bias alone, so folding them into the weights would save no engine time and would round differently from eager.

Pooling is a `pool` node: max (padding -inf) or sum (padding 0); an average is that sum divided by torch's
divisor (count_include_pad, divisor_override, the windows ceil_mode cuts short), which fuses into the
evacuation. Adaptive pooling with windows of one size is a plain pool; otherwise it is separable, a reduction
per output row and then per output column.
"""
from __future__ import annotations

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


def _batched(rw: Rewriter, x: ir.Node) -> ir.Node:
    """A 2-d pooling's input as [N, C, H, W]: an unbatched [C, H, W] gets N = 1 (torch's 1-d pools call the 2-d
    ones with H = 1 already)."""
    if len(x.shape) not in (3, 4):
        rw.fail(f"of a {len(x.shape)}-d input: [C, H, W] or [N, C, H, W] expected")
    return rw.reshape(x, (1, *x.shape) if len(x.shape) == 3 else x.shape)


@rule("aten.convolution.default")
def _convolution(rw: Rewriter, n, a):
    x, weight = a["input"], a["weight"]
    rank = len(x.shape) - 2
    if rank not in (1, 2):
        rw.fail(f"over {rank} spatial dims: trnc lowers 1-d and 2-d convolutions")
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
        out = _transposed(rw, n, x, weight, stride, dilation, pad, (0,) * (2 - rank) + out_pad, groups)
    else:
        layout = rw.permute(weight, (1, 2, 3, 0))
        out = _conv(rw, n, x, layout, stride, (pad[0], pad[0], pad[1], pad[1]), dilation, groups, (1, 1))
    if a["bias"] is not None:
        out = rw.binary("add", out, rw.reshape(a["bias"], (out.shape[1], 1, 1)))
    return rw.reshape(out, n.shape)


def _conv(rw: Rewriter, n, x, layout, stride, padding, dilation, groups, input_dilation) -> ir.Node:
    sizes = tuple(ir.window_out_size(x.shape[2 + d], layout.shape[1 + d], stride[d], padding[2 * d:2 * d + 2],
                                     dilation[d], input_dilation[d]) for d in (0, 1))
    if min(sizes) < 1:
        rw.fail(f"gives an empty output {list(sizes)}")
    return rw.emit("conv", (x, layout), (x.shape[0], layout.shape[3], *sizes), n.dtype, stride=tuple(stride),
                   padding=tuple(padding), dilation=tuple(dilation), groups=groups,
                   input_dilation=tuple(input_dilation))


def _transposed(rw: Rewriter, n, x, weight, stride, dilation, pad, out_pad, groups) -> ir.Node:
    """conv_transpose as a convolution of the input with stride - 1 zeros between its elements, padded by
    dilation * (K - 1) - padding (plus output_padding after), by the flipped weight with its channel axes
    swapped per group; a negative padding crops the result."""
    if weight.op != "const":
        rw.fail("with a weight computed at run time: the transposed convolution's flipped weight is made at "
                "compile time")
    w = rw.torch_value(weight, torch.float64)
    cin, cout_g, kh, kw = w.shape
    w = w.reshape(groups, cin // groups, cout_g, kh, kw).transpose(1, 2).flip(3, 4)
    layout = rw.const(w.permute(2, 3, 4, 0, 1).reshape(cin // groups, kh, kw, groups * cout_g), weight.dtype)
    lo = [dilation[d] * (k - 1) - pad[d] for d, k in enumerate((kh, kw))]
    hi = [lo[d] + out_pad[d] for d in (0, 1)]
    padding = (max(lo[0], 0), max(hi[0], 0), max(lo[1], 0), max(hi[1], 0))
    out = _conv(rw, n, x, layout, (1, 1), padding, dilation, groups, stride)
    for d in (0, 1):
        out = rw.slice(out, 2 + d, max(-lo[d], 0), out.shape[2 + d] - max(-hi[d], 0))
    return out


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
    reaches (more than `pad` under ceil_mode, or none), so the node's shape rule holds."""
    after = [max(0, (out_size[d] - 1) * stride[d] + dilation[d] * (kernel[d] - 1) + 1 - x.shape[2 + d] - pad[d])
             for d in (0, 1)]
    return rw.emit("pool", (x,), (*x.shape[:2], *out_size), dtype, op=op, kernel=tuple(kernel), stride=tuple(stride),
                   padding=(pad[0], after[0], pad[1], after[1]), dilation=tuple(dilation), keep_fp32=op == "sum")


def _pool_args(a, rank: int):
    kernel = _pair(a["kernel_size"], rank)
    stride = _pair(a["stride"], rank) if a["stride"] else kernel
    return kernel, stride, _pair(a["padding"], rank)


@rule("aten.max_pool2d_with_indices.default")
def _max_pool(rw: Rewriter, n, a):
    x = _batched(rw, a["input"])
    kernel, stride, pad = _pool_args(a, 2)
    dilation = _pair(a["dilation"])
    (out_shape, _), (index_shape, index_dtype) = n.attrs["outputs"][:2]
    out = _pool(rw, n, x, "max", kernel, stride, pad, dilation, out_shape[-2:], x.dtype)
    taps = [[(torch.arange(out_shape[-2 + d]) * stride[d] - pad[d] + t * dilation[d], x.shape[2 + d])
             for t in range(kernel[d])] for d in (0, 1)]
    indices = _window_argmax(rw, x, *[[(i, (i >= 0) & (i < size)) for i, size in taps[d]] for d in (0, 1)])
    return [rw.reshape(out, out_shape), rw.reshape(rw.cast(indices, index_dtype), index_shape)]


def _window_argmax(rw: Rewriter, x: ir.Node, rows, cols) -> ir.Node:
    """The indices output of a max pool over [N, C, H, W], as torch's CPU loop finds them: h * W + w of the first
    element of each window that is greater than all before it, or NaN (so the last NaN), starting from the
    window's first element. Windows are given per axis as taps (input position of each output row or column, and
    whether it lies in that output's window), visited in the loop's order; each tap is a gather by constant
    positions, a compare and two selects. int32 (index_bound), exact in fp32 for H * W within 2^24."""
    width = x.shape[3]
    first = None
    for (r, r_in), (c, c_in) in reversed([(row, col) for row in rows for col in cols]):
        inside = r_in[:, None] & c_in[None, :]
        here = (r[:, None] * width + c[None, :]).float()
        first = here if first is None else torch.where(inside, here, first)
    best_value = rw.filled(-math.inf, (*x.shape[:2], len(rows[0][0]), len(cols[0][0])), x.dtype)
    best = rw.const(first, DType.FP32)
    for (r, r_in), (c, c_in) in ((row, col) for row in rows for col in cols):
        inside = r_in[:, None] & c_in[None, :]
        if not inside.any():
            continue
        value = take(rw, take(rw, x, 2, rw.const(r.clamp(0, x.shape[2] - 1), DType.INT32)), 3,
                     rw.const(c.clamp(0, width - 1), DType.INT32))
        better = rw.binary("or", rw.binary("gt", value, best_value), rw.binary("ne", value, value))
        if not inside.all():
            better = rw.binary("and", better, rw.const(inside, DType.UINT8))
        best_value = rw.where(better, value, best_value, x.dtype)
        best = rw.where(better, rw.const((r[:, None] * width + c[None, :]).float(), DType.FP32), best, DType.FP32)
    return keep_fp32_inside(_to_int(rw, best, DType.INT32, x.shape[2] * width), x)   # compares as eager's, in fp32


@rule("aten.avg_pool2d.default")
def _avg_pool(rw: Rewriter, n, a):
    x = _batched(rw, a["input"])
    kernel, stride, pad = _pool_args(a, 2)
    out_size = n.shape[-2:]
    total = _pool(rw, n, x, "sum", kernel, stride, pad, (1, 1), out_size, DType.FP32)
    divisor = _avg_divisors(x.shape[2:], out_size, kernel, stride, pad, a["count_include_pad"],
                            a["divisor_override"])
    return rw.reshape(_divided(rw, total, divisor, n.dtype), n.shape)


def _avg_divisors(size, out_size, kernel, stride, pad, include_pad: bool, override) -> torch.Tensor:
    """torch's avg_pool2d divisor of each output: the window clipped to the padded input (count_include_pad)
    or to the input itself, unless divisor_override."""
    if override:
        return torch.full(tuple(out_size), float(override), dtype=torch.float64)

    def counts(d: int) -> torch.Tensor:
        start = torch.arange(out_size[d]) * stride[d] - pad[d]
        end = torch.clamp(start + kernel[d], max=size[d] + pad[d])
        if include_pad:
            return (end - start).double()
        return (torch.clamp(end, max=size[d]) - torch.clamp(start, min=0)).double()
    return counts(0)[:, None] * counts(1)[None, :]


def _divided(rw: Rewriter, total: ir.Node, divisor: torch.Tensor, dtype: DType) -> ir.Node:
    """total / divisor (one value, or one per output position), then in `dtype`."""
    if bool((divisor == divisor.flatten()[0]).all()):
        out = rw.scalar(total, "div", float(divisor.flatten()[0]), dtype=DType.FP32)
    else:
        out = rw.binary("div", total, rw.const(divisor, DType.FP32), DType.FP32)
    return rw.cast(out, dtype)


@rule("aten._adaptive_avg_pool2d.default", "aten.adaptive_max_pool2d.default")
def _adaptive_pool(rw: Rewriter, n, a):
    x = _batched(rw, a["input"])
    op = "max" if "max" in n.op else "sum"
    size, out_size = x.shape[2:], _pair(a["output_size"])
    out_shape = n.attrs["outputs"][0][0] if op == "max" else n.shape
    dtype = x.dtype if op == "max" else DType.FP32
    if all(size[d] % out_size[d] == 0 for d in (0, 1)):
        kernel = tuple(size[d] // out_size[d] for d in (0, 1))
        out = _pool(rw, n, x, op, kernel, kernel, (0, 0), (1, 1), out_size, dtype)
    elif sum(out_size) <= MAX_ADAPTIVE_REDUCTIONS:
        out = x
        for d in (0, 1):
            parts = [rw.reduce(rw.slice(out, 2 + d, *_adaptive_window(i, size[d], out_size[d])), op, (2 + d,), True,
                               dtype) for i in range(out_size[d])]
            out = rw.cat(parts, 2 + d, dtype)
            for node in [*parts, out]:
                node.attrs["keep_fp32"] = op == "sum"
    else:
        rw.fail(f"to {list(out_size)} from {list(size)}: windows of several sizes and more than "
                f"{MAX_ADAPTIVE_REDUCTIONS} output rows and columns")
    windows = [[_adaptive_window(i, size[d], out_size[d]) for i in range(out_size[d])] for d in (0, 1)]
    if op == "sum":
        counts = [torch.tensor([float(hi - lo) for lo, hi in windows[d]], dtype=torch.float64) for d in (0, 1)]
        out = _divided(rw, out, counts[0][:, None] * counts[1][None, :], n.dtype)
        return rw.reshape(out, out_shape)
    taps = []
    for d in (0, 1):
        start, end = (torch.tensor(v) for v in zip(*windows[d]))
        taps.append([(start + t, start + t < end) for t in range(int((end - start).max()))])
    index_shape, index_dtype = n.attrs["outputs"][1]
    return [rw.reshape(out, out_shape), rw.reshape(rw.cast(_window_argmax(rw, x, *taps), index_dtype), index_shape)]


def _adaptive_window(i: int, size: int, out: int) -> tuple[int, int]:
    """torch's adaptive pooling window of output i: [floor(i * size / out), ceil((i + 1) * size / out))."""
    return i * size // out, -(-(i + 1) * size // out)
