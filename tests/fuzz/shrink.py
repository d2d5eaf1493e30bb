"""Shrinking: a failing program reduced, one edit at a time, while its failure keeps the same signature.

Greedy, like a delta debugger over the program's data: try the edits in order, keep the first one after
which the program still fails the same way (Outcome.signature: the kind, and what kind of mismatch, error or
crash), start again, until no edit helps or the budget of runs is spent. The edits, biggest first:

- keep fewer outputs (one alone, then one fewer), in a plain tuple or as the tensor itself;
- bypass an op: its uses take one of its operands instead (the op and what only it needed go);
- cut the graph: an op's value becomes a fresh input of its shape and dtype (everything above it goes);
- shrink an input dim (to 1, 2, 3, half, one less): parameter shapes follow, as ops hold no shapes;
- simplify an attr: a size or index smaller, a flag off, an optional value None, the plain spelling;
- make a low-precision input float32.

Edits that eager rejects are dropped before they cost a run; others run as the campaign runs programs (in a
worker process, for crashes), and come back invalid when their reference is unfit to judge.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from .build import Invalid, resolve
from .program import Input, Op, Program, live, substitute
from .run import Outcome

SHRINKABLE = ("n", "rows", "d", "sk", "dv", "size", "chunks", "index", "start", "stop", "length", "step", "k",
              "batch", "correction", "form", "dim", "dims", "e")
FLAGS = ("bias", "keepdim", "causal", "left", "flip", "weight")
OPTIONAL = ("scale", "lo", "hi")


def shrink(program: Program, outcome: Outcome, run: Callable[[Program], Outcome], budget: int = 300,
           seconds: float = 600.0) -> tuple[Program, Outcome, int]:
    """The smallest program found that fails like `outcome`, its outcome, and the number of runs spent."""
    target, runs, deadline = outcome.signature, 0, time.monotonic() + seconds
    seen = {program}
    improved = True
    while improved and runs < budget and time.monotonic() < deadline:
        improved = False
        for candidate in _edits(program):
            if candidate in seen or not _valid(candidate):
                continue
            seen.add(candidate)
            result = run(candidate)
            runs += 1
            if result.signature == target:
                program, outcome, improved = candidate, result, True
                break
            if runs >= budget or time.monotonic() >= deadline:
                break
    return program, outcome, runs


def _valid(program: Program) -> bool:
    if not any(isinstance(n, Op) for n in program.nodes) or len(program.inputs) > 3:
        return False
    try:
        resolve(program)
    except Invalid:
        return False
    return True


def _edits(p: Program) -> Iterator[Program]:
    yield from _fewer_outputs(p)
    yield from _bypasses(p)
    yield from _cuts(p)
    yield from _smaller_inputs(p)
    yield from _simpler_attrs(p)
    for i in p.inputs:
        node = p.nodes[i]
        if node.dtype in ("bfloat16", "float16"):
            yield _with_node(p, i, replace(node, dtype="float32"))


def _fewer_outputs(p: Program) -> Iterator[Program]:
    outs = p.outputs
    if len(outs) > 1:
        for o in outs:
            yield live(Program(p.nodes, (o,), "tensor"))
            yield live(Program(p.nodes, (o,), "tuple"))
        for k in range(len(outs)):
            yield live(Program(p.nodes, outs[:k] + outs[k + 1:], p.structure))
    if p.structure not in ("tensor", "tuple"):
        yield Program(p.nodes, outs, "tensor" if len(outs) == 1 else "tuple")


def _bypasses(p: Program) -> Iterator[Program]:
    metas, _ = resolve(p)
    for i in range(len(p.nodes) - 1, -1, -1):
        node = p.nodes[i]
        if isinstance(node, Op):
            args = sorted(set(node.args), key=lambda a: metas[a] != metas[i])   # same shape and dtype first
            for a in args:
                yield substitute(p, i, a)


def _cuts(p: Program) -> Iterator[Program]:
    if len(p.inputs) >= 3:
        return
    metas, _ = resolve(p)
    for i, node in enumerate(p.nodes):
        if isinstance(node, Op) and any(isinstance(p.nodes[a], Op) for a in node.args):
            m = metas[i]
            name = str(m.dtype).removeprefix("torch.")
            if m.is_float:
                cut = Input(m.shape, name, "normal", node.seed)
            elif name == "bool":
                cut = Input(m.shape, name, "mask", node.seed)
            else:
                continue
            yield live(_with_node(p, i, cut))


def _smaller_inputs(p: Program) -> Iterator[Program]:
    for i in p.inputs:
        node = p.nodes[i]
        for d, size in enumerate(node.shape):
            for smaller in sorted({1, 2, 3, size // 2, size - 1}):
                if 1 <= smaller < size:
                    shape = node.shape[:d] + (smaller,) + node.shape[d + 1:]
                    yield _with_node(p, i, replace(node, shape=shape))
        if node.kind == "index" and node.high > 1:
            yield _with_node(p, i, replace(node, high=1))


def _simpler_attrs(p: Program) -> Iterator[Program]:
    for i, node in enumerate(p.nodes):
        if not isinstance(node, Op):
            continue
        attrs = node.a
        for name, value in attrs.items():
            for simpler in _simpler(name, value):
                yield _with_node(p, i, replace(node, attrs=tuple(sorted({**attrs, name: simpler}.items()))))


def _simpler(name: str, value) -> list:
    if name in FLAGS and value is True:
        return [False]
    if name in OPTIONAL and value is not None:
        return [None]
    if name in SHRINKABLE and isinstance(value, int) and not isinstance(value, bool) and value not in (0, 1, -1):
        return sorted({v for v in (0, 1, value // 2, value - 1 if value > 0 else value + 1) if abs(v) < abs(value)})
    return []


def _with_node(p: Program, i: int, node) -> Program:
    return Program(p.nodes[:i] + (node,) + p.nodes[i + 1:], p.outputs, p.structure)
