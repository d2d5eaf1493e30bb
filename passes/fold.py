"""fold: compute now every node whose inputs are all constants (masks, rotary tables, reshaped weights).

Runs after legalize, on trnc ops only, with the IR interpreter (trnc/interpret.py) so a folded value is
exactly what the machine would have computed. A node whose result would be much larger than its
inputs (an expand of a scalar to a big mask) stays a node: computing it on chip costs less HBM and
DMA than a materialized constant. Unused constants are pruned afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass

from trnc import ir
from trnc.interpret import array_of, evaluate, tensor_of

FOLD_MAX_ELEMENTS = 4 * 1024 * 1024   # results above this many elements ...
FOLD_MAX_GROWTH = 4                   # ... and this many times the largest input stay nodes


def too_big_to_fold(numel: int, input_numels: list[int]) -> bool:
    return numel > FOLD_MAX_ELEMENTS and numel > FOLD_MAX_GROWTH * max(input_numels, default=1)


def const_value(node: ir.Node):
    """The torch tensor of a const node, in its shape."""
    return tensor_of(node.attrs["value"], node.dtype).reshape(node.shape)


@dataclass(frozen=True)
class FoldConstants:
    """Replace each node of constant inputs by a const node holding its value (unless too big to keep)."""

    name: str = "fold"

    def run(self, state) -> dict:
        graph: ir.Graph = state.graph
        replaced: dict[ir.Node, ir.Node] = {}
        nodes: list[ir.Node] = []
        for n in graph.nodes:
            n.inputs = tuple(replaced.get(i, i) for i in n.inputs)
            foldable = (n.op not in ir.OPS_SOURCE and n.inputs and all(i.op == "const" for i in n.inputs)
                        and not too_big_to_fold(n.numel, [i.numel for i in n.inputs]))
            if not foldable:
                nodes.append(n)
                continue
            value = evaluate(n, [const_value(i) for i in n.inputs])
            const = ir.Node("const", (), n.shape, n.dtype, {"value": array_of(value, n.dtype)}, n.name, n.source)
            replaced[n] = const
            nodes.append(const)
        graph.nodes = nodes
        graph.outputs = [replaced.get(o, o) for o in graph.outputs]
        pruned = graph.prune()
        return {"folded": len(replaced), "pruned": pruned}
