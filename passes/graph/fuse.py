"""fuse: group the legalized graph into kernels, each computed on chip between one HBM read and one write.

Rules (pm_fuse), in topological order:
- a matmul opens a "matmul" kernel whose epilogue (scale, bias, activation, residual add, cast)
  is evaluated on the PSUM tile as it is evacuated, so the product never goes to HBM unscaled;
- an elementwise node joins the kernel that produced one of its inputs when that input has no
  other user, has the same shape, and ends a matmul, reduce or elementwise kernel (a chain of elementwise
  ops becomes one pass over each tile; a reduction's is applied to its result before the store);
- when it joins an elementwise kernel, an earlier elementwise kernel that ends in another of its inputs, of
  the same shape and with no other user, merges into that kernel: two chains that meet (GPT-2's tanh GELU,
  0.5 x times the chain of x's tanh) are one pass, not two, whose first wrote 0.5 x to HBM for the second
  and both read x (6.3 MB per layer of GPT-2 at hidden 512, seq 256);
- every other node (row-wise ops, reductions, attention, gathers, movement) is a kernel of its own;
- last, an elementwise kernel that holds every read of its latest input p, which ends a fusible kernel,
  joins that kernel whole: no node could join alone, since p is read more than once (GPT-2's GELU reads
  the c_fc result four times; as a kernel of its own it read the result back from HBM, 4 MB per layer).
A node joins a kernel only if its other inputs come from earlier kernels or from the chains merged
with it, so kernels stay in dependency order. The kind a node opens and the kinds it may join are rows
of passes/graph/kernel_kinds.py.
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
        target, meeting = _fusion_target(n, kernels, kernel_of, users) if kind == "elementwise" else (None, [])
        if target is None:
            kernels.append(ir.Kernel(kind, [n]))
            kernel_of[n] = len(kernels) - 1
            stats[f"kernel.{kind}"] += 1
        else:
            for merged in meeting:
                kernels[target].nodes[:0] = kernels[merged].nodes
                kernel_of.update((m, target) for m in kernels[merged].nodes)
                kernels[merged].nodes = []
                stats["kernel.elementwise"] -= 1
                stats["merged_into.elementwise"] += 1
            kernels[target].nodes.append(n)
            kernel_of[n] = target
            stats[f"fused_into.{kernels[target].kind}"] += 1
    for e in range(len(kernels)):
        target = _shared_producer(e, kernels, kernel_of, users)
        if target is not None:
            kernels[target].nodes.extend(kernels[e].nodes)
            kernel_of.update((m, target) for m in kernels[e].nodes)
            kernels[e].nodes = []
            stats["kernel.elementwise"] -= 1
            stats[f"joined.{kernels[target].kind}"] += 1
    graph.kernels = [k for k in kernels if k.nodes]
    return stats


def _copy_alone(p) -> bool:
    """A reduce that reduces nothing is lowered as a copy, alone: nothing joins it."""
    return p.op in ir.OPS_REDUCE and p.numel == p.inputs[0].numel


def _shared_producer(e, kernels, kernel_of, users) -> int | None:
    """The kernel that elementwise kernel e joins whole (None: it stays): the fusible kernel ending in e's
    latest input p, when p is read more than once, always in e (so no node could join alone: GPT-2's GELU
    reads the c_fc result four times; y * y reads y twice), of p's shape, and e's other inputs come from
    earlier kernels."""
    kernel = kernels[e]
    if kernel.kind != "elementwise" or not kernel.nodes:
        return None
    sources = {kernel_of[i]: i for i in kernel.inputs if i in kernel_of}
    if not sources:
        return None
    target = max(sources)
    p = sources[target]
    if not KINDS[kernels[target].kind].fusible or kernels[target].output is not p or len(users[p]) < 2:
        return None
    if _copy_alone(p):
        return None
    inside = set(kernel.nodes)
    if not all(u in inside for u in users[p]) or any(n.shape != p.shape for n in kernel.nodes):
        return None
    return target


def _fusion_target(n, kernels, kernel_of, users) -> tuple[int | None, list[int]]:
    """The kernel n joins (None: it opens one) and the kernels of chains meeting it there, merged first."""
    for p in n.inputs:
        k = kernel_of.get(p)
        if k is None or not KINDS[kernels[k].kind].fusible or kernels[k].output is not p:
            continue
        if len(users[p]) != 1 or p.shape != n.shape:
            continue
        if _copy_alone(p):
            continue
        others = [kernel_of[i] for i in n.inputs if i is not p and i in kernel_of]
        meeting = _chains_meeting(n, k, kernels, kernel_of, users)
        if all(o < k or o in meeting for o in others):
            return k, meeting
    return None, []


def _chains_meeting(n, target, kernels, kernel_of, users) -> list[int]:
    """The elementwise kernels before `target`, itself elementwise, that end in an input of `n` (of n's shape,
    n its only user): their nodes read only earlier kernels, so they may run first in target's pass."""
    if kernels[target].kind != "elementwise":
        return []
    found = []
    for q in dict.fromkeys(n.inputs):
        j = kernel_of.get(q)
        if j is None or j >= target or kernels[j].kind != "elementwise" or kernels[j].output is not q:
            continue
        if len(users[q]) == 1 and q.shape == n.shape:
            found.append(j)
    return found


@dataclass(frozen=True)
class Fuse:
    """Kernels: matmul epilogues into PSUM evacuation, elementwise chains into one pass per tile."""

    name: str = "fuse"

    def run(self, state) -> dict:
        return dict(fuse(state.graph))
