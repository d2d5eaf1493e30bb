"""The ordering checks of the verifier: semaphores, the happens-before order, deadlocks and data races.

Each queue (pe, act, dve, pool, dma0..dma15) runs in program order; semaphores add the only edges
between queues. Because every semaphore is signalled from one queue, the wait (s, v) follows exactly
the v-th signalling instruction of s (spec_intro.md, "Execution and ordering"), so happens-before is
the transitive closure of a static graph: queue order plus one edge per wait. A program is valid when
that graph is acyclic and every two accesses from different queues that share a byte, one of them a
write, are ordered by it.

Complexity, for N instructions, Q queues in use and A operand accesses:
- semaphores and the graph: O(N + waits + signals); a topological order costs O(N) when program order
  already is one (the usual case), else O(N log N) (Kahn's algorithm, lowest index first).
- vector clocks: O(N Q), one numpy row maximum per edge, in topological order.
  HB(a, b) iff clock[b][queue(a)] > position of a in its queue.
- race candidates, per memory and pair of queues: every pair that can race is found by two enumerations,
  each a set of contiguous runs located by binary search in O(A log A): in time, for each access b the
  accesses of the other queue that b's clock has not seen and that rank before b (W pairs: about N times
  the pipelining depth for a synchronized program, N^2 for queues that never synchronize); in space, a
  sweep over byte ranges sorted by start, pairing each access with those starting inside it (K pairs:
  small for disjoint buffers, N^2 for one buffer reused all program long, as allocated programs do).
  Both sizes are counted first and only the smaller is expanded and filtered by bounding box and
  happens-before with numpy: O(A log A + min(W, K)).
- exact test, only for unordered pairs whose boxes overlap: the sorted byte addresses each access
  touches within a partition (on chip) or a tensor (HBM), intersected: O(E log E) in the elements E.
  Interleaved strided accesses have overlapping boxes but no common byte, so boxes alone would report
  false races.
Measured: a 4-queue pipeline of 100k instructions verifies in about 3 s, two never-synchronized queues of
20k instructions in about 1 s.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from trnc.isa.ap import AP, Mem
from trnc.isa.config import SEMAPHORES
from trnc.isa.program import Program

EXACT_LIMIT = 1 << 24     # addresses enumerated per access by the exact test; beyond it boxes decide
PAIR_CHUNK = 1 << 20      # candidate pairs expanded at once (bounds the memory of the sweep)

Problem = tuple[int, str, str]   # (instruction index, rule id, message)


@dataclass(frozen=True)
class Ordering:
    """The happens-before order of a program whose semaphores are consistent and whose graph is acyclic."""

    queue_names: tuple[str, ...]
    queue: np.ndarray   # queue id of each instruction
    pos: np.ndarray     # position of each instruction within its queue
    rank: np.ndarray    # position of each instruction in a topological order
    clock: np.ndarray   # clock[i, q]: the number of instructions of queue q that happen before i or are i

    def happens_before(self, a: int, b: int) -> bool:
        """True when a chain of queue order and semaphore waits leads from instruction a to b (a != b)."""
        return a != b and int(self.clock[b, self.queue[a]]) > int(self.pos[a])


def order(program: Program) -> tuple[Ordering | None, list[Problem]]:
    """The happens-before order, or None with the semaphore and deadlock problems that prevent it."""
    instrs = program.instructions
    n = len(instrs)
    names: dict[str, int] = {}
    queue = np.empty(n, dtype=np.int64)
    pos = np.empty(n, dtype=np.int64)
    prev = [-1] * n
    last: list[int] = []
    for i, ins in enumerate(instrs):
        q = names.setdefault(ins.queue_name, len(names))
        if q == len(last):
            last.append(-1)
        queue[i], prev[i], last[q] = q, last[q], i
        pos[i] = pos[prev[i]] + 1 if prev[i] >= 0 else 0
    queue_names = tuple(names)
    events, problems = _signal_events(program, queue, queue_names)
    waits: list[list[int]] = [[] for _ in range(n)]
    for i, ins in enumerate(instrs):
        for s, v in ins.waits:
            if not 0 <= s < SEMAPHORES:
                problems.append((i, "semaphore", f"waits on semaphore {s}; semaphores are 0..{SEMAPHORES - 1}"))
            elif v < 1:
                problems.append((i, "semaphore", f"waits for semaphore {s} >= {v}; a wait value is at least 1"))
            elif v > len(events.get(s, ())):
                msg = (f"waits for semaphore {s} >= {v}, but {len(events.get(s, ()))} instruction(s) signal it: "
                       "it would wait forever")
                problems.append((i, "deadlock", msg))
            else:
                waits[i].append(events[s][v - 1])
    if problems:
        return None, problems
    topo = _topological(prev, waits)
    if len(topo) < n:
        return None, [_cycle(prev, waits, set(range(n)) - set(topo), queue, queue_names)]
    clock = np.zeros((n, len(queue_names)), dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    for r, i in enumerate(topo):
        rank[i] = r
        row = clock[i]
        if prev[i] >= 0:
            row[:] = clock[prev[i]]
        for p in waits[i]:
            np.maximum(row, clock[p], out=row)
        row[queue[i]] = pos[i] + 1
    return Ordering(queue_names, queue, pos, rank, clock), []


def _signal_events(program: Program, queue: np.ndarray, queue_names: tuple[str, ...]):
    """Per semaphore, its signalling instructions in order (one entry per increment), and the problems."""
    events: dict[int, list[int]] = {}
    owner: dict[int, int] = {}
    problems: list[Problem] = []
    reported: set[tuple[int, int]] = set()
    for i, ins in enumerate(program.instructions):
        for s in ins.signals:
            if not 0 <= s < SEMAPHORES:
                problems.append((i, "semaphore", f"signals semaphore {s}; semaphores are 0..{SEMAPHORES - 1}"))
                continue
            q = int(queue[i])
            first = owner.setdefault(s, q)
            if first != q:
                if (s, q) not in reported:
                    reported.add((s, q))
                    msg = (f"signals semaphore {s} from {queue_names[q]}, but instruction {events[s][0]} signals it "
                           f"from {queue_names[first]}; a semaphore is signalled from one queue only")
                    problems.append((i, "semaphore", msg))
                continue
            events.setdefault(s, []).append(i)
    return events, problems


def _topological(prev: list[int], waits: list[list[int]]) -> list[int]:
    """A topological order of the graph, lowest index first among the ready; shorter when there is a cycle."""
    n = len(prev)
    if all(p < i for i in range(n) for p in waits[i]):
        return list(range(n))
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i in range(n):
        for p in ([prev[i]] if prev[i] >= 0 else []) + waits[i]:
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
    return topo


def _cycle(prev, waits, stuck: set[int], queue, queue_names) -> Problem:
    """One cycle among the instructions that can never start: each of them waits on another of them."""
    node, path, seen = min(stuck), [], {}
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(p for p in [prev[node], *waits[node]] if p in stuck)
    cycle = path[seen[node]:][::-1]
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    steps = " -> ".join(f"{i} ({queue_names[queue[i]]})" for i in [*cycle, cycle[0]])
    msg = f"instructions wait on each other in a cycle (queue order and semaphore waits): {steps}; none can start"
    return cycle[0], "deadlock", msg


# -- races --------------------------------------------------------------------------------------------

@dataclass
class _Accesses:
    """Every operand access of the checked instructions, as columns."""

    instr: np.ndarray
    mem: np.ndarray     # memory id: 0 SBUF, 1 PSUM, 2 HBM
    write: np.ndarray
    plo: np.ndarray     # partition range [plo, phi); HBM is one partition
    phi: np.ndarray
    blo: np.ndarray     # byte range [blo, bhi) within a partition (on chip) or of HBM, where tensors lie
                        # one after the other (tensor t from byte base[t]), so all HBM is one group
    bhi: np.ndarray
    rows: np.ndarray    # [4, accesses]: the footprint's first byte (shifted as blo), end byte, row stride, width
    operands: list[tuple[str, AP]]


def _accesses(program: Program, indices: list[int]) -> _Accesses:
    rows, operands = [], []
    boxes: dict[AP, tuple[int, ...]] = {}
    base = np.concatenate([[0], np.cumsum([t.num_bytes + 1 for t in program.tensors])]).tolist()
    for i in indices:
        for name, ap, write in program.instructions[i].operands():
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
            rows.append((i, write, *box))
            operands.append((name, ap))
    cols = np.array(rows, dtype=np.int64).reshape(-1, 11).T
    return _Accesses(cols[0], cols[2], cols[1].astype(bool), cols[3], cols[4], cols[5], cols[6], cols[7:], operands)


def find_races(program: Program, ordering: Ordering, indices: list[int],
               describe: Callable[[int], str]) -> list[Problem]:
    """A `race` problem per pair of instructions (among `indices`) on different queues that share a byte,
    one writing it, with no happens-before chain between them; reported at the later one in topological order."""
    acc = _accesses(program, indices)
    if not acc.instr.size:
        return []
    queue = ordering.queue[acc.instr]
    by = np.lexsort((acc.instr, queue, acc.mem))
    groups: dict[int, dict[int, np.ndarray]] = {}
    keys = np.stack([acc.mem[by], queue[by]], axis=1)
    cuts = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
    for part in np.split(by, cuts):
        groups.setdefault(int(acc.mem[part[0]]), {})[int(queue[part[0]])] = part
    found: dict[tuple[int, int], Problem] = {}
    exact = _ExactTest(acc)
    for per_queue in groups.values():
        writes = {q for q, ids in per_queue.items() if acc.write[ids].any()}
        for qa, a_ids in per_queue.items():
            for qb, b_ids in per_queue.items():
                if qa != qb and (qa in writes or qb in writes):   # reads alone never race
                    for ga, gb in _candidates(acc, ordering, qa, a_ids, b_ids):
                        pair = (int(acc.instr[ga]), int(acc.instr[gb]))
                        if pair not in found:
                            problem = exact.race(program, ordering, ga, gb, describe)
                            if problem is not None:
                                found[pair] = problem
    return list(found.values())


def _candidates(acc: _Accesses, ordering: Ordering, qa: int, a_ids: np.ndarray, b_ids: np.ndarray):
    """Pairs (a, b) of access ids, a on queue qa ranked before b and not happening before it, whose bounding
    boxes overlap and one of which writes; a_ids are in queue order.

    Two enumerations find a superset: in time, the run of a's that b's clock has not seen and that rank
    before b; in space, the pairs where one byte range starts inside the other. Both are counted first
    (binary searches) and the shorter one is expanded, so neither a long unsynchronized stretch nor the
    reuse of one buffer over time alone makes the work quadratic.
    """
    a_instr, b_instr = acc.instr[a_ids], acc.instr[b_ids]
    t_lo = np.searchsorted(ordering.pos[a_instr], ordering.clock[b_instr, qa], side="left")
    t_hi = np.searchsorted(ordering.rank[a_instr], ordering.rank[b_instr], side="left")
    a_by_lo, b_by_lo = np.argsort(acc.blo[a_ids], kind="stable"), np.argsort(acc.blo[b_ids], kind="stable")
    a_lo, b_lo = acc.blo[a_ids][a_by_lo], acc.blo[b_ids][b_by_lo]
    # a starting in [blo_b, bhi_b), and b starting in (blo_a, bhi_a): every overlapping pair exactly once
    s1_lo, s1_hi = np.searchsorted(a_lo, acc.blo[b_ids], "left"), np.searchsorted(a_lo, acc.bhi[b_ids], "left")
    s2_lo, s2_hi = np.searchsorted(b_lo, acc.blo[a_ids], "right"), np.searchsorted(b_lo, acc.bhi[a_ids], "left")
    in_time = np.maximum(t_hi - t_lo, 0).sum()
    in_space = (s1_hi - s1_lo).sum() + (s2_hi - s2_lo).sum()
    if in_time <= in_space:
        runs = [(t_lo, t_hi, lambda owner, at: (a_ids[at], b_ids[owner]))]
    else:
        runs = [(s1_lo, s1_hi, lambda owner, at: (a_ids[a_by_lo[at]], b_ids[owner])),
                (s2_lo, s2_hi, lambda owner, at: (a_ids[owner], b_ids[b_by_lo[at]]))]
    for lo, hi, pairs in runs:
        for owner, at in _expand(lo, np.maximum(hi - lo, 0)):
            ga, gb = pairs(owner, at)
            ia, ib = acc.instr[ga], acc.instr[gb]
            keep = ((ordering.rank[ia] < ordering.rank[ib]) & (ordering.pos[ia] >= ordering.clock[ib, qa])
                    & (acc.write[ga] | acc.write[gb]) & (acc.plo[ga] < acc.phi[gb]) & (acc.plo[gb] < acc.phi[ga])
                    & (acc.blo[ga] < acc.bhi[gb]) & (acc.blo[gb] < acc.bhi[ga]))
            ga, gb = ga[keep], gb[keep]
            meet = footprint_columns(acc.rows[:, ga], acc.rows[:, gb])   # e.g. two column tiles of one matrix
            yield from zip(ga[meet].tolist(), gb[meet].tolist(), strict=True)


def _expand(starts: np.ndarray, counts: np.ndarray):
    """(owner, position) arrays for every owner k and position in [starts[k], starts[k] + counts[k]), in chunks
    of about PAIR_CHUNK pairs."""
    total = np.cumsum(counts)
    if not total.size or not total[-1]:
        return
    cuts = np.searchsorted(total, np.arange(PAIR_CHUNK, total[-1], PAIR_CHUNK), side="left") + 1
    for chunk in np.split(np.arange(len(counts)), cuts):
        c = counts[chunk]
        n = int(c.sum())
        if n:
            yield np.repeat(chunk, c), np.repeat(starts[chunk], c) + np.arange(n) - np.repeat(np.cumsum(c) - c, c)


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

    def __init__(self, acc: _Accesses):
        self.acc = acc
        self.cache: dict[AP, np.ndarray | None] = {}

    def _bytes(self, g: int) -> np.ndarray | None:
        ap = self.acc.operands[g][1]
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
        (name_a, ap_a), (name_b, ap_b) = self.acc.operands[ga], self.acc.operands[gb]
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
