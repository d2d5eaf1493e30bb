"""legalize rules of nn and creation odds and ends (issue 16), composed from the existing rules and the trnc op
set (registered in passes/graph/legalize_table.py's `pm_legalize`).

Batch norm's functional forms: `_native_batch_norm_legit_functional` with training=False is the inference batch
norm of passes/graph/legalize_conv.py with the running statistics returned unchanged (its rule here replaces
legalize_nn's, which it calls for training=True); `_batch_norm_with_update_functional` is the training batch norm
of passes/graph/legalize_nn.py plus the running statistics moved toward the batch's (variance unbiased), as
torch's kernel does.

embedding_renorm (embedding with max_norm, functionalized to a new weight): every row some index reads whose
p-norm exceeds max_norm is scaled by max_norm / (norm + 1e-7), as torch's CPU kernel does; which rows are read
is a compare of the indices with the row numbers (exact: row numbers below 2^24), reduced over the indices.

F.linear_cross_entropy's chunked custom ops: one matmul, one log_softmax and a gather of the targets' entries (the
chunks only bound eager's memory).

Antialiased bilinear resize: shapes are static and the filter separable, so it is two matmuls by compile-time
[out, in] matrices, one per axis, taken from eager's own kernel in float64 on an identity (exactly torch's
support, triangle filter, normalization, align_corners and scale rules), rounded to fp32: measured 2^-23.6 of
max |x| from float64, where eager's fp32 kernel is 2^-19.6 off.

ldexp: an integer exponent is exact ldexp (bit for bit with eager, past 2^128 and into the subnormals); a float
one is x * 2^e as eager computes it: 1.60 ulp from the exact x * 2^e (eager's 1.41) on normal results, e in
[-120, 120].

linspace and logspace with 0-d tensor bounds (taken whole: torch's decomposition computes in float64, which the
machine lacks): eager's fp32 kernel formula, the first half start + step * i, the second end - step * (steps - 1 -
i); eager's vectorized loop rounds start + step * i0 + step * j instead, an ulp or so of the larger bound apart.
logspace is base^x of those exponents with eager's double base: 2.2 ulp from float64's base^x.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph import legalize_conv, legalize_matmul, legalize_nn, legalize_tail
from trnc.passes.graph.legalize_index import EXACT_FP32
from trnc.passes.graph.legalize_table import Unusable, keep_fp32_inside, rule, take

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32


# -- batch norm's functional forms -------------------------------------------------------------------------
@rule("aten._native_batch_norm_legit_functional.default")
def _batch_norm_functional(rw: Rewriter, n, a):
    """Training: legalize_nn's rule. Inference (training=False): the running statistics normalize, as
    `_native_batch_norm_legit_no_training` does, and come back unchanged; save_mean and save_rstd are empty."""
    if a["training"]:
        return legalize_nn._batch_norm_training(rw, n, a)
    out, *_ = legalize_conv._batch_norm(rw, n, a)
    (_, mean_out), (_, rstd_out), (_, mean_dtype), (_, var_dtype) = n.attrs["outputs"][1:]
    return [out, rw.filled(0, (0,), mean_out), rw.filled(0, (0,), rstd_out),
            rw.cast(a["running_mean"], mean_dtype), rw.cast(a["running_var"], var_dtype)]


@rule("aten._batch_norm_with_update_functional.default")
def _batch_norm_with_update(rw: Rewriter, n, a):
    """Training batch norm returning (out, save_mean, save_invstd, reserve (empty), new running_mean, new
    running_var): legalize_nn's functional training rule computes all but the reserve."""
    if 0 in a["input"].shape:   # statistics over no values
        return legalize_nn.empty_outputs(rw, n)
    y, mean, invstd, running_mean, running_var = legalize_nn._batch_norm_training(rw, n, {**a, "training": True})
    shape, dtype = n.attrs["outputs"][3]
    return [y, mean, invstd, rw.filled(0, shape, dtype), running_mean, running_var]


# -- embedding with max_norm -------------------------------------------------------------------------------
@rule("aten.embedding_renorm.default")
def _embedding_renorm(rw: Rewriter, n, a):
    """The weight with each row that `indices` reads scaled by max_norm / (norm + 1e-7) where its `norm_type`
    norm exceeds max_norm (torch's embedding_renorm_, functional). As eager, the norm and the scale are rounded
    to the weight's dtype (a bf16 weight then matches eager bit for bit; fp32 within an ulp: eager divides in
    double)."""
    weight, indices, max_norm, p = a["input"], a["indices"], float(a["max_norm"]), float(a["norm_type"])
    if not n.dtype.is_float:
        rw.fail(f"of a {n.dtype.text} weight is not supported")
    rows = weight.shape[0]
    if rows >= EXACT_FP32:
        rw.fail(f"of {rows} rows is not supported: row numbers above 2^24 are not exact in fp32")
    if 0 in weight.shape or 0 in indices.shape:
        return weight
    flat = rw.reshape(rw.cast(indices, DType.INT32), (math.prod(indices.shape), 1))
    numbers = rw.const(torch.arange(rows, dtype=torch.int32).reshape(1, rows), DType.INT32)
    read = rw.reduce(rw.cast(rw.binary("eq", flat, numbers), FP32), "max", (0,), False, FP32)   # [rows], 0 or 1
    norm = legalize_tail._norm(rw, weight, p, (1,), False, FP32)
    if n.dtype is not FP32:   # eager's norm is in w's dtype: rounded by a cast of its own (one inside _norm's
        norm = rw.cast(rw.cast(norm, n.dtype), FP32)   # last node was not: a bf16 sqrt read as fp32 kept fp32)
    scale = rw.scalar(rw.scalar(norm, "add", 1e-7, dtype=FP32), "div", max_norm, reverse=True, dtype=FP32)
    scaled = rw.binary("and", rw.scalar(read, "gt", 0.5), rw.scalar(norm, "gt", max_norm))
    factor = rw.where(scaled, scale, rw.filled(1.0, (rows,), FP32), n.dtype)   # eager's scalar, in w's dtype
    return keep_fp32_inside(rw.binary("mul", weight, rw.reshape(factor, (rows, 1)), n.dtype), weight, indices)


# -- chunked linear cross entropy --------------------------------------------------------------------------
@rule("torch_nn._linear_cross_entropy_batch_chunked.default",
      "torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default")
def _linear_cross_entropy(rw: Rewriter, n, a):
    """F.linear_cross_entropy's chunked ops (torch/nn/modules/linear_cross_entropy.py): logits = input @
    linear_weight.T + linear_bias, then each row's loss w[n] (logsumexp(logits[n]) - logits[n, target[n]]) with
    w[n] the class weight of its target (1 without weights) and 0 where target is ignore_index; 'mean' divides the
    sum by the sum of w (NaN when it is 0), 'sum' sums, the no_reduction op returns the rows. The chunks only bound
    eager's memory: the result is one matmul and one log_softmax. The scalar op's gradient outputs (computed in
    forward when autograd needs them) are not: empty ones are empty, others unusable."""
    x, lw, target, bias, weight = a["input"], a["linear_weight"], a["target"], a["linear_bias"], a["weight"]
    reduction = a.get("reduction", "none")
    if float(a.get("label_smoothing", 0.0)) != 0.0:
        rw.fail("with label_smoothing is not supported (F.linear_cross_entropy does not take the chunked path then)")
    (batch, _), classes = x.shape, lw.shape[0]
    if classes >= EXACT_FP32:
        rw.fail(f"over {classes} classes is not supported: class numbers above 2^24 are not exact in fp32")
    loss_dtype = n.attrs["outputs"][0][1] if "outputs" in n.attrs else n.dtype
    logits = legalize_matmul._matmul(rw, x, rw.permute(lw, (1, 0)), FP32,
                                     lambda p, **arith: p if bias is None else rw.binary("add", p, bias, FP32))
    ignored = rw.scalar(target, "eq", a["ignore_index"])
    picked = rw.where(ignored, rw.filled(0, target.shape, DType.INT32), rw.cast(target, DType.INT32), DType.INT32)
    if batch:
        logp = rw.emit("log_softmax", (logits,), logits.shape, FP32)
        nll = rw.scalar(rw.reshape(legalize_tail._gather_along(rw, logp, 1, rw.reshape(picked, (batch, 1))),
                                   (batch,)), "mul", -1.0, dtype=FP32)
    else:
        nll = rw.filled(0.0, (0,), FP32)
    w = rw.filled(1.0, (batch,), FP32) if weight is None else rw.cast(take(rw, weight, 0, picked), FP32)
    w = rw.where(ignored, rw.filled(0.0, (batch,), FP32), w, FP32)
    losses = rw.binary("mul", w, nll, FP32)
    if reduction == "none":
        return rw.cast(losses, loss_dtype)
    total = rw.reduce(losses, "sum", (0,), False, FP32)
    if reduction == "mean":
        d = rw.reduce(w, "sum", (0,), False, FP32)
        total = rw.where(rw.scalar(d, "eq", 0), rw.filled(math.nan, (), FP32), rw.binary("div", total, d, FP32), FP32)
    grads = [rw.filled(0, shape, dtype) if 0 in shape else Unusable("a gradient computed in forward")
             for shape, dtype in n.attrs["outputs"][1:]]
    return [rw.cast(total, loss_dtype)] + grads


# -- antialiased bilinear resize ---------------------------------------------------------------------------
AA_PROBE_MAX = 2048   # an axis's weights are probed with an n x n identity through eager; beyond, refused


def _aa_weights(size: int, out: int, align_corners: bool, scale, height: bool) -> torch.Tensor:
    """The [out, size] interpolation matrix of one axis of torch's antialiased bilinear resize: eager's own
    kernel in float64 applied to the identity (each input position a batch row), the other axis 2 -> 2 (an
    identity; a one-wide axis takes another path in eager). The filter is separable, so the two axes' matrices
    give the whole resize."""
    basis = torch.eye(size, dtype=torch.float64)
    if height:
        probe = basis.reshape(size, 1, size, 1).expand(size, 1, size, 2).contiguous()
        rows = torch.ops.aten._upsample_bilinear2d_aa(probe, (out, 2), align_corners, scale, None)[:, 0, :, 0]
    else:
        probe = basis.reshape(size, 1, 1, size).expand(size, 1, 2, size).contiguous()
        rows = torch.ops.aten._upsample_bilinear2d_aa(probe, (2, out), align_corners, None, scale)[:, 0, 0, :]
    return rows.T


@rule("aten._upsample_bilinear2d_aa.default", "aten._upsample_bilinear2d_aa.vec")
def _upsample_bilinear_aa(rw: Rewriter, n, a):
    """x [N, C, H, W] -> Wh @ x @ Ww.T with the axes' interpolation matrices (compile-time constants, fp32),
    the intermediate kept fp32; an axis whose matrix is the identity is skipped."""
    x = a["input"]
    if not n.dtype.is_float:
        rw.fail(f"of a {n.dtype.text} tensor is not supported")
    (*_, h, w), (*_, oh, ow) = x.shape, n.shape
    if n.op.endswith(".vec"):
        scales = a["scale_factors"] or (None, None)
    else:
        scales = (a["scales_h"], a["scales_w"])
    if ow == 1 and oh != h:
        rw.fail("to one output column with the height resized is not supported: torch's CPU kernel computes a "
                "different resize for that shape, which trnc does not reproduce")
    if max(h, w) > AA_PROBE_MAX:
        rw.fail(f"of an axis longer than {AA_PROBE_MAX} is not supported (its weights are computed at compile time)")
    y = x
    for dim, size, out, scale in ((3, w, ow, scales[1]), (2, h, oh, scales[0])):
        weights = _aa_weights(size, out, a["align_corners"], scale, dim == 2)
        if weights.shape[0] == weights.shape[1] and torch.equal(weights, torch.eye(size, dtype=torch.float64)):
            continue
        last = rw.permute(y, (0, 1, 3, 2)) if dim == 2 else y
        product = legalize_matmul._matmul(rw, last, rw.const(weights.T.float(), FP32), FP32)
        y = rw.permute(product, (0, 1, 3, 2)) if dim == 2 else product
    return rw.cast(y, n.dtype)


# -- ldexp -------------------------------------------------------------------------------------------------
LDEXP_CLAMP = (-298, 300)   # exponents beyond take every finite fp32 to 0 or inf, as these bounds do


@rule("aten.ldexp.Tensor")
def _ldexp(rw: Rewriter, n, a):
    """x * 2^other as eager computes it. A float `other`: mul(x, pow(2.0, other)), 2^other in other's dtype
    (inf from 2^128, 0 below 2^-149, as eager). An integer `other`: eager's product is exact (in double), rounded
    once to the result dtype, finite where 2^other alone is not; here x times up to three exact powers of two
    (the machine's pow of 2 is exact at integer exponents): up by at most 2^127 each (exact until an overflow,
    which eager's result has too), or down by 2^(e + 149) then 2^-149, the first exact unless the result is 0
    anyway, so only the last product rounds."""
    x, other = a["input"], a["other"]
    if not n.dtype.is_float:
        rw.fail(f"with result dtype {n.dtype.text} is not supported")
    if other.dtype.is_float:
        return rw.binary("mul", x, rw.scalar(other, "pow", 2.0, reverse=True, dtype=other.dtype), n.dtype)
    low, high = LDEXP_CLAMP
    e = rw.scalar(rw.scalar(rw.cast(other, FP32), "max", low, dtype=FP32), "min", high, dtype=FP32)
    first = rw.where(rw.scalar(e, "lt", -149), rw.scalar(e, "add", 149, dtype=FP32),
                     rw.scalar(e, "min", 127, dtype=FP32), FP32)
    rest = rw.binary("sub", e, first, FP32)
    second = rw.scalar(rw.scalar(rest, "max", -149, dtype=FP32), "min", 127, dtype=FP32)
    third = rw.binary("sub", rest, second, FP32)
    y = rw.cast(x, FP32)
    for p in (first, second, third):
        y = rw.binary("mul", y, rw.scalar(p, "pow", 2.0, reverse=True, dtype=FP32), FP32)
    return keep_fp32_inside(rw.cast(y, n.dtype), x, other)


# -- linspace and logspace with tensor bounds --------------------------------------------------------------
def _bound(rw: Rewriter, value) -> ir.Node:
    """A start or end as eager's kernel reads it (Scalar.to<float>): a 0-d tensor cast to fp32, a number rounded."""
    if isinstance(value, ir.Node):
        return rw.reshape(rw.cast(value, FP32), ())
    return rw.scalar_const(float(torch.tensor(float(value), dtype=torch.float32)), FP32)


def _linspace(rw: Rewriter, n, a) -> ir.Node:
    """eager's fp32 linspace: step = (end - start) / (steps - 1), the first steps // 2 values start + step * i, the
    rest end - step * (steps - 1 - i); one value is start."""
    steps = a["steps"]
    if n.dtype is not FP32 or n.attrs.get("float64"):
        rw.fail(f"with dtype {n.dtype.text} is not supported (computed as eager's float32 kernel only)")
    start, end = _bound(rw, a["start"]), _bound(rw, a["end"])
    if steps == 1:
        return rw.reshape(start, (1,))
    step = rw.scalar(rw.binary("sub", end, start, FP32), "div", steps - 1, dtype=FP32)
    half = steps // 2
    i = torch.arange(steps, dtype=torch.float32)
    low = rw.binary("add", start, rw.binary("mul", step, rw.const(i[:half], FP32), FP32), FP32)
    high = rw.binary("sub", end, rw.binary("mul", step, rw.const((steps - 1) - i[half:], FP32), FP32), FP32)
    return rw.cat([low, high] if half else [high], 0, FP32)


@rule("aten.linspace.Tensor_Tensor", "aten.linspace.Tensor_Scalar", "aten.linspace.Scalar_Tensor", whole=True)
def _linspace_rule(rw: Rewriter, n, a):
    return _linspace(rw, n, a)


@rule("aten.logspace.Tensor_Tensor", "aten.logspace.Tensor_Scalar", "aten.logspace.Scalar_Tensor", whole=True)
def _logspace_rule(rw: Rewriter, n, a):
    """base ^ (the fp32 linspace of the exponents), as eager's kernel, whose base is a double: a base fp32 cannot
    hold is b = fp32(base) times (base / b), and (base / b)^x = exp(x d) with d = log(base) - log(b) in float64
    (the machine's pow takes an fp32 base; 1.1^30 was 11 ulp off without the factor)."""
    base = float(a["base"])
    if base <= 0:
        rw.fail(f"with base {base} is not supported (a power of a base <= 0)")
    x = _linspace(rw, n, a)
    b = float(torch.tensor(base, dtype=torch.float32))
    power = rw.scalar(x, "pow", b, reverse=True, dtype=FP32)
    d = math.log(base) - math.log(b)
    if d == 0:
        return power
    return rw.binary("mul", power, rw.unary(rw.scalar(x, "mul", d, dtype=FP32), "exp", FP32), FP32)
