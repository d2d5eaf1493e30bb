"""fuse: group the legalized graph into kernels, each computed on chip between one HBM read and one write.

Rules (pm_fuse), in topological order:
- a matmul opens a "matmul" kernel whose epilogue (scale, bias, activation, residual add, cast)
  is evaluated on the PSUM tile as it is evacuated, so the product never goes to HBM unscaled;
- an elementwise node joins the kernel that produced one of its inputs when that input has no
  other user, has the same shape, and ends a matmul, reduce or elementwise kernel (a chain of elementwise
  ops becomes one pass over each tile; a reduction's is applied to its result before the store);
- every other node (row-wise ops, reductions, attention, gathers, movement) is a kernel of its own.
A node joins a kernel only if its other inputs come from earlier kernels, so kernels stay in
dependency order. The kind a node opens and the kinds it may join are rows of passes/graph/kernel_kinds.py.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from trnc import ir
from trnc.passes.graph.kernel_kinds import KIND_OF_OP, KINDS


def fuse(graph: ir.Graph) -> Counter:
    users = graph.users()
    for o in graph.outputs:   # a model output must be written to HBM: it ends its kernel
        users.setdefault(o, []).append(None)
    kernel_of: dict[ir.Node, int] = {}
    kernels: list[ir.Kernel] = []
    stats: Counter = Counter()
    for n in graph.nodes:
        if n.op in ir.OPS_SOURCE:
            continue
        kind = KIND_OF_OP[n.op]
        target = _fusion_target(n, kernels, kernel_of, users) if kind == "elementwise" else None
        if target is None:
            kernels.append(ir.Kernel(kind, [n]))
            kernel_of[n] = len(kernels) - 1
            stats[f"kernel.{kind}"] += 1
        else:
            kernels[target].nodes.append(n)
            kernel_of[n] = target
            stats[f"fused_into.{kernels[target].kind}"] += 1
    graph.kernels = kernels
    return stats


def _fusion_target(n, kernels, kernel_of, users) -> int | None:
    for p in n.inputs:
        k = kernel_of.get(p)
        if k is None or not KINDS[kernels[k].kind].fusible or kernels[k].output is not p:
            continue
        if len(users[p]) != 1 or p.shape != n.shape:
            continue
        if p.op in ir.OPS_REDUCE and p.numel == p.inputs[0].numel:   # no reduction: lowered as a copy, alone
            continue
        others = [kernel_of[i] for i in n.inputs if i is not p and i in kernel_of]
        if all(o < k for o in others):
            return k
    return None


@dataclass(frozen=True)
class Fuse:
    """Kernels: matmul epilogues into PSUM evacuation, elementwise chains into one pass per tile."""

    name: str = "fuse"

    def run(self, state) -> dict:
        return dict(fuse(state.graph))
