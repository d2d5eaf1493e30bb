"""merge-matmuls: sibling matmuls of one input with constant weights become one wider matmul.

Attention's query, key and value projections all multiply the same activations: as three
kernels they load those activations three times and pay three pipeline start-ups. Concatenating
the weights (and the biases) gives one matmul whose output the
three consumers read through slices, which are free views of HBM. Siblings whose results meet in an
elementwise node (Llama's SiLU(gate) * up) stay apart: each one's epilogue then takes its part of the
product, where the merged result would go to HBM whole and come back through slices.

Siblings merge with their biases or without any: those that add a bias merge among themselves, those that
add none among themselves. Merging both kinds left the biases as an add after the merged matmul, so at
auto_cast="all" the dot product was rounded to bf16 before its bias was added; where the two nearly cancel
(the fuzzer: a dot of 0.717 and a bias of -0.732) that rounding was 9% of the result, which torch's linear,
adding the bias in the fp32 accumulation, does not make.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from trnc import ir
from trnc.passes.graph.simplify import replace_uses


def _weight(m: ir.Node):
    w = m.inputs[1]
    return w if w.op == "const" and len(w.shape) == 2 else None


def _bias_of(m: ir.Node, users) -> ir.Node | None:
    """The single user of m when it is `add(m, const [N])` (either operand order), else None."""
    us = users.get(m, [])
    if len(us) != 1 or us[0].op != "binary" or us[0].attrs.get("op") != "add" or m not in us[0].inputs:
        return None
    u = us[0]
    b = u.inputs[1] if u.inputs[0] is m else u.inputs[0]
    ok = b.op == "const" and b.shape == (m.shape[-1],) and b.dtype == m.dtype and u.shape == m.shape
    return u if ok else None


def _const_operand(add: ir.Node) -> ir.Node:
    return add.inputs[1] if add.inputs[1].op == "const" else add.inputs[0]


def merge_matmuls(graph: ir.Graph, kept=lambda module: None) -> dict:
    """`kept`: the dtype keep_precision keeps a module's matmuls in: siblings merge only with equal ones."""
    users = graph.users()
    siblings: dict[ir.Node, list[ir.Node]] = defaultdict(list)
    for n in graph.nodes:
        if n.op == "matmul" and _weight(n) is not None and n.inputs[0].op != "const" and n not in graph.outputs:
            siblings[n.inputs[0]].append(n)
    merged = 0
    consts: dict[tuple, ir.Node] = {}   # one merged weight (bias) per set of weights (biases): layers that share
    for a, group in siblings.items():   # their weights (ALBERT) share the merged one too
        group = [m for m in group if _weight(m).dtype == _weight(group[0]).dtype and m.dtype == group[0].dtype
                 and kept(m.module) == kept(group[0].module)]
        gated = _gated(group, users)
        group = [m for m in group if m not in gated]
        if len(group) < 2:
            continue
        biases = [_bias_of(m, users) for m in group]
        with_bias = [(m, b) for m, b in zip(group, biases) if b is not None and b not in graph.outputs]
        without = [m for m, b in zip(group, biases) if b is None]   # a bias that is an output: left alone
        if len(with_bias) >= 2:
            _merge(graph, a, [m for m, _ in with_bias], [b for _, b in with_bias], consts)
            merged += len(with_bias)
        if len(without) >= 2:
            _merge(graph, a, without, None, consts)
            merged += len(without)
    if merged:
        graph.prune()   # once for all groups: each merge leaves the node list topological, with dead nodes
    return {"matmuls_merged": merged}


def _elementwise_reach(m: ir.Node, users) -> set[ir.Node]:
    """The elementwise nodes of m's shape that read m through elementwise nodes of its shape."""
    seen: set[ir.Node] = set()
    todo = [m]
    while todo:
        for u in users.get(todo.pop(), []):
            if u not in seen and u.op in ir.OPS_ELEMENTWISE and u.shape == m.shape:
                seen.add(u)
                todo.append(u)
    return seen


def _gated(group: list[ir.Node], users) -> set[ir.Node]:
    """Siblings whose results meet in an elementwise node (Llama's SiLU(gate) * up): apart, each one's epilogue
    takes its part of the product, where merged the wide result goes to HBM and is read back through slices."""
    reach = [_elementwise_reach(m, users) for m in group]
    return {m for i, m in enumerate(group) for j in range(len(group)) if j != i and reach[i] & reach[j]}


def _concatenated(parts: list[ir.Node], axis: int, consts: dict[tuple, ir.Node]) -> tuple[ir.Node, bool]:
    """The const of `parts` concatenated along `axis` (made once per tuple of parts), and whether it is new."""
    key = (axis, *parts)
    if key in consts:
        return consts[key], False
    value = np.concatenate([p.attrs["value"] for p in parts], axis=axis)
    consts[key] = ir.Node("const", (), value.shape, parts[0].dtype, {"value": value}, name=f"{parts[0].name}_merged")
    return consts[key], True


def _merge(graph: ir.Graph, a: ir.Node, group: list[ir.Node], biases: list[ir.Node] | None,
           consts: dict[tuple, ir.Node]) -> None:
    weight, fresh = _concatenated([_weight(m) for m in group], 1, consts)
    out_shape = (*group[0].shape[:-1], weight.shape[1])
    mm = ir.Node("matmul", (a, weight), out_shape, group[0].dtype, source=group[0].source, module=group[0].module)
    new = [weight, mm] if fresh else [mm]
    base, ends = mm, group
    if biases is not None:
        bias, fresh = _concatenated([_const_operand(b) for b in biases], 0, consts)
        base = ir.Node("binary", (mm, bias), out_shape, biases[0].dtype, {"op": "add"}, source=biases[0].source)
        new += [bias, base] if fresh else [base]
        ends = biases
    start = 0
    slices = []
    for m, end in zip(group, ends):
        n = m.shape[-1]
        s = ir.Node("slice", (base,), end.shape, end.dtype,
                    {"dim": len(out_shape) - 1, "start": start, "stop": start + n, "step": 1}, source=end.source)
        slices.append((end, s))
        start += n
    at = min(graph.nodes.index(m) for m in group)
    graph.nodes[at:at] = new + [s for _, s in slices]
    for end, s in slices:
        replace_uses(graph, end, s)


@dataclass(frozen=True)
class MergeMatmuls:
    """Sibling matmuls of one input with constant weights (Q, K, V) into one wider matmul and free slices."""

    name: str = "merge-matmuls"

    def run(self, state) -> dict:
        return merge_matmuls(state.graph, state.options.kept_dtype)
