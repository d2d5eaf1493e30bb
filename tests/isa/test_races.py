"""The race check against a brute-force oracle: random synchronized programs with one semaphore wait removed.

The oracle shares no code with isa/races.py: happens-before is reachability over the explicit graph
(queue order plus one edge per wait, found by counting signals), and accesses are explicit Python sets
of (memory, partition, byte) built element by element.
"""
import dataclasses
import functools
import itertools
import random
import re

import numpy as np
import pytest

from trnc import flags
from trnc.isa import AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind, races
from trnc.isa import verify
from trnc.isa.operand_table import operand_table
from trnc.isa.races import operand_overlap, order
from trnc.isa.verify import check

F32 = DType.FP32
make = Instruction.make
TENSORS = tuple(TensorDecl(name, TensorKind.INPUT, F32, (128, 64)) for name in ("u", "v"))
QUEUES = ((Engine.DMA, 0), (Engine.DMA, 1), (Engine.ACT, 0), (Engine.DVE, 0), (Engine.POOL, 0))
# Free patterns of 8 fp32 elements: (dims, element offsets to start from). Several interleave: [2, 8] from 0
# and from 1, [8, 8] from 0..7, [16, 2][2, 4] from 0 and 1; [-1, 8] runs backwards; [0, 8] only reads.
PATTERNS = (
    (((1, 8),), range(0, 64, 8)),
    (((2, 8),), (0, 1, 16, 17, 32, 33, 48, 49)),
    (((8, 8),), range(8)),
    (((16, 2), (2, 4)), (0, 1, 32, 33)),
    (((-1, 8),), range(7, 64, 8)),
    (((0, 8),), range(0, 64, 5)),
)


# -- the oracle ----------------------------------------------------------------------------------------

@functools.cache
def touched(ap: AP) -> frozenset:
    """Every (memory, partition, byte) the AP touches, element by element (cached: mutants share their APs)."""
    out = set()
    isz = ap.dtype.itemsize
    for p in range(ap.partitions):
        for idx in itertools.product(*(range(c) for _, c in ap.dims)):
            elem = sum(i * s for i, (s, _) in zip(idx, ap.dims, strict=True))
            for k in range(isz):
                if ap.mem is Mem.HBM:
                    out.add((("hbm", ap.tensor), 0, ap.offset + isz * (p * ap.partition_stride + elem) + k))
                else:
                    out.add((ap.mem, ap.start_partition + p, ap.offset + isz * elem + k))
    return frozenset(out)


def reachability(program: Program) -> list[set]:
    """reach[a]: the instructions a happens before, by search over the explicit graph."""
    instrs = program.instructions
    succ = [set() for _ in instrs]
    last = {}
    for i, ins in enumerate(instrs):
        if ins.queue_name in last:
            succ[last[ins.queue_name]].add(i)
        last[ins.queue_name] = i
    signallers = {}
    for i, ins in enumerate(instrs):
        for s in ins.signals:
            signallers.setdefault(s, []).append(i)
    for i, ins in enumerate(instrs):
        for s, v in ins.waits:
            succ[signallers[s][v - 1]].add(i)
    reach = []
    for a in range(len(instrs)):
        seen, todo = set(), [a]
        while todo:
            for b in succ[todo.pop()] - seen:
                seen.add(b)
                todo.append(b)
        reach.append(seen)
    return reach


def oracle_races(program: Program) -> set[tuple[int, int]]:
    """Pairs (a, b), a < b, on different queues, sharing a byte that one of them writes, unordered."""
    instrs = program.instructions
    reach = reachability(program)
    acc = [[(touched(ap), w) for _, ap, w in ins.operands()] for ins in instrs]
    races = set()
    for a, b in itertools.combinations(range(len(instrs)), 2):
        if instrs[a].queue_name == instrs[b].queue_name or b in reach[a] or a in reach[b]:
            continue
        if any((wa or wb) and sa & sb for sa, wa in acc[a] for sb, wb in acc[b]):
            races.add((a, b))
    return races


def reported_races(program: Program) -> set[tuple[int, int]]:
    found = check(program)
    assert {v.rule for v in found} <= {"race"}, [(v.rule, v.message) for v in found]
    pairs = set()
    for v in found:
        other = int(re.search(r"of instruction (\d+) on", v.message).group(1))
        pairs.add((min(v.index, other), max(v.index, other)))
    assert len(pairs) == len(found)          # one report per pair of instructions
    return pairs


# -- random synchronized programs ----------------------------------------------------------------------

def random_ap(rng: random.Random, mem: Mem, partitions: int, write: bool) -> AP:
    dims, starts = rng.choice(PATTERNS[:-1] if write else PATTERNS)
    base = rng.choice(starts)
    if mem is Mem.HBM:
        pstride = rng.choice((64, 128))                       # rows one after another, or every other row
        row0 = rng.randrange(0, 128 - (partitions - 1) * pstride // 64)
        return AP(Mem.HBM, F32, partitions, dims, 4 * (row0 * 64 + base), tensor=rng.randrange(2),
                  partition_stride=pstride)
    start = rng.choice((0, 64) if partitions > 32 else (0, 32, 64, 96))
    return AP(mem, F32, partitions, dims, 4 * base, start)


def random_instruction(rng: random.Random, engine: Engine, queue: int) -> Instruction:
    """A random instruction whose written operand does not partially overlap its other operands (rule overlap)."""
    while True:
        ins = _random_instruction(rng, engine, queue)
        if not list(operand_overlap(ins)):
            return ins


def _random_instruction(rng: random.Random, engine: Engine, queue: int) -> Instruction:
    p = rng.choice((16, 32, 32, 64))
    if engine is Engine.DMA:
        mems = [rng.choice((Mem.SBUF, Mem.HBM)) for _ in range(2)]
        return make("dma_copy", engine, queue=queue, dst=random_ap(rng, mems[0], p, True),
                    src=random_ap(rng, mems[1], p, False))
    mems = (Mem.SBUF,) if engine is Engine.POOL else (Mem.SBUF, Mem.SBUF, Mem.PSUM)

    def ap(write):
        return random_ap(rng, rng.choice(mems), p, write)
    if engine is Engine.ACT:
        return make("activation", engine, dst=ap(True), src=ap(False), func=ActFunc.RELU)
    kind = rng.choice(("tensor_tensor", "tensor_copy", "memset"))
    if kind == "tensor_tensor":
        return make(kind, engine, dst=ap(True), in0=ap(False), in1=ap(False), op=AluOp.ADD)
    if kind == "tensor_copy":
        return make(kind, engine, dst=ap(True), src=ap(False))
    return make(kind, engine, dst=ap(True), value=1.0)


def synchronized_program(seed: int) -> Program:
    """A random program made race-free by waits: each instruction signals its queue's semaphore, and waits for
    the latest instruction of every other queue it conflicts with that does not already happen before it;
    some waits are added that may order nothing new. Half of the programs then list the queues interleaved
    in a random order, which need not be a topological one."""
    rng = random.Random(seed)
    queues = rng.sample(QUEUES, rng.choice((2, 3, 3)))
    instrs = []
    for _ in range(rng.randrange(6, 13)):
        instrs.append(random_instruction(rng, *rng.choice(queues)))
    names = sorted({ins.queue_name for ins in instrs})
    sem = {q: k for k, q in enumerate(names)}
    pos, seen = [], {}
    for ins in instrs:
        pos.append(seen.get(ins.queue_name, 0))
        seen[ins.queue_name] = pos[-1] + 1
    out = []
    for b, ins in enumerate(instrs):
        reach = reachability(Program(TENSORS, tuple(out) + (ins.replace(signals=(sem[ins.queue_name],)),), "trn3"))
        latest = {}
        for a in range(b):
            q = instrs[a].queue_name
            if q != ins.queue_name and b not in reach[a] and conflict(instrs[a], ins):
                latest[q] = max(latest.get(q, -1), a)
        others = [a for a in range(b) if instrs[a].queue_name != ins.queue_name]
        if others and rng.random() < 0.4:
            latest.setdefault(f"extra{b}", rng.choice(others))
        waits = tuple((sem[instrs[a].queue_name], pos[a] + 1) for a in latest.values())
        out.append(ins.replace(waits=waits, signals=(sem[ins.queue_name],)))
    if rng.random() < 0.5:
        per_queue = {q: [x for x in out if x.queue_name == q] for q in names}
        order = [q for q in names for _ in per_queue[q]]
        rng.shuffle(order)
        out = [per_queue[q].pop(0) for q in order]
    return Program(TENSORS, tuple(out), "trn3")


def without_wait(program: Program, i: int, k: int) -> Program:
    instrs = list(program.instructions)
    instrs[i] = instrs[i].replace(waits=instrs[i].waits[:k] + instrs[i].waits[k + 1:])
    return Program(program.tensors, tuple(instrs), program.target)


def signaller(program: Program, s: int, v: int) -> int:
    return [i for i, ins in enumerate(program.instructions) if s in ins.signals][v - 1]


def spans(accessed: set) -> dict:
    """(memory, partition) -> (lowest, highest) byte touched there."""
    out = {}
    for m, p, x in accessed:
        lo, hi = out.get((m, p), (x, x))
        out[(m, p)] = (min(lo, x), max(hi, x))
    return out


def interleaved(program: Program) -> bool:
    """Whether two unordered instructions on different queues, one writing, have byte spans that overlap in a
    shared partition while sharing no byte (what a bounding-box test alone would call a race)."""
    reach = reachability(program)
    instrs = program.instructions
    sets = [[(touched(ap), w) for _, ap, w in ins.operands()] for ins in instrs]
    for a, b in itertools.combinations(range(len(instrs)), 2):
        if instrs[a].queue_name == instrs[b].queue_name or b in reach[a] or a in reach[b]:
            continue
        for (sa, wa), (sb, wb) in itertools.product(sets[a], sets[b]):
            span_a, span_b = spans(sa), spans(sb)
            if (wa or wb) and not sa & sb and any(span_a[r][0] <= span_b[r][1] and span_b[r][0] <= span_a[r][1]
                                   for r in span_a.keys() & span_b.keys()):
                return True
    return False


def conflict(a: Instruction, b: Instruction) -> bool:
    """Whether the two instructions share a byte that one of them writes."""
    return any((wa or wb) and touched(ap_a) & touched(ap_b)
               for _, ap_a, wa in a.operands() for _, ap_b, wb in b.operands())


def mutation_stats(seeds) -> dict:
    """Check every single-wait removal of the programs of `seeds` against the oracle; count the cases seen."""
    stats = {"mutations": 0, "races": 0, "no race": 0, "implied": 0, "kahn": 0, "interleaved": 0}
    for seed in seeds:
        program = synchronized_program(seed)
        assert oracle_races(program) == set()
        assert check(program) == []
        ordering, _ = order(program)
        reach = reachability(program)
        n = len(program.instructions)
        assert all(ordering.happens_before(a, b) == (b in reach[a]) for a in range(n) for b in range(n))
        stats["interleaved"] += interleaved(program)
        stats["kahn"] += any(signaller(program, s, v) > i for i, ins in enumerate(program.instructions)
                             for s, v in ins.waits)
        for i, ins in enumerate(program.instructions):
            for k, (s, v) in enumerate(ins.waits):
                mutated = without_wait(program, i, k)
                expected = oracle_races(mutated)
                assert reported_races(mutated) == expected, (seed, i, k)
                stats["mutations"] += 1
                stats["races" if expected else "no race"] += 1
                stats["implied"] += conflict(program.instructions[signaller(program, s, v)], ins) and not expected
    return stats


@pytest.mark.parametrize("block", range(4))
def test_removing_a_wait_is_reported_iff_it_makes_a_race(block):
    stats = mutation_stats(range(block, 160, 4))
    # the generator must exercise every case the check distinguishes
    assert stats["mutations"] >= 150, stats
    assert min(stats["races"], stats["no race"]) >= 30, stats
    assert stats["implied"] >= 3 and stats["kahn"] >= 10 and stats["interleaved"] >= 10, stats


def test_order_implied_through_another_chain_is_not_a_race():
    """dma0 writes X; act waits for it and reads X; dve waits for act and also for dma0, and writes X.
    dve's wait on dma0 is implied by the chain through act; act's wait is not implied by anything."""
    x = AP(Mem.SBUF, F32, 32, ((1, 8),))
    y = AP(Mem.SBUF, F32, 32, ((1, 8),), offset=64)
    program = Program(TENSORS, (
        make("dma_copy", Engine.DMA, queue=0, dst=x, src=AP(Mem.HBM, F32, 32, ((1, 8),), tensor=0, partition_stride=64),
          signals=[0]),
        make("activation", Engine.ACT, dst=y, src=x, func=ActFunc.EXP, waits=[(0, 1)], signals=[1]),
        make("memset", Engine.DVE, dst=x, value=0.0, waits=[(1, 1), (0, 1)]),
    ), "trn3")
    assert check(program) == []
    assert reported_races(without_wait(program, 2, 1)) == set()
    assert reported_races(without_wait(program, 1, 0)) == {(0, 1)}
    assert reported_races(without_wait(program, 2, 0)) == {(1, 2)}


def pipeline(iterations: int, drop=None) -> Program:
    """dma0 loads a tile into buffer t % 2, dve scales it into out[t % 2], act applies exp into out2[t % 2],
    dma1 stores out2[t % 2]; every buffer reuse waits for the reader two iterations back.
    Semaphores: s0 dma0, s1 dve, s2 act, s3 dma1."""
    def tile(base, t):
        return AP(Mem.SBUF, F32, 128, ((1, 64),), offset=base + (t % 2) * 256)
    instrs = []
    for t in range(iterations):
        back = [(1, t - 1)] if t >= 2 else []
        src = AP(Mem.HBM, F32, 16, ((1, 64),), offset=(t % 8) * 16 * 256, tensor=0, partition_stride=64)
        instrs.append(make("dma_copy", Engine.DMA, queue=0, dst=AP(Mem.SBUF, F32, 16, ((1, 64),), offset=(t % 2) * 256),
                        src=src, waits=back, signals=[0]))
        instrs.append(make("tensor_scalar", Engine.DVE, dst=tile(1024, t), src=tile(0, t), op0=AluOp.MUL, scalar0=0.5,
                        waits=[(0, t + 1)] + ([(2, t - 1)] if t >= 2 else []), signals=[1]))
        act_waits = [(1, t + 1)] + ([(3, t - 1)] if t >= 2 and t != drop else [])
        instrs.append(make("activation", Engine.ACT, dst=tile(2048, t), src=tile(1024, t), func=ActFunc.EXP,
                        waits=act_waits, signals=[2]))
        dst = AP(Mem.HBM, F32, 128, ((1, 64),), tensor=1, partition_stride=64)
        instrs.append(make("dma_copy", Engine.DMA, queue=1, dst=dst, src=tile(2048, t), waits=[(2, t + 1)],
                           signals=[3]))
    return Program(TENSORS, tuple(instrs), "trn3")


def test_pipeline_is_race_free():
    assert check(pipeline(4)) == []


def test_scale_20k_instructions():
    """5000 iterations of a 4-queue pipeline (20000 instructions) verify; removing one wait in the middle
    is reported as exactly the one race it creates."""
    assert check(pipeline(5000)) == []
    t = 2500
    assert reported_races(pipeline(5000, drop=t)) == {(4 * (t - 2) + 3, 4 * t + 2)}


def test_scale_unsynchronized_interleaved_queues():
    """dve and pool never synchronize and write interleaved columns of the same 10000 regions: every pair of
    their instructions is unordered, thousands have overlapping boxes, none shares a byte; then one pool
    write is shifted onto dve's column and is the one race."""
    def column(engine, k, first):
        return make("memset", engine, dst=AP(Mem.SBUF, F32, 32, ((2, 2),), offset=16 * k + 4 * first), value=1.0)
    instrs = [column(engine, k, first) for k in range(5000) for engine, first in ((Engine.DVE, 0), (Engine.POOL, 1))]
    assert check(Program(TENSORS, tuple(instrs), "trn3")) == []
    instrs[2 * 1234 + 1] = column(Engine.POOL, 1234, 0)
    assert reported_races(Program(TENSORS, tuple(instrs), "trn3")) == {(2 * 1234, 2 * 1234 + 1)}


@pytest.mark.parametrize("seed", range(6))
def test_accesses_meeting_no_write_are_those_whose_byte_range_no_write_shares(seed):
    """The race walk leaves out the accesses no write can meet (a weight tensor only read): exactly those whose
    byte range shares no byte with a writing access's."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 80))
    lo = rng.integers(0, 200, n)
    hi = lo + rng.integers(1, 12, n)
    write = rng.random(n) < [0.0, 0.1, 0.5][seed % 3]
    want = [any(write[k] and lo[k] < hi[x] and lo[x] < hi[k] for k in range(n)) for x in range(n)]
    assert races._meets_a_write(lo, hi, write).tolist() == want


# -- the operand table's columns against the per-AP path ----------------------------------------------

def any_ap(rng: random.Random) -> AP:
    """An AP of any shape: negative, zero and equal strides, count-1 dims, transposed HBM views (a free dim
    stepping further than the partitions), 0 to 4 dims; some HBM tensors out of range."""
    dtype = rng.choice((DType.FP32, DType.BF16, DType.INT8))
    dims = tuple((rng.choice((0, 1, -1, 2, -3, 8, 64, -64, 200)), rng.choice((1, 1, 2, 3, 7)))
                 for _ in range(rng.randrange(5)))
    partitions = rng.choice((1, 2, 5, 32))
    offset = dtype.itemsize * rng.randrange(0, 4096)
    if rng.random() < 0.5:
        return AP(Mem.HBM, dtype, partitions, dims, offset, tensor=rng.choice((0, 1, 1, 2, -1)),
                  partition_stride=rng.choice((0, 1, -1, 8, 64, -64, 200)))
    return AP(rng.choice((Mem.SBUF, Mem.PSUM)), dtype, partitions, dims, offset, rng.randrange(0, 96))


def any_program(rng: random.Random, n: int) -> Program:
    instrs = tuple(make("dma_copy", Engine.DMA, queue=rng.randrange(4), dst=any_ap(rng), src=any_ap(rng))
                   for _ in range(n))
    return Program(TENSORS, instrs, "trn3")


@pytest.mark.parametrize("seed", range(8))
def test_footprint_columns_of_the_operand_table_are_footprint_row_for_row(seed):
    program = any_program(random.Random(seed), 300)
    table = operand_table(program)
    expected = [races.footprint(ap)[3:] for ap in table.aps]
    got = races.footprint_table(table, np.arange(len(table)))
    assert got.T.tolist() == [list(e) for e in expected]


@pytest.mark.parametrize("seed", range(8))
def test_accesses_from_the_table_are_those_of_the_per_ap_path(seed):
    """Every column, the shift of HBM tensors one after the other included, over a subset of instructions."""
    rng = random.Random(seed)
    program = any_program(rng, 200)
    indices = sorted(rng.sample(range(200), rng.choice((0, 1, 150, 200))))
    table, per_ap = races._accesses(program, indices), races._accesses_per_ap(program, indices)
    for column in ("instr", "mem", "write", "plo", "phi", "blo", "bhi", "slot"):
        assert getattr(table, column).tolist() == getattr(per_ap, column).tolist(), column
    every = np.arange(len(table.instr))
    assert table.footprints(every).tolist() == per_ap.footprints(every).tolist()
    some = np.array([g for g in every if rng.random() < 0.3], dtype=np.int64)   # asked of a few, in any order
    assert table.footprints(some[::-1]).tolist() == per_ap.footprints(some[::-1]).tolist()
    assert [table.operand(program, g) for g in range(len(table.instr))] == \
           [per_ap.operand(program, g) for g in range(len(per_ap.instr))]


def test_checking_on_one_thread_or_several_finds_the_same_problems(monkeypatch):
    """With several threads the verifier finds the ordering and the race candidates of every instruction while its
    rules run, and falls back to the sound ones when a rule fails one: the same violations, in order, as on one
    thread; on synchronized programs with a wait removed, on programs of ill-formed APs, and on racing programs
    where one of the racing instructions has an operand ill-formed but inside its memory."""
    rng = random.Random(21)
    programs = [without_wait(program, i, k) for program in map(synchronized_program, range(0, 40, 3))
                for i, ins in enumerate(program.instructions) for k in range(len(ins.waits))]
    programs += [any_program(rng, 60) for _ in range(4)]
    racing = [(p, v.index) for p in programs[:-4] for v in check(p)[:1] if v.rule == "race"
              and any(ap.mem is not Mem.HBM for _, ap, _ in p.instructions[v.index].operands())][:12]
    programs += [with_an_unsound_operand(p, i) for p, i in racing]
    with flags.override(TRNC_THREADS=1):
        serial = [check(p) for p in programs]
    monkeypatch.setattr(verify, "AHEAD_INSTRUCTIONS", 0)   # threads for these small programs too
    monkeypatch.setattr(races, "PARALLEL_ACCESSES", 0)
    with flags.override(TRNC_THREADS=3):
        threaded = [check(Program(p.tensors, p.instructions, p.target)) for p in programs]
    assert threaded == serial
    assert sum(v.rule == "race" for found in serial for v in found) >= 10
    assert sum(v.rule != "race" for found in serial for v in found) >= 10
    assert len(racing) >= 5
    for (_, i), found in zip(racing, serial[-len(racing):]):   # the unsound instruction is in no race any more
        assert {v.rule for v in found if v.index == i} == {"ap-form"}


def with_an_unsound_operand(program: Program, i: int) -> Program:
    """Instruction i with an on-chip operand naming a tensor: still inside its memory, but not well formed, so the
    race checks leave the instruction out."""
    instrs = list(program.instructions)
    ins = instrs[i]
    name = next(name for name, ap, _ in ins.operands() if ap.mem is not Mem.HBM)
    instrs[i] = ins.replace(args=tuple((k, dataclasses.replace(v, tensor=0) if k == name else v) for k, v in ins.args))
    return Program(program.tensors, tuple(instrs), program.target)


@pytest.mark.parametrize("block", range(2))
def test_races_are_the_same_without_an_operand_table(block, monkeypatch):
    """The per-AP path (programs with an operand the table cannot hold) finds the same problems, in order."""
    mutants = []
    for seed in range(block, 40, 2):
        program = synchronized_program(seed)
        mutants += [without_wait(program, i, k) for i, ins in enumerate(program.instructions)
                    for k in range(len(ins.waits))]
    with_table = [check(m) for m in mutants]
    assert sum(map(len, with_table)) >= 20

    def no_table(program):
        raise TypeError("no table")
    monkeypatch.setattr(races, "operand_table", no_table)
    assert [check(m) for m in mutants] == with_table


def test_a_race_is_found_beside_an_operand_the_table_cannot_hold():
    x = AP(Mem.SBUF, F32, 32, ((1, 8),))
    five_dims = AP(Mem.SBUF, F32, 32, ((1, 1),) * 5, offset=1024)
    program = Program(TENSORS, (
        make("memset", Engine.DVE, dst=x, value=0.0),
        make("memset", Engine.POOL, dst=five_dims, value=0.0),
        make("activation", Engine.ACT, dst=x, src=x, func=ActFunc.EXP),
    ), "trn3")
    with pytest.raises(TypeError):
        operand_table(program)
    found = check(program)
    assert [(v.index, v.rule) for v in found if v.rule == "race"] == [(2, "race")]
    assert any(v.index == 1 and v.rule == "ap-form" for v in found)
