"""Random valid programs over everything trnc lowers, drawn op by op against their float64 reference.

A Builder keeps the program so far with its values in every lane of reference.py. Each step picks an op kind
(PROPOSERS, weighted), operands among the values so far (unused and recent ones more often, so graphs get deep) and
attrs, and adds the op only if eager accepts it, its size is within the limits and its values are fit to judge
(finite, not huge, no comparison near a tie). Because the values are known while building, domains are met by
construction: log, sqrt, rsqrt and pow get positive operands and divisions nonzero ones, through a preceding
`abs(x) + c`, `x * x + c`, clamp or exp when the value at hand is not. Macros emit op sequences that models
write by hand (an MLP, attention and RMS norm spelled out, a residual norm).

Shapes straddle the machine's tiles (128 partitions, 512-wide PSUM banks): sizes 1, 2, 3, 127, 128, 129, 511,
512, 513 and odd sizes, ranks 0 to 4. The outputs are 1 to 3 values in a random order and structure (tensor,
tuple, list, dict), with inputs, views of inputs, 0-d values and repeated values among them.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from .build import Invalid, resolve_op
from .draw import DTYPES
from .program import STRUCTURES, Input, Meta, Op, Program, live, op
from .proposals import PROPOSERS
from .reference import MAX_ELEMENTS, Case, Evaluation, prepare, size_trouble

SIZES = (1, 2, 3, 127, 128, 129, 511, 512, 513)
FLOATS = ("float32", "bfloat16", "float16")
MAX_INPUTS = 3


class Builder:
    """A program under construction with its values in every lane; ops that do not fit are refused (None)."""

    def __init__(self, seed: int, precisions):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Input | Op] = []
        self.metas: list[Meta] = []
        self.ev = Evaluation(precisions)
        self.used: set[int] = set()     # nodes some op takes as an argument

    # -- draws ------------------------------------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def choice(self, seq, p=None):
        return seq[int(self.rng.choice(len(seq), p=p))]

    def int(self, lo: int, hi: int) -> int:
        """An int in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def seed(self) -> int:
        return int(self.rng.integers(1, 2 ** 31))

    def form(self) -> int:
        return self.int(0, 5)

    def size(self) -> int:
        r = self.rng.random()
        if r < 0.35:
            return self.choice(SIZES)
        return self.int(1, 9) if r < 0.75 else 2 * self.int(5, 49) + 1

    def shape(self, rank: int | None = None, budget: int | None = None) -> tuple[int, ...]:
        rank = self.choice((0, 1, 2, 3, 4), p=(0.08, 0.25, 0.35, 0.2, 0.12)) if rank is None else rank
        budget = budget or (2 ** 14 if self.chance(0.7) else MAX_ELEMENTS)
        for _ in range(20):
            dims = tuple(self.size() for _ in range(rank))
            if math.prod(dims) <= budget:
                return dims
        return tuple(min(self.size(), 3) for _ in range(rank))

    # -- values -----------------------------------------------------------------------------------------
    def shape_of(self, i: int) -> tuple[int, ...]:
        return self.metas[i].shape

    def dtype_name(self, i: int) -> str:
        return str(self.metas[i].dtype).removeprefix("torch.")

    def ref(self, i: int):
        return self.ev.values[i][0]

    def pick(self, candidates: list[int]) -> int | None:
        """A candidate: often one no op uses yet (so branches join and little code is dead), else a recent one,
        else any."""
        if not candidates:
            return None
        unused = [c for c in candidates if c not in self.used]
        if unused and self.chance(0.5):
            return self.choice(unused[-3:])
        if self.chance(0.6):
            return self.choice(candidates[-4:])
        return self.choice(candidates)

    def values(self, kind: str = "float", min_rank: int = 0, max_rank: int = 4) -> list[int]:
        def fits(m: Meta) -> bool:
            ok = {"float": m.is_float, "bool": m.dtype == torch.bool, "index": m.dtype == torch.int64, "any": True}[kind]
            return ok and min_rank <= len(m.shape) <= max_rank
        return [i for i, m in enumerate(self.metas) if fits(m)]

    def pick_float(self, min_rank: int = 0, max_rank: int = 4) -> int | None:
        found = self.pick(self.values("float", min_rank, max_rank))
        if found is None and self.inputs < MAX_INPUTS:
            rank = self.int(min_rank, max_rank)
            return self.input(self.shape(rank))
        return found

    @property
    def inputs(self) -> int:
        return sum(isinstance(n, Input) for n in self.nodes)

    # -- adding -----------------------------------------------------------------------------------------
    def add(self, node: Input | Op) -> int | None:
        if isinstance(node, Input):
            meta, params = Meta(node.shape, DTYPES[node.dtype]), []
        else:
            try:
                meta, params = resolve_op(node, self.metas)
            except Invalid:
                return None
        if size_trouble(node, self.metas, meta) is not None:
            return None
        index = len(self.nodes)
        self.ev.add(node, meta, params)
        if self.ev.trouble(index, node) is not None:
            self.ev.pop()
            return None
        self.nodes.append(node)
        self.metas.append(meta)
        if isinstance(node, Op):
            self.used.update(node.args)
        return index

    def op(self, kind: str, args, **attrs) -> int | None:
        if any(a is None for a in args):
            return None
        return self.add(op(kind, args, self.seed(), **attrs))

    def input(self, shape, dtype: str | None = None, kind: str | None = None, high: int = 0) -> int | None:
        if self.inputs >= MAX_INPUTS:
            return None
        dtype = dtype or self.choice(FLOATS, p=(0.75, 0.15, 0.1))
        kind = kind or self.choice(("normal", "grid"), p=(0.65, 0.35))
        return self.add(Input(tuple(shape), dtype, kind, self.seed(), high))

    # -- operands with a property ------------------------------------------------------------------------
    def positive(self, x: int | None) -> int | None:
        """x if its values are safely positive, else x made positive by one of the usual constructions."""
        if x is None or self.ref(x).min() > 0.05:
            return x
        way = self.int(0, 3)
        if way == 0:
            return self.op("scalar", [self.op("abs", [x], form=self.form())], fn="+", c=self.choice((0.25, 0.5, 1.0)),
                           flip=self.chance(0.5))
        if way == 1:
            return self.op("scalar", [self.op("square", [x], form=self.form())], fn="+", c=0.5, flip=False)
        if way == 2:
            return self.op("clamp", [x], lo=self.choice((0.125, 0.5)), hi=None, form=self.form())
        return self.op("exp", [self.bounded(x, 3.0)], form=self.form())

    def nonzero(self, x: int | None) -> int | None:
        if x is None or self.ref(x).abs().min() > 0.05:
            return x
        return self.positive(x)

    def bounded(self, x: int | None, limit: float) -> int | None:
        if x is None or self.ref(x).abs().max() <= limit:
            return x
        if self.chance(0.5):
            return self.op("clamp", [x], lo=-limit, hi=limit, form=self.form())
        return self.op("scalar", [self.op("tanh", [x], form=self.form())], fn="*", c=limit, flip=False)

    def partner(self, x: int, kind: str = "float") -> int | None:
        """A value whose shape broadcasts with x's (x itself included), or a new input of such a shape."""
        shape = self.shape_of(x)

        def broadcasts(j: int) -> bool:
            try:
                return math.prod(np.broadcast_shapes(shape, self.shape_of(j))) <= MAX_ELEMENTS
            except ValueError:
                return False
        found = [j for j in self.values(kind) if broadcasts(j)]
        if (not found or self.chance(0.3)) and kind == "float" and self.inputs < MAX_INPUTS:
            made = self.input(self.broadcast_shape(shape))
            if made is not None:
                return made
        others = [j for j in found if j != x]
        return self.pick(others if others and self.chance(0.85) else found)

    def broadcast_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against `shape`: a suffix of it with some dims 1, sometimes a new leading dim."""
        tail = shape[len(shape) - self.int(0, len(shape)):]
        out = tuple(1 if self.chance(0.3) else s for s in tail)
        if self.chance(0.15) and len(out) < 4 and math.prod(shape) * 3 <= MAX_ELEMENTS:
            out = (self.choice((2, 3)),) + out
        return out

    def dims(self, rank: int, single: bool = False):
        """Reduction dims: None (all), one dim (maybe negative), or a tuple of distinct dims."""
        if rank == 0:
            return self.choice((None, 0, -1))
        r = self.rng.random()
        if r < 0.25 and not single:
            return None
        if r < 0.8 or rank < 2 or single:
            d = self.int(0, rank - 1)
            return d - rank if self.chance(0.3) else d
        picked = self.rng.choice(rank, size=self.int(2, rank), replace=False)
        return tuple(int(d) - rank if self.chance(0.3) else int(d) for d in picked)




ATTEMPTS = 20


def generate(seed: int, precision: str, max_ops: int = 30) -> Case:
    """The program of `seed`, ready to run at `precision`: programs are drawn until one passes `prepare` (eager
    within its bound); the same seed and precision always give the same program."""
    precisions = ("fp32",) if precision == "fp32" else ("fp32", precision)
    redraws = []
    for attempt in range(ATTEMPTS):
        program = draw_program([seed, attempt], precisions, max_ops)
        if program is None:
            redraws.append("no op fitted")
            continue
        try:
            return dataclasses.replace(prepare(program, precision), redraws=tuple(redraws))
        except Invalid as e:
            redraws.append(str(e).split(":")[0])
    raise RuntimeError(f"no valid program for seed {seed} in {ATTEMPTS} attempts: {redraws}")


def draw_program(seed, precisions, max_ops: int = 30) -> Program | None:
    b = Builder(seed, precisions)
    b.input(b.shape())
    r = b.rng.random()
    target = b.int(1, 5) if r < 0.4 else b.int(6, 15) if r < 0.75 else b.int(16, 30)
    target = min(target, max_ops)
    families = list(PROPOSERS)
    weights = np.array([PROPOSERS[f][1] for f in families], dtype=float)
    for _ in range(4 * target + 20):
        if sum(isinstance(n, Op) for n in b.nodes) >= target:
            break
        PROPOSERS[b.choice(families, p=weights / weights.sum())][0](b)
    ops = [i for i, n in enumerate(b.nodes) if isinstance(n, Op)]
    if not ops:
        return None
    outputs = _outputs(b, ops[-1])
    count = len(outputs)
    structure = b.choice(STRUCTURES, p=(0.55, 0.25, 0.1, 0.1)) if count == 1 else \
        b.choice(STRUCTURES[1:], p=(0.5, 0.25, 0.25))
    return live(Program(tuple(b.nodes), outputs, structure))


def _outputs(b: Builder, last: int) -> tuple[int, ...]:
    """1 to 3 outputs: the last op, then values no op uses, inputs, views of inputs, 0-d values, repeats or any
    value, shuffled."""
    outs = [last]
    wanted = b.choice((1, 2, 3), p=(0.45, 0.35, 0.2))
    inputs = [i for i, n in enumerate(b.nodes) if isinstance(n, Input)]
    for _ in range(10):
        if len(outs) >= wanted:
            break
        r = b.rng.random()
        unused = [i for i, n in enumerate(b.nodes) if isinstance(n, Op) and i not in b.used and i not in outs]
        if unused and r < 0.4:
            extra = b.choice(unused[-2:])
        elif r < 0.5:
            extra = b.choice(inputs)
        elif r < 0.6:
            extra = _view(b, b.choice(inputs))
        elif r < 0.7:
            x = b.pick(b.values("float"))
            extra = b.op("reduce", [x], fn=b.choice(("sum", "amax", "mean")), dims=None, keepdim=False, form=0)
        elif r < 0.8:
            extra = b.choice(outs)
        else:
            extra = b.pick(list(range(len(b.nodes))))
        if extra is not None:
            outs.append(extra)
    order = b.rng.permutation(len(outs))
    return tuple(outs[int(k)] for k in order)


def _view(b: Builder, x: int) -> int | None:
    shape = b.shape_of(x)
    way = b.int(0, 3)
    if way == 0 or not shape:
        return b.op("unsqueeze", [x], dim=0, form=0)
    if way == 1:
        return b.op("reshape", [x], shape=(-1,), form=0)
    if way == 2 and len(shape) >= 2:
        return b.op("transpose", [x], d0=0, d1=1, form=0)
    return b.op("slice", [x], dim=0, index=None, start=None, stop=None, step=2)
