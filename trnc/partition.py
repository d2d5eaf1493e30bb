"""Partitioning for the torch.compile backend: which aten nodes trnc compiles, and the graph that wires them.

The backend (trnc/backend.py) hands this module a static Core-ATen fx graph (aot_autograd's forward,
specialized to concrete shapes, its weights frozen by `freeze` into get_attr constants). A node is a device
candidate when its tensors are of dtypes the machine holds and legalize has a rule for its op
(passes/graph/legalize_rules.py `pm_legalize`) or it is deterministic and depends on constants alone (legalize
computes it with torch at compile time: creation ops, masks and tables built from buffers). torch's
CapabilityBasedPartitioner groups candidates into the largest regions that keep the graph acyclic; each
region becomes a submodule compiled by `trnc.compile`, and the nodes outside run in eager PyTorch between
them, wired by fx. A rule can still refuse particular arguments (an UnsupportedOpError from legalize on,
say, a strided convolution): the nodes of that op in the failing region move to eager and the graph is
partitioned again, so one refusal costs one region, never the graph; a region that fails for another trnc
reason runs in eager whole. Regions that compiled are reused across rounds by their node names. The
constants a region reads move inside it, so trnc compiles them as constants rather than inputs.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from trnc.capture import source_of
from trnc.dtypes import DTYPES
from trnc.errors import TrncError, UnsupportedOpError
from trnc.passes.graph.legalize_rules import pm_legalize
from trnc.passes.graph.legalize_table import lowered

NO_RULE = "no legalize rule"
CONSTANT = "a constant feeding eager code"


@dataclass(frozen=True)
class FallbackOp:
    """One aten op that runs in eager PyTorch: its nodes, the user's source lines, and why."""

    op: str                     # 'aten.sort.default'
    count: int                  # nodes of this op that fell back
    sources: tuple[str, ...]    # distinct 'model.py:12: code' lines of those nodes
    reason: str                 # why its first node fell back: 'no legalize rule', or the trnc error


@dataclass
class Partitioned:
    """The graph to run (device regions are submodules calling compiled programs) and what fell back."""

    module: torch.fx.GraphModule
    device_partitions: int
    device_nodes: int
    fallback: tuple[FallbackOp, ...]
    device_ops: tuple[str, ...] = ()   # the distinct aten ops of the device regions' nodes ('aten.add.Tensor')


def _tensors(value) -> list:
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def unsupported_reason(node: torch.fx.Node, reasons: dict[str, str], constants: set[str]) -> str | None:
    """Why `node` cannot run on the device, or None when it is a candidate. `reasons` holds the nodes
    decided before it (in graph order): a getitem follows its parent. `constants` names the nodes computed
    from frozen weights (get_attr) alone: legalize evaluates those with torch, whatever their op."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        parent = node.args[0]
        return reasons.get(parent.name) if isinstance(parent, torch.fx.Node) else None
    target = node.target
    if not lowered(target):
        return "not an aten operator"
    values = _tensors(node.meta.get("val")) + [t for a in node.all_input_nodes for t in _tensors(a.meta.get("val"))]
    bad = sorted({str(t.dtype) for t in values if t.dtype not in DTYPES})
    if bad:
        return f"tensors of {', '.join(bad)} (the machine holds {', '.join(sorted(str(d) for d in DTYPES))})"
    if _constant(node, constants):
        return None
    if any(t.dtype == torch.float64 for t in values):
        return "float64 values computed from inputs (the machine has no 64-bit floats; it holds float64 constants)"
    return None if str(target) in pm_legalize else NO_RULE


# creation ops whose tensor argument gives only its shape, dtype and device, never its values
SHAPE_ONLY = frozenset({"aten.full_like.default", "aten.empty_like.default", "aten.new_empty_strided.default",
                        "aten.new_empty.default", "aten.new_zeros.default", "aten.new_ones.default",
                        "aten.new_full.default"})


def _constant(node: torch.fx.Node, constants: set[str]) -> bool:
    """A frozen weight, or a deterministic op of constants only (creation ops included; the `like` argument of
    SHAPE_ONLY's ops does not count: its values are never read)."""
    if node.op == "get_attr":
        return True
    seeded = isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags
    read = node.all_input_nodes[1:] if str(node.target) in SHAPE_ONLY else node.all_input_nodes
    return node.op == "call_function" and not seeded and all(a.name in constants for a in read)


class _Support(OperatorSupportBase):
    def __init__(self, reasons: dict[str, str]):
        self.reasons = reasons

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.name not in self.reasons


def _where(node: torch.fx.Node) -> str:
    source = source_of(node.meta.get("stack_trace"))
    return f" (at {source})" if source else ""


def initial_reasons(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Node name -> reason for every node that is not a device candidate, in graph order."""
    reasons: dict[str, str] = {}
    constants: set[str] = set()
    for node in gm.graph.nodes:
        reason = unsupported_reason(node, reasons, constants)
        if reason is not None:
            reasons[node.name] = reason
        if _constant(node, constants):
            constants.add(node.name)
    return reasons


def unsupported_error(gm: torch.fx.GraphModule, reasons: dict[str, str]) -> UnsupportedOpError:
    """The error for fallback=False: every op that would fall back, with its source line and reason."""
    nodes = {n.name: n for n in gm.graph.nodes}
    lines = [f"{nodes[name].target}{_where(nodes[name])}: {reason}" for name, reason in reasons.items()
             if nodes[name].target is not operator.getitem]
    return UnsupportedOpError("trnc cannot compile " + "; ".join(lines) + ". Pass options={'fallback': True} to "
                              "torch.compile to run these ops in eager PyTorch between device regions")


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A fresh GraphModule over a copy of the graph (same node names and meta), sharing gm's attributes,
    because fusing partitions rewrites the graph it is given."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _example(node_arg) -> torch.Tensor:
    """A tensor of the node's static shape and dtype for tracing (capture only looks at shapes and dtypes)."""
    val = node_arg.meta["val"]
    return torch.zeros(tuple(int(s) for s in val.shape), dtype=val.dtype)


def _culprits(error: TrncError, nodes) -> list[torch.fx.Node]:
    """The nodes of a failed region whose op the error names (legalize names the aten op), else all of them."""
    named = [n for n in nodes if n.target is not operator.getitem and str(n.target) in str(error)]
    return named or list(nodes)


class DeviceRegion(torch.nn.Module):
    """A fused region compiled by trnc.compile, called in place of its fx submodule."""

    def __init__(self, compiled):
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        return self.compiled(*args)


def partition(gm: torch.fx.GraphModule, compile_region: Callable, fallback: bool) -> Partitioned:
    """Split `gm` into device regions compiled by `compile_region(submodule, example_inputs)` and eager nodes.

    fallback=False raises UnsupportedOpError naming every op without a rule and its line, or the first trnc
    error of a region's compile.
    """
    reasons = initial_reasons(gm)
    if reasons and not fallback:
        raise unsupported_error(gm, reasons)
    compiled: dict[tuple[str, ...], object] = {}
    while True:
        work = _copy(gm)
        partitioner = CapabilityBasedPartitioner(work, _Support(reasons), allows_single_node_partition=True)
        regions = partitioner.propose_partitions()
        fused = partitioner.fuse_partitions(regions) if regions else work
        if not _compile_regions(fused, compiled, compile_region, reasons, fallback):
            break
    regions = _regions(fused)
    for node, _, key in regions:
        setattr(fused, node.target, DeviceRegion(compiled[key]))
    fused.recompile()
    ops = sorted({str(n.target) for _, sub, _ in regions for n in sub.graph.nodes if n.op == "call_function"})
    return Partitioned(fused, len(regions), sum(len(key) for _, _, key in regions), _fallback(gm, reasons),
                       tuple(ops))


def _regions(fused: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, torch.fx.GraphModule, tuple[str, ...]]]:
    """(call node, submodule, key) of each fused region; the key is its sorted op node names."""
    out = []
    for node in fused.graph.nodes:
        if node.op == "call_module" and node.target.startswith("fused_"):
            sub = getattr(fused, node.target)
            if isinstance(sub, torch.fx.GraphModule):
                out.append((node, sub, tuple(sorted(n.name for n in sub.graph.nodes if n.op == "call_function"))))
    return out


def _compile_regions(fused, compiled, compile_region, reasons, fallback) -> bool:
    """Compile each region not compiled before. On a trnc error, move the culprits to eager and return True
    (partition again); a region without inputs (constants feeding eager code) is moved to eager likewise."""
    for node, sub, key in _regions(fused):
        _inline_constants(fused, node, sub)
        if key in compiled:
            continue
        if not node.args:
            reasons.update({name: CONSTANT for name in key})
            return True
        try:
            compiled[key] = compile_region(sub, [_example(a) for a in node.args])
        except TrncError as e:
            if not fallback:
                raise
            ops = [n for n in sub.graph.nodes if n.op == "call_function"]
            culprits = _culprits(e, ops) if isinstance(e, UnsupportedOpError) else ops
            reasons.update({n.name: str(e).splitlines()[0] for n in culprits})
            for n in ops:   # getitems follow their parent
                if n.target is operator.getitem and n.args[0].name in reasons:
                    reasons[n.name] = reasons[n.args[0].name]
            return True
    return False


def _inline_constants(fused: torch.fx.GraphModule, node: torch.fx.Node, sub: torch.fx.GraphModule) -> None:
    """Frozen weights (get_attr in the outer graph) that a region reads become get_attr inside it, so trnc
    compiles them as constants (folded, laid out once) instead of taking them as inputs on every call."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    kept = []
    for placeholder, arg in zip(placeholders, node.args):
        if arg.op != "get_attr":
            kept.append(arg)
            continue
        sub.register_buffer(arg.target, getattr(fused, arg.target))
        with sub.graph.inserting_before(placeholder):
            constant = sub.graph.get_attr(arg.target)
        constant.meta = dict(arg.meta)
        placeholder.replace_all_uses_with(constant)
        sub.graph.erase_node(placeholder)
    node.args = tuple(kept)
    sub.recompile()


def freeze(gm: torch.fx.GraphModule, args: list, weights: list[int]) -> torch.fx.GraphModule:
    """A copy of `gm` whose placeholders at positions `weights` read the tensors `args[i]` as attributes
    (get_attr); the other placeholders stay, in order. The caller keeps the tensors unchanged or recompiles."""
    frozen = _copy(gm)
    placeholders = [n for n in frozen.graph.nodes if n.op == "placeholder"]
    for i in weights:
        name = f"trnc_weight_{i}"
        frozen.register_buffer(name, args[i].detach())
        with frozen.graph.inserting_before(placeholders[i]):
            constant = frozen.graph.get_attr(name)
        constant.meta = dict(placeholders[i].meta)
        placeholders[i].replace_all_uses_with(constant)
        frozen.graph.erase_node(placeholders[i])
    frozen.recompile()
    return frozen


def _fallback(gm: torch.fx.GraphModule, reasons: dict[str, str]) -> tuple[FallbackOp, ...]:
    """The report's rows: ops (not getitems or constants feeding eager code) grouped by op, in graph order."""
    rows: dict[str, tuple[int, list[str], str]] = {}
    for node in gm.graph.nodes:
        reason = reasons.get(node.name)
        if reason in (None, CONSTANT) or node.target is operator.getitem or node.op != "call_function":
            continue
        count, sources, first = rows.get(str(node.target), (0, [], reason))
        source = source_of(node.meta.get("stack_trace"))
        if source and source not in sources:
            sources.append(source)
        rows[str(node.target)] = (count + 1, sources, first)
    return tuple(FallbackOp(op, count, tuple(sources), reason) for op, (count, sources, reason) in rows.items())
