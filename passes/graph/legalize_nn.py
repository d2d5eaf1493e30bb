"""legalize rules of the vision models' layers (issue 14): activations, paddings and normalizations, lowered to
the existing trnc op set (registered in passes/graph/legalize_table.py's `pm_legalize`).

Activations: the machine has exp, log and tanh but no expm1 or log1p, and e^x - 1 or log(1 + y) lose the
relative accuracy of small results (all of it below 2^-24), so both are written here from the accurate
functions: expm1(x) = 2 / (1/t - 1) with t = tanh(x / 2) (ScalarE's tanh is itself built on an accurate expm1),
log1p(y) = log(u) - ((u - 1) - y) / u with u = 1 + y (the second term undoes the rounding of u). Measured against
float64 on the machine's fp32 math (runtime/fp32math.py) over dense sweeps: expm1 4.4 ulp, elu and selu 3.7,
log1p 2.0, softplus and log_sigmoid 1.9, mish 4.2 (eager's mish is 17 ulp off near its subnormal results). Ops
whose torch decomposition would spell them out with expm1/log1p stay whole (`whole=True`) so these formulas apply.

Paddings: every mode maps output index j of a padded dim to an input index (or to the fill value), and that
map becomes a `cat` of slices (runs of consecutive indices), expands of one-wide slices (a repeated edge) and
filled slabs (free views); a negative pad is a slice. Circular padding reaches legalize as copy and
slice_scatter (torch decomposes it before export): copy here, slice_scatter in legalize_strided.py.

Normalizations: group norm and training-mode batch norm (what instance norm becomes) normalize rows of a
reshaped input with the fused row-wise `layer_norm` (fp32 statistics, as torch computes them), then apply the
per-channel weight and bias. Their mean and rstd outputs are computed by reductions that legalize prunes when
nothing reads them (the backward pass's buffers).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_table import TRUNCATED_BITS, Unusable, rule, truncated

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
EXPM1_BY_EXP = 0.5   # expm1 above this is e^x - 1 (1.7 ulp there); below, the tanh form (4.4 ulp)
LOG1P_BY_LOG = 0.5   # log1p of |y| above this is log(1 + y) (2 ulp there; exact at y = -1 and +inf)
SOFTPLUS_LINEAR = 20.0   # softplus(x) rounds to x in fp32 above 17, and e^x overflows above 88.7
MISH_EXP_MAX = 20.0      # mish(x) rounds to x above 9; m = e^x (e^x + 2) overflows above 44


# -- activations -------------------------------------------------------------------------------------------
# The formulas are chains where they can be: fuse joins an elementwise node to the kernel of its producer when
# that producer has no other user, and any other operand may be the chain's input, so a value read twice (t in
# 2t / (1 - t)) ends a kernel where one read (2 / (1/t - 1)) does not.
def _times(rw: Rewriter, x: ir.Node, value: float) -> ir.Node:
    return x if value == 1 else rw.scalar(x, "mul", value, dtype=FP32)


def _expm1_nonpositive(rw: Rewriter, x: ir.Node, scale: float, times: float) -> ir.Node:
    """times * expm1(scale * x) for scale * x <= 0, as 2 times / (1/t - 1) with t = tanh(scale x / 2): 4.4 ulp (no
    cancellation: 1/t <= -1). At x = 0 it is 0 (1/t is infinite); above 0 it is meaningless."""
    t = rw.unary(rw.scalar(x, "mul", scale / 2, dtype=FP32), "tanh", FP32)
    return rw.scalar(rw.scalar(rw.unary(t, "reciprocal", FP32), "sub", 1, dtype=FP32), "div", 2 * times,
                     reverse=True, dtype=FP32)


def _expm1(rw: Rewriter, x: ir.Node, dtype: DType) -> ir.Node:
    above = rw.scalar(x, "gt", EXPM1_BY_EXP)
    large = rw.scalar(rw.unary(x, "exp", FP32), "sub", 1, dtype=FP32)
    return rw.where(above, large, _expm1_nonpositive(rw, x, 1, 1), dtype)


def _log1p_of_nonnegative(rw: Rewriter, y: ir.Node) -> ir.Node:
    """log(1 + y) for finite y >= 0 (2 ulp): log(u) minus the rounding error of u = 1 + y over u. u - 1 is exact
    for u < 2^24, so (u - 1) - y is that error; above, the term is below half an ulp of log(u)."""
    u = rw.scalar(y, "add", 1, dtype=FP32)
    error = rw.binary("div", rw.binary("sub", rw.scalar(u, "sub", 1, dtype=FP32), y, FP32), u, FP32)
    return rw.binary("sub", rw.unary(u, "log", FP32), error, FP32)


def _float_only(rw: Rewriter, n) -> None:
    if not n.dtype.is_float:
        rw.fail(f"is supported on floating-point tensors only, not {n.dtype.text}")


@rule("aten.expm1.default")
def _expm1_rule(rw: Rewriter, n, a):
    _float_only(rw, n)
    return _expm1(rw, a["input"], n.dtype)


@rule("aten.log1p.default")
def _log1p_rule(rw: Rewriter, n, a):
    """The correction also holds for -0.5 <= y < 0 (u - 1 is exact for u >= 0.5); beyond |y| = 0.5 log(u) is
    accurate as it is, and right where the correction is not: log(0) = -inf, log(inf) = inf."""
    _float_only(rw, n)
    y = a["input"]
    beyond = rw.scalar(rw.unary(y, "abs", FP32), "gt", LOG1P_BY_LOG)
    near = _log1p_of_nonnegative(rw, y)
    return rw.where(beyond, rw.unary(rw.scalar(y, "add", 1, dtype=FP32), "log", FP32), near, n.dtype)


def _elu(rw: Rewriter, n, x: ir.Node, alpha: float, scale: float, input_scale: float) -> ir.Node:
    """scale * x for x > 0, else scale * alpha * expm1(input_scale * x) (coefficients in fp32, as torch's kernel).

    When 0 <= alpha * input_scale <= 1 (elu, celu) the negative side is above x, so the whole op is one chain:
    scale * max(x, alpha expm1(input_scale min(x, 0))); else (selu) a select by x > 0."""
    _float_only(rw, n)
    alpha, scale, input_scale = (float(np.float32(v)) for v in (alpha, scale, input_scale))
    if alpha >= 0 and input_scale >= 0 and alpha * input_scale <= 1:
        below = _expm1_nonpositive(rw, rw.scalar(x, "min", 0, dtype=FP32), input_scale, alpha)
        return rw.cast(_times(rw, rw.binary("max", below, x, FP32), scale), n.dtype)
    positive = rw.scalar(x, "gt", 0)
    if input_scale >= 0:
        below = _expm1_nonpositive(rw, x, input_scale, alpha)
    else:
        below = rw.scalar(_expm1(rw, _times(rw, x, input_scale), FP32), "mul", alpha, dtype=FP32)
    return rw.cast(_times(rw, rw.where(positive, x, below, FP32), scale), n.dtype)


@rule("aten.elu.default")
def _elu_rule(rw: Rewriter, n, a):
    return _elu(rw, n, a["input"], a["alpha"], a["scale"], a["input_scale"])


@rule("aten.celu.default", whole=True)
def _celu(rw: Rewriter, n, a):
    """elu with input_scale 1 / alpha, as torch computes it (its decomposition would call expm1)."""
    return _elu(rw, n, a["input"], a["alpha"], 1, 1 / a["alpha"])


@rule("aten.leaky_relu.default")
def _leaky_relu(rw: Rewriter, n, a):
    """x for x > 0, else slope * x: for a finite slope the larger of the two (the smaller if slope > 1), exact."""
    _float_only(rw, n)
    x, slope = a["input"], a["negative_slope"]
    if not math.isfinite(slope):
        rw.fail(f"with negative_slope={slope} is not supported; use a finite slope")
    return rw.binary("max" if slope <= 1 else "min", rw.scalar(x, "mul", slope, dtype=FP32), x, n.dtype)


@rule("aten.softplus.default", whole=True)
def _softplus(rw: Rewriter, n, a):
    """log1p(e^(beta x)) / beta, and x where beta x > threshold, as torch computes it. A threshold above 20 acts
    as 20, where the result rounds to x anyway (torch gives inf above 88.7, where e^(beta x) overflows)."""
    _float_only(rw, n)
    x, beta = a["input"], a["beta"]
    bx = _times(rw, x, beta)
    linear = rw.scalar(bx, "gt", min(a["threshold"], SOFTPLUS_LINEAR))
    soft = _log1p_of_nonnegative(rw, rw.unary(bx, "exp", FP32))
    return rw.where(linear, x, soft if beta == 1 else rw.scalar(soft, "div", beta, dtype=FP32), n.dtype)


@rule("aten.mish.default", whole=True)
def _mish(rw: Rewriter, n, a):
    """x tanh(log(1 + e^x)) = x / (1 + 2 / m) with m = e^x (e^x + 2): one exp and nothing that cancels, in two
    kernels (torch's decomposition, through softplus and tanh, takes five). Results below 1e-36 in magnitude
    (e^x < 3e-39, where 2 / m overflows) are flushed to 0."""
    _float_only(rw, n)
    x = a["input"]
    e = rw.unary(rw.scalar(x, "min", MISH_EXP_MAX, dtype=FP32), "exp", FP32)
    m = rw.binary("mul", rw.scalar(e, "add", 2, dtype=FP32), e, FP32)
    fraction = rw.unary(rw.scalar(rw.scalar(m, "div", 2, reverse=True, dtype=FP32), "add", 1, dtype=FP32),
                        "reciprocal", FP32)
    return rw.binary("mul", fraction, x, n.dtype)


@rule("aten.log_sigmoid_forward.default", whole=True)
def _log_sigmoid(rw: Rewriter, n, a):
    """min(x, 0) - log1p(e^-|x|), accurate for every x; the second output is a buffer of the backward pass."""
    _float_only(rw, n)
    x = a["input"]
    tail = _log1p_of_nonnegative(rw, rw.unary(rw.unary(rw.unary(x, "abs", FP32), "neg", FP32), "exp", FP32))
    return [rw.binary("sub", rw.scalar(x, "min", 0, dtype=FP32), tail, n.attrs["outputs"][0][1]), Unusable("buffer")]


# -- padding -----------------------------------------------------------------------------------------------
def _constant_index(j: int, size: int) -> int | None:
    return j if 0 <= j < size else None


def _reflect_index(j: int, size: int) -> int:
    j = -j if j < 0 else j
    return 2 * (size - 1) - j if j >= size else j


def _replicate_index(j: int, size: int) -> int:
    return min(max(j, 0), size - 1)


def _runs(indices: list[int | None]) -> list[list]:
    """The index map as [first index, count, step] runs: step 1 for consecutive indices, 0 for one index repeated
    or for a run of fill values (first None)."""
    runs: list[list] = []
    for i in indices:
        if runs:
            first, count, step = runs[-1]
            if first is None and i is None:
                runs[-1][1] += 1
                continue
            if first is not None and i is not None:
                diff = i - (first + step * (count - 1))
                if diff in ((0, 1) if count == 1 else (step,)):
                    runs[-1][1:] = [count + 1, diff]
                    continue
        runs.append([i, 1, 0])
    return runs


def _take_static(rw: Rewriter, x: ir.Node, dim: int, indices: list, fill, dtype: DType) -> ir.Node:
    """x along `dim` at the given indices (None: the fill value), as one cat of views."""
    pieces = []
    for first, count, step in _runs(indices):
        shape = x.shape[:dim] + (count,) + x.shape[dim + 1:]
        if first is None:
            pieces.append(rw.expand(fill, shape))
        elif step == 1:
            pieces.append(rw.slice(x, dim, first, first + count))
        else:
            pieces.append(rw.expand(rw.slice(x, dim, first, first + 1), shape))
    return rw.cat(pieces, dim, dtype)


def _pad(rw: Rewriter, n, x: ir.Node, pads, index_of, fill=None) -> ir.Node:
    """x padded as torch's `pad` lists it (before and after the last dim, then the one before, ...)."""
    for k in range(len(pads) // 2):
        dim = len(x.shape) - 1 - k
        before, after, size = pads[2 * k], pads[2 * k + 1], x.shape[dim]
        out = size + before + after
        if (before, after) == (0, 0):
            continue
        x = _take_static(rw, x, dim, [index_of(j - before, size) for j in range(out)], fill, n.dtype)
    return x


@rule("aten.constant_pad_nd.default")
def _constant_pad(rw: Rewriter, n, a):
    value = torch.tensor(a["value"], dtype=rw.arg_dtypes[0])   # converted as torch fills: truncated for integers
    return _pad(rw, n, a["input"], a["pad"], _constant_index, rw.const(value, n.dtype))


@rule("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default",
      whole=True)
def _reflection_pad(rw: Rewriter, n, a):
    """Kept whole: torch's decomposition is a gather by computed indices; this is a cat of one-wide slices."""
    return _pad(rw, n, a["input"], a["padding"], _reflect_index)


@rule("aten.replication_pad1d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default",
      whole=True)
def _replication_pad(rw: Rewriter, n, a):
    return _pad(rw, n, a["input"], a["padding"], _replicate_index)


@rule("aten.copy.default")
def _copy(rw: Rewriter, n, a):
    """`self` overwritten by `src`: src broadcast to self's shape, in self's dtype."""
    source, target = rw.arg_dtypes[1], rw.arg_dtypes[0]
    src = a["src"]
    if target is torch.bool and source is not torch.bool:
        src = rw.scalar(src, "ne", 0)
    elif source.is_floating_point and not target.is_floating_point:
        if target not in TRUNCATED_BITS:
            rw.fail(f"from {source} to {target} is not supported on a non-constant tensor: the machine holds "
                    f"{target} as int32, and torch gives values beyond int32's range")
        src = truncated(rw, src, target)
    return rw.expand(rw.cast(src, n.dtype), n.shape)


# -- normalization -----------------------------------------------------------------------------------------
def _normalized_rows(rw: Rewriter, rows: ir.Node, eps: float, dtype: DType) -> ir.Node:
    return rw.emit("layer_norm", (rows,), rows.shape, dtype, eps=float(eps), has_weight=False, has_bias=False)


def row_stats(rw: Rewriter, rows: ir.Node, eps: float, mean_dtype: DType, rstd_dtype: DType):
    """The mean of each row and 1 / sqrt(biased variance + eps), in fp32 (pruned when unused); also the sum of
    squared deviations, for the unbiased variance of the running statistics."""
    count = rows.shape[-1]
    mean = rw.scalar(rw.reduce(rows, "sum", (len(rows.shape) - 1,), True, FP32), "mul", 1 / count, dtype=FP32)
    centered = rw.binary("sub", rows, mean, FP32)
    squares = rw.reduce(rw.unary(centered, "square", FP32), "sum", (len(rows.shape) - 1,), False, FP32)
    rstd = rw.unary(rw.scalar(rw.scalar(squares, "mul", 1 / count, dtype=FP32), "add", eps, dtype=FP32), "rsqrt",
                    rstd_dtype)
    mean = rw.cast(rw.reshape(mean, mean.shape[:-1]), mean_dtype)
    return mean, rstd, squares


def _affine(rw: Rewriter, y: ir.Node, weight, bias, channel_dim: int, dtype: DType) -> ir.Node:
    """y * weight + bias with weight and bias per channel (the dim `channel_dim` of y), rounded once to dtype."""
    ones = (1,) * (len(y.shape) - channel_dim - 1)
    for op, p in (("mul", weight), ("add", bias)):
        if p is not None:
            y = rw.binary(op, y, rw.reshape(p, p.shape + ones), FP32)
    return rw.cast(y, dtype)


def empty_outputs(rw: Rewriter, n) -> list:
    """The outputs of a norm of an empty input: empty ones are empty, statistics over no values unsupported."""
    return [rw.filled(0, shape, dtype) if 0 in shape else Unusable("statistics over no values")
            for shape, dtype in n.attrs["outputs"]]


@rule("aten.native_group_norm.default")
def _group_norm(rw: Rewriter, n, a):
    """Each group of C / group channels of a sample is one row of the layer norm."""
    x, groups = a["input"], a["group"]
    if 0 in x.shape:
        return empty_outputs(rw, n)
    batch, channels = x.shape[0], x.shape[1]
    rows = rw.reshape(x, (batch, groups, math.prod(x.shape[1:]) // groups))
    (_, out_dtype), (_, mean_dtype), (_, rstd_dtype) = n.attrs["outputs"]
    affine = a["weight"] is not None or a["bias"] is not None
    y = _normalized_rows(rw, rows, a["eps"], FP32 if affine else out_dtype)
    y = _affine(rw, rw.reshape(y, (batch, channels, math.prod(x.shape[2:]))), a["weight"],
                a["bias"], 1, out_dtype)
    mean, rstd, _ = row_stats(rw, rows, a["eps"], mean_dtype, rstd_dtype)
    return [rw.reshape(y, x.shape), mean, rstd]


@rule("aten._native_batch_norm_legit.no_stats")   # the functional ops: legalize_misc, which calls this
def _batch_norm_training(rw: Rewriter, n, a):
    """Batch norm with the batch's statistics (training mode; instance norm is this on a [1, N*C, ...] view):
    each channel over the batch and spatial dims is one row of the layer norm. The functional form also returns
    the running statistics moved toward the batch's by `momentum` (the variance unbiased), as torch does."""
    x, momentum = a["input"], a["momentum"]
    if not a["training"]:
        rw.fail("with training=False is not supported here: inference-mode batch norm is "
                "aten._native_batch_norm_legit_no_training")
    if 0 in x.shape:
        return empty_outputs(rw, n)
    rank, channels = len(x.shape), x.shape[1]
    channel_first = (1, 0) + tuple(range(2, rank))   # a swap of dims 0 and 1, its own inverse
    channels_first = x if x.shape[0] == 1 else rw.permute(x, channel_first)
    rows = rw.reshape(channels_first, (channels, math.prod(x.shape) // channels))
    outputs = [dtype for _, dtype in n.attrs["outputs"]]
    affine = a["weight"] is not None or a["bias"] is not None
    y = _normalized_rows(rw, rows, a["eps"], FP32 if affine else outputs[0])
    if x.shape[0] == 1:
        y = rw.reshape(y, x.shape)
    else:
        y = rw.permute(rw.reshape(y, tuple(x.shape[d] for d in channel_first)), channel_first)
    y = _affine(rw, y, a["weight"], a["bias"], 1, outputs[0])
    mean, rstd, squares = row_stats(rw, rows, a["eps"], FP32, outputs[2])
    result = [y, rw.cast(mean, outputs[1]), rstd]
    if n.op in ("aten._native_batch_norm_legit_functional.default", "aten._batch_norm_with_update_functional.default"):
        count = rows.shape[1]
        unbiased = rw.scalar(squares, "mul", 1 / (count - 1) if count > 1 else math.nan, dtype=FP32)
        for stat, running, dtype in ((mean, a["running_mean"], outputs[-2]), (unbiased, a["running_var"], outputs[-1])):
            moved = rw.binary("add", rw.scalar(stat, "mul", momentum, dtype=FP32),
                              rw.scalar(running, "mul", 1 - momentum, dtype=FP32), dtype)
            result.append(moved)
    return result
