"""The pass pipeline, in pipeline order, and the manager that runs it: timed, verified, printable.

Each pass is a frozen dataclass with a `name` and `run(state) -> stats`. The manager knows nothing
of particular passes: hooks run before and after each one (`Hook`), and give the timing, the
verifier of the IR level the state has reached (VERIFIERS, with `verify=True`, the default; the tile
level's only in debug mode, TRNC_DEBUG=1, as tests run), `print_after` (or TRNC_PRINT_AFTER=tile,emit /
all: the IR, the tile program or the assembly after a pass) and the caller's progress line. Adding a pass
is one line in PIPELINE. A failure inside a pass, or in the verifier after it, names the pass.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from trnc import flags, ir
from trnc.errors import TrncError
from trnc.log import get_logger
from trnc.isa.asm import format_program
from trnc.isa.config import HwConfig
from trnc.isa.program import Instruction, Program
from trnc.options import Options
from trnc.passes.tile.allocate import Allocate
from trnc.passes.tile.emit import Emit
from trnc.passes.graph.fold import FoldConstants
from trnc.passes.graph.fuse import Fuse
from trnc.passes.graph.layout import ChooseLayouts
from trnc.passes.graph.legalize import Legalize
from trnc.passes.graph.merge_matmuls import MergeMatmuls
from trnc.passes.graph.plan import PlanKernels
from trnc.passes.graph.precision import Precision
from trnc.passes.graph.quantize import Quantize
from trnc.passes.graph.recognize import Recognize
from trnc.passes.tile.schedule import Schedule
from trnc.passes.graph.simplify import Simplify
from trnc.passes.tile.lower import LowerToTiles
from trnc.passes.tile.prefetch import Prefetch
from trnc.passes.tile.tiles import TileProgram
from trnc.passes.tile.verify import verify_tiles


@dataclass
class CompileState:
    """What the passes read and write: the graph, then the tile program, then the instructions and program.
    `example_inputs`: the graph's inputs as the caller gave them (the quantize pass calibrates static scales)."""

    graph: ir.Graph
    options: Options
    hw: HwConfig
    example_inputs: tuple = ()
    tiles: TileProgram | None = None
    instructions: list[Instruction] | None = None
    program: Program | None = None
    stats: dict = field(default_factory=dict)

    @property
    def level(self) -> str:
        """The IR the passes have reached: "graph", then "tiles" once tile ran, then "program" after emit."""
        if self.program is not None:
            return "program"
        return "graph" if self.tiles is None else "tiles"

    def text(self) -> str:
        if self.level == "program":
            return format_program(self.program)
        return self.graph.text() if self.level == "graph" else self.tiles.text()


PIPELINE = (
    Legalize(),        # Core ATen -> the trnc op set (ir.TRNC_OPS)
    FoldConstants(),   # nodes of constants only (masks, rotary tables, reshaped weights) computed now
    Simplify(),        # CSE; reshapes sunk below elementwise ops so fusion sees through them
    Recognize(),       # spelled-out RMS norms into the row-wise rms_norm op, tanh GELUs into gelu_tanh
    MergeMatmuls(),    # sibling matmuls of one input (Q, K, V) into one wider matmul
    Quantize(),        # precision="fp8": weights' matmuls to fp8 operands scaled per tensor
    Fuse(),            # kernels: matmul epilogues, elementwise chains, row-wise ops
    Precision(),       # storage and compute dtype of every value (auto_cast)
    ChooseLayouts(),   # which dim of each kernel lies on the partitions
    PlanKernels(),     # what crosses kernels: hand-overs in SBUF, orientation, row tiles, feature-major stores
    LowerToTiles(),    # kernels -> tile instructions over HBM views and symbolic buffers
    Prefetch(),        # convolutions' weight loads ahead of the kernels before them
    Allocate(),        # SBUF/PSUM addresses by liveness
    Schedule(),        # engines, DMA queues, semaphores
    Emit(),            # isa.Program, verified
)
PASS_NAMES = tuple(p.name for p in PIPELINE)
# the verifier of each IR level, run after every pass that leaves the state at that level
VERIFIERS: dict[str, Callable[[CompileState], None]] = {
    "graph": lambda state: ir.verify(state.graph),
    "tiles": lambda state: verify_tiles(state.tiles, state.graph, state.instructions),
}
# levels verified only in debug mode: the tile verifier re-derives every instruction's footprint, a large
# share of a cold compile's tile time, and emit's ISA verifier checks the result anyway
DEBUG_LEVELS = frozenset({"tiles"})


def print_after_names(requested=()) -> set[str]:
    """The passes to print the state after: `requested` and TRNC_PRINT_AFTER ('all': every pass). An unknown
    name is an error listing the passes, raised before anything slow runs."""
    names = set(requested or ()) | set(flags.get("TRNC_PRINT_AFTER"))
    if "all" in names:
        return set(PASS_NAMES)
    unknown = names - set(PASS_NAMES)
    if unknown:
        raise TrncError(f"unknown pass name(s) {', '.join(map(repr, sorted(unknown)))} to print after; passes are "
                        f"{', '.join(PASS_NAMES)} (or all)")
    return names


class Hook:
    """Runs around every pass: `before` hooks in list order, `after` hooks in reverse, so hooks nest like
    scopes (a timer inside a progress line measures what the line shows). The base does nothing."""

    def before(self, name: str, state: CompileState) -> None:
        pass

    def after(self, name: str, state: CompileState) -> None:
        pass


class Timer(Hook):
    """Seconds per pass, the verifier after it included; logged at DEBUG."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._start = 0.0

    def before(self, name, state):
        self._start = time.perf_counter()

    def after(self, name, state):
        self.seconds[name] = time.perf_counter() - self._start
        get_logger(__name__).debug("pass %s: %.3f s", name, self.seconds[name])


class Verify(Hook):
    """The captured graph before the first pass, then the verifier of the level each pass leaves the state at."""

    def __init__(self):
        self._input_checked = False

    def before(self, name, state):
        if not self._input_checked:
            ir.verify(state.graph, legalized=False)
            self._input_checked = True

    def after(self, name, state):
        check = VERIFIERS.get(state.level)
        if check is not None and (state.level not in DEBUG_LEVELS or flags.get("TRNC_DEBUG")):
            check(state)


class PrintAfter(Hook):
    def __init__(self, names: set[str], out):
        self.names, self.out = names, out

    def after(self, name, state):
        if name in self.names:
            print(f"// ----- after {name} -----\n{state.text()}", file=self.out)


class PassProgress(Hook):
    """One step of a progress line (trnc/progress.py) per pass; `steps` of them."""

    def __init__(self, progress):
        self.progress = progress
        self.steps = len(PIPELINE)

    def before(self, name, state):
        self.progress.begin(name)

    def after(self, name, state):
        self.progress.end()


def run_pipeline(state: CompileState, *, print_after=(), verify: bool = True, hooks: tuple[Hook, ...] = (),
                 out=None) -> dict[str, float]:
    """Run every pass on `state` with the caller's `hooks` outermost; return seconds per pass. Stats of each
    pass go to state.stats[pass]."""
    timer = Timer()
    scopes = [*hooks, PrintAfter(print_after_names(print_after), out or sys.stderr), timer]
    if verify:
        scopes.append(Verify())
    for p in PIPELINE:
        for hook in scopes:
            hook.before(p.name, state)
        try:
            state.stats[p.name] = p.run(state) or {}
            for hook in reversed(scopes):
                hook.after(p.name, state)
        except TrncError as e:
            raise type(e)(f"{e}\n  (in pass '{p.name}')") from e
        except Exception as e:
            raise TrncError(f"internal error in pass '{p.name}': {type(e).__name__}: {e}") from e
    return timer.seconds
