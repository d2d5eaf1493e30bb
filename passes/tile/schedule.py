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
accesses to overlapping bytes, one a write, needs an order; the pass finds the latest conflicting earlier
instruction of each queue (memory tracked in buckets, entries pruned once a covering write orders them), then
drops every wait already implied by a vector clock, so each instruction waits at most once per
other queue. Semaphore q counts completions of the instructions of queue q that someone waits for.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from trnc.isa import cost
from trnc.isa.ap import QUEUES, Engine, Mem, queue_index
from trnc.isa.config import DMA_QUEUES
from trnc.isa.decoding import no_gc
from trnc.isa.races import footprint, footprints_overlap
from trnc.isa.program import Instruction
from trnc.passes.tile.tiles import TileProgram

FIRST_DMA = queue_index(Engine.DMA)
NQ = len(QUEUES)
BUCKET = {Mem.SBUF: 512, Mem.PSUM: 2048, Mem.HBM: 1 << 16}
MAX_GAPS = 64   # gaps remembered per queue (the latest): bounds the search, and old gaps are rarely usable


class _Memory:
    """Recent accesses per bucket of bytes, for reads and for writes: per partition range, then per queue,
    (start, index, footprint) entries sorted by start (the queue's order).

    The schedule needs, of the earlier instructions that conflict with an access, only the latest on each
    queue (its semaphore position, and, since a queue runs one instruction at a time, its finish is the
    queue's latest): so a scan walks each queue's entries from the latest and stops at the first conflict
    or at an entry no later than the best already found, instead of testing every entry. Grouping by
    partition range lets a scan, and the pruning by a write to a few partitions, skip the others at once."""

    def __init__(self):
        self.tables: tuple[dict, dict] = ({}, {})   # reads, writes: bucket -> (p0, p1) -> queue -> entries
        self.sizes: tuple[dict, dict] = ({}, {})    # reads, writes: bucket -> number of entries
        self.high = 0   # the highest end partition recorded

    def latest_conflicts(self, box, write: bool, latest: dict[int, tuple[float, int]]) -> None:
        """Raise latest[q] to the (start, index) of the last instruction of queue q whose access conflicts."""
        key, p0, p1, b0, b1 = box[:5]
        size = BUCKET[key[0]]
        tables = self.tables if write else self.tables[1:]
        for k in range(b0 // size, (b1 - 1) // size + 1):
            bucket = (key, k)
            for table in tables:
                groups = table.get(bucket)
                if not groups:
                    continue
                for (e0, e1), per_queue in groups.items():
                    if not (e0 < p1 and p0 < e1):
                        continue
                    for q, entries in per_queue.items():
                        best = latest.get(q)
                        for j in range(len(entries) - 1, -1, -1):
                            start, index, e = entries[j]
                            if best is not None and (start, index) <= best:
                                break
                            if e[3] < b1 and b0 < e[4] and footprints_overlap(box, e):
                                latest[q] = (start, index)
                                break

    def record(self, box, write: bool, entry: tuple[float, int, tuple], queue: int) -> None:
        key, p0, p1, b0, b1, stride, _ = box
        size = BUCKET[key[0]]
        self.high = max(self.high, p1)
        for k in range(b0 // size, (b1 - 1) // size + 1):
            bucket = (key, k)
            if write and not stride:   # entries this dense write covers (in the bucket) are ordered through it
                self._prune(bucket, p0, p1, max(b0, k * size), min(b1, (k + 1) * size), k * size, (k + 1) * size)
            sizes = self.sizes[write]
            sizes[bucket] = sizes.get(bucket, 0) + 1
            entries = self.tables[write].setdefault(bucket, {}).setdefault((p0, p1), {}).setdefault(queue, [])
            if not entries or entries[-1][:2] < entry[:2]:
                entries.append(entry)
            else:                      # placed in a gap, before later-placed instructions of its queue
                bisect.insort(entries, entry, key=lambda x: x[:2])

    def _prune(self, bucket, p0: int, p1: int, cb0: int, cb1: int, lo: int, hi: int) -> None:
        """Drop the entries of the bucket whose partitions lie in [p0, p1) and whose bytes within the bucket,
        [lo, hi), lie in [cb0, cb1): a write there covers them."""
        whole = cb0 == lo and cb1 == hi
        for table, sizes in zip(self.tables, self.sizes):
            groups = table.get(bucket)
            if not groups or sizes[bucket] <= 4:   # short lists cost less to scan than to prune
                continue
            if whole and p0 == 0 and p1 >= self.high:   # all of them (a whole tile rewritten)
                del table[bucket]
                sizes[bucket] = 0
                continue
            for (e0, e1), per_queue in list(groups.items()):
                if not (p0 <= e0 and e1 <= p1):
                    continue
                for q, entries in list(per_queue.items()):
                    kept = [] if whole else [
                        x for x in entries if not (cb0 <= max(x[2][3], lo) and min(x[2][4], hi) <= cb1)]
                    sizes[bucket] -= len(entries) - len(kept)
                    if kept:
                        per_queue[q] = kept
                    else:
                        del per_queue[q]
                if not per_queue:
                    del groups[(e0, e1)]


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


def schedule(program: TileProgram) -> tuple[list[Instruction], dict]:
    """Place the instructions in program order, each in the slot (gaps included) that finishes it first.

    An instruction must follow the earlier ones that access a byte it accesses, one of the two writing
    (program order is the meaning of the tile program); it becomes ready when the latest of them, on every
    queue, finishes. (Placing by critical path or by ready time instead was measured worse on a BERT layer:
    weight loads, ready at once, then take the queues that a kernel's stores and the next kernel's loads need.)"""
    with no_gc():   # hundreds of thousands of small live tuples: collecting would free none
        return _schedule(program)


def _schedule(program: TileProgram) -> tuple[list[Instruction], dict]:
    hw = program.hw
    n = len(program.instrs)
    memory = _Memory()
    footprints: dict = {}   # AP -> footprint: equal APs recur (loop bodies, HBM views)
    queues = [_Queue() for _ in range(NQ)]
    start_of, finish, queue_of = [0.0] * n, [0.0] * n, [0] * n
    latest_of: list[dict[int, tuple[float, int]]] = []
    built: list[Instruction] = []
    for index, tins in enumerate(program.instrs):
        first = tins.instruction()
        boxes = []
        for _, ap, write in first.operands():
            box = footprints.get(ap)
            if box is None:
                box = footprints[ap] = footprint(ap)
            boxes.append((box, write))
        latest: dict[int, tuple[float, int]] = {}
        for box, write in boxes:
            memory.latest_conflicts(box, write, latest)
        ready = max((finish[i] for _, i in latest.values()), default=0.0)
        if tins.engines == (Engine.DMA,):
            # The queues in their tie-break order ((q - index) % DMA_QUEUES): the first that can start the
            # instruction when it is ready finishes it first, and no later queue can beat it.
            duration = cost.seconds(first, hw)
            best = None
            for t in range(DMA_QUEUES):
                q = (index + t) % DMA_QUEUES
                begin, gap = queues[FIRST_DMA + q].slot(ready, duration)
                if best is None or begin + duration < best[0]:
                    best = (begin + duration, begin, gap, q)
                if begin == ready:
                    break
            end, begin, gap, q = best
            qi = FIRST_DMA + q
            placed = first if q == 0 else first.replace(queue=q)
        else:
            best = None
            for e in tins.engines:
                on = first if e is first.engine else first.replace(engine=e)
                duration = cost.seconds(on, hw)
                qi = queue_index(e)
                begin, gap = queues[qi].slot(ready, duration)
                if best is None or (begin + duration, qi) < best[:2]:
                    best = (begin + duration, qi, begin, gap, on)
            end, qi, begin, gap, placed = best
        queues[qi].take(begin, end, gap)
        built.append(placed)
        start_of[index], finish[index], queue_of[index] = begin, end, qi
        latest_of.append(latest)
        for box, write in boxes:
            memory.record(box, write, (begin, index, box), qi)
    order = sorted(range(len(built)), key=lambda i: (start_of[i], i))
    pos_of = [0] * len(built)
    count = [0] * NQ
    for i in order:
        pos_of[i] = count[queue_of[i]]
        count[queue_of[i]] += 1
    needs = [{q: pos_of[d] for q, (_, d) in latest_of[i].items() if q != queue_of[i]} for i in order]
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
