"""The rules of legalize (passes/graph/legalize.py): one per Core ATen op, aten name -> trnc nodes, registered in
passes/graph/legalize_table.py; the matmul and attention rules are in passes/graph/legalize_matmul.py.

A rule is `rule(rw, node, a)`: `rw` the Rewriter (its helpers build trnc nodes and skip no-ops),
`node` the aten node (its shape and dtype are the result torch computed), `a` the arguments bound
by schema name (the schema's `self` is `input`, as torch.fx names it). It returns the value: a node,
an input node reused (views that change nothing, clone, dropout in eval), a list for multi-output
ops, or None for ops without a result (asserts).
The rules follow the attr conventions of docs/ir.md, which the kernels rely on.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.dtypes import DTYPES
from trnc.isa.dtypes import DType
from trnc.passes.graph import legalize_bessel  # noqa: F401  (registers the Bessel-family special function rules)
from trnc.passes.graph import legalize_conv  # noqa: F401  (registers the convolution, pooling, batch norm rules)
from trnc.passes.graph import legalize_index  # noqa: F401  (registers the arg-reduction and scan rules)
from trnc.passes.graph import legalize_matmul  # noqa: F401  (registers the matmul and attention rules)
from trnc.passes.graph import legalize_math  # noqa: F401  (registers the math function rules)
from trnc.passes.graph import legalize_nn  # (registers the activation, padding and norm rules; row statistics)
from trnc.passes.graph import legalize_polynomials  # noqa: F401  (registers the orthogonal polynomial rules)
from trnc.passes.graph import legalize_scatter  # noqa: F401  (registers the scatter and index update rules)
from trnc.passes.graph import legalize_sort  # noqa: F401  (registers the sort, top-k and k-th value rules)
from trnc.passes.graph import legalize_strided  # noqa: F401  (registers as_strided, view scatters, max_unpool)
from trnc.passes.graph import legalize_segments  # noqa: F401  (registers segment_reduce and embedding_bag)
from trnc.passes.graph import legalize_sample  # noqa: F401  (registers fractional max pools, grid samplers)
from trnc.passes.graph import legalize_random  # (registers the random ops' rules; training-mode dropout)
from trnc.passes.graph import legalize_tail  # noqa: F401  (registers the vector norm, sign and structure rules)
from trnc.passes.graph import legalize_misc  # noqa: F401  (registers the nn and creation odds and ends)
from trnc.passes.graph import legalize_zeta  # noqa: F401  (registers the Hurwitz zeta rule)
from trnc.passes.graph.legalize_table import (TRUNCATED_BITS, Unusable, dim_of, dims_of, index_tensor,
                                              keep_fp32_inside, pm_legalize, pm_whole, rule, take, truncated)

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

# -- elementwise ---------------------------------------------------------------------------------------
UNARY = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "sqrt": "sqrt",
         "rsqrt": "rsqrt", "reciprocal": "reciprocal", "abs": "abs", "neg": "neg", "silu": "silu", "square": "square"}
for _name, _func in UNARY.items():
    pm_legalize[f"aten.{_name}.default"] = lambda rw, n, a, func=_func: rw.unary(a["input"], func)

pm_whole.add("aten.silu.default")   # one ScalarE function; torch's table spells it x * sigmoid(x)


@rule("aten.gelu.default", whole=True)
def _gelu(rw: Rewriter, n, a):
    if a["approximate"] not in ("none", "tanh"):
        rw.fail(f"with approximate={a['approximate']!r} is not supported; use 'none' or 'tanh'")
    return rw.unary(a["input"], "gelu" if a["approximate"] == "none" else "gelu_tanh")


BOOL_ARITH = {"add": "or", "mul": "and"}   # what torch computes for + and * of bool tensors


def _arith(op: str):
    def lower(rw: Rewriter, n, a):
        x, other = a["input"], a["other"]
        alpha = a.get("alpha", 1)
        if all(d is torch.bool for d in rw.arg_dtypes) and op in BOOL_ARITH and n.dtype is DType.UINT8:
            return rw.arith(BOOL_ARITH[op], x, other)
        rounded = rw.in_common_dtype(x, other)
        # torch's CPU mul and div of a bf16 or fp16 tensor by a number use the number in fp32, unrounded (opmath)
        x, other = rounded if op not in ("mul", "div") else (
            r if isinstance(v, ir.Node) else v for v, r in zip((x, other), rounded))
        if alpha is not None and alpha != 1:
            other = rw.scalar(other, "mul", alpha) if isinstance(other, ir.Node) else other * alpha
        return legalize_index.bound_integer_arith(rw, rw.arith(op, x, other))
    return lower


for _op in ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge"):
    pm_legalize[f"aten.{_op}.Tensor"] = pm_legalize[f"aten.{_op}.Scalar"] = _arith(_op)
for _aten, _op in (("maximum", "max"), ("minimum", "min"), ("logical_and", "and"), ("logical_or", "or"),
                   ("logical_xor", "xor")):
    pm_legalize[f"aten.{_aten}.default"] = _arith(_op)


@rule("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(rw: Rewriter, n, a):
    x = a["input"] if a["alpha"] == 1 else rw.scalar(a["input"], "mul", a["alpha"])
    return rw.arith("sub", a["other"], x)


@rule("aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor", "aten.bitwise_and.Scalar",
      "aten.bitwise_or.Scalar", "aten.bitwise_xor.Scalar")
def _bitwise(rw: Rewriter, n, a):
    if any(d is not torch.bool for d in rw.arg_dtypes) or not all(isinstance(v, (ir.Node, bool)) for v in a.values()):
        rw.fail("is supported on bool tensors only")
    return rw.arith(n.op.split(".")[1].split("_")[1], a["input"], a["other"])


@rule("aten.logical_not.default", "aten.bitwise_not.default")
def _not(rw: Rewriter, n, a):
    if n.op == "aten.bitwise_not.default" and rw.arg_dtypes[0] is not torch.bool:
        rw.fail("is supported on bool tensors only")
    return rw.scalar(a["input"], "eq", 0)


POW_FUNCS = {2: "square", 0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal"}


@rule("aten.pow.Tensor_Scalar")
def _pow_scalar(rw: Rewriter, n, a):
    x, e = a["input"], a["exponent"]
    if e == 1:
        return rw.cast(x, n.dtype)
    if e == 0:
        return rw.expand(rw.scalar_const(1, n.dtype), n.shape)
    if e in POW_FUNCS:
        return rw.unary(x, POW_FUNCS[e])
    if e in (3, -2) and n.dtype.is_float:   # as torch's pow kernel: (x * x) * x and 1 / (x * x), bit for bit
        square = rw.binary("mul", x, x)
        return rw.binary("mul", square, x) if e == 3 else rw.unary(square, "reciprocal")
    return rw.scalar(x, "pow", e)


@rule("aten.pow.Tensor_Tensor")
def _pow_tensor(rw: Rewriter, n, a):
    return rw.binary("pow", a["input"], a["exponent"])


@rule("aten.pow.Scalar")
def _pow_base(rw: Rewriter, n, a):
    return rw.scalar(a["exponent"], "pow", a["input"], reverse=True)


def _clamp(rw: Rewriter, x, low, high):
    for op, bound in (("max", low), ("min", high)):
        if bound is not None:
            x = rw.arith(op, x, bound)
    return x


@rule("aten.clamp.default", "aten.clamp.Tensor")
def _clamp_rule(rw: Rewriter, n, a):
    return _clamp(rw, a["input"], a["min"], a["max"])


@rule("aten.clamp_min.default", "aten.clamp_min.Tensor")
def _clamp_min(rw: Rewriter, n, a):
    return _clamp(rw, a["input"], a["min"], None)


@rule("aten.clamp_max.default", "aten.clamp_max.Tensor")
def _clamp_max(rw: Rewriter, n, a):
    return _clamp(rw, a["input"], None, a["max"])


@rule("aten.hardtanh.default")
def _hardtanh(rw: Rewriter, n, a):
    return _clamp(rw, a["input"], a["min_val"], a["max_val"])


def _tensor(rw: Rewriter, v, dtype: DType) -> ir.Node:
    return v if isinstance(v, ir.Node) else rw.scalar_const(v, dtype)


@rule("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(rw: Rewriter, n, a):
    return rw.where(a["condition"], _tensor(rw, a["input"], n.dtype), _tensor(rw, a["other"], n.dtype))


@rule("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(rw: Rewriter, n, a):
    return rw.where(a["mask"], _tensor(rw, a["value"], n.dtype), a["input"])


# -- dtypes and identities ---------------------------------------------------------------------------------
@rule("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.to.other",
      "aten.type_as.default")
def _convert(rw: Rewriter, n, a):
    x, source = a["input"], rw.arg_dtypes[0]
    target = a.get("dtype")
    if "other" in a:
        target = rw.arg_dtypes[1]
    if target is None or target == source:
        return x
    if target is torch.bool:
        return rw.scalar(x, "ne", 0)
    if source.is_floating_point and not target.is_floating_point:
        if target not in TRUNCATED_BITS:
            rw.fail(f"from {source} to {target} is not supported on a non-constant tensor: the machine holds "
                    f"{target} as int32, and torch gives values beyond int32's range")
        return truncated(rw, x, target)
    return rw.cast(x, DTYPES[target])


@rule("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.lift_fresh_copy.default",
      "aten.contiguous.default")
def _identity(rw: Rewriter, n, a):
    return a["input"]


@rule("aten.dropout.default", "aten.native_dropout.default")
def _dropout(rw: Rewriter, n, a):
    if a["train"] and a["p"] > 0:
        out, keep = legalize_random.dropout(rw, a["input"], float(a["p"]))
        return out if n.op == "aten.dropout.default" else [out, keep]
    return a["input"] if n.op == "aten.dropout.default" else [a["input"], Unusable("dropout mask")]


@rule("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
      "aten.sym_constrain_range_for_size.default")
def _no_result(rw: Rewriter, n, a):
    return None


# -- creation ------------------------------------------------------------------------------------------
def _filled(value):
    """The creation ops (the empty ones give zeros: eager's memory nobody wrote). A float64 result is a constant
    tensor, which the machine may hold (a filled view of a 0-d constant would be a value computed on device)."""
    def lower(rw: Rewriter, n, a):
        v = a[value] if isinstance(value, str) else value
        if n.attrs.get("float64"):
            return rw.const(torch.full(n.shape, v, dtype=torch.float64), n.dtype)
        return rw.filled(v, n.shape, n.dtype)
    return lower


for _op, _value in (("full.default", "fill_value"), ("full_like.default", "fill_value"),
                    ("new_full.default", "fill_value"), ("fill.Scalar", "value"), ("scalar_tensor.default", "s"),
                    ("zeros.default", 0), ("zeros_like.default", 0), ("new_zeros.default", 0),
                    ("ones.default", 1), ("ones_like.default", 1), ("new_ones.default", 1),
                    ("empty.memory_format", 0), ("empty_like.default", 0), ("new_empty.default", 0),
                    ("empty_strided.default", 0), ("empty_permuted.default", 0),
                    ("new_empty_strided.default", 0)):
    pm_legalize[f"aten.{_op}"] = _filled(_value)


# -- reductions -------------------------------------------------------------------------------------------
def _acc(dtype: DType) -> DType:
    """The dtype of intermediates inside one decomposed op: fp32 for floats, so the result rounds once."""
    return DType.FP32 if dtype.is_float else dtype


def _mean(rw: Rewriter, x, axes, keepdim, dtype):
    count = math.prod(x.shape[d] for d in axes)
    scale = 1.0 / count if count else math.nan   # the mean of no values is nan, as in torch
    return rw.scalar(rw.reduce(x, "sum", axes, keepdim, _acc(dtype)), "mul", scale, dtype=dtype)


def _var(rw: Rewriter, x, axes, correction, keepdim, dtype):
    count = math.prod(x.shape[d] for d in axes)
    acc = _acc(dtype)
    centered = rw.binary("sub", x, _mean(rw, x, axes, True, acc), acc)
    total = rw.reduce(rw.unary(centered, "square", acc), "sum", axes, keepdim, acc)
    # torch divides by max(count - correction, 0): by 0 when there are too few values, giving nan (or inf)
    scale = 1.0 / (count - correction) if count > correction else math.inf
    return rw.scalar(total, "mul", scale, dtype=dtype)


def _correction(a) -> float:
    if a.get("correction") is not None:
        return a["correction"]
    return 1 if a.get("unbiased", True) else 0


@rule("aten.sum.dim_IntList", "aten.sum.default")
def _sum(rw: Rewriter, n, a):
    x = a["input"]
    return rw.reduce(x, "sum", dims_of(a.get("dim"), len(x.shape)), a.get("keepdim", False))


@rule("aten.mean.dim", "aten.mean.default")
def _mean_rule(rw: Rewriter, n, a):
    x = a["input"]
    return keep_fp32_inside(_mean(rw, x, dims_of(a.get("dim"), len(x.shape)), a.get("keepdim", False), n.dtype), x)


@rule("aten.amax.default", "aten.amin.default", "aten.max.default", "aten.min.default")
def _extreme(rw: Rewriter, n, a):
    x = a["input"]
    op = "max" if n.op.split(".")[1] in ("amax", "max") else "min"
    return rw.reduce(x, op, dims_of(a.get("dim"), len(x.shape)), a.get("keepdim", False))


@rule("aten.var.correction", "aten.var.dim", "aten.var.default", "aten.std.correction", "aten.std.dim",
      "aten.std.default")
def _var_rule(rw: Rewriter, n, a):
    x = a["input"]
    var = _var(rw, x, dims_of(a.get("dim"), len(x.shape)), _correction(a), a.get("keepdim", False), _acc(n.dtype))
    return keep_fp32_inside(rw.unary(var, "sqrt") if n.op.startswith("aten.std") else rw.cast(var, n.dtype), x)


@rule("aten.var_mean.correction", "aten.var_mean.dim", "aten.var_mean.default")
def _var_mean(rw: Rewriter, n, a):
    x = a["input"]
    axes, keepdim = dims_of(a.get("dim"), len(x.shape)), a.get("keepdim", False)
    return [keep_fp32_inside(_var(rw, x, axes, _correction(a), keepdim, n.dtype), x),
            keep_fp32_inside(_mean(rw, x, axes, keepdim, n.dtype), x)]


@rule("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim", "aten.all.dims", "aten.all.default")
def _any_all(rw: Rewriter, n, a):
    x = a["input"]
    if rw.arg_dtypes[0] is not torch.bool:
        x = rw.scalar(x, "ne", 0)
    op = "max" if n.op.startswith("aten.any") else "min"
    return rw.reduce(x, op, dims_of(a.get("dim"), len(x.shape)), a.get("keepdim", False), DType.UINT8)


# -- row-wise ----------------------------------------------------------------------------------------------
def _last_axis(rw: Rewriter, x, dim: int, build):
    """build(x) over the last axis; another dim is swapped to the end and back (a swap is its own inverse)."""
    rank = len(x.shape)
    if rank == 0:
        return rw.reshape(build(rw.reshape(x, (1,))), ())
    dim = dim_of(dim, rank)
    if dim == rank - 1:
        return build(x)
    swap = list(range(rank))
    swap[dim], swap[-1] = rank - 1, dim
    return rw.permute(build(rw.permute(x, swap)), swap)


@rule("aten._softmax.default", "aten._log_softmax.default", "aten.softmax.int", "aten.log_softmax.int", whole=True)
def _softmax(rw: Rewriter, n, a):
    op = "log_softmax" if "log_softmax" in n.op else "softmax"
    return _last_axis(rw, a["input"], a["dim"], lambda x: rw.emit(op, (x,), x.shape, n.dtype))


def _layer_norm(rw: Rewriter, n, a, dtype: DType):
    x, k = a["input"], len(a["normalized_shape"])
    weight, bias = a["weight"], a["bias"]
    if k > 1:   # merge the normalized trailing dims into one last axis
        size = math.prod(x.shape[-k:])
        x = rw.reshape(x, x.shape[:-k] + (size,))
        weight = weight and rw.reshape(weight, (size,))
        bias = bias and rw.reshape(bias, (size,))
    params = tuple(p for p in (weight, bias) if p is not None)
    out = rw.emit("layer_norm", (x, *params), x.shape, dtype, eps=float(a["eps"]), has_weight=weight is not None,
                  has_bias=bias is not None)
    return rw.reshape(out, a["input"].shape)


@rule("aten.layer_norm.default", whole=True)
def _layer_norm_rule(rw: Rewriter, n, a):
    return _layer_norm(rw, n, a, n.dtype)


@rule("aten.native_layer_norm.default", whole=True)
def _native_layer_norm(rw: Rewriter, n, a):
    """The normalized tensor, and each row's mean and 1 / sqrt(variance + eps) (legalize_nn.row_stats, pruned
    where unused, as in every model's layer norms)."""
    (_, out_dtype), (stat_shape, mean_dtype), (_, rstd_dtype) = n.attrs["outputs"]
    x, k = a["input"], len(a["normalized_shape"])
    if 0 in x.shape:
        return legalize_nn.empty_outputs(rw, n)
    rows = rw.reshape(x, (math.prod(x.shape[:-k]), math.prod(x.shape[-k:])))
    mean, rstd, _ = legalize_nn.row_stats(rw, rows, a["eps"], mean_dtype, rstd_dtype)
    return [_layer_norm(rw, n, a, out_dtype), rw.reshape(mean, stat_shape), rw.reshape(rstd, stat_shape)]


# -- movement -------------------------------------------------------------------------------------------------
@rule("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.squeeze.default",
      "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default", "aten.flatten.using_ints",
      "aten.unflatten.int", "aten.view_as.default")
def _reshape(rw: Rewriter, n, a):
    return rw.reshape(a["input"], n.shape)


@rule("aten.permute.default")
def _permute(rw: Rewriter, n, a):
    x = a["input"]
    return rw.permute(x, [dim_of(d, len(x.shape)) for d in a["dims"]])


@rule("aten.transpose.int", "aten.t.default")
def _transpose(rw: Rewriter, n, a):
    x = a["input"]
    rank = len(x.shape)
    if rank < 2:
        return x
    d0, d1 = (dim_of(a["dim0"], rank), dim_of(a["dim1"], rank)) if "dim0" in a else (0, 1)
    dims = list(range(rank))
    dims[d0], dims[d1] = d1, d0
    return rw.permute(x, dims)


@rule("aten.expand.default", "aten.expand_as.default")
def _expand(rw: Rewriter, n, a):
    return rw.expand(a["input"], n.shape)


@rule("aten.repeat.default")
def _repeat(rw: Rewriter, n, a):
    repeats = list(a["repeats"])
    x = a["input"]
    shape = (1,) * (len(repeats) - len(x.shape)) + x.shape
    interleaved = rw.reshape(x, [d for s in shape for d in (1, s)])
    tiled = rw.expand(interleaved, [d for r, s in zip(repeats, shape) for d in (r, s)])
    return rw.reshape(tiled, n.shape)


def _bound(v, size: int, default: int) -> int:
    """A slice bound as Python clamps it: None is the default, negatives count from the end."""
    if v is None:
        return default
    v = v + size if v < 0 else v
    return min(max(v, 0), size)


@rule("aten.slice.Tensor")
def _slice(rw: Rewriter, n, a):
    x = a["input"]
    dim = dim_of(a["dim"], len(x.shape))
    size = x.shape[dim]
    start = _bound(a["start"], size, 0)
    stop = max(start, _bound(a["end"], size, size))
    return rw.slice(x, dim, start, stop, a["step"] or 1)


@rule("aten.select.int")
def _select(rw: Rewriter, n, a):
    x = a["input"]
    dim = dim_of(a["dim"], len(x.shape))
    index = a["index"] + x.shape[dim] if a["index"] < 0 else a["index"]
    return rw.reshape(rw.slice(x, dim, index, index + 1), n.shape)


@rule("aten.narrow.default")
def _narrow(rw: Rewriter, n, a):
    x = a["input"]
    dim = dim_of(a["dim"], len(x.shape))
    start = a["start"] + x.shape[dim] if a["start"] < 0 else a["start"]
    return rw.slice(x, dim, start, start + a["length"])


@rule("aten.cat.default")
def _cat(rw: Rewriter, n, a):
    xs = [x for x in a["tensors"] if x.shape != (0,)]   # torch skips legacy empty 1-D tensors
    return rw.cat(xs, dim_of(a["dim"], len(n.shape)), n.dtype)


@rule("aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int")
def _split(rw: Rewriter, n, a):
    x = a["input"]
    dim = dim_of(a["dim"], len(x.shape))
    start, pieces = 0, []
    for shape, _ in n.attrs["outputs"]:
        size = 1 if n.op == "aten.unbind.int" else shape[dim]
        pieces.append(rw.reshape(rw.slice(x, dim, start, start + size), shape))
        start += size
    return pieces


# -- gathers --------------------------------------------------------------------------------------------------
@rule("aten.embedding.default")
def _embedding(rw: Rewriter, n, a):
    return take(rw, a["weight"], 0, a["indices"])


@rule("aten.index_select.default")
def _index_select(rw: Rewriter, n, a):
    x = a["input"]
    if not x.shape:   # torch indexes a 0-d tensor as the one element of a 1-d one
        return rw.reshape(take(rw, rw.reshape(x, (1,)), 0, a["index"]), n.shape)
    return take(rw, x, dim_of(a["dim"], len(x.shape)), a["index"])


@rule("aten.index.Tensor")
def _index(rw: Rewriter, n, a):
    """x[i0, i1, ...] with integer index tensors: the indexed dims merge into one, indexed by a flat index."""
    x, indices = a["input"], list(a["indices"])
    dims = [d for d, i in enumerate(indices) if i is not None]
    tensors = [indices[d] for d in dims]
    if any(rw.arg_dtypes[i] is torch.bool for i in range(len(rw.arg_dtypes)) if i > 0):
        rw.fail("with a boolean mask is not supported: its result shape depends on the values")
    if dims != list(range(dims[0], dims[-1] + 1)):   # torch puts the index dims first when they are apart
        rest = [d for d in range(len(x.shape)) if d not in dims]
        x = rw.permute(x, dims + rest)
        dims = list(range(len(dims)))
    first, sizes = dims[0], [x.shape[d] for d in dims]
    merged = rw.reshape(x, x.shape[:first] + (math.prod(sizes),) + x.shape[first + len(dims):])
    flat, stride, bound = None, 1, math.prod(sizes)
    for index, size in reversed(list(zip(tensors, sizes))):
        index = index_tensor(rw, index, size, wrap=True)
        term = index if stride == 1 else rw.scalar(index, "mul", stride, dtype=DType.INT32, index_bound=bound)
        flat = term if flat is None else rw.binary("add", flat, term, DType.INT32, index_bound=bound)
        stride *= size
    return take(rw, merged, first, flat)
