"""The program verifier: the machine's rules as tables, checked on every instruction before a program runs.

A program that passes `verify` cannot make the runtime touch memory outside its buffers, uses
every engine and memory only as the hardware allows, and computes the same result under every
legal interleaving of its queues (the ordering checks live in isa/races.py). The rules come from
isa/spec_intro.md, the opcode table and ../shared/reference/neuroncore.md.

The rules are tables, in the manner of tinygrad's `spec_*` pattern tables: `spec_operand` runs on
every operand of every instruction (AP form, memory, partition alignment, bounds, e8m0 placement),
`spec_instruction` on every instruction (engine and queue), and `spec_shape` / `spec_dtype` are keyed
by opcode (isa/verify_opcodes.py, with the context and helpers the rules share). The facts these
generic rules apply (memories, roles, one-bank operands, e8m0 placement, engine limits on enum
fields) are read from the opcode rows, so neither file states them again.
Each rule yields (rule id, message) pairs; the rule ids are short kebab-case names that tests and
users can match on.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from numbers import Integral, Real
import threading

import numpy as np

from trnc import flags
from trnc.errors import VerifyError
from trnc.isa import races
from trnc.isa.ap import AP, MAX_AP_ELEMENTS, MAX_COUNT, MAX_FREE_DIMS, STRIDE_LIMIT, Engine, Mem
from trnc.isa.config import DMA_QUEUES, HwConfig, get_target
from trnc.isa.decoding import no_gc
from trnc.isa.dtypes import DType
from trnc.isa.field_table import field_table
from trnc.isa.opcodes import BY_NAME, E8m0, Kind
from trnc.isa.native import first_appearances, row_ids
from trnc.isa.operand_table import OperandTable, operand_table
from trnc.isa.program import Instruction, Program
from trnc.isa.verify_opcodes import (
    Ctx, Problem, engine_limits, features, fsize, listed, psum_bank, spec_dtype, spec_shape,
)

ERROR_LIMIT = 20         # violations spelled out in one VerifyError message
AHEAD_INSTRUCTIONS = 4096   # from this size, with TRNC_THREADS > 1, the race candidates are found beside the rules



@dataclass(frozen=True)
class Violation:
    """One broken rule: the instruction index, the rule id (e.g. 'psum-bank') and the specifics."""

    index: int
    rule: str
    message: str

    def describe(self, program: Program) -> str:
        """The violation as the error text: index, rule, specifics and the instruction's assembly."""
        asm = assembly(program, self.index) if 0 <= self.index < len(program.instructions) else "?"
        head, *rest = self.message.split("\n")
        return "\n".join([f"instruction {self.index}: {self.rule}: {head}", f"    {self.index}: {asm}", *rest])


def assembly(program: Program, index: int) -> str:
    """The instruction as assembly text (isa/asm.py formats ill-formed instructions too), else its repr."""
    ins = program.instructions[index]
    try:
        from trnc.isa.asm import format_instruction
    except ImportError:
        return repr(ins)
    return format_instruction(ins, program)


# -- fields: the instruction must be a well-typed row of the opcode table --------------------------

def _field_problems(ins: Instruction) -> Iterator[Problem]:
    """Field names, order and value types; nothing else is checked on an instruction that fails here."""
    spec = BY_NAME[ins.opcode]
    names = tuple(k for k, _ in ins.args)
    expected = tuple(f.name for f in spec.fields)
    if names != expected:
        yield "fields", f"{ins.opcode} fields are {list(names)}; the table has {list(expected)}"
        return
    for f, (_, v) in zip(spec.fields, ins.args, strict=True):
        if f.kind is Kind.AP:
            ok = isinstance(v, AP) and isinstance(v.mem, Mem) and isinstance(v.dtype, DType)
            if not ok and not (v is None and f.optional):
                yield "fields", f"{f.name} must be an access pattern{' or absent' if f.optional else ''}, not {v!r}"
        elif f.kind is Kind.ENUM:
            try:
                f.enum(v)
            except (ValueError, TypeError):
                yield "fields", f"{f.name} = {v!r} is not a {f.enum.__name__}; expected one of {listed(f.enum)}"
        elif f.kind is Kind.BOOL:
            if v not in (True, False):
                yield "fields", f"{f.name} = {v!r} must be a bool"
        elif f.kind is Kind.F32:
            if not isinstance(v, Real) or isinstance(v, bool):
                yield "fields", f"{f.name} = {v!r} must be a number"
        else:
            lo, hi = (0, 2**32) if f.kind is Kind.U32 else (-2**31, 2**31)
            values = v if f.kind is Kind.I32X4 else (v,)
            width_ok = f.kind is not Kind.I32X4 or (isinstance(v, tuple) and len(v) == 4)
            if not width_ok or not all(isinstance(x, Integral) and lo <= x < hi for x in values):
                yield "fields", (f"{f.name} = {v!r} must be {'4 x ' if f.kind is Kind.I32X4 else ''}{f.kind.value} "
                                 f"in [{lo}, {hi})")


# -- rules on every instruction ----------------------------------------------------------------------

def _engine(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    engines = ins.spec.engines
    if ins.engine not in engines:
        yield "engine", f"{ins.opcode} runs on {listed(engines)}, not {ins.engine.text}"


def _queue(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    if not _integer(ins.queue):
        yield "queue", f"queue {ins.queue!r} is not a 64-bit integer"
    elif ins.engine is Engine.DMA:
        if not 0 <= ins.queue < DMA_QUEUES:
            yield "queue", f"DMA queue {ins.queue} is outside [0, {DMA_QUEUES})"
    elif ins.queue != 0:
        yield "queue", f"queue {ins.queue} on {ins.engine.text}: compute engines have one queue, number 0"


def _integer(value) -> bool:
    """An int of 64 bits (what the sync table holds)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and -2**63 <= value < 2**63


def _sync_problems(ins: Instruction) -> Iterator[Problem]:
    """The waits are (semaphore, value) pairs of integers and the signals integers: what the ordering rules
    read (isa/sync_table.py); checked on every instruction only when the program's sync table fails."""
    if not isinstance(ins.waits, (tuple, list)) or not all(
            isinstance(w, (tuple, list)) and len(w) == 2 and all(map(_integer, w)) for w in ins.waits):
        yield "semaphore", f"waits {ins.waits!r} are not (semaphore, value) pairs of 64-bit integers"
    if not isinstance(ins.signals, (tuple, list)) or not all(map(_integer, ins.signals)):
        yield "semaphore", f"signals {ins.signals!r} are not semaphore numbers (64-bit integers)"


spec_instruction: tuple[Callable[[Ctx, Instruction], Iterator[Problem]], ...] = (_engine, _queue)


# -- rules on every operand --------------------------------------------------------------------------

def _ap_form(ctx: Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    """The AP is well formed; the other operand rules run only on operands that pass this one."""
    if ap.partitions < 1:
        yield "ap-form", f"{name}: partition count {ap.partitions} must be >= 1"
    if len(ap.dims) > MAX_FREE_DIMS:
        yield "ap-form", f"{name}: {len(ap.dims)} free dims; at most {MAX_FREE_DIMS}"
    for j, (stride, count) in enumerate(ap.dims):
        if not 1 <= count <= MAX_COUNT:
            yield "ap-form", f"{name}: free dim {j} count {count} is outside [1, {MAX_COUNT}]"
        if abs(stride) >= STRIDE_LIMIT:
            yield "ap-form", f"{name}: free dim {j} stride {stride} is outside (-2^31, 2^31)"
        if write and stride == 0 and count > 1:
            yield "ap-form", (f"{name}: written with stride 0 over {count} elements of free dim {j}; "
                              "only read operands may repeat an element")
    if ap.num_elements > MAX_AP_ELEMENTS:
        yield "ap-form", (f"{name}: spans {ap.num_elements} elements ({ap.partitions} partitions x {fsize(ap)}); "
                          f"at most 2^32, so every instruction's work is bounded")
    if ap.mem is Mem.HBM:
        if abs(ap.partition_stride) >= STRIDE_LIMIT:
            yield "ap-form", f"{name}: partition stride {ap.partition_stride} is outside (-2^31, 2^31)"
        if write and ap.partitions > 1 and ap.partition_stride == 0:
            yield "ap-form", f"{name}: written over {ap.partitions} partitions with partition stride 0"
    elif ap.partition_stride != 0:
        yield "ap-form", f"{name}: an on-chip AP has no partition stride ({ap.partition_stride}); it must be 0"
    yield from _ap_place(ctx, ins, name, ap, write)


def _ap_place(ctx: Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    """The AP's place (offset, start partition, tensor) is well formed."""
    isz = ap.dtype.itemsize
    if ap.offset < 0 or ap.offset % isz:
        yield "ap-form", f"{name}: byte offset {ap.offset} must be >= 0 and a multiple of {isz} ({ap.dtype.text})"
    if ap.mem is Mem.HBM:
        tensors = ctx.program.tensors
        if ap.start_partition != 0:
            yield "ap-form", f"{name}: an HBM AP has no start partition ({ap.start_partition}); it must be 0"
        if not 0 <= ap.tensor < len(tensors):
            yield "ap-form", f"{name}: tensor {ap.tensor} does not exist; the program declares {len(tensors)}"
        elif ap.dtype is not tensors[ap.tensor].dtype:
            t = tensors[ap.tensor]
            yield "ap-form", (f"{name}: dtype {ap.dtype.text} differs from tensor '{t.name}' ({t.dtype.text}); "
                              "HBM is read and written in its declared dtype")
    else:
        if ap.tensor != -1:
            yield "ap-form", f"{name}: an on-chip AP has no tensor ({ap.tensor}); it must be unset (-1)"
        lo, hi = ap.partition_range()
        if lo < 0 or hi > ctx.hw.partitions:
            yield "ap-form", f"{name}: partitions [{lo}, {hi}) are outside [0, {ctx.hw.partitions})"


def _memory(ctx: Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    allowed = ins.spec.memories(ins.spec.field(name), ins.engine)
    if ap.mem not in allowed:
        yield "memory", (f"{name} is in {ap.mem.text}; {ins.opcode} on {ins.engine.text} takes it from "
                         f"{listed(allowed)}")


def aligned_starts(partitions: int) -> tuple[int, ...]:
    """Legal start partitions of a compute-engine AP (neuroncore.md 3, "Partition rules")."""
    if partitions > 64:
        return (0,)
    if partitions > 32:
        return (0, 64)
    return (0, 32, 64, 96)


def _partition_align(ctx: Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    if ins.engine is Engine.DMA or ap.mem is Mem.HBM:
        return
    starts = aligned_starts(ap.partitions)
    if ap.start_partition not in starts:
        yield "partition-align", (f"{name} starts at partition {ap.start_partition} with {ap.partitions} "
                                  f"partitions; compute engines allow starts {set(starts)}")


def _bounds(ctx: Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    lo, hi = ap.byte_range()
    if ap.mem is Mem.HBM:
        if not 0 <= ap.tensor < len(ctx.program.tensors):
            return
        t = ctx.program.tensors[ap.tensor]
        size, where = t.num_bytes, f"tensor '{t.name}'"
    else:
        size = ctx.hw.sbuf_bytes_per_partition if ap.mem is Mem.SBUF else ctx.hw.psum_bytes_per_partition
        where = f"a {ap.mem.text} partition on {ctx.hw.name}"
    if lo < 0 or hi > size:
        yield "ap-bounds", f"{name} reaches bytes [{lo}, {hi}), outside the {size} bytes of {where}"


def _e8m0_allowed(ins: Instruction, name: str) -> bool:
    """Whether operand `name` may be e8m0, by its row's E8m0 placement."""
    place = ins.spec.field(name).e8m0
    if place is E8m0.COPY:
        return all(ins[f.name].dtype is DType.E8M0 for f in ins.spec.aps if f.e8m0 is not E8m0.NEVER)
    return place is not E8m0.NEVER


def _e8m0(ctx: Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    if ap.dtype is DType.E8M0 and not _e8m0_allowed(ins, name):
        yield "dtype", (f"{name} is e8m0; e8m0 is only an MX scale (quantize_mx scale, matmul_mx scales), "
                        "copied bit for bit (dma_copy, tensor_copy with both sides e8m0) or decoded by tensor_copy")


spec_operand = (_ap_form, _memory, _partition_align, _bounds, _e8m0)
# The operand rules that read an AP's place (offset, start partition, tensor); every other rule reads only
# the instruction's form (_form_key), so instructions of one form differ only in these.
place_operand = (_ap_place, _partition_align, _bounds)


# -- the driver ---------------------------------------------------------------------------------------

def _instruction(ctx: Ctx, ins: Instruction) -> tuple[list[Problem], bool]:
    """Problems of one instruction, and whether its operands are sound enough for the ordering checks."""
    if ins.opcode not in BY_NAME:
        return [("opcode", f"unknown opcode '{ins.opcode}'; expected one of {', '.join(BY_NAME)}")], False
    problems = list(_field_problems(ins))
    if not problems and not isinstance(ins.engine, Engine):
        problems.append(("engine", f"engine {ins.engine!r} is not one of {listed(Engine)}"))
    if problems:
        return problems, False
    for rule in spec_instruction:
        problems.extend(rule(ctx, ins))
    # On the wrong engine only the rules that keep memory safe apply; the others would judge the wrong engine.
    legal_engine = all(r != "engine" for r, _ in problems)
    operand_rules = spec_operand[1:] if legal_engine else (_bounds,)
    formed = True
    for name, ap, write in ins.operands():
        form = list(_ap_form(ctx, ins, name, ap, write))
        problems.extend(form)
        if form:
            formed = False
            continue
        for rule in operand_rules:
            problems.extend(rule(ctx, ins, name, ap, write))
    if formed and legal_engine:
        problems.extend(spec_shape[ins.opcode](ctx, ins))
        problems.extend(features(ctx, ins))
        problems.extend(spec_dtype.get(ins.opcode, lambda c, i: ())(ctx, ins))
        problems.extend(engine_limits(ctx, ins))
        problems.extend(psum_bank(ctx, ins))
        problems.extend(races.operand_overlap(ins))
    return problems, formed


def _form_key(ins: Instruction) -> tuple:
    """Everything the rules read but the places of the access patterns and the queue."""
    return (ins.opcode, ins.engine,
            tuple((k, (v.mem, v.dtype, v.partitions, v.dims, v.partition_stride) if isinstance(v, AP) else v)
                  for k, v in ins.args))


def _table(program: Program) -> OperandTable | None:
    """The program's operand table; None when an ill-formed instruction leaves it without one."""
    try:
        return operand_table(program)
    except TypeError:
        return None


def _forms(program: Program, table: OperandTable | None) -> np.ndarray | None:
    """Per instruction, an id shared by exactly the instructions of one _form_key: the same field row
    (isa/field_table.py: opcode, engine, queue, every field but the APs) and instruction form of
    the operand table (each AP operand's field and AP but for its place, and which operands are identical);
    None when an instruction has no field row or the program no table."""
    if table is None:
        return None
    try:
        rows = field_table(program).ids
    except TypeError:
        return None
    return row_ids(np.column_stack([rows, table.instruction_forms]))


def _engines(program: Program) -> np.ndarray:
    """Each instruction's engine, from the field table when the program has one."""
    try:
        return field_table(program).engine
    except TypeError:
        return np.array([ins.engine for ins in program.instructions], dtype=np.int64)


def _place_problems(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    """The rules that read places and the queue, on an instruction whose form has passed every rule elsewhere."""
    yield from _queue(ctx, ins)
    for name, ap, write in ins.operands():
        for rule in place_operand:
            yield from rule(ctx, ins, name, ap, write)
    yield from psum_bank(ctx, ins)
    yield from races.operand_overlap(ins)


def _place_suspects(ctx: Ctx, table: OperandTable, indices: np.ndarray) -> np.ndarray:
    """The instructions among `indices` (of forms that passed every rule) that _place_problems might fault: a
    superset, computed over the operand table at once; the others have no problem. Each test below is a
    necessary condition of a rule of _place_problems failing (tests/isa/test_verify_places.py holds it to that)."""
    hw, tensors = ctx.hw, ctx.program.tensors
    chosen = np.zeros(len(table.first) - 1, dtype=bool)
    chosen[indices] = True
    mem, start, parts, offset, tensor = table.mem, table.start, table.partitions, table.offset, table.tensor
    lo, hi = table.byte_range   # every row, as most are chosen: no gathered copies
    hbm = mem == Mem.HBM
    known = (tensor >= 0) & (tensor < len(tensors))
    at = np.where(known, tensor, 0)
    tensor_bytes = np.array([t.num_bytes for t in tensors] or [0], dtype=np.int64)[at]
    tensor_dtype = np.array([t.dtype.code for t in tensors] or [-1], dtype=np.int64)[at]
    size = np.where(hbm, tensor_bytes, np.where(mem == Mem.SBUF, hw.sbuf_bytes_per_partition,
                                                hw.psum_bytes_per_partition))
    engine = _engines(ctx.program)[table.instr]
    aligned = np.where(parts > 64, start == 0, np.where(parts > 32, (start == 0) | (start == 64), start % 32 == 0))
    bad = ((offset < 0) | (offset % table.itemsize != 0) | (lo < 0) | (hi > size)
           | np.where(hbm, (start != 0) | ~known | (table.dtype != tensor_dtype),
                      (tensor != -1) | (start < 0) | (start + parts > hw.partitions)
                      | ((engine != Engine.DMA) & ~aligned))
           | ((mem == Mem.PSUM) & (lo // hw.psum_bank_bytes != (hi - 1) // hw.psum_bank_bytes)))
    suspects = np.concatenate([table.instr[bad], _overlap_suspects(table)])
    return np.unique(np.concatenate([suspects[chosen[suspects]], _queue_suspects(ctx, indices)]))


def _within_memory(ctx: Ctx, table: OperandTable) -> bool:
    """Whether every operand lies in its memory: on chip inside the partitions and their bytes, in HBM inside a
    declared tensor. What bounds the race candidates of instructions not yet known sound."""
    tensors, hw = ctx.program.tensors, ctx.hw
    tensor = table.tensor
    known = (tensor >= 0) & (tensor < len(tensors))
    tensor_bytes = np.array([t.num_bytes for t in tensors] or [0], dtype=np.int64)[np.where(known, tensor, 0)]
    hbm = table.mem == Mem.HBM
    size = np.where(hbm, tensor_bytes, np.where(table.mem == Mem.SBUF, hw.sbuf_bytes_per_partition,
                                                hw.psum_bytes_per_partition))
    lo, hi = table.byte_range
    inside = (lo >= 0) & (hi <= size) & np.where(hbm, known, (table.start >= 0) & (table.partitions >= 1)
                                                  & (table.start + table.partitions <= hw.partitions))
    return bool(inside.all())


def _queue_suspects(ctx: Ctx, indices: np.ndarray) -> np.ndarray:
    """The instructions among `indices` whose queue breaks rule `queue`, over the field table when the program has
    one."""
    try:
        fields = field_table(ctx.program)
    except TypeError:
        return np.array([i for i in indices.tolist() if next(_queue(ctx, ctx.program.instructions[i]), None)],
                        dtype=np.int64)
    engine, queue = fields.engine[indices], fields.queue[indices]
    return indices[np.where(engine == Engine.DMA, (queue < 0) | (queue >= DMA_QUEUES), queue != 0)]


def _overlap_suspects(table: OperandTable) -> np.ndarray:
    """Instructions with a written operand that may share a byte with another operand it is not identical to
    (rule overlap's candidates: races.operand_overlap decides). Each row against the row d after it, for every d
    an instruction's operands span, as whole-column slices."""
    lo, hi = table.byte_range
    instr, write, mem, tensor, start, parts, ap_id = (table.instr, table.write, table.mem, table.tensor, table.start,
                                                      table.partitions, table.ap_id)
    found = [np.zeros(0, dtype=np.int64)]
    for d in range(1, int(np.diff(table.first).max(initial=0))):
        a, b = slice(0, len(table) - d), slice(d, None)
        share = ((instr[a] == instr[b]) & (write[a] | write[b]) & (mem[a] == mem[b])
                 & np.where(mem[a] == Mem.HBM, tensor[a] == tensor[b],
                            (start[a] < start[b] + parts[b]) & (start[b] < start[a] + parts[a]))
                 & (lo[a] < hi[b]) & (lo[b] < hi[a]) & (ap_id[a] != ap_id[b]))
        found.append(instr[a][share])
    return np.concatenate(found)


def check(program: Program, hw: HwConfig | None = None, meanwhile: Callable[[], None] | None = None) -> list[Violation]:
    """Every violation of the machine's rules in `program`, ordered by instruction index.

    The ordering checks (semaphores, deadlocks, races) run on the instructions whose operands are well
    formed; a race is reported once per pair of instructions, at the later one in the happens-before order.
    `meanwhile`, when given, is called once every instruction has passed every other rule, while the ordering
    checks may still run on their thread (the JIT lays the program out then); not when an instruction failed.
    """
    ctx = Ctx(program, hw if hw is not None else _target(program))
    found, sound = [], []   # violations; the instructions whose operands are well formed
    # Once an instruction of a form passes every rule, the others of that form (a kernel's tiles at other
    # offsets) are left to the place rules (place_operand, psum_bank, operand_overlap), checked at the end
    # over the operand table; every rule runs on the ones those might fault.
    with no_gc():   # hundreds of thousands of small live objects: collecting would free none
        table = _table(program)
        ordering_ahead = _ahead(partial(_ordering_and_candidates, ctx, table),
                                flags.get("TRNC_THREADS") > 1 and len(program.instructions) >= AHEAD_INSTRUCTIONS)
        forms = _forms(program, table)
        later = _check_by_key(ctx, found, sound) if forms is None else _check_by_form(ctx, forms, found, sound)
        formed = np.zeros(len(program.instructions), dtype=bool)
        formed[sound] = formed[later] = True
        for i in _recheck(ctx, table, later):
            problems, ok = _instruction(ctx, program.instructions[i])
            found.extend(Violation(i, rule, msg) for rule, msg in problems)
            formed[i] = ok
        sound = np.flatnonzero(formed)
        if meanwhile is not None and not found:
            meanwhile()
        ordering, problems, every_candidate = ordering_ahead()
        if problems is None:   # a wait, signal, engine or queue that is not an integer; engines and queues are above
            problems = [(i, *p) for i, ins in enumerate(program.instructions) for p in _sync_problems(ins)]
        found.extend(Violation(*p) for p in problems)
        if ordering is not None:
            describe = partial(assembly, program)
            candidates = every_candidate if every_candidate is not None and formed.all() else \
                races.candidates(program, ordering, sound)
            found.extend(Violation(*p) for p in races.find_races(program, ordering, candidates, describe))
    found.sort(key=lambda v: v.index)
    return found


def _ordering_and_candidates(ctx: Ctx, table: OperandTable | None) -> tuple[races.Ordering | None, list | None,
                                                                          races.Candidates | None]:
    """races.order (problems None when a sync field is not an integer) and the race candidates of every
    instruction, as if all were sound (what they are in a valid program); None when they cannot be found, or when
    an operand lies outside its memory (an invalid program, whose garbage ranges could make the candidates many)."""
    program = ctx.program
    try:
        ordering, problems = races.order(program)
    except TypeError:
        return None, None, None
    if ordering is None or table is None or not _within_memory(ctx, table):
        return ordering, problems, None
    return ordering, problems, races.candidates(program, ordering, np.arange(len(program.instructions)))


def _ahead(work: Callable[[], object], threaded: bool) -> Callable[[], object]:
    """work() begun now on a thread of its own when `threaded` (its numpy and native loops let go of the GIL, so
    it overlaps the caller's rules), else run when its result is asked for; the function returned gives the
    result, or raises work's error."""
    if not threaded:
        return work
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((work(), None))
        except BaseException as e:   # raised again in the caller's thread
            outcome.append((None, e))
    thread = threading.Thread(target=run)
    thread.start()

    def result():
        thread.join()
        value, error = outcome[0]
        if error is not None:
            raise error
        return value
    return result


def _check_one(ctx: Ctx, i: int, found: list[Violation], sound: list[int]) -> bool:
    """Every rule on instruction i, its violations added to `found` (and i to `sound` when its operands are well
    formed); whether it has none."""
    problems, ok = _instruction(ctx, ctx.program.instructions[i])
    found.extend(Violation(i, rule, msg) for rule, msg in problems)
    if ok:
        sound.append(i)
    return not problems


def _check_by_form(ctx: Ctx, forms: np.ndarray, found: list[Violation], sound: list[int]) -> np.ndarray:
    """The first instruction of each form (_forms) fully; of the others, those of a form that passed are returned
    (for the place rules) and those of a form that failed checked each fully."""
    leaders = first_appearances(forms)
    passed = np.zeros(len(leaders), dtype=bool)
    for form, i in enumerate(leaders.tolist()):
        passed[form] = _check_one(ctx, i, found, sound)
    others = np.ones(len(forms), dtype=bool)
    others[leaders] = False
    for i in np.flatnonzero(others & ~passed[forms]).tolist():
        _check_one(ctx, i, found, sound)
    return np.flatnonzero(others & passed[forms])


def _check_by_key(ctx: Ctx, found: list[Violation], sound: list[int]) -> np.ndarray:
    """_check_by_form for a program without forms, by each instruction's _form_key in Python."""
    passed: set[tuple] = set()
    later: list[int] = []
    for i, ins in enumerate(ctx.program.instructions):
        try:
            key = _form_key(ins)
            seen = key in passed
        except (TypeError, AttributeError, IndexError):   # unhashable, ill-typed or missing fields: ill-formed
            key, seen = None, False
        if seen:
            later.append(i)
        elif _check_one(ctx, i, found, sound) and key is not None:
            passed.add(key)
    return np.array(later, dtype=np.int64)


def _recheck(ctx: Ctx, table: OperandTable | None, later: np.ndarray) -> list[int]:
    """Those of `later` (instructions of forms that passed) that every rule must see again: the place rules'
    suspects over the operand table, or (a program without one) the instructions they fault on."""
    if not len(later):
        return []
    if table is None:
        return [i for i in later.tolist() if next(_place_problems(ctx, ctx.program.instructions[i]), None) is not None]
    return _place_suspects(ctx, table, later).tolist()


def verify(program: Program, hw: HwConfig | None = None, meanwhile: Callable[[], object] | None = None) -> object:
    """Raise VerifyError naming each broken rule (index, assembly, rule id, specifics); return if none.

    `meanwhile` (see check) is called while the ordering checks run, and its result returned once the program
    passes. Its error is raised only then: an invalid program may well make it fail, and the verdict comes first.
    """
    outcome: list = []

    def guarded() -> None:
        try:
            outcome.append((meanwhile(), None))
        except Exception as e:   # raised once the program has passed
            outcome.append((None, e))
    found = check(program, hw, None if meanwhile is None else guarded)
    if not found:
        if meanwhile is None:
            return None
        value, error = outcome[0]
        if error is not None:
            raise error
        return value
    lines = [v.describe(program) for v in found[:ERROR_LIMIT]]
    more = f"\n... and {len(found) - ERROR_LIMIT} more" if len(found) > ERROR_LIMIT else ""
    head = "" if len(found) == 1 else f"{len(found)} violations:\n"
    error = VerifyError(head + "\n".join(lines) + more)
    error.violations = found
    raise error


def _target(program: Program) -> HwConfig:
    try:
        return get_target(program.target)
    except ValueError as e:
        raise VerifyError(f"program target: {e}") from None
