"""schedule: an engine or DMA queue for every tile instruction, and the fewest semaphores that order them.

Engines: a list scheduler estimates when each instruction could start (its data ready, its engine
free, durations from isa/cost.py) and gives it the allowed engine or DMA queue that finishes it
first. This spreads PSUM evacuations and elementwise work over ScalarE, VectorE and GpSimdE and DMA
over the 16 queues, so loads for later tiles run while engines compute (prefetch).

Semaphores: instructions keep program order within a queue. Between queues, every pair of
accesses to overlapping bytes, one a write, needs an order; the pass finds the conflicting earlier
instructions (memory tracked in buckets, entries pruned once a covering write orders them), then
drops every wait already implied by a vector clock, so each instruction waits at most once per
other queue. Semaphore q counts completions of the instructions of queue q that someone waits for.
"""
from __future__ import annotations

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


def schedule(program: TileProgram) -> tuple[list[Instruction], dict]:
    hw = program.hw
    free_at = [0.0] * NQ          # estimated time each queue is free
    finish: list[float] = []      # estimated finish of each instruction
    queue_of: list[int] = []
    pos_of: list[int] = []
    count = [0] * NQ
    memory = _Memory()
    needs: list[dict[int, int]] = []
    built: list[Instruction] = []
    for index, tins in enumerate(program.instrs):
        first = tins.instruction()
        boxes = [(footprint(ap), write) for _, ap, write in first.operands()]
        deps: set[int] = set()
        for box, write in boxes:
            deps |= memory.conflicts(box, write)
        ready = max((finish[d] for d in deps), default=0.0)
        if tins.engines == (Engine.DMA,):
            candidates = [(Engine.DMA, q) for q in range(DMA_QUEUES)]
        else:
            candidates = [(e, 0) for e in tins.engines]
        durations = {e: cost.seconds(first if e is first.engine else first.replace(engine=e), hw)
                     for e in tins.engines}
        end, _, qi, engine, q = min((max(free_at[queue_index(e, q)], ready) + durations[e],
                                     (q - index) % DMA_QUEUES, queue_index(e, q), e, q) for e, q in candidates)
        ins = first if (engine, q) == (first.engine, 0) else first.replace(engine=engine, queue=q)
        free_at[qi] = end
        finish.append(end)
        queue_of.append(qi)
        pos_of.append(count[qi])
        count[qi] += 1
        need: dict[int, int] = {}
        for d in deps:
            if queue_of[d] != qi:
                need[queue_of[d]] = max(need.get(queue_of[d], -1), pos_of[d])
        needs.append(need)
        built.append(ins)
        for box, write in boxes:
            memory.record(box, write, index)
    return _synchronize(built, queue_of, pos_of, needs)


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
