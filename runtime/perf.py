"""The performance model: a verified program replayed on a timeline of engine and DMA queues, and its counters.

It needs no data (counting-only mode): every duration comes from the cost model (isa/cost.py), so a
program of a million instructions replays in about a second. runtime/trace.py exports the timeline as a
Chrome/Perfetto trace.

The machine model, from isa/spec_intro.md ("Execution and ordering"):
- Each queue (pe, act, dve, pool, dma0..dma15) runs its instructions in program order, one at a time.
  An instruction starts at the later of the moment its queue is free and, for each wait `s >= v`, the
  completion of the instruction that gave semaphore s its v-th signal; its signals happen at completion.
- A DMA instruction occupies its queue for the cost model's fixed cost plus bytes over the per-queue
  bandwidth. Queues are independent: no shared HBM cap is modeled, because in every preset the 16 queues
  together are no faster than the core's HBM bandwidth (trn2: 16 x 23 B/ns = 368 GB/s <= 375 GB/s), so the
  cap could never bind (a test checks this for every preset).
- Time is an integer count of ticks: the least common multiple of the clocks (24 GHz on trn2), so one
  cycle of every engine is a whole number of ticks and times add exactly. Counters in cycles are given in
  each queue's own clock; DMA queues count nanoseconds, as the cost model does.

Stalls: the time from the moment a queue is free to the start of its next instruction is charged to that
instruction's binding wait (the latest of its signals; the first listed on a tie): "dma" when that
semaphore is signalled by a DMA queue, "semaphore" when by a compute engine. A queue's first instruction
counts the same way, from time 0. Idle is the rest: after the queue's last instruction, or the whole run
for a queue with nothing to do. Per queue, busy + stalls + idle = the total time.

SBUF and PSUM high-water marks are footprints, not liveness: the highest byte (per partition) that any
operand of the program touches in that memory.

Speed: durations and counters are computed once per distinct instruction (opcode, queue and fields, HBM
operands by shape), found first by the identity of the instruction's field tuple on its queue (shared by
the instructions a loop repeats: build them with Instruction.replace) and only then by value, which costs
a few microseconds; the replay itself is one loop over plain lists, with the garbage collector paused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trnc.isa import cost
from trnc.isa.ap import AP, QUEUES, Engine, Mem
from trnc.isa.decoding import no_gc
from trnc.isa.config import SEMAPHORES, HwConfig, get_target
from trnc.isa.program import Instruction, Program, TensorKind
from trnc.isa.verify import verify
from trnc.runtime.reference import execution_order

FIRST_DMA_QUEUE = int(Engine.DMA)   # queue index = engine + DMA queue: pe, act, dve, pool, dma0..dma15
QUEUE_NAMES = QUEUES
CLOCKS = ("pe", "act", "dve", "pool", "dma")
DIRECTIONS = ("hbm->sbuf", "sbuf->hbm", "sbuf->sbuf", "hbm->hbm")
MAX_TICKS_PER_SECOND = 10**15     # past this the clocks have no useful common multiple: ticks are femtoseconds
_DIRECTION = {(Mem.HBM, Mem.SBUF): 0, (Mem.SBUF, Mem.HBM): 1, (Mem.SBUF, Mem.SBUF): 2, (Mem.HBM, Mem.HBM): 3}
_COMPULSORY = (TensorKind.INPUT, TensorKind.CONST, TensorKind.SEED, TensorKind.OUTPUT)


def time_base(hw: HwConfig) -> tuple[int, dict[str, int]]:
    """Ticks per second and ticks per cycle of each clock (clocks in whole hertz).

    The tick is 1 / lcm(clocks), so every cycle is a whole number of ticks; when that multiple exceeds
    MAX_TICKS_PER_SECOND the tick is a femtosecond and cycles round to the nearest tick.
    """
    hertz = {name: int(round(hw.clock_hz[name])) for name in CLOCKS}
    tps = math.lcm(*hertz.values())
    if tps > MAX_TICKS_PER_SECOND:
        tps = MAX_TICKS_PER_SECOND
    return tps, {name: max(1, round(tps / hz)) for name, hz in hertz.items()}


@dataclass(frozen=True)
class _Signature:
    """What every instruction with the same opcode, queue and fields (HBM operands by shape) costs and counts."""

    queue: int                # index into QUEUE_NAMES
    ticks: int                # duration
    opcode: str
    macs: int                 # useful TensorE multiply-accumulates
    transpose_macs: int       # the identity matmul of a transpose: P * P * F
    peak_pe_cycles: float     # macs at the dtype's peak rate: the TensorE part of the roofline
    direction: int            # index into DIRECTIONS, -1 for compute instructions
    dma_bytes: int
    sbuf_top: int             # highest SBUF / PSUM byte per partition its operands touch, 0 when none
    psum_top: int


def _measure(ins: Instruction, queue: int, hw: HwConfig, tick_of: dict[str, int]) -> _Signature:
    clock = "dma" if ins.engine is Engine.DMA else ins.engine.text
    macs = transpose_macs = dma_bytes = 0
    peak = 0.0
    direction = -1
    if ins.opcode in ("matmul", "matmul_mx"):
        st, dst = ins["stationary"], ins["dst"]
        # dst is [M, N]; stationary holds K * M elements, K counting double-row pairs and MX row groups.
        macs = dst.num_elements * (st.num_elements // dst.partitions)
        mx = ins.opcode == "matmul_mx"
        peak = cost.peak_pe_cycles(macs, st.dtype, hw, double_row=not mx and ins["double_row"], mx=mx)
    elif ins.opcode == "transpose":
        src = ins["src"]
        transpose_macs = src.partitions * src.num_elements
    elif ins.engine is Engine.DMA:
        src = ins["table"] if ins.opcode == "dma_gather" else ins["src"]
        direction = _DIRECTION[src.mem, ins["dst"].mem]
        dma_bytes = cost.dma_bytes(ins)
    tops = {Mem.SBUF: 0, Mem.PSUM: 0, Mem.HBM: 0}
    for _, ap, _ in ins.operands():
        tops[ap.mem] = max(tops[ap.mem], ap.byte_range()[1])
    return _Signature(queue, cost.cycles(ins, hw) * tick_of[clock], ins.opcode, macs, transpose_macs, peak,
                      direction, dma_bytes, tops[Mem.SBUF], tops[Mem.PSUM])


def _value_key(ins: Instruction, queue: int) -> tuple:
    """The instruction's identity for the model: opcode, queue and fields, operands as plain tuples.

    An HBM operand counts by its shape and dtype alone (where it points changes no duration or counter), so
    the tiles a loop streams through share one signature; dtypes count by identity (members are singletons,
    and Enum's hash is slow).
    """
    key: list = [ins.opcode, queue]
    for _, v in ins.args:
        if v.__class__ is AP:
            on_chip = v.mem is not Mem.HBM
            key.append((v.mem, id(v.dtype), v.partitions, v.dims, v.offset if on_chip else 0,
                        v.start_partition if on_chip else 0))
        else:
            key.append(v)
    return tuple(key)


class _Replay:
    """One replay: the signatures met so far and the queue, semaphore and stall state of the timeline."""

    def __init__(self, hw: HwConfig, tick_of: dict[str, int]):
        self.hw, self.tick_of = hw, tick_of
        self.signatures: list[_Signature] = []
        self.by_value: dict[tuple, int] = {}

    def signature(self, ins: Instruction, queue: int) -> int:
        """The signature of `ins` on queue index `queue`, measuring it if it is new."""
        key = _value_key(ins, queue)
        sig = self.by_value.get(key)
        if sig is None:
            sig = self.by_value[key] = len(self.signatures)
            self.signatures.append(_measure(ins, queue, self.hw, self.tick_of))
        return sig

    def run(self, instrs) -> tuple[list[int], list[int], list[int], list[list[int]]] | None:
        """Start ticks and signatures of `instrs` in the given order, the queues' free times and the stall
        ticks of each queue (columns) per binding semaphore (rows); None when an instruction waits for a
        signal given later in that order.

        The queue index is engine + DMA queue (compute engines have queue 0 in a verified program).
        """
        nq = len(QUEUE_NAMES)
        free = [0] * nq
        # Per queue: id(field tuple) -> signature. Values are small shared ints, not per-entry tuples: a loop
        # cycling through thousands of field tuples then misses the cache less (measured: 12% of the replay).
        seen: list[dict[int, int]] = [{} for _ in range(nq)]
        ticks_of = [s.ticks for s in self.signatures]
        done = [[0] for _ in range(SEMAPHORES)]    # done[s][v]: completion tick of the v-th signal of s
        stalled = [[0] * nq for _ in range(SEMAPHORES)]
        starts: list[int] = []
        sigs: list[int] = []
        try:
            for ins in instrs:
                q = ins.engine + ins.queue      # isa/ap.py queue_index, inlined in the hot loop
                try:                               # the program keeps every field tuple alive: ids stay unique
                    sig = seen[q][id(ins.args)]
                except KeyError:
                    sig = seen[q][id(ins.args)] = self.signature(ins, q)
                    if sig == len(ticks_of):
                        ticks_of.append(self.signatures[sig].ticks)
                start = free_at = free[q]
                waits = ins.waits
                if waits:
                    for s, v in waits:
                        t = done[s][v]             # IndexError: the v-th signal comes later in this order
                        if t > start:
                            start, cause = t, s
                    if start > free_at:
                        stalled[cause][q] += start - free_at
                end = start + ticks_of[sig]
                free[q] = end
                starts.append(start)
                sigs.append(sig)
                for s in ins.signals:
                    done[s].append(end)
        except IndexError:
            return None
        return starts, sigs, free, stalled


def _signallers(instrs, wanted: set[int]) -> dict[int, int]:
    """The queue index that signals each semaphore of `wanted` (one queue per semaphore, as verified)."""
    found: dict[int, int] = {}
    for ins in instrs:
        for s in ins.signals:
            if s in wanted:
                found[s] = ins.engine + ins.queue
        if len(found) == len(wanted):
            break
    return found


def _stalls(instrs, stalled: list[list[int]]) -> tuple[list[int], list[int]]:
    """Stall ticks per queue charged to DMA signals and to compute-engine signals."""
    nq = len(QUEUE_NAMES)
    dma, sem = [0] * nq, [0] * nq
    rows = {s: row for s, row in enumerate(stalled) if any(row)}
    for s, queue in _signallers(instrs, set(rows)).items():
        into = dma if queue >= FIRST_DMA_QUEUE else sem
        for q, ticks in enumerate(rows[s]):
            into[q] += ticks
    return dma, sem


@dataclass(frozen=True)
class Timeline:
    """When each instruction ran, in ticks (`ticks_per_second` of them in a second), indexed like the program.

    `queue` indexes QUEUE_NAMES; `sbuf_top` / `psum_top` are the highest byte per partition the instruction's
    operands touch in that memory (0 when none), from which the trace draws the footprint counters.
    """

    ticks_per_second: int
    queue: np.ndarray
    start: np.ndarray
    end: np.ndarray
    sbuf_top: np.ndarray
    psum_top: np.ndarray


@dataclass(frozen=True)
class QueueStats:
    """One queue's time split into busy, stalled on a DMA signal, stalled on a compute signal, and idle.

    Times are ticks; the `*_cycles` properties are in the queue's own clock (ns for DMA queues).
    """

    name: str
    clock_hz: float
    ticks_per_cycle: int
    instructions: int
    busy_ticks: int
    stall_dma_ticks: int
    stall_semaphore_ticks: int
    idle_ticks: int
    utilization: float        # busy / total time
    dma_bytes: int = 0        # bytes moved (DMA queues)

    @property
    def busy_cycles(self) -> float:
        return self.busy_ticks / self.ticks_per_cycle

    @property
    def stall_dma_cycles(self) -> float:
        return self.stall_dma_ticks / self.ticks_per_cycle

    @property
    def stall_semaphore_cycles(self) -> float:
        return self.stall_semaphore_ticks / self.ticks_per_cycle

    @property
    def idle_cycles(self) -> float:
        return self.idle_ticks / self.ticks_per_cycle


@dataclass(frozen=True)
class PerfReport:
    """The counters of one replay. `queues` holds the four compute engines and the DMA queues in use.

    Roofline (isa/cost.py): the larger of TensorE time for the executed MACs at the dtype's peak rate and HBM
    time for the compulsory bytes (the INPUT, CONST and OUTPUT tensors); efficiency = roofline / modeled time.
    """

    target: str
    instructions: int
    ticks_per_second: int
    ticks_per_cycle: dict[str, int]
    total_ticks: int
    queues: dict[str, QueueStats]
    opcode_counts: dict[str, int]
    dma_bytes: dict[str, int]              # by direction, DIRECTIONS
    macs: int
    transpose_macs: int
    sbuf_high_water: int                   # bytes per partition (footprint)
    psum_high_water: int
    compulsory_bytes: int
    roofline: cost.Roofline
    timeline: Timeline = field(repr=False, compare=False)

    @property
    def total_seconds(self) -> float:
        return self.total_ticks / self.ticks_per_second

    def total_cycles(self, clock: str) -> float:
        """The modeled time in cycles of `clock` (pe, act, dve, pool; dma counts ns)."""
        return self.total_ticks / self.ticks_per_cycle[clock]

    @property
    def efficiency(self) -> float:
        """Roofline time over modeled time (0 for an empty program)."""
        return self.roofline.efficiency(self.total_seconds)

    def to_dict(self) -> dict:
        """The counters as one flat JSON-able dict, named `<engine>.<quantity>` with units."""
        out: dict = {"target": self.target, "instructions": self.instructions, "total.seconds": self.total_seconds}
        out.update({f"total.{c}_cycles": self.total_cycles(c) for c in CLOCKS[:-1]})
        out["total.ns"] = self.total_cycles("dma")
        for name, q in self.queues.items():
            out.update({f"{name}.instructions": q.instructions, f"{name}.busy_cycles": q.busy_cycles,
                        f"{name}.utilization": q.utilization, f"{name}.stall_dma_cycles": q.stall_dma_cycles,
                        f"{name}.stall_semaphore_cycles": q.stall_semaphore_cycles,
                        f"{name}.idle_cycles": q.idle_cycles})
            if name.startswith("dma"):
                out[f"{name}.bytes"] = q.dma_bytes
        out["dma.bytes"] = sum(self.dma_bytes.values())
        out.update({f"dma.{d.replace('->', '_to_')}_bytes": b for d, b in self.dma_bytes.items()})
        out.update({"pe.macs": self.macs, "pe.transpose_macs": self.transpose_macs,
                    "sbuf.high_water_bytes": self.sbuf_high_water, "psum.high_water_bytes": self.psum_high_water,
                    "roofline.compulsory_bytes": self.compulsory_bytes, "roofline.pe_seconds": self.roofline.pe_seconds,
                    "roofline.hbm_seconds": self.roofline.hbm_seconds, "roofline.seconds": self.roofline.seconds,
                    "roofline.efficiency": self.efficiency})
        out.update({f"opcode.{op}": n for op, n in self.opcode_counts.items()})
        return out

    def table(self) -> str:
        """A readable summary: totals, one row per queue, then traffic, work and the roofline."""
        us = 1e6
        lines = [f"target {self.target}: {self.instructions} instructions, {self.total_seconds * us:.3f} us "
                 f"({self.total_cycles('pe'):.0f} pe cycles)",
                 f"{'queue':<6} {'clock':>8} {'instrs':>8} {'busy cyc':>12} {'util':>7} {'stall dma':>12} "
                 f"{'stall sem':>12} {'idle':>12}"]
        for q in self.queues.values():
            lines.append(f"{q.name:<6} {q.clock_hz / 1e9:>5.2f}GHz {q.instructions:>8} {q.busy_cycles:>12.0f} "
                         f"{q.utilization:>7.1%} {q.stall_dma_cycles:>12.0f} {q.stall_semaphore_cycles:>12.0f} "
                         f"{q.idle_cycles:>12.0f}")
        lines.append("dma bytes: " + ", ".join(f"{d} {b}" for d, b in self.dma_bytes.items()))
        lines.append(f"pe macs {self.macs} (transpose {self.transpose_macs}); high water per partition: "
                     f"sbuf {self.sbuf_high_water} B, psum {self.psum_high_water} B")
        lines.append("opcodes: " + ", ".join(f"{op} {n}" for op, n in sorted(self.opcode_counts.items())))
        roofline = self.roofline
        lines.append(f"roofline {roofline.seconds * us:.3f} us (pe {roofline.pe_seconds * us:.3f} us, "
                     f"hbm {roofline.hbm_seconds * us:.3f} us for {self.compulsory_bytes} B); "
                     f"efficiency {self.efficiency:.1%}")
        return "\n".join(lines)


def simulate(program: Program, hw: HwConfig | None = None, *, verified: bool = False) -> PerfReport:
    """Replay `program` on the timeline of `hw` (default: the program's target) and count.

    The program is verified first (VerifyError otherwise) unless `verified` says it already was: the
    model assumes what the verifier guarantees (legal queues, operands, one signalling queue per
    semaphore, no deadlock).
    """
    hw = hw if hw is not None else get_target(program.target)
    if not verified:
        verify(program, hw)
    tps, tick_of = time_base(hw)
    replay = _Replay(hw, tick_of)
    instrs = program.instructions
    order = None
    with no_gc():                                # millions of small live objects: collecting would free none
        result = replay.run(instrs)
        if result is None:                       # program order lists a wait before its signal
            order = np.array(execution_order(program), dtype=np.int64)
            result = replay.run([instrs[i] for i in order])
    starts, sigs, free, stalled = result
    stall_dma, stall_sem = _stalls(instrs, stalled)
    sig = np.fromiter(sigs, dtype=np.int64, count=len(sigs))
    start = np.fromiter(starts, dtype=np.int64, count=len(starts))
    if order is not None:                        # back to program order
        sig, start = _unpermute(sig, order), _unpermute(start, order)
    timeline = _timeline(replay.signatures, tps, sig, start)
    return _report(program, hw, tps, tick_of, replay.signatures, np.bincount(sig, minlength=len(replay.signatures)),
                   max(free), stall_dma, stall_sem, timeline)


def _unpermute(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    out[order] = values
    return out


def _timeline(signatures: list[_Signature], tps: int, sig: np.ndarray, start: np.ndarray) -> Timeline:
    def column(name: str, dtype) -> np.ndarray:
        return np.array([getattr(s, name) for s in signatures], dtype=dtype)[sig] if len(sig) else \
            np.zeros(0, dtype=dtype)
    return Timeline(tps, column("queue", np.int16), start, start + column("ticks", np.int64),
                    column("sbuf_top", np.int64), column("psum_top", np.int64))


def _report(program, hw, tps, tick_of, signatures, counts, total, stall_dma, stall_sem, timeline) -> PerfReport:
    nq = len(QUEUE_NAMES)
    busy, instrs, qbytes = [0] * nq, [0] * nq, [0] * nq
    opcodes: dict[str, int] = {}
    dma_bytes = [0] * len(DIRECTIONS)
    macs = transpose_macs = sbuf_top = psum_top = 0
    peak_pe_cycles = 0.0
    for s, n in zip(signatures, counts.tolist()):
        busy[s.queue] += n * s.ticks
        instrs[s.queue] += n
        qbytes[s.queue] += n * s.dma_bytes
        opcodes[s.opcode] = opcodes.get(s.opcode, 0) + n
        if s.direction >= 0:
            dma_bytes[s.direction] += n * s.dma_bytes
        macs += n * s.macs
        transpose_macs += n * s.transpose_macs
        peak_pe_cycles += n * s.peak_pe_cycles
        sbuf_top, psum_top = max(sbuf_top, s.sbuf_top), max(psum_top, s.psum_top)
    queues = {}
    for q, name in enumerate(QUEUE_NAMES):
        if q >= FIRST_DMA_QUEUE and not instrs[q]:
            continue
        clock = "dma" if q >= FIRST_DMA_QUEUE else name
        idle = total - busy[q] - stall_dma[q] - stall_sem[q]
        queues[name] = QueueStats(name, hw.clock_hz[clock], tick_of[clock], instrs[q], busy[q], stall_dma[q],
                                  stall_sem[q], idle, busy[q] / total if total else 0.0, qbytes[q])
    compulsory = sum(t.num_bytes for t in program.tensors if t.kind in _COMPULSORY)
    return PerfReport(hw.name, len(program.instructions), tps, dict(tick_of), total, queues, opcodes,
                      dict(zip(DIRECTIONS, dma_bytes)), macs, transpose_macs, sbuf_top, psum_top, compulsory,
                      cost.Roofline.of(peak_pe_cycles, compulsory, hw), timeline)
