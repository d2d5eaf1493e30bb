"""Benchmark: modeled efficiency of the compiler's GEMM (passes/tile/kernels/matmul.py) on trn2.

Goal (issue 4): a 4096x4096x4096 GEMM with bf16 operands reaches a modeled efficiency of at least 0.90,
where efficiency = roofline / modeled time from `runtime.perf.simulate` (roofline: the larger of TensorE
time for the MACs at the dtype's peak rate and HBM time for the compulsory bytes).

Each case is one matmul kernel, out[M, N] = a[M, K] @ b[K, N], with a, b and out in HBM in the case's
dtype (the operand dtype on chip too), compiled by the backend passes (tile, allocate, schedule, emit;
emit runs the machine's verifier) and replayed by the performance model in counting-only mode: no data,
no execution. `build s` is the wall time of those four passes; `modeled` the simulated time; the engine
columns are busy / total time per engine (dma: the mean over the 16 queues); `DMA MB` all bytes moved.

Run: python benchmarks/bench_gemm.py [--orientation auto|m|n] [--only 4096x4096x4096:bf16 ...]
"""
from __future__ import annotations

import argparse
import time

from trnc import ir
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.passes.tile.allocate import Allocate
from trnc.passes.tile.emit import Emit
from trnc.options import Options
from trnc.passes.pipeline import CompileState
from trnc.passes.graph.plan import PlanKernels
from trnc.passes.tile.schedule import Schedule
from trnc.passes.tile.lower import LowerToTiles
from trnc.runtime.perf import simulate

CASES = [  # (M, K, N, dtype)
    (4096, 4096, 4096, "bf16"),
    (2048, 2048, 2048, "bf16"),
    (4096, 4096, 4096, "fp32"),
    (512, 768, 2304, "bf16"),    # BERT-base at sequence length 512: the merged Q, K, V projection,
    (512, 768, 3072, "bf16"),    # the FFN up-projection
    (512, 3072, 768, "bf16"),    # and the FFN down-projection
]
GOAL = {(4096, 4096, 4096, "bf16"): 0.90}


def build(m: int, k: int, n: int, dtype: DType, orientation: str | None) -> tuple[CompileState, float]:
    """The compiled program of one GEMM kernel, and the seconds the backend passes took."""
    a = ir.Node("input", (), (m, k), dtype, {"index": 0}, name="a")
    b = ir.Node("input", (), (k, n), dtype, {"index": 1}, name="b")
    mm = ir.Node("matmul", (a, b), (m, n), dtype, name="out")
    kernel = ir.Kernel("matmul", [mm], compute_dtype=dtype, partition_dim=orientation)
    graph = ir.Graph([a, b, mm], [a, b], [mm], kernels=[kernel])
    state = CompileState(graph, Options(target="trn2"), get_target("trn2"))
    start = time.perf_counter()
    for p in (PlanKernels(), LowerToTiles(), Allocate(), Schedule(), Emit()):
        state.stats[p.name] = p.run(state)
    return state, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description="modeled efficiency of the GEMM kernel on trn2.")
    parser.add_argument("--orientation", choices=("auto", "m", "n"), default="auto",
                        help="output dim on the PSUM partitions; auto lets the kernel choose. Defaults to auto.")
    parser.add_argument("--only", nargs="*", default=None, help="cases as MxKxN:dtype, e.g. 4096x4096x4096:bf16.")
    args = parser.parse_args()
    cases = CASES if not args.only else [(*map(int, c.split(":")[0].split("x")), c.split(":")[1]) for c in args.only]
    orientation = None if args.orientation == "auto" else args.orientation
    header = (f"{'M x K x N':>18} {'dtype':>5} {'instrs':>7} {'modeled us':>11} {'roofline us':>11} {'eff':>6} "
              f"{'pe':>6} {'act':>6} {'dve':>6} {'pool':>6} {'dma':>6} {'DMA MB':>8} {'build s':>7}  goal")
    print(header)
    for m, k, n, dt in cases:
        state, seconds = build(m, k, n, DType.from_text(dt), orientation)
        report = simulate(state.program, verified=True)
        util = {name: q.utilization for name, q in report.queues.items()}
        dma = [u for name, u in util.items() if name.startswith("dma")]
        goal = GOAL.get((m, k, n, dt))
        verdict = "" if goal is None else f">= {goal:.2f}: {'met' if report.efficiency >= goal else 'NOT met'}"
        print(f"{f'{m} x {k} x {n}':>18} {dt:>5} {report.instructions:>7} {report.total_seconds * 1e6:>11.1f} "
              f"{report.roofline.seconds * 1e6:>11.1f} {report.efficiency:>6.3f} {util['pe']:>6.1%} "
              f"{util['act']:>6.1%} {util['dve']:>6.1%} {util['pool']:>6.1%} {sum(dma) / 16:>6.1%} "
              f"{sum(report.dma_bytes.values()) / 1e6:>8.1f} {seconds:>7.1f}  {verdict}")


if __name__ == "__main__":
    main()
