"""fold: compute now every node whose inputs are all constants (masks, rotary tables, reshaped weights).

Runs after legalize, on trnc ops only, with the IR interpreter (trnc/interpret.py) so a folded value is
exactly what the machine would have computed. A node whose result would be much larger than its
inputs (an expand of a scalar to a big mask) stays a node: computing it on chip costs less HBM and
DMA than a materialized constant. Unused constants are pruned afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trnc import ir
from trnc.dtypes import array_of, tensor_of
from trnc.interpret import evaluate

FOLD_MAX_ELEMENTS = 4 * 1024 * 1024   # results above this many elements ...
FOLD_MAX_GROWTH = 4                   # ... and this many times the largest input stay nodes


def too_big_to_fold(numel: int, input_numels: list[int]) -> bool:
    return numel > FOLD_MAX_ELEMENTS and numel > FOLD_MAX_GROWTH * max(input_numels, default=1)


def const_value(node: ir.Node):
    """The torch tensor of a const node, in its shape: a view of the node's array when torch can hold it as is
    (copying every weight a transpose folds costs more than the transpose), else the interpreter's copy. The
    interpreter's ops never write into their inputs, and FoldConstants copies a result that is a view of one."""
    value = node.attrs["value"]
    if value.dtype == node.dtype.storage and value.dtype.kind in "biuf" and value.flags.c_contiguous \
            and value.flags.writeable:
        return torch.from_numpy(value).reshape(node.shape)
    return tensor_of(value, node.dtype).reshape(node.shape)


def _shares_memory(t: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    return any(t.untyped_storage().data_ptr() == i.untyped_storage().data_ptr() for i in inputs)


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
            args = [const_value(i) for i in n.inputs]
            value = evaluate(n, args)
            if _shares_memory(value, args):   # a view (reshape, copy): the new const gets its own array
                value = value.clone()
            kept = {"keep_fp32": True} if n.attrs.get("keep_fp32") else {}   # precision still leaves it fp32
            const = ir.Node("const", (), n.shape, n.dtype, {"value": array_of(value, n.dtype), **kept}, n.name,
                            n.source)
            replaced[n] = const
            nodes.append(const)
        graph.nodes = nodes
        graph.outputs = [replaced.get(o, o) for o in graph.outputs]
        pruned = graph.prune()
        return {"folded": len(replaced), "pruned": pruned}
