"""The ordering checks of the verifier: semaphores, the happens-before order, deadlocks and data races.

Each queue (pe, act, dve, pool, dma0..dma15) runs in program order; semaphores add the only edges
between queues. Because every semaphore is signalled from one queue, the wait (s, v) follows exactly
the v-th signalling instruction of s (spec_intro.md, "Execution and ordering"), so happens-before is
the transitive closure of a static graph: queue order plus one edge per wait. A program is valid when
that graph is acyclic and every two accesses from different queues that share a byte, one of them a
write, are ordered by it.

Complexity, for N instructions, Q queues in use and A operand accesses:
- semaphores and the graph: O(N + waits + signals), numpy over the program's sync table
  (isa/sync_table.py); a topological order costs O(N) when program order already is one (the usual case),
  else O(N log N) (Kahn's algorithm, lowest index first).
- vector clocks: O(N Q), a row maximum per edge in topological order (isa/native.py's trnc_clocks).
  HB(a, b) iff clock[b][queue(a)] > position of a in its queue. In the same pass, ranked[b][q]: the number of
  queue q's instructions before b in the topological order.
- race candidates, per memory: accesses whose byte range meets no write's (a weight only read) can race with
  nothing and are left out. For each access b and each other queue, the run of that queue's accesses that b's
  clock has not seen and that rank before b is found in O(1) (clock[b] and ranked[b], through a table of where
  each of the queue's instructions' accesses start): about the pipelining depth for a synchronized program. A run
  of at most native.SCAN_LIMIT accesses is scanned; a longer one (queues that rarely synchronize, where runs grow
  to N) is searched only in the byte buckets b covers, so reusing one buffer all program long stays linear too.
  Kept: pairs whose byte and partition ranges meet, one writing; in native code (isa/native.py's trnc_pairs,
  one call per memory, its queues shared among TRNC_THREADS threads): O(A (Q + SCAN_LIMIT)) for A accesses
  and Q queues, plus the bucketed pairs. The accesses' boxes and footprints are numpy over the program's
  operand table (isa/operand_table.py); programs the table cannot hold take a per-AP path.
- exact test, only for unordered pairs whose boxes overlap: the sorted byte addresses each access
  touches within a partition (on chip) or a tensor (HBM), intersected: O(E log E) in the elements E.
  Interleaved strided accesses have overlapping boxes but no common byte, so boxes alone would report
  false races.
Measured (2026-12-03, a 2-core EPYC VM): BERT-large at seq 512 as compiled (95k instructions, 20 queues,
234k operands, 22M pairs of accesses scanned) walks its race candidates in about 60 ms on 2 threads;
`benchmarks/bench_host.py --load-at-scale` measures the whole load path.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from trnc import flags
from trnc.isa.ap import AP, Mem
from trnc.isa.config import SEMAPHORES
from trnc.isa.operand_table import OperandTable, operand_table
from trnc.isa import native
from trnc.isa.program import Program
from trnc.isa.sync_table import SyncTable, sync_table

EXACT_LIMIT = 1 << 24     # addresses enumerated per access by the exact test; beyond it boxes decide
PARALLEL_ACCESSES = 4096  # from this many accesses in a memory, TRNC_THREADS threads walk its race candidates

Problem = tuple[int, str, str]   # (instruction index, rule id, message)


@dataclass(frozen=True)
class Ordering:
    """The happens-before order of a program whose semaphores are consistent and whose graph is acyclic."""

    queue_names: tuple[str, ...]
    queue: np.ndarray   # queue id of each instruction
    pos: np.ndarray     # position of each instruction within its queue
    rank: np.ndarray    # position of each instruction in a topological order
    clock: np.ndarray   # clock[i, q]: the number of instructions of queue q that happen before i or are i
    ranked: np.ndarray  # ranked[i, q]: the number of instructions of queue q that rank before i

    def happens_before(self, a: int, b: int) -> bool:
        """True when a chain of queue order and semaphore waits leads from instruction a to b (a != b)."""
        return a != b and int(self.clock[b, self.queue[a]]) > int(self.pos[a])


def order(program: Program) -> tuple[Ordering | None, list[Problem]]:
    """The happens-before order, or None with the semaphore and deadlock problems that prevent it."""
    sync = sync_table(program)
    n, queue = len(sync.queue), sync.queue
    members, start = sync.by_queue
    pos, prev = np.empty(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    pos[members] = np.arange(n) - np.repeat(start[:-1], np.diff(start))
    prev[members[1:]] = np.where(pos[members[1:]] > 0, members[:-1], -1)
    events, event_start, problems = _signal_events(sync)
    source, wait_problems = _wait_sources(sync, events, event_start)
    problems += wait_problems
    if problems:
        return None, problems
    waiting = sync.wait_instr
    topo = np.arange(n) if np.all(source < waiting) else _topological(prev, waiting, source)
    if len(topo) < n:
        stuck = np.ones(n, dtype=bool)
        stuck[topo] = False
        return None, [_cycle(prev, waiting, source, stuck, queue, sync.names)]
    rank = np.empty(n, dtype=np.int64)
    rank[topo] = np.arange(n)
    clock, ranked = native.clocks(topo, prev, sync.wait_first, source, queue, pos, len(sync.names))
    return Ordering(sync.names, queue, pos, rank, clock, ranked), []


def _signal_events(sync: SyncTable) -> tuple[np.ndarray, np.ndarray, list[Problem]]:
    """Every semaphore's signalling instructions in order, one entry per increment (semaphore s's are
    events[event_start[s]:event_start[s + 1]]), and the problems: a semaphore out of range, or signalled from
    a second queue (once per semaphore and queue)."""
    sem, instr = sync.signal_semaphore, sync.signal_instr
    in_range = (0 <= sem) & (sem < SEMAPHORES)
    owner = np.full(SEMAPHORES, -1, dtype=np.int64)
    first_event = np.full(SEMAPHORES, -1, dtype=np.int64)
    ok = np.flatnonzero(in_range)
    used, first = np.unique(sem[ok], return_index=True)   # the first signal of a semaphore decides its queue
    owner[used], first_event[used] = sync.queue[instr[ok][first]], instr[ok][first]
    accepted = in_range & (owner[np.where(in_range, sem, 0)] == sync.queue[instr])
    problems: list[Problem] = []
    reported: set[tuple[int, int]] = set()
    for k in np.flatnonzero(~accepted).tolist():
        i, s = int(instr[k]), int(sem[k])
        if not in_range[k]:
            problems.append((i, "semaphore", f"signals semaphore {s}; semaphores are 0..{SEMAPHORES - 1}"))
            continue
        q = int(sync.queue[i])
        if (s, q) not in reported:
            reported.add((s, q))
            msg = (f"signals semaphore {s} from {sync.names[q]}, but instruction {first_event[s]} signals it "
                   f"from {sync.names[owner[s]]}; a semaphore is signalled from one queue only")
            problems.append((i, "semaphore", msg))
    order = np.flatnonzero(accepted)
    order = order[np.argsort(sem[order], kind="stable")]
    event_start = np.zeros(SEMAPHORES + 1, dtype=np.int64)
    np.cumsum(np.bincount(sem[order], minlength=SEMAPHORES), out=event_start[1:])
    return instr[order], event_start, problems


def _wait_sources(sync: SyncTable, events: np.ndarray, event_start: np.ndarray) -> tuple[np.ndarray, list[Problem]]:
    """Per wait (s, v), the instruction it follows: the v-th signal of s; and the problems of the waits that have
    none (a semaphore out of range, a value below 1, or more than the signals of s: it would wait forever)."""
    sem, value = sync.wait_semaphore, sync.wait_value
    in_range = (0 <= sem) & (sem < SEMAPHORES)
    signals = np.diff(event_start)[np.where(in_range, sem, 0)]
    good = in_range & (value >= 1) & (value <= signals)
    source = events[np.where(good, event_start[np.where(in_range, sem, 0)] + value - 1, 0)] if len(events) else \
        np.zeros(len(sem), dtype=np.int64)
    problems: list[Problem] = []
    waiting = sync.wait_instr
    for k in np.flatnonzero(~good).tolist():
        i, s, v = int(waiting[k]), int(sem[k]), int(value[k])
        if not in_range[k]:
            problems.append((i, "semaphore", f"waits on semaphore {s}; semaphores are 0..{SEMAPHORES - 1}"))
        elif v < 1:
            problems.append((i, "semaphore", f"waits for semaphore {s} >= {v}; a wait value is at least 1"))
        else:
            msg = (f"waits for semaphore {s} >= {v}, but {signals[k]} instruction(s) signal it: "
                   "it would wait forever")
            problems.append((i, "deadlock", msg))
    return source, problems


def _topological(prev: np.ndarray, waiting: np.ndarray, source: np.ndarray) -> np.ndarray:
    """A topological order of the graph (queue order, and wait k of instruction waiting[k] after source[k]),
    lowest index first among the ready; shorter when there is a cycle."""
    n = len(prev)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i, p in zip([*waiting.tolist(), *np.flatnonzero(prev >= 0).tolist()],
                    [*source.tolist(), *prev[prev >= 0].tolist()]):
        succ[p].append(i)
        indeg[i] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    topo = []
    while ready:
        i = heapq.heappop(ready)
        topo.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    return np.array(topo, dtype=np.int64)


def _cycle(prev: np.ndarray, waiting: np.ndarray, source: np.ndarray, stuck: np.ndarray, queue: np.ndarray,
           queue_names: tuple[str, ...]) -> Problem:
    """One cycle among the instructions that can never start (`stuck`): each of them waits on another of them."""
    before: dict[int, list[int]] = {}
    for i, p in zip(waiting.tolist(), source.tolist()):
        before.setdefault(i, []).append(p)
    node, path, seen = int(np.flatnonzero(stuck)[0]), [], {}
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(p for p in [int(prev[node]), *before.get(node, ())] if p >= 0 and stuck[p])
    cycle = path[seen[node]:][::-1]
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    steps = " -> ".join(f"{i} ({queue_names[queue[i]]})" for i in [*cycle, cycle[0]])
    msg = f"instructions wait on each other in a cycle (queue order and semaphore waits): {steps}; none can start"
    return cycle[0], "deadlock", msg


# -- races --------------------------------------------------------------------------------------------

@dataclass
class _Accesses:
    """Every operand access of the checked instructions, as columns, in instruction order."""

    instr: np.ndarray
    mem: np.ndarray     # memory id: 0 SBUF, 1 PSUM, 2 HBM
    write: np.ndarray
    plo: np.ndarray     # partition range [plo, phi); HBM is one partition
    phi: np.ndarray
    blo: np.ndarray     # byte range [blo, bhi) within a partition (on chip) or of HBM, where tensors lie
                        # one after the other (tensor t from byte base[t]), so all HBM is one group
    bhi: np.ndarray
    slot: np.ndarray    # position among the instruction's operands, which names the operand in a message
    # [4, len(g)] of accesses g: the footprint's first byte (shifted as blo), end byte, row stride, width; asked
    # only of the candidates
    footprints: Callable[[np.ndarray], np.ndarray]

    def operand(self, program: Program, g: int) -> tuple[str, AP]:
        """(field name, AP) of access g; only candidate races need them."""
        name, ap, _ = list(program.instructions[self.instr[g]].operands())[self.slot[g]]
        return name, ap


def _accesses(program: Program, indices: np.ndarray) -> _Accesses:
    """The accesses of the instructions `indices` (sorted), as numpy over the rows of the program's operand table."""
    try:
        table = operand_table(program)
    except TypeError:   # an ill-formed instruction (not among `indices`) leaves the program without a table
        return _accesses_per_ap(program, indices)
    at: np.ndarray | slice = slice(None)   # every row, as views, when every instruction is checked
    if len(indices) < len(program.instructions):
        chosen = np.zeros(len(program.instructions), dtype=bool)
        chosen[indices] = True
        at = np.flatnonzero(chosen[table.instr])
    mem, tensor, start = table.mem[at], table.tensor[at], table.start[at]
    hbm = mem == Mem.HBM
    tensors = len(program.tensors)
    shift = np.where(hbm, _tensor_base(program)[np.where((0 <= tensor) & (tensor < tensors), tensor, tensors)], 0)

    def footprints(g: np.ndarray) -> np.ndarray:
        rows = footprint_table(table, g if isinstance(at, slice) else at[g])
        rows[:2] += shift[g]
        return rows
    return _Accesses(table.instr[at], mem - 1, table.write[at], np.where(hbm, 0, start),
                     np.where(hbm, 1, start + table.partitions[at]), table.byte_range[0][at] + shift,
                     table.byte_range[1][at] + shift, table.slot[at], footprints)


def _accesses_per_ap(program: Program, indices: np.ndarray) -> _Accesses:
    """_accesses for a program without an operand table: footprint() of each distinct AP."""
    rows = []
    boxes: dict[AP, tuple[int, ...]] = {}
    base = _tensor_base(program).tolist()
    for i in np.asarray(indices).tolist():
        for slot, (_, ap, write) in enumerate(program.instructions[i].operands()):
            box = boxes.get(ap)
            if box is None:
                lo, hi = ap.byte_range()
                first, end, stride, width = footprint(ap)[3:]
                if ap.mem is Mem.HBM:
                    shift = base[ap.tensor] if 0 <= ap.tensor < len(program.tensors) else base[-1]
                    box = (2, 0, 1, lo + shift, hi + shift)
                else:
                    shift = 0
                    box = (int(ap.mem is Mem.PSUM), *ap.partition_range(), lo, hi)
                box = boxes[ap] = (*box, first + shift, end + shift, stride, width)
            rows.append((i, write, slot, *box))
    cols = np.array(rows, dtype=np.int64).reshape(-1, 12).T
    return _Accesses(cols[0], cols[3], cols[1].astype(bool), cols[4], cols[5], cols[6], cols[7], cols[2],
                     lambda g: cols[8:, g])


def _tensor_base(program: Program) -> np.ndarray:
    """Where each HBM tensor starts when all lie one after the other with a byte between; then the end."""
    sizes = np.array([t.num_bytes + 1 for t in program.tensors], dtype=np.int64)
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])


@dataclass(frozen=True)
class Candidates:
    """The accesses of some instructions and their race candidates: pairs (a, b) of access ids (_candidates)."""

    acc: _Accesses
    pairs: list[tuple[int, int]]


def candidates(program: Program, ordering: Ordering, indices: np.ndarray) -> Candidates:
    """The race candidates among the instructions `indices` (sorted)."""
    acc = _accesses(program, indices)
    pairs = list(_candidates(acc, ordering, ordering.queue[acc.instr])) if acc.instr.size else []
    return Candidates(acc, pairs)


def find_races(program: Program, ordering: Ordering, found_candidates: Candidates,
               describe: Callable[[int], str]) -> list[Problem]:
    """A `race` problem per pair of instructions (among the candidates' instructions) on different queues that
    share a byte, one writing it, with no happens-before chain between them; reported at the later one in
    topological order."""
    acc = found_candidates.acc
    found: dict[tuple[int, int], Problem] = {}
    exact = _ExactTest(program, acc)
    for ga, gb in found_candidates.pairs:
        pair = (int(acc.instr[ga]), int(acc.instr[gb]))
        if pair not in found:
            problem = exact.race(program, ordering, ga, gb, describe)
            if problem is not None:
                found[pair] = problem
    return list(found.values())


def _candidates(acc: _Accesses, ordering: Ordering, queue: np.ndarray) -> Iterator[tuple[int, int]]:
    """Pairs (a, b) of access ids on different queues, a ranked before b and not happening before it, whose
    footprints meet and one of which writes; per memory, in the order of a's access, then b's.

    isa/native.py's trnc_pairs finds a superset: for each access b, the a's of another queue that b's clock has
    not seen and that rank before b, kept when the byte and partition ranges meet (a long run searched only in the
    byte buckets b covers). So neither a long unsynchronized stretch nor the reuse of one buffer over time makes
    the work quadratic; the footprints' rows then drop column tiles of one matrix.
    """
    # by memory, then queue, then queue order: the accesses are in instruction order, which a stable sort keeps
    # (a radix sort when the keys fit 16 bits)
    key = acc.mem * (int(queue.max()) + 1) + queue
    by = np.argsort(key.astype(np.int16) if key.max() < 2**15 else key, kind="stable")
    for part in np.split(by, np.flatnonzero(np.diff(acc.mem[by])) + 1):
        if acc.mem[part[0]] == Mem.HBM - 1:   # a weight only ever read (on chip, every buffer is written)
            part = part[_meets_a_write(acc.blo[part], acc.bhi[part], acc.write[part])]
        if not len(part):
            continue
        group = queue[part]
        cuts = np.flatnonzero(np.r_[True, group[1:] != group[:-1], True])
        columns = {"writes": np.logical_or.reduceat(acc.write[part], cuts[:-1]), "instr": acc.instr[part],
                   "pos": ordering.pos[acc.instr[part]], "blo": acc.blo[part], "bhi": acc.bhi[part],
                   "plo": acc.plo[part], "phi": acc.phi[part], "write": acc.write[part]}
        ia, ib = native.race_pairs(cuts, group[cuts[:-1]], columns, ordering.clock, ordering.ranked,
                                   np.bincount(ordering.queue, minlength=len(ordering.queue_names)),
                                   threads=flags.get("TRNC_THREADS") if len(part) >= PARALLEL_ACCESSES else 1)
        ga, gb = part[ia], part[ib]
        both = np.concatenate([ga, gb])
        where = native.row_ids(both[:, None])
        candidates = both[native.first_appearances(where)]
        rows = acc.footprints(candidates)
        meet = footprint_columns(rows[:, where[:len(ga)]], rows[:, where[len(ga):]])   # e.g. column tiles of a matrix
        ga, gb = ga[meet], gb[meet]
        by = np.lexsort((gb, ga))   # in access order, whatever order the walk found them in
        yield from zip(ga[by].tolist(), gb[by].tolist(), strict=True)


def _meets_a_write(blo: np.ndarray, bhi: np.ndarray, write: np.ndarray) -> np.ndarray:
    """Per access of one memory, whether its byte range meets that of a writing access (in any partitions): those
    that do not (a weight tensor only ever read) can race with nothing, and leave the walk."""
    order = np.argsort(blo[write], kind="stable")
    starts, reach = blo[write][order], np.maximum.accumulate(bhi[write][order])
    before = np.searchsorted(starts, bhi)   # the writes starting before the access ends
    return (before > 0) & (reach[np.maximum(before - 1, 0)] > blo) if len(starts) else np.zeros(len(blo), bool)


def byte_addresses(ap: AP) -> np.ndarray | None:
    """Sorted distinct byte addresses the AP touches in each of its partitions (on chip) or in its tensor (HBM);
    None when there are more than EXACT_LIMIT of them to enumerate."""
    dims = [(s, c) for s, c in ap.dims if s != 0 and c > 1]
    if ap.mem is Mem.HBM and ap.partition_stride != 0 and ap.partitions > 1:
        dims.append((ap.partition_stride, ap.partitions))
    elems = np.zeros(1, dtype=np.int64)
    for stride, count in dims:
        if elems.size * count > EXACT_LIMIT:
            return None
        elems = np.unique((elems[:, None] + np.arange(count, dtype=np.int64) * stride).reshape(-1))
    isz = ap.dtype.itemsize
    return ((ap.offset + elems * isz)[:, None] + np.arange(isz, dtype=np.int64)).reshape(-1)


def operand_overlap(ins) -> Iterator[tuple[str, str]]:
    """Rule `overlap`: a written operand may coincide exactly with another operand (in place) but not overlap it
    partially, since an instruction reads all operands before writing (spec_intro.md); a partial overlap would
    make the result depend on the order in which an implementation visits the elements."""
    operands = list(ins.operands())
    for i, (name_w, w, write) in enumerate(operands):
        if not write:
            continue
        for j, (name_o, o, _) in enumerate(operands):
            if j == i or (j < i and operands[j][2]) or o == w or not _may_share(w, o):
                continue
            a, b = byte_addresses(w), byte_addresses(o)
            if a is None or b is None or np.intersect1d(a, b).size:
                yield "overlap", (f"{name_w} partially overlaps {name_o}; a written operand must be disjoint from "
                                  f"every other operand or identical to it (in place)")


def _may_share(a: AP, b: AP) -> bool:
    if a.mem is not b.mem or (a.mem is Mem.HBM and a.tensor != b.tensor):
        return False
    if a.mem is not Mem.HBM:
        (pa, qa), (pb, qb) = a.partition_range(), b.partition_range()
        if qa <= pb or qb <= pa:
            return False
    (la, ha), (lb, hb) = a.byte_range(), b.byte_range()
    return la < hb and lb < ha


# -- row footprints: a cheap superset of the bytes of an access --------------------------------------------

def _rows(offset: int, stride: int, count: int, width: int) -> tuple[int, int, int, int]:
    """(first byte, end byte, row stride, row width); stride 0 when the rows touch or overlap (dense)."""
    if count > 1 and stride >= width:
        return offset, offset + (count - 1) * stride + width, stride, width
    lo = min(offset, offset + (count - 1) * stride)
    return lo, max(offset, offset + (count - 1) * stride) + width, 0, 0


def footprint(ap: AP) -> tuple:
    """(memory key, first partition, end partition, first byte, end byte, row stride, row width).

    The bytes are rows base + i * stride + [0, width) when the access is a set of disjoint rows (the dim
    of largest stride of an HBM access; the outer free dim of an on-chip one), else one dense range.
    Rows keep column tiles of one matrix apart (stores of different columns of the same rows do not
    conflict) at the cost of a few integer operations; passes/tile/schedule.py orders instructions by them.
    """
    isz = ap.dtype.itemsize
    if ap.mem is Mem.HBM:
        return ((Mem.HBM, ap.tensor), 0, 1, *_hbm_rows(ap, isz))
    p0, p1 = ap.start_partition, ap.start_partition + ap.partitions
    if len(ap.dims) > 1 and ap.dims[0][0] > 0:
        (outer_stride, outer_count), inner = ap.dims[0], ap.dims[1:]
        lo = sum(min(0, st * (c - 1)) for st, c in inner)
        hi = sum(max(0, st * (c - 1)) for st, c in inner)
        return ((ap.mem,), p0, p1, *_rows(ap.offset + lo * isz, outer_stride * isz, outer_count, (hi - lo + 1) * isz))
    return ((ap.mem,), p0, p1, *ap.byte_range(), 0, 0)


def _row_range(s: int, w: int, n: int, lo: int, hi: int) -> bool:
    """Whether some row i < n of [i*s, i*s + w) meets [lo, hi)."""
    i_min = max(0, (lo - w) // s + 1)
    i_max = min(n - 1, -((-hi) // s) - 1)
    return i_min <= i_max


def _hbm_rows(ap: AP, isz: int) -> tuple[int, int, int, int]:
    """The rows of an HBM access along its dim of largest stride (the partitions, or a free dim when the
    access is transposed: a feature-on-partition store of a token-major matrix is rows of tokens, each
    as wide as its features, so stores of other features do not meet it), the other dims their width."""
    dims = [(s, c) for s, c in ((ap.partition_stride, ap.partitions), *ap.dims) if c > 1 and s != 0]
    if not dims:
        return (*ap.byte_range(), 0, 0)
    row = max(range(len(dims)), key=lambda d: abs(dims[d][0]))
    stride, count = dims.pop(row)
    lo = sum(min(0, s * (c - 1)) for s, c in dims)
    hi = sum(max(0, s * (c - 1)) for s, c in dims)
    first = ap.offset + (lo + min(0, stride * (count - 1))) * isz
    return _rows(first, abs(stride) * isz, count, (hi - lo + 1) * isz)


def footprint_table(table: OperandTable, at: np.ndarray) -> np.ndarray:
    """footprint(ap)[3:] of the table's rows `at` as [4, rows] columns (first byte, end byte, row stride, row
    width): the same rows, chosen by the same rules, computed over all rows at once."""
    isz, offset, strides, counts = table.itemsize[at], table.offset[at], table.strides[at], table.counts[at]
    lo, hi = table.byte_range[0][at], table.byte_range[1][at]
    zero = np.zeros_like(lo)
    # on chip: rows along the outer free dim when there are several and its stride is positive
    inner = strides[:, 1:] * (counts[:, 1:] - 1)
    in_lo, in_hi = np.minimum(inner, 0).sum(axis=1), np.maximum(inner, 0).sum(axis=1)
    chip = _rows_columns(offset + in_lo * isz, strides[:, 0] * isz, counts[:, 0], (in_hi - in_lo + 1) * isz)
    chip_rows = (table.ndims[at] > 1) & (strides[:, 0] > 0)
    # HBM: rows along the first dim of largest |stride| among the partitions then the free dims that move
    s = np.column_stack([table.pstride[at], strides])
    c = np.column_stack([table.partitions[at], counts])
    moves = (c > 1) & (s != 0)
    row = np.argmax(np.where(moves, np.abs(s), -1), axis=1)[:, None]   # argmax keeps the first, as max does
    reach = s * (c - 1)   # 0 for the dims that do not move
    row_reach = np.take_along_axis(reach, row, axis=1)[:, 0]
    out_lo = np.minimum(reach, 0).sum(axis=1) - np.minimum(row_reach, 0)
    out_hi = np.maximum(reach, 0).sum(axis=1) - np.maximum(row_reach, 0)
    hbm = _rows_columns(offset + (out_lo + np.minimum(row_reach, 0)) * isz,
                        np.abs(np.take_along_axis(s, row, axis=1)[:, 0]) * isz,
                        np.take_along_axis(c, row, axis=1)[:, 0], (out_hi - out_lo + 1) * isz)
    on_hbm = table.mem[at] == Mem.HBM
    return np.where(on_hbm & moves.any(axis=1), hbm,
                    np.where(~on_hbm & chip_rows, chip, np.stack([lo, hi, zero, zero])))


def _rows_columns(offset: np.ndarray, stride: np.ndarray, count: np.ndarray, width: np.ndarray) -> np.ndarray:
    """_rows over columns, as [4, n]."""
    far = offset + (count - 1) * stride
    apart = (count > 1) & (stride >= width)
    zero = np.zeros_like(offset)
    return np.where(apart, np.stack([offset, far + width, stride, width]),
                    np.stack([np.minimum(offset, far), np.maximum(offset, far) + width, zero, zero]))


def footprints_overlap(a, b) -> bool:
    """Whether two footprints share a byte (their boxes already intersect)."""
    _, _, _, a0, a1, sa, wa = a
    _, _, _, b0, b1, sb, wb = b
    if not sa and not sb:
        return True
    if not sb:
        return _row_range(sa, wa, (a1 - a0 - wa) // sa + 1, b0 - a0, b1 - a0)
    if not sa:
        return _row_range(sb, wb, (b1 - b0 - wb) // sb + 1, a0 - b0, a1 - b0)
    if sa != sb:
        return True
    d, na, nb = b0 - a0, (a1 - a0 - wa) // sa + 1, (b1 - b0 - wb) // sb + 1
    k_min = max(-(nb - 1), (d - wa) // sa + 1)
    k_max = min(na - 1, -((-(d + wb)) // sa) - 1)
    return k_min <= k_max


def footprint_columns(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """footprints_overlap over columns: a and b are [4, n] arrays of (first byte, end byte, row stride, row width)
    of footprints whose boxes intersect (the verifier's race candidates; tests hold it to footprints_overlap)."""
    a0, a1, sa, wa = a
    b0, b1, sb, wb = b
    one_a, one_b = np.maximum(sa, 1), np.maximum(sb, 1)   # strides where they divide (unused where 0)
    na, nb = (a1 - a0 - wa) // one_a + 1, (b1 - b0 - wb) // one_b + 1

    def some_row_meets(s, w, n, lo, hi):
        return np.maximum(0, (lo - w) // s + 1) <= np.minimum(n - 1, -((-hi) // s) - 1)

    d = b0 - a0
    same_rows = np.maximum(-(nb - 1), (d - wa) // one_a + 1) <= np.minimum(na - 1, -((-(d + wb)) // one_a) - 1)
    return np.where((sa == 0) & (sb == 0), True,
                    np.where(sb == 0, some_row_meets(one_a, wa, na, b0 - a0, b1 - a0),
                             np.where(sa == 0, some_row_meets(one_b, wb, nb, a0 - b0, a1 - b0),
                                      (sa != sb) | same_rows)))


class _ExactTest:
    """The exact overlap test of two accesses, caching the byte addresses of each AP (loops reuse them)."""

    def __init__(self, program: Program, acc: _Accesses):
        self.program, self.acc = program, acc
        self.cache: dict[AP, np.ndarray | None] = {}

    def _bytes(self, g: int) -> np.ndarray | None:
        ap = self.acc.operand(self.program, g)[1]
        if ap not in self.cache:
            self.cache[ap] = byte_addresses(ap)
        return self.cache[ap]

    def race(self, program: Program, ordering: Ordering, ga: int, gb: int, describe) -> Problem | None:
        bytes_a, bytes_b = self._bytes(ga), self._bytes(gb)
        if bytes_a is None or bytes_b is None:
            lo, hi = max(self.acc.blo[ga], self.acc.blo[gb]), min(self.acc.bhi[ga], self.acc.bhi[gb])
            where = f"bytes [{lo}, {hi}) (too many addresses for the exact test; their ranges overlap)"
        else:
            common = np.intersect1d(bytes_a, bytes_b, assume_unique=True)
            if not common.size:
                return None
            where = f"bytes [{common[0]}, {common[-1] + 1}) ({common.size} in common)"
        a, b = int(self.acc.instr[ga]), int(self.acc.instr[gb])
        (name_a, ap_a), (name_b, ap_b) = self.acc.operand(program, ga), self.acc.operand(program, gb)
        if ap_a.mem is Mem.HBM:
            memory = f"hbm tensor '{program.tensors[ap_a.tensor].name}' {where}"
        else:
            plo = max(ap_a.start_partition, ap_b.start_partition)
            phi = min(ap_a.partition_range()[1], ap_b.partition_range()[1])
            memory = f"{ap_a.mem.text} partitions [{plo}, {phi}) {where}"
        verb = {True: "writes", False: "reads"}
        qa, qb = (ordering.queue_names[ordering.queue[x]] for x in (a, b))
        msg = (f"{name_b} on {qb} {verb[bool(self.acc.write[gb])]} {memory}, which {name_a} of instruction {a} "
               f"on {qa} {verb[bool(self.acc.write[ga])]}, and no semaphore chain orders the two instructions"
               f"\n    {a}: {describe(a)}")
        return b, "race", msg
