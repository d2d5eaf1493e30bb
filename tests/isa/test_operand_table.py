"""isa/operand_table.py: its columns agree with the AP methods they vectorize, row for row."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from trnc.isa.ap import AP, Engine, Mem
from trnc.isa.dtypes import DType
from trnc.isa.native import row_ids
from trnc.isa.operand_table import build, operand_table
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind, kept_with_program

DTYPES = (DType.FP32, DType.BF16, DType.FP8_E4M3)


def _ap(rng: random.Random) -> AP:
    mem = rng.choice(list(Mem))
    dims = tuple((rng.randint(-40, 40), rng.randint(1, 5)) for _ in range(rng.randint(0, 4)))
    if mem is Mem.HBM:
        return AP(mem, rng.choice(DTYPES), rng.randint(1, 8), dims, rng.randrange(0, 4096, 4), tensor=rng.randrange(2),
                  partition_stride=rng.randint(-64, 64))
    return AP(mem, rng.choice(DTYPES), rng.randint(1, 64), dims, rng.randrange(0, 4096, 4), rng.randrange(64))


def _program(rng: random.Random, n: int) -> Program:
    tensors = (TensorDecl("a", TensorKind.INPUT, DType.FP32, (64, 64)), TensorDecl("b", TensorKind.OUTPUT, DType.FP32, (64,)))
    instructions = []
    for _ in range(n):
        kind = rng.randrange(3)
        if kind == 0:
            ins = Instruction.make("dma_copy", Engine.DMA, dst=_ap(rng), src=_ap(rng))
        elif kind == 1:
            ins = Instruction.make("tensor_tensor", Engine.DVE, dst=_ap(rng), in0=_ap(rng), in1=_ap(rng))
        else:   # an operand repeated: one AP object in two rows
            ap = _ap(rng)
            ins = Instruction.make("tensor_tensor", Engine.DVE, dst=ap, in0=ap, in1=_ap(rng))
        instructions.append(ins)
    return Program(tensors, tuple(instructions))


def test_columns_match_the_ap_methods():
    rng = random.Random(7)
    program = _program(rng, 300)
    table = build(program.instructions)
    operands = [(i, slot, ap, write) for i, ins in enumerate(program.instructions)
                for slot, (_, ap, write) in enumerate(ins.operands())]
    assert len(table) == len(operands)
    lo, hi = table.byte_range
    for row, (i, slot, ap, write) in enumerate(operands):
        assert (table.instr[row], table.slot[row], bool(table.write[row])) == (i, slot, write)
        assert table.aps[row] is ap
        assert (table.mem[row], table.dtype[row], table.offset[row], table.start[row], table.tensor[row]) == \
               (ap.mem, ap.dtype.code, ap.offset, ap.start_partition, ap.tensor)
        assert (lo[row], hi[row]) == ap.byte_range()
        assert (table.extent[0][row], table.extent[1][row]) == ap.free_extent()
        assert table.first[i] <= row < table.first[i + 1]


def test_ids_group_exactly_the_equal_aps_and_those_equal_but_for_their_place():
    rng = random.Random(8)
    table = build(_program(rng, 400).instructions)

    def form(ap: AP):
        return ap.mem, ap.dtype, ap.partitions, ap.dims, ap.partition_stride

    ids: dict = {}
    for row, ap in enumerate(table.aps):
        assert ids.setdefault(form(ap), int(table.form[row])) == table.form[row]
    assert len(set(ids.values())) == len(ids)
    same: dict = {}
    for row, ap in enumerate(table.aps):
        assert same.setdefault(ap, int(table.ap_id[row])) == table.ap_id[row]
    assert len(set(same.values())) == len(same)


def test_the_table_is_kept_with_its_program_only():
    program = _program(random.Random(9), 5)
    assert operand_table(program) is operand_table(program)
    copy = Program(program.tensors, program.instructions, program.target)
    assert operand_table(copy) is not operand_table(program)


def test_a_table_asked_for_from_two_threads_at_once_is_built_once():
    """The verifier's ordering thread and the JIT loader ask for the sync table at once: one build, one table."""
    built, got = [], []
    both_asking = threading.Barrier(2)

    @kept_with_program
    def slow_table(program):
        built.append(program)
        time.sleep(0.05)   # the other thread asks meanwhile
        return object()
    program = _program(random.Random(9), 5)

    def ask():
        both_asking.wait()
        got.append(slow_table(program))
    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1 and got[0] is got[1]


@pytest.mark.parametrize("offset", [8.0, 2**64, None])
def test_a_field_that_is_no_int64_integer_has_no_table(offset):
    ap = AP(Mem.SBUF, DType.FP32, 4, ((1, 4),), offset)
    program = Program((), (Instruction.make("tensor_copy", Engine.DVE, dst=AP(Mem.SBUF, DType.FP32, 4, ((1, 4),)),
                                            src=ap),))
    with pytest.raises(TypeError):
        build(program.instructions)


def _same_partition(ids, reference) -> bool:
    return len(set(zip(ids.tolist(), reference.tolist()))) == len(set(ids.tolist())) == len(set(reference.tolist()))


def test_row_ids_group_exactly_the_equal_rows():
    rng = np.random.default_rng(3)
    key = rng.integers(-3, 3, (5000, 6))
    assert _same_partition(row_ids(key), np.unique(key, axis=0, return_inverse=True)[1].reshape(-1))


def test_row_ids_tell_apart_two_rows_of_one_hash():
    """(1, 0) and (2, (1*P) ^ (2*P)) collide in the hash (P: its multiplier): the exact sort must split them."""
    p = 0x100000001B3
    colliding = ((1 * p) ^ (2 * p)) % 2**64
    key = np.array([[1, 0], [2, colliding], [1, 0]], dtype=np.uint64).view(np.int64)
    ids = row_ids(key)
    assert ids[0] == ids[2] != ids[1]


def test_a_pickled_program_has_the_same_table():
    """APs and instructions pickle by their fields and make their rows again when loaded."""
    import pickle
    program = _program(random.Random(10), 50)
    copy = pickle.loads(pickle.dumps(program))
    assert copy == program
    mine, theirs = build(program.instructions), build(copy.instructions)
    for name in ("instr", "slot", "field", "write", "mem", "dtype", "partitions", "start", "offset", "tensor",
                 "pstride", "ndims", "strides", "counts", "first"):
        assert np.array_equal(getattr(mine, name), getattr(theirs, name)), name


def test_replacing_waits_or_signals_keeps_the_rows_an_instruction_would_pack():
    from trnc.isa.rows import instruction_rows
    program = _program(random.Random(11), 40)
    for k, ins in enumerate(program.instructions):
        for changed in (ins.replace(waits=((k, 2),)), ins.replace(signals=(3, k)),
                        ins.replace(waits=((1, 1), (2, 2)), signals=(4,)), ins.replace(waits=((True, 1),)),
                        ins.replace(args=ins.args, waits=((5, 6),))):
            assert changed.rows == instruction_rows(changed)
            assert changed == Instruction(changed.opcode, changed.engine, changed.args, changed.queue,
                                          changed.waits, changed.signals)
