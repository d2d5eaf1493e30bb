"""The roofline of a compiled model and the stats dict of a CompiledModel: both built here and nowhere else.

A program has two rooflines, from one formula (isa/cost.py Roofline) and the same compulsory HBM bytes:
the performance model's, of the MACs the program executes (runtime/perf.py), and the model's, of the MACs
the model asks for (passes/graph/kernel_kinds.py kernel_macs: its matmuls and attentions as eager computes them).
A compiled model's efficiency is against the model's, which no extra work of a kernel plan (padding,
recomputation) can inflate; the other stays as `executed_macs_efficiency`. A model loaded from an artifact
gets the program's (program_stats), and the compile-side stats saved with it on top.
"""
from __future__ import annotations

from trnc import ir
from trnc.isa import cost
from trnc.isa.config import HwConfig
from trnc.isa.dtypes import DType
from trnc.passes.graph.kernel_kinds import kernel_macs
from trnc.runtime.perf import PerfReport

ENGINES = ("pe", "act", "dve", "pool")


def model_pe_cycles(graph: ir.Graph, hw: HwConfig) -> tuple[int, float]:
    """MACs the model asks for and their TensorE cycles at the peak rate of each kernel's operand dtype (fp8 at
    the double-row rate where the target has it, MX matmuls at the MX rate): the compute side of the model's
    roofline."""
    macs, cycles = 0, 0.0
    for kernel in graph.kernels:
        work = kernel_macs(kernel)
        if work:
            macs += work
            dtype = kernel.compute_dtype or DType.FP32
            cycles += cost.peak_pe_cycles(work, dtype, hw, double_row=dtype.is_fp8 and hw.fp8_double_row,
                                          mx=kernel.kind == "matmul_mx")
    return macs, cycles


def _against(roofline: cost.Roofline, report: PerfReport, hw: HwConfig) -> dict:
    return {"roofline_seconds": roofline.seconds, "roofline_cycles": roofline.seconds * hw.clock_hz["pe"],
            "efficiency": roofline.efficiency(report.total_seconds)}


def program_stats(report: PerfReport, hw: HwConfig) -> dict:
    """The stats of a program from its performance model alone, efficiency against the executed MACs."""
    busy = {name: q.busy_cycles / q.clock_hz for name, q in report.queues.items()}
    engine_busy = {e: busy.get(e, 0.0) for e in ENGINES}
    engine_busy["dma"] = sum(v for k, v in busy.items() if k.startswith("dma"))
    return {"cycles": report.total_cycles("pe"), "seconds": report.total_seconds,
            **_against(report.roofline, report, hw), "executed_macs_efficiency": report.efficiency,
            "engine_busy": engine_busy,
            "engine_utilization": {n: q.utilization for n, q in report.queues.items()},
            "dma_bytes": sum(report.dma_bytes.values()), "instructions": report.instructions,
            "macs": report.macs}


def compiled_stats(graph: ir.Graph, hw: HwConfig, report: PerfReport, allocation: dict) -> dict:
    """The stats of a model compiled to `graph`'s program: the program's, the compile-side ones (`allocation`:
    the allocate pass's stats), and the roofline and efficiency against the model's MACs."""
    macs, pe_cycles = model_pe_cycles(graph, hw)
    return {**program_stats(report, hw),
            "sbuf_peak_bytes": allocation.get("sbuf_peak_bytes", 0),
            "psum_peak_bytes": allocation.get("psum_peak_bytes", 0),
            "kernels": len(graph.kernels or ()), "model_macs": macs,
            **_against(cost.Roofline.of(pe_cycles, report.compulsory_bytes, hw), report, hw)}
