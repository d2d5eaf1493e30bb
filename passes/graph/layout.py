"""layout: for each kernel, which dim of its output lies on the 128 partitions, chosen by the cost model.

A kernel module may offer `candidates(kernel)`: the layouts it can lower (matmul: "m" or "n", i.e.
tokens or features on the partitions; elementwise: an output dim). With more than one, each is
lowered into a scratch tile program and costed with isa/cost.py: the estimate is the busiest
engine class (TensorE; the three vector engines together; the 16 DMA queues together). A linear
layer with a per-feature bias thus keeps features on the partitions (the bias becomes a
per-partition operand of the evacuation), while row-wise ops keep tokens there. Each choice is the
kernel's own; the plan pass (passes/graph/plan.py) may then overrule it where a neighbour gains more (a
matmul handing its rows to a layer norm in SBUF). Kernels of the same signature (a repeated layer)
reuse the first decision.
"""
from __future__ import annotations

from dataclasses import dataclass

from trnc import ir
from trnc.isa import cost
from trnc.isa.ap import Engine
from trnc.isa.config import DMA_QUEUES, HwConfig
from trnc.isa.program import TensorKind
from trnc.passes.tile import kernels
from trnc.passes.tile.tiles import TileBuilder, TileProgram

VECTOR_ENGINES = 3


def _signature(k: ir.Kernel) -> tuple:
    return (k.kind, k.compute_dtype, tuple((n.op, n.shape, n.dtype, repr(sorted(n.attrs.items())) if n.op != "const"
                                             else None, tuple(i.shape for i in n.inputs)) for n in k.nodes))


def estimate(kernel: ir.Kernel, partition_dim, hw: HwConfig) -> float:
    """Seconds of the busiest engine class when `kernel` is lowered with `partition_dim` on the partitions and
    no hand-over to its neighbours (inputs contiguous)."""
    tp = TileProgram(hw)
    kb = TileBuilder(tp, "est")
    views = {n: kb.tensor(f"i{i}", TensorKind.INPUT, n.dtype, n.shape) for i, n in enumerate(kernel.inputs)}
    out = kb.tensor("o", TensorKind.OUTPUT, kernel.output.dtype, kernel.output.shape)
    kernels.lowering(kernel.kind)(kb, kernel, views, out, ir.KernelPlan(partition_dim))
    for b in tp.buffers:
        b.offset = 0
    busy = {"pe": 0.0, "vector": 0.0, "dma": 0.0}
    for t in tp.instrs:
        ins = t.instruction()
        seconds = cost.seconds(ins, hw)
        cls = {Engine.PE: "pe", Engine.DMA: "dma"}.get(ins.engine, "vector")
        busy[cls] += seconds
    return max(busy["pe"], busy["vector"] / VECTOR_ENGINES, busy["dma"] / DMA_QUEUES)


def choose_layouts(graph: ir.Graph, hw: HwConfig) -> dict:
    decided: dict[tuple, object] = {}
    stats = {"estimated": 0, "reused": 0}
    for k in graph.kernels:
        mod = kernels.module(k.kind)
        if k.partition_dim is not None or not hasattr(mod, "candidates"):
            continue
        options = mod.candidates(k)
        if len(options) <= 1:
            k.partition_dim = options[0] if options else None
            continue
        sig = _signature(k)
        if sig in decided:
            k.partition_dim = decided[sig]
            stats["reused"] += 1
            continue
        k.partition_dim = decided[sig] = min(options, key=lambda o: estimate(k, o, hw))
        stats["estimated"] += 1
    return stats


@dataclass(frozen=True)
class ChooseLayouts:
    """Partition dim of every kernel by the cost of lowering each candidate."""

    name: str = "layout"

    def run(self, state) -> dict:
        return choose_layouts(state.graph, state.hw)
