"""The pass pipeline, in pipeline order, and the manager that runs it: timed, verified, printable.

Each pass is a frozen dataclass with a `name` and `run(state) -> stats`. Between graph passes the
IR verifier runs (in debug mode: `verify=True`, the default in tests); `print_after` (or
TRNC_PRINT_AFTER=tile,emit / all) prints the IR, the tile program or the assembly after a pass.
A failure inside a pass names the pass.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from trnc import flags, ir
from trnc.errors import TrncError
from trnc.isa.asm import format_program
from trnc.isa.config import HwConfig
from trnc.isa.program import Instruction, Program
from trnc.options import Options
from trnc.passes.allocate import Allocate
from trnc.passes.emit import Emit
from trnc.passes.fold import FoldConstants
from trnc.passes.fuse import Fuse
from trnc.passes.layout import ChooseLayouts
from trnc.passes.legalize import Legalize
from trnc.passes.merge_matmuls import MergeMatmuls
from trnc.passes.plan import PlanKernels
from trnc.passes.precision import Precision
from trnc.passes.schedule import Schedule
from trnc.passes.simplify import Simplify
from trnc.passes.tile import LowerToTiles
from trnc.passes.tiles import TileProgram


@dataclass
class CompileState:
    """What the passes read and write: the graph, then the tile program, then the instructions and program."""

    graph: ir.Graph
    options: Options
    hw: HwConfig
    tiles: TileProgram | None = None
    instructions: list[Instruction] | None = None
    program: Program | None = None
    stats: dict = field(default_factory=dict)

    def text(self) -> str:
        if self.program is not None:
            return format_program(self.program)
        if self.tiles is not None:
            return self.tiles.text()
        return self.graph.text()


PIPELINE = (
    Legalize(),        # Core ATen -> the trnc op set (ir.TRNC_OPS)
    FoldConstants(),   # nodes of constants only (masks, rotary tables, reshaped weights) computed now
    Simplify(),        # CSE; reshapes sunk below elementwise ops so fusion sees through them
    MergeMatmuls(),    # sibling matmuls of one input (Q, K, V) into one wider matmul
    Fuse(),            # kernels: matmul epilogues, elementwise chains, row-wise ops
    Precision(),       # storage and compute dtype of every value (auto_cast)
    ChooseLayouts(),   # which dim of each kernel lies on the partitions
    PlanKernels(),     # what crosses kernels: hand-overs in SBUF, orientation, row tiles, feature-major stores
    LowerToTiles(),    # kernels -> tile instructions over HBM views and symbolic buffers
    Allocate(),        # SBUF/PSUM addresses by liveness
    Schedule(),        # engines, DMA queues, semaphores
    Emit(),            # isa.Program, verified
)
GRAPH_PASSES = {"legalize", "fold", "simplify", "merge-matmuls", "fuse", "precision", "layout", "plan"}
PASS_NAMES = tuple(p.name for p in PIPELINE)


def _print_after(requested) -> set[str]:
    names = set(requested or ()) | set(flags.get("TRNC_PRINT_AFTER"))
    if "all" in names:
        return set(PASS_NAMES)
    unknown = names - set(PASS_NAMES)
    if unknown:
        raise TrncError(f"unknown pass name(s) {sorted(unknown)} to print after; passes are {', '.join(PASS_NAMES)}")
    return names


def run_pipeline(state: CompileState, *, print_after=(), verify: bool = True,
                 on_pass: Callable[[str, float], None] | None = None, out=None) -> dict[str, float]:
    """Run every pass on `state`; return seconds per pass. Stats of each pass go to state.stats[pass]."""
    out = out or sys.stderr
    printing = _print_after(print_after)
    times: dict[str, float] = {}
    if verify:
        ir.verify(state.graph, legalized=False)
    for p in PIPELINE:
        start = time.perf_counter()
        try:
            state.stats[p.name] = p.run(state) or {}
            if verify and p.name in GRAPH_PASSES:
                ir.verify(state.graph)
        except TrncError as e:
            raise type(e)(f"{e}\n  (in pass '{p.name}')") from e
        except Exception as e:
            raise TrncError(f"internal error in pass '{p.name}': {type(e).__name__}: {e}") from e
        times[p.name] = time.perf_counter() - start
        if on_pass:
            on_pass(p.name, times[p.name])
        if p.name in printing:
            print(f"// ----- after {p.name} -----\n{state.text()}", file=out)
    return times
