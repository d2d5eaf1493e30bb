"""legalize rules of torch's random ops (issue 16): each a transform, in fp32, of uniform draws in (0, 1).

The draws are `random` nodes (Rewriter.random): the machine's counter-based generator under a seed the
program reads at each run (its SEED tensor; trnc/api.py draws one from torch's default generator per call), so
calls differ, `torch.manual_seed` makes them repeat, and the interpreter computes the same bits. The values
are not eager's (torch's Philox/MT19937 streams are not the machine's), only their distribution is:

- uniform, rand: from + (to - from) u; normal, randn: Box-Muller, sqrt(-2 log u1) cos(2 pi u2), whose draws
  stop at 5.8 sigma (u1 >= 2^-24); log_normal exp of a normal; exponential -log(u) / lambda (> 0); geometric
  ceil(log(u) / log(1 - p)) (>= 1); cauchy median + sigma tan(pi (u - 1/2)); bernoulli and dropout u < p;
  randint low + floor(u (high - low)), for ranges up to 2^24 (fp32 holds every such integer).

A draw stored in a narrower float than fp32 is first clamped below 1, as torch's rand never gives 1. A
torch.Generator argument is refused: its state is the host's.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.dtypes import torch_dtype
from trnc.isa.dtypes import DType
from trnc.passes.graph.legalize_table import keep_fp32_inside, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter

FP32 = DType.FP32
EXACT_RANGE = 2 ** 24   # randint's widest range: every integer below it is an fp32 value


def _uniform(rw: Rewriter, a, shape) -> ir.Node:
    if a.get("generator") is not None:
        rw.fail("with a torch.Generator is not supported: the machine draws from its own generator, seeded per call")
    return rw.random(shape)


def _below_one(rw: Rewriter, u: ir.Node, dtype: DType) -> ir.Node:
    """u in (0, 1) stored as `dtype` without rounding up to 1 (a float narrower than fp32 would)."""
    if dtype is FP32 or not dtype.is_float:
        return rw.cast(u, dtype)
    t = torch_dtype(dtype)
    below = float(torch.nextafter(torch.tensor(1.0, dtype=t), torch.tensor(0.0, dtype=t)))
    draws = rw.cast(rw.scalar(u, "min", below, dtype=FP32), dtype)
    # auto_cast "all" stores float intermediates in bf16, which rounds fp16's 1 - 2^-11 up to 1: keep the dtype
    keep_fp32_inside(draws, u).attrs["keep_fp32"] = True
    return draws


def _normal(rw: Rewriter, a, shape) -> ir.Node:
    """Standard normal draws (Box-Muller) in fp32."""
    radius = rw.unary(rw.scalar(rw.unary(_uniform(rw, a, shape), "log", FP32), "mul", -2.0, dtype=FP32), "sqrt", FP32)
    angle = rw.unary(rw.scalar(_uniform(rw, a, shape), "mul", 2 * math.pi, dtype=FP32), "cos", FP32)
    return rw.binary("mul", radius, angle, FP32)


def _affine(rw: Rewriter, z: ir.Node, mean, std) -> ir.Node:
    """mean + std * z, each a Python number or a node (broadcast)."""
    return rw.arith("add", rw.arith("mul", z, std, FP32), mean, FP32)


def _operand(rw: Rewriter, v):
    return rw.cast(v, FP32) if isinstance(v, ir.Node) else float(v)


@rule("aten.rand.default", "aten.rand.generator", "aten.rand_like.default", "aten.uniform.default")
def _rand(rw: Rewriter, n, a):
    lo, hi = float(a.get("from", 0.0)), float(a.get("to", 1.0))
    u = _uniform(rw, a, n.shape)
    if (lo, hi) == (0.0, 1.0):
        return _below_one(rw, u, n.dtype)
    return rw.cast(rw.scalar(rw.scalar(u, "mul", hi - lo, dtype=FP32), "add", lo, dtype=FP32), n.dtype)


@rule("aten.randn.default", "aten.randn.generator", "aten.randn_like.default", "aten.normal_functional.default",
      "aten.normal.Tensor_Tensor", "aten.normal.Tensor_float", "aten.normal.float_Tensor", "aten.normal.float_float")
def _randn(rw: Rewriter, n, a):
    mean, std = _operand(rw, a.get("mean", 0.0)), _operand(rw, a.get("std", 1.0))
    return rw.cast(_affine(rw, _normal(rw, a, n.shape), mean, std), n.dtype)


@rule("aten.log_normal.default")
def _log_normal(rw: Rewriter, n, a):
    z = _affine(rw, _normal(rw, a, n.shape), float(a.get("mean", 1.0)), float(a.get("std", 2.0)))
    return rw.cast(rw.unary(z, "exp", FP32), n.dtype)


@rule("aten.exponential.default")
def _exponential(rw: Rewriter, n, a):
    log_u = rw.unary(_uniform(rw, a, n.shape), "log", FP32)
    return rw.cast(rw.scalar(log_u, "div", -float(a.get("lambd", 1.0)), dtype=FP32), n.dtype)


@rule("aten.geometric.default")
def _geometric(rw: Rewriter, n, a):
    p = float(a["p"])
    if not 0.0 < p <= 1.0:
        rw.fail(f"with p={p}: p must be in (0, 1]")
    trials = rw.unary(rw.scalar(rw.unary(_uniform(rw, a, n.shape), "log", FP32), "div", math.log1p(-p) if p < 1
                                else -math.inf, dtype=FP32), "ceil", FP32)
    return rw.cast(rw.scalar(trials, "max", 1.0, dtype=FP32), n.dtype)


@rule("aten.cauchy.default")
def _cauchy(rw: Rewriter, n, a):
    turn = rw.scalar(rw.scalar(_uniform(rw, a, n.shape), "sub", 0.5, dtype=FP32), "mul", math.pi, dtype=FP32)
    z = rw.unary(turn, "tan", FP32)
    return rw.cast(_affine(rw, z, float(a.get("median", 0.0)), float(a.get("sigma", 1.0))), n.dtype)


def _hits(rw: Rewriter, a, shape, p) -> ir.Node:
    """1 where a draw falls below p (a number or a node), else 0, as a comparison gives it (uint8)."""
    return rw.arith("lt", _uniform(rw, a, shape), _operand(rw, p))


@rule("aten.bernoulli.default", "aten.bernoulli.p", "aten.bernoulli.Tensor")
def _bernoulli(rw: Rewriter, n, a):
    p = a.get("p", a["input"])
    return rw.cast(_hits(rw, a, n.shape, p), n.dtype)


@rule("aten.randint.default", "aten.randint.low", "aten.randint.generator", "aten.randint_like.default",
      "aten.randint_like.low_dtype", "aten.randint_like.Tensor")
def _randint(rw: Rewriter, n, a):
    low, high = a.get("low", 0), a["high"]
    if isinstance(low, ir.Node) or isinstance(high, ir.Node):
        rw.fail("with tensor bounds is not supported; give the bounds as Python integers")
    span = int(high) - int(low)
    if not 0 < span <= EXACT_RANGE:
        rw.fail(f"over [{low}, {high}) is not supported: the machine draws integers in ranges of 1 to 2^24")
    k = rw.unary(rw.scalar(_uniform(rw, a, n.shape), "mul", float(span), dtype=FP32), "floor", FP32)
    k = rw.scalar(rw.scalar(k, "min", float(span - 1), dtype=FP32), "add", float(low), dtype=FP32)
    return rw.cast(k, n.dtype)


def dropout(rw: Rewriter, x: ir.Node, p: float) -> tuple[ir.Node, ir.Node]:
    """Training-mode dropout of x: (x * keep / (1 - p), keep as bool, uint8 0/1), keep = u < 1 - p; p = 1 drops
    every element."""
    keep = _hits(rw, {}, x.shape, 1.0 - p)
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    out = rw.scalar(rw.binary("mul", rw.cast(x, FP32), rw.cast(keep, FP32), FP32), "mul", scale, dtype=FP32)
    return rw.cast(out, x.dtype), keep


@rule("aten.rrelu_with_noise_functional.default")
def _rrelu(rw: Rewriter, n, a):
    """Randomized leaky ReLU: in training each x <= 0 is scaled by its own draw in [lower, upper], which `noise`
    returns (1 elsewhere); in evaluation by (lower + upper) / 2, `noise` unchanged."""
    x, noise = a["input"], a["noise"]
    lower, upper = float(a.get("lower", 0.125)), float(a.get("upper", 1 / 3))
    xf = rw.cast(x, FP32)
    negative = rw.scalar(xf, "le", 0.0)
    if not a.get("training", False):
        return [rw.cast(rw.where(negative, rw.scalar(xf, "mul", (lower + upper) / 2, dtype=FP32), xf, FP32), x.dtype),
                noise]
    slope = rw.scalar(rw.scalar(_uniform(rw, a, x.shape), "mul", upper - lower, dtype=FP32), "add", lower, dtype=FP32)
    scale = rw.where(negative, slope, rw.filled(1.0, x.shape, FP32), FP32)
    return [rw.cast(rw.binary("mul", xf, scale, FP32), x.dtype), rw.cast(scale, noise.dtype)]
