"""schedule: an engine or DMA queue for every tile instruction, its place in that queue, and the fewest semaphores.

Engines: a list scheduler estimates when each instruction could start (its data ready, a free slot
on its engine, durations from isa/cost.py) and gives it the allowed engine or DMA queue that
finishes it first. This spreads PSUM evacuations and elementwise work over ScalarE, VectorE and
GpSimdE and DMA over the 16 queues, so loads for later tiles run while engines compute (prefetch).
A free slot may be a gap that earlier instructions left on a queue (waiting for their data): an
instruction that is ready then goes into it ahead of them (a weight load into the gaps between a
layer norm's stores), so the output lists the instructions by estimated start, which is a valid
order (an instruction starts after everything it depends on finishes) and each queue's order.

Semaphores: instructions keep the order above within a queue. Between queues, every pair of
accesses to overlapping bytes, one a write, needs an order; the pass finds the conflicting earlier
instructions (memory tracked in buckets, entries pruned once a covering write orders them), then
drops every wait already implied by a vector clock, so each instruction waits at most once per
other queue. Semaphore q counts completions of the instructions of queue q that someone waits for.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from trnc.isa import cost
from trnc.isa.ap import Engine, Mem
from trnc.isa.config import DMA_QUEUES
from trnc.isa.races import footprint, footprints_overlap
from trnc.isa.program import Instruction
from trnc.passes.tiles import TileProgram

COMPUTE = (Engine.PE, Engine.ACT, Engine.DVE, Engine.POOL)
NQ = len(COMPUTE) + DMA_QUEUES
BUCKET = {Mem.SBUF: 512, Mem.PSUM: 2048, Mem.HBM: 1 << 16}
MAX_GAPS = 64   # gaps remembered per queue (the latest): bounds the search, and old gaps are rarely usable


def queue_index(engine: Engine, dma_queue: int = 0) -> int:
    return len(COMPUTE) + dma_queue if engine is Engine.DMA else COMPUTE.index(engine)


class _Memory:
    """Recent accesses per bucket of bytes: (footprint, instruction index) lists for reads and for writes."""

    def __init__(self):
        self.reads: dict[tuple, list] = defaultdict(list)
        self.writes: dict[tuple, list] = defaultdict(list)

    @staticmethod
    def buckets(box):
        key, _, _, b0, b1 = box[:5]
        size = BUCKET[key[0]]
        return [(key, k) for k in range(b0 // size, (b1 - 1) // size + 1)]

    def conflicts(self, box, write: bool) -> set[int]:
        _, p0, p1, b0, b1 = box[:5]
        found = set()
        tables = (self.writes, self.reads) if write else (self.writes,)
        for bucket in self.buckets(box):
            for table in tables:
                for e, index in table.get(bucket, ()):
                    if e[1] < p1 and p0 < e[2] and e[3] < b1 and b0 < e[4] and index not in found and \
                            footprints_overlap(box, e):
                        found.add(index)
        return found

    def record(self, box, write: bool, index: int):
        key, p0, p1, b0, b1, stride, _ = box
        size = BUCKET[key[0]]
        for bucket in self.buckets(box):
            lo, hi = bucket[1] * size, (bucket[1] + 1) * size
            if write and not stride:   # entries this dense write covers (in the bucket) are ordered through it
                cb0, cb1 = max(b0, lo), min(b1, hi)
                for table in (self.reads, self.writes):
                    entries = table.get(bucket)
                    if entries and len(entries) > 4:   # short lists cost less to scan than to prune
                        table[bucket] = [(e, i) for e, i in entries if not (
                            p0 <= e[1] and e[2] <= p1 and cb0 <= max(e[3], lo) and min(e[4], hi) <= cb1)]
            (self.writes if write else self.reads)[bucket].append((box, index))


class _Queue:
    """When one queue is busy: the end of its last instruction and the gaps before it (by start time)."""

    def __init__(self):
        self.free_at = 0.0
        self.gaps: list[tuple[float, float]] = []

    def slot(self, ready: float, duration: float) -> tuple[float, int]:
        """The earliest start at or after `ready` with `duration` free, and the gap it is in (-1: the end)."""
        i = bisect.bisect_left(self.gaps, (ready,)) - 1
        for g in range(max(0, i), len(self.gaps)):
            lo, hi = self.gaps[g]
            start = max(lo, ready)
            if start + duration <= hi:
                return start, g
        return max(self.free_at, ready), -1

    def take(self, start: float, end: float, gap: int) -> None:
        if gap < 0:
            if start > self.free_at:
                self.gaps.append((self.free_at, start))
                if len(self.gaps) > MAX_GAPS:
                    del self.gaps[0]
            self.free_at = end
            return
        lo, hi = self.gaps[gap]
        self.gaps[gap:gap + 1] = [g for g in ((lo, start), (end, hi)) if g[1] > g[0]]


def _dependences(program: TileProgram) -> tuple[list[Instruction], list[set[int]]]:
    """Each tile instruction as an isa Instruction on its first engine, and the earlier instructions it
    must follow: those that access a byte it accesses, one of the two writing (program order is the
    meaning of the tile program)."""
    memory = _Memory()
    firsts: list[Instruction] = []
    deps_of: list[set[int]] = []
    for index, tins in enumerate(program.instrs):
        first = tins.instruction()
        boxes = [(footprint(ap), write) for _, ap, write in first.operands()]
        deps: set[int] = set()
        for box, write in boxes:
            deps |= memory.conflicts(box, write)
        for box, write in boxes:
            memory.record(box, write, index)
        firsts.append(first)
        deps_of.append(deps)
    return firsts, deps_of


def schedule(program: TileProgram) -> tuple[list[Instruction], dict]:
    """Place the instructions in program order, each in the slot (gaps included) that finishes it first.

    (Placing them by critical path or by ready time instead was measured worse on a BERT layer: weight
    loads, ready at once, then take the queues that a kernel's stores and the next kernel's loads need.)"""
    hw = program.hw
    firsts, deps_of = _dependences(program)
    n = len(firsts)
    queues = [_Queue() for _ in range(NQ)]
    start_of, finish, queue_of = [0.0] * n, [0.0] * n, [0] * n
    built: list[Instruction] = []
    for index, (tins, first) in enumerate(zip(program.instrs, firsts)):
        ready = max((finish[d] for d in deps_of[index]), default=0.0)
        if tins.engines == (Engine.DMA,):
            candidates = [(Engine.DMA, q) for q in range(DMA_QUEUES)]
        else:
            candidates = [(e, 0) for e in tins.engines]
        durations = {e: cost.seconds(first if e is first.engine else first.replace(engine=e), hw)
                     for e in tins.engines}
        best = None
        for e, q in candidates:
            qi = queue_index(e, q)
            begin, gap = queues[qi].slot(ready, durations[e])
            key = (begin + durations[e], (q - index) % DMA_QUEUES, qi)
            if best is None or key < best[0]:
                best = (key, begin, gap, e, q)
        (end, _, qi), begin, gap, engine, q = best
        queues[qi].take(begin, end, gap)
        built.append(first if (engine, q) == (first.engine, 0) else first.replace(engine=engine, queue=q))
        start_of[index], finish[index], queue_of[index] = begin, end, qi
    order = sorted(range(len(built)), key=lambda i: (start_of[i], i))
    pos_of = [0] * len(built)
    count = [0] * NQ
    for i in order:
        pos_of[i] = count[queue_of[i]]
        count[queue_of[i]] += 1
    needs: list[dict[int, int]] = []
    for i in order:
        need: dict[int, int] = {}
        for d in deps_of[i]:
            if queue_of[d] != queue_of[i]:
                need[queue_of[d]] = max(need.get(queue_of[d], -1), pos_of[d])
        needs.append(need)
    return _synchronize([built[i] for i in order], [queue_of[i] for i in order], [pos_of[i] for i in order], needs)


def _synchronize(built, queue_of, pos_of, needs) -> tuple[list[Instruction], dict]:
    """Waits from the needed (queue, position) pairs, minus those a vector clock already implies."""
    clock = [[0] * NQ for _ in range(NQ)]   # clock[q][q2]: instructions of q2 known complete by queue q
    index_at: dict[tuple[int, int], int] = {}
    vclock: list[tuple[int, ...]] = []
    waits_of: list[list[tuple[int, int]]] = []
    for i, need in enumerate(needs):
        q = queue_of[i]
        cur = clock[q]
        todo = [(q2, j) for q2, j in need.items() if cur[q2] < j + 1]
        chosen = [(q2, j) for q2, j in todo
                  if not any(vclock[index_at[(q3, k)]][q2] >= j + 1 for q3, k in todo if (q3, k) != (q2, j))]
        for q2, j in chosen:
            other = vclock[index_at[(q2, j)]]
            for t in range(NQ):
                if other[t] > cur[t]:
                    cur[t] = other[t]
        cur[q] = pos_of[i] + 1
        index_at[(q, pos_of[i])] = i
        vclock.append(tuple(cur))
        waits_of.append(chosen)
    waited = defaultdict(set)
    for chosen in waits_of:
        for q2, j in chosen:
            waited[q2].add(j)
    rank = {q2: {j: r + 1 for r, j in enumerate(sorted(js))} for q2, js in waited.items()}
    out = []
    for i, ins in enumerate(built):
        q = queue_of[i]
        waits = tuple(sorted((q2, rank[q2][j]) for q2, j in waits_of[i]))
        signals = (q,) if pos_of[i] in waited.get(q, ()) else ()
        out.append(ins.replace(waits=waits, signals=signals) if waits or signals else ins)
    stats = {"waits": sum(len(w) for w in waits_of), "semaphores": len(waited)}
    return out, stats


@dataclass(frozen=True)
class Schedule:
    """Engines and DMA queues by an estimated list schedule; semaphores for the cross-queue orders."""

    name: str = "schedule"

    def run(self, state) -> dict:
        state.instructions, stats = schedule(state.tiles)
        return stats
