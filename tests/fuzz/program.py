"""A fuzz program as plain data: input specs and op records that name earlier values by index, and its outputs.

Everything else is derived from this data: the nn.Module and the tensors (build.py), the float64 reference and
the tolerance (reference.py), the reproducer file (repro.py). Being plain frozen data, a program pickles to the
worker processes, prints in a report, and the shrinker (shrink.py) edits it without touching torch.

Node i is either an Input (a forward argument, in the order the inputs appear) or an Op whose `args` are indices
of earlier nodes. Ops hold no shapes: parameter shapes and most sizes follow from the operands' shapes when the
program is built, so shrinking an input's shape carries through the whole program.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    dtype: str          # a key of draw.DTYPES
    kind: str           # a kind of draw.draw: normal, grid, positive, index, mask
    seed: int
    high: int = 0       # index inputs: values in [0, high)


@dataclass(frozen=True)
class Op:
    kind: str                           # a key of ops.OPS
    args: tuple[int, ...]               # indices of earlier nodes
    attrs: tuple[tuple[str, object], ...]   # sorted (name, value) pairs: a frozen dict
    seed: int                           # of the op's parameters

    @property
    def a(self) -> dict:
        return dict(self.attrs)


def op(kind: str, args, seed: int, **attrs) -> Op:
    return Op(kind, tuple(args), tuple(sorted(attrs.items())), seed)


@dataclass(frozen=True)
class Param:
    """A parameter of an op: a tensor of the module, so trnc sees it as a constant."""

    shape: tuple[int, ...]
    dtype: str
    kind: str = "normal"
    scale: float = 1.0


@dataclass(frozen=True)
class Meta:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point


STRUCTURES = ("tensor", "tuple", "list", "dict")


@dataclass(frozen=True)
class Program:
    nodes: tuple[Input | Op, ...]
    outputs: tuple[int, ...]
    structure: str      # how forward returns the outputs: one of STRUCTURES ("tensor": exactly one output)

    @property
    def inputs(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if isinstance(n, Input)]

    @property
    def ops(self) -> int:
        return sum(isinstance(n, Op) for n in self.nodes)

    def describe(self) -> str:
        ins = ", ".join(f"{n.dtype}{list(n.shape)}" for n in self.nodes if isinstance(n, Input))
        kinds = sorted({n.kind for n in self.nodes if isinstance(n, Op)})
        return f"{self.ops} ops ({', '.join(kinds)}), inputs {ins}, outputs {list(self.outputs)} as {self.structure}"


def live(program: Program) -> Program:
    """The program without the nodes no output depends on, renumbered."""
    needed = set(program.outputs)
    for i in range(len(program.nodes) - 1, -1, -1):
        node = program.nodes[i]
        if i in needed and isinstance(node, Op):
            needed.update(node.args)
    keep = sorted(needed)
    index = {old: new for new, old in enumerate(keep)}
    nodes = []
    for i in keep:
        node = program.nodes[i]
        nodes.append(replace(node, args=tuple(index[a] for a in node.args)) if isinstance(node, Op) else node)
    return Program(tuple(nodes), tuple(index[o] for o in program.outputs), program.structure)


def substitute(program: Program, old: int, new: int) -> Program:
    """Every use of node `old` (as an argument or an output) replaced by node `new` (new < old), then `live`."""
    nodes = [replace(n, args=tuple(new if a == old else a for a in n.args)) if isinstance(n, Op) and k > old else n
             for k, n in enumerate(program.nodes)]
    outputs = tuple(new if o == old else o for o in program.outputs)
    return live(Program(tuple(nodes), outputs, program.structure))
