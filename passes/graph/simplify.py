"""simplify: common subexpressions merged and reshapes sunk below elementwise ops, so fuse sees through views.

torch.export writes a fresh `view` for every use (three linears of one input get three views of
it), and a linear on [B, S, K] becomes reshape -> matmul -> reshape, which hides the bias, the
activation and the residual add that follow from the matmul. Two rewrites fix both:
- CSE: nodes with the same op, inputs, shape, dtype and attrs become one (constants excluded);
- reshape sinking: op(reshape(p), others) -> reshape(op(p, others')) when the reshape keeps the
  last dim and the other operands are full-size (reshaped alike, a free view) or vary only along
  the last dim; a reshape with several readers sinks when each of them can take it; reshape chains
  collapse and identity reshapes vanish.
"""
from __future__ import annotations

from dataclasses import dataclass

from trnc import ir

SINKABLE = ("unary", "scalar", "cast", "binary", "where")


def replace_uses(graph: ir.Graph, old: ir.Node, new: ir.Node) -> None:
    for n in graph.nodes:
        if old in n.inputs:
            n.inputs = tuple(new if i is old else i for i in n.inputs)
    graph.outputs = [new if o is old else o for o in graph.outputs]


def _key(n: ir.Node):
    attrs = tuple(sorted((k, repr(v)) for k, v in n.attrs.items()))
    return n.op, tuple(id(i) for i in n.inputs), n.shape, n.dtype, attrs


def cse(graph: ir.Graph) -> int:
    seen: dict[tuple, ir.Node] = {}
    merged = 0
    for n in list(graph.nodes):
        if n.op in ir.OPS_SOURCE:
            continue
        key = _key(n)
        if key in seen:
            replace_uses(graph, n, seen[key])
            graph.nodes.remove(n)
            merged += 1
        else:
            seen[key] = n
    return merged


def _only_last_dim(shape: tuple[int, ...]) -> bool:
    return all(s == 1 for s in shape[:-1])


def _sunk_inputs(n: ir.Node, r: ir.Node) -> list[ir.Node] | None:
    """n's inputs computed in the shape of r's source p (the sources of r and of other reshapes from p's shape,
    views of the other full-size inputs, last-dim vectors), or None when n cannot take r's source."""
    p = r.inputs[0]
    if r.shape != n.shape or n.op not in SINKABLE or not p.shape or not n.shape or p.shape[-1] != n.shape[-1]:
        return None
    new_inputs = []
    for o in n.inputs:
        if o is r or (o.op == "reshape" and o.inputs[0].shape == p.shape and o.shape == n.shape):
            new_inputs.append(o.inputs[0])
        elif o.shape == n.shape:
            new_inputs.append(ir.Node("reshape", (o,), p.shape, o.dtype, source=o.source))
        elif _only_last_dim(o.shape):
            new_inputs.append(o if len(o.shape) <= 1 else
                              ir.Node("reshape", (o,), o.shape[-1:], o.dtype, source=o.source))
        else:
            return None
    return new_inputs


def _sink_once(graph: ir.Graph, n: ir.Node, users: dict, operand_views: set) -> bool:
    """Sink one reshape input r of n below it. r may have several users (GPT-2's GELU reads the c_fc result
    four times) when each of them can take it, so that all of them sink in turn and r goes."""
    for r in n.inputs:
        if r.op != "reshape" or r in operand_views or r in graph.outputs:
            continue
        new_inputs = _sunk_inputs(n, r)
        if new_inputs is None or any(_sunk_inputs(u, r) is None for u in users.get(r, ()) if u is not n):
            continue
        inner = ir.Node(n.op, tuple(new_inputs), r.inputs[0].shape, n.dtype, dict(n.attrs), source=n.source)
        outer = ir.Node("reshape", (inner,), n.shape, n.dtype, source=n.source)
        added = [x for x in dict.fromkeys(new_inputs) if x not in graph.nodes]
        operand_views.update(added)   # views of the other operands are never sunk back
        for view in added:   # right after its source, so fuse sees it as early as the source
            graph.nodes.insert(graph.nodes.index(view.inputs[0]) + 1, view)
        at = graph.nodes.index(n)
        graph.nodes[at:at + 1] = [inner, outer]
        replace_uses(graph, n, outer)
        return True   # r, once without users, goes in graph.prune
    return False


def _collapse_reshapes(graph: ir.Graph) -> int:
    users = graph.users()
    removed = 0
    for n in list(graph.nodes):
        if n.op != "reshape":
            continue
        src = n.inputs[0]
        if src.op == "reshape" and len(users[src]) == 1 and src not in graph.outputs:
            n.inputs = src.inputs
            graph.nodes.remove(src)
            removed += 1
            src = n.inputs[0]
        if n.shape == src.shape and n not in graph.outputs:
            replace_uses(graph, n, src)
            graph.nodes.remove(n)
            removed += 1
            users = graph.users()
    return removed


def simplify(graph: ir.Graph) -> dict:
    stats = {"cse": cse(graph), "reshapes_sunk": 0}
    changed, operand_views = True, set()
    while changed:
        changed = False
        users = graph.users()
        for n in list(graph.nodes):
            if n.op in SINKABLE and _sink_once(graph, n, users, operand_views):
                stats["reshapes_sunk"] += 1
                changed = True
                break
    stats["reshapes_collapsed"] = _collapse_reshapes(graph)
    graph.prune()
    return stats


@dataclass(frozen=True)
class Simplify:
    """CSE, then reshapes sunk below elementwise ops and collapsed, so fusion sees through views."""

    name: str = "simplify"

    def run(self, state) -> dict:
        return simplify(state.graph)
