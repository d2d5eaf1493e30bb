"""The executable meaning of the legalized trnc IR: evaluate a graph with torch, one small function per op.

Tests compare compiled programs with it, and the fold pass uses it to compute constant nodes, so it
follows the machine's numerics rather than torch's (isa/spec_intro.md, Numerics): every compute op
reads its operands into fp32, computes in fp32 and writes the node's dtype (floats round to nearest
even; ints round half to even, saturate, NaN -> 0). Comparisons and logical ops give 0/1. Movement
ops (reshape, permute, expand, slice, cat, copy) and gather move values exactly. The conversions
between torch tensors and the numpy arrays `const` nodes keep are trnc/dtypes.py's.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from trnc import ir
from trnc.dtypes import INT_RANGES, tensor_of, torch_dtype
from trnc.errors import TrncError
from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.isa.enums import ScaleMode
from trnc.runtime.convert import to_fp32, uniform_draws
from trnc.runtime.mx import quantize_mx, scale_pow2_f64


def store(t: torch.Tensor, dtype: DType) -> torch.Tensor:
    """The machine's write rule: convert a computed tensor to `dtype`."""
    target = torch_dtype(dtype)
    if t.dtype == target:
        return t
    if not dtype.is_int:
        return t.to(target)
    low, high = INT_RANGES[dtype]
    if t.dtype.is_floating_point:   # in float64, where the int32 bounds are exact
        t = torch.nan_to_num(torch.round(t.double()), nan=0.0)
    return t.clamp(low, high).to(target)


def _f32(t: torch.Tensor) -> torch.Tensor:
    """The machine's read rule: every dtype into fp32 (int32 above 2^24 rounds to nearest even)."""
    return t.to(torch.float32)


def _logical(fn):
    return lambda a, b: fn(a != 0, b != 0)


UNARY = {
    "copy": lambda x: x, "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "log": torch.log,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "square": lambda x: x * x,
    "abs": torch.abs, "neg": torch.neg, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "asinh": torch.asinh,
    "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf, "erfc": torch.erfc, "exp2": torch.exp2,
    "log2": torch.log2, "log10": torch.log10, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
    "rint": torch.round, "sign": torch.sign, "erfinv": torch.erfinv,
    "erfcx": torch.special.erfcx,
    "i0e": torch.special.i0e,
    "i1e": torch.special.i1e,
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "pow": torch.pow, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "and": _logical(torch.logical_and), "or": _logical(torch.logical_or),
    "xor": _logical(torch.logical_xor), "atan2": torch.atan2, "fmod": torch.fmod, "remainder": torch.remainder,
    "hypot": torch.hypot, "logaddexp": torch.logaddexp,
}
REDUCE = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}


def _unary(n, x):
    return UNARY[n.attrs["func"]](_f32(x))


def _binary(n, a, b):
    return BINARY[n.attrs["op"]](_f32(a), _f32(b))


def _scalar(n, x):
    value = torch.tensor(n.attrs["value"], dtype=torch.float32)
    x = _f32(x)
    fn = BINARY[n.attrs["op"]]
    return fn(value, x) if n.attrs.get("reverse") else fn(x, value)


def _where(n, cond, a, b):
    return torch.where(cond != 0, _f32(a), _f32(b))


def _cast(n, x):
    return x if x.dtype.is_floating_point or not n.dtype.is_float else _f32(x)


def _reduce(n, x):
    """Over |x| with attrs abs (the quantize pass's amax)."""
    x = _f32(x).abs() if n.attrs.get("abs") else _f32(x)
    return REDUCE[n.attrs["op"]](x, dim=tuple(n.attrs["axes"]), keepdim=n.attrs["keepdim"])


def _softmax(n, x):
    return torch.softmax(_f32(x), dim=-1)


def _log_softmax(n, x):
    return torch.log_softmax(_f32(x), dim=-1)


def _layer_norm(n, x, *params):
    params = [_f32(p) for p in params]
    weight = params.pop(0) if n.attrs["has_weight"] else None
    bias = params.pop(0) if n.attrs["has_bias"] else None
    return F.layer_norm(_f32(x), (x.shape[-1],), weight, bias, n.attrs["eps"])


def _rms_norm(n, x, *weight):
    """x / sqrt(mean(x^2) + eps), rounded, then times the weight, rounded (LlamaRMSNorm's fp32 ops)."""
    x = _f32(x)
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + n.attrs["eps"])
    return y * _f32(weight[0]) if n.attrs["has_weight"] else y


def _matmul(n, a, b, scale=None):
    """With attrs quantize (passes/graph/quantize.py): operand `operand` first becomes fp8(x * scale) in fp32,
    its scale the attribute or the third input, as the kernel quantizes it while loading."""
    q = n.attrs.get("quantize")
    if q is not None:
        operands = [a, b]
        s = torch.tensor(q["scale"], dtype=torch.float32) if scale is None else _f32(scale)
        operands[q["operand"]] = store(_f32(operands[q["operand"]]) * s, DType.from_text(q["dtype"]))
        a, b = operands
    return torch.matmul(_f32(a), _f32(b))


def _matmul_mx(n, x, elems, scales):
    """x quantized along K in MX blocks (runtime/mx.py, the node's element type and scale rule) times the weight's
    blocks, as matmul_mx computes: per block of 32 the fp32 sum of the element products in K order, times both
    scales in float64, added into an fp32 accumulator block by block."""
    elem = DType.from_text(n.attrs["elem"])
    *lead, k = x.shape
    rows = _f32(x).reshape(-1, k).T.contiguous().numpy()
    codes, x_scales = quantize_mx(rows, elem, ScaleMode.from_text(n.attrs["scale_mode"]))
    a = to_fp32(codes, elem).reshape(k, -1)
    b = to_fp32(elems.contiguous().view(torch.uint8).numpy(), elem).reshape(k, -1)
    w_scales = scales.contiguous().view(torch.uint8).numpy().reshape(k // MX_BLOCK, -1)
    acc = np.zeros((a.shape[1], b.shape[1]), np.float32)
    for block in range(k // MX_BLOCK):
        part = np.zeros_like(acc)
        for i in range(block * MX_BLOCK, (block + 1) * MX_BLOCK):
            part = part + np.multiply.outer(a[i], b[i])
        factor = scale_pow2_f64(x_scales[block][:, None], w_scales[block][None, :])
        acc = acc + (part.astype(np.float64) * factor).astype(np.float32)
    return torch.from_numpy(acc).reshape(*lead, b.shape[1])


def _attention(n, q, k, v, *mask):
    """softmax(q k^T * scale + mask [+ causal mask]) v, the causal mask aligned to the top left as in torch."""
    scores = torch.matmul(_f32(q), _f32(k).transpose(-1, -2)) * n.attrs["scale"]
    if mask:
        scores = scores + _f32(mask[0])
    if n.attrs["causal"]:
        sq, sk = scores.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.matmul(torch.softmax(scores, dim=-1), _f32(v))


def _placed(n, x: torch.Tensor, fill: float) -> torch.Tensor:
    """x [N, C, H, W] as a window op sees it: inputs `input_dilation` apart, `padding` fill around them."""
    a = n.attrs
    (lh, lw), (pt, pb, pl, pr) = a.get("input_dilation", (1, 1)), a["padding"]
    batch, channels, h, w = x.shape
    placed = torch.full((batch, channels, pt + (h - 1) * lh + 1 + pb, pl + (w - 1) * lw + 1 + pr), fill,
                        dtype=torch.float32)
    placed[:, :, pt:pt + (h - 1) * lh + 1:lh, pl:pl + (w - 1) * lw + 1:lw] = _f32(x)
    return placed


def _conv(n, x, w):
    """Weight [C_in / groups, KH, KW, C_out] (the layout legalize gives it) over the placed input."""
    a = n.attrs
    weight = _f32(w).permute(3, 0, 1, 2)
    return F.conv2d(_placed(n, x, 0.0), weight, stride=a["stride"], dilation=a["dilation"], groups=a["groups"])


def _pool(n, x):
    """max or sum over each window, from its taps (F.unfold) in the placed input (-inf or 0 around it)."""
    a = n.attrs
    placed = _placed(n, x, -math.inf if a["op"] == "max" else 0.0)
    taps = F.unfold(placed, a["kernel"], dilation=a["dilation"], stride=a["stride"])
    taps = taps.reshape(x.shape[0], x.shape[1], a["kernel"][0] * a["kernel"][1], -1)
    out = taps.amax(2) if a["op"] == "max" else taps.sum(2)
    return out.reshape(n.shape)


def _gather(n, table, index):
    return table[index.long()]


def _reshape(n, x):
    return x.reshape(n.shape)


def _permute(n, x):
    return x.permute(n.attrs["dims"])


def _expand(n, x):
    return torch.broadcast_to(x, n.shape)


def _slice(n, x):
    a = n.attrs
    index = [slice(None)] * x.dim()
    index[a["dim"]] = slice(a["start"], a["stop"], a.get("step", 1))
    return x[tuple(index)]


def _cat(n, *xs):
    return torch.cat([store(x, n.dtype) for x in xs], dim=n.attrs["dim"])


def _copy(n, x):
    return x.clone()


EVAL = {
    "unary": _unary, "binary": _binary, "scalar": _scalar, "where": _where, "cast": _cast, "reduce": _reduce,
    "softmax": _softmax, "log_softmax": _log_softmax, "layer_norm": _layer_norm, "rms_norm": _rms_norm,
    "matmul": _matmul, "matmul_mx": _matmul_mx,
    "attention": _attention, "conv": _conv, "pool": _pool, "gather": _gather, "reshape": _reshape,
    "permute": _permute, "expand": _expand, "slice": _slice, "cat": _cat, "copy": _copy,
}


def evaluate(node: ir.Node, args: list[torch.Tensor]) -> torch.Tensor:
    """The value of one non-source node from the values of its inputs, in the node's dtype."""
    if node.op not in EVAL:
        raise TrncError(f"the IR interpreter cannot run op '{node.op}' of %{node.name}{node.where()}; "
                        "run it on a legalized graph")
    return store(EVAL[node.op](node, *args).contiguous(), node.dtype)


def draws(node: ir.Node, seed: int) -> torch.Tensor:
    """A random node's value: the uniform draw of each element's row-major index in its stream."""
    counters = np.arange(node.numel, dtype=np.int64)
    return torch.from_numpy(uniform_draws(seed, node.attrs["stream"], counters)).reshape(node.shape)


def run_graph(graph: ir.Graph, inputs: list[torch.Tensor], seed: int = 0) -> list[torch.Tensor]:
    """Evaluate a legalized graph on user inputs (converted to each input node's dtype); returns the outputs."""
    values = evaluate_graph(graph, inputs, seed)
    return [values[o] for o in graph.outputs]


def evaluate_graph(graph: ir.Graph, inputs: list[torch.Tensor], seed: int = 0) -> dict[ir.Node, torch.Tensor]:
    """The value of every node of a legalized graph on user inputs (converted to each input node's dtype), its
    random nodes drawn under `seed` (the value of a program's SEED tensor)."""
    if len(inputs) != len(graph.inputs):
        raise TrncError(f"the graph takes {len(graph.inputs)} inputs, got {len(inputs)}")
    values: dict[ir.Node, torch.Tensor] = {}
    for node, x in zip(graph.inputs, inputs):
        if tuple(x.shape) != node.shape:
            raise TrncError(f"input {node.attrs.get('index')} has shape {list(x.shape)}, the graph was captured "
                            f"with {list(node.shape)}")
        values[node] = store(x.detach(), node.dtype)
    for node in graph.nodes:
        if node.op == "const":
            values[node] = tensor_of(node.attrs["value"], node.dtype).reshape(node.shape)
        elif node.op == "random":
            values[node] = draws(node, seed)
        elif node.op != "input":
            values[node] = evaluate(node, [values[i] for i in node.inputs])
    return values
