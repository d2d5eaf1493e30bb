"""The verifier's place rules over the operand table (isa/verify.py _place_suspects) find exactly what the
per-instruction rules find: random programs of a few forms at random places, many of them out of bounds,
misaligned, crossing a PSUM bank or partly overlapping, verified both ways."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from trnc.isa import AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind, get_target
from trnc.isa import verify as verifier
from trnc.isa.operand_table import operand_table

F32, I32 = DType.FP32, DType.INT32
TENSORS = (TensorDecl("x", TensorKind.INPUT, F32, (128, 64)), TensorDecl("idx", TensorKind.INPUT, I32, (128, 64)),
           TensorDecl("out", TensorKind.OUTPUT, F32, (64, 64)))
TARGET = "trn3"


def _rare(rng: random.Random, usual, *faults):
    """`usual`, or one of `faults` one time in ten: most faulty instructions then have one fault only."""
    return rng.choice(faults) if rng.random() < 0.1 else usual


def _sbuf(rng: random.Random, partitions: int, dims) -> AP:
    hw = get_target(TARGET)
    offset = _rare(rng, rng.randrange(0, 4096, 4), hw.sbuf_bytes_per_partition - rng.randrange(0, 512, 4),
                   rng.randrange(0, 4096, 4) + 2)
    return AP(Mem.SBUF, F32, partitions, dims, offset, _rare(rng, rng.choice((0, 32, 64, 96)), 16, 100, 8))


def _instruction(rng: random.Random) -> Instruction:
    kind = rng.randrange(3)
    if kind == 0:   # tensor_tensor, sometimes in place or partly overlapping its output
        dst = _sbuf(rng, 32, ((1, 64),))
        shift = _rare(rng, rng.choice((None, 0)), 8, 256)
        in0 = _sbuf(rng, 32, ((1, 64),)) if shift is None else AP(Mem.SBUF, F32, 32, ((1, 64),), dst.offset + shift,
                                                                   dst.start_partition)
        return Instruction.make("tensor_tensor", Engine.DVE, dst=dst, in0=in0, in1=_sbuf(rng, 32, ((1, 64),)),
                                op=AluOp.ADD)
    if kind == 1:   # matmul into PSUM at a random offset: some cross a bank, some leave PSUM
        dst = AP(Mem.PSUM, F32, 64, ((1, 64),), _rare(rng, rng.randrange(0, 7) * 2048, rng.randrange(1, 8) * 2048 - 128, 16384),
                 _rare(rng, rng.choice((0, 64)), 32))
        return Instruction.make("matmul", Engine.PE, dst=dst, stationary=_sbuf(rng, 32, ((1, 64),)),
                                moving=_sbuf(rng, 32, ((1, 64),)))
    hbm = AP(Mem.HBM, F32, 16, ((1, 64),), _rare(rng, rng.randrange(0, 28000, 4), rng.randrange(30000, 40000, 4),
                                                  rng.randrange(0, 28000, 4) + 2),
             tensor=_rare(rng, rng.choice((0, 2)), 1, 3), partition_stride=64)
    sbuf = _sbuf(rng, 16, ((1, 64),))
    dst, src = (hbm, sbuf) if rng.random() < 0.5 else (sbuf, hbm)
    return Instruction.make("dma_copy", Engine.DMA, queue=rng.randrange(2), dst=dst, src=src)


@pytest.mark.parametrize("seed", range(4))
def test_the_table_path_reports_what_the_per_instruction_path_reports(seed, monkeypatch):
    rng = random.Random(seed)
    program = Program(TENSORS, tuple(_instruction(rng) for _ in range(800)), TARGET)
    suspects = []
    real = verifier._place_suspects
    monkeypatch.setattr(verifier, "_place_suspects", lambda *a: suspects.append(real(*a)) or suspects[-1])
    fast = verifier.check(program)

    def no_table(program):
        raise TypeError("no table")

    monkeypatch.setattr(verifier, "operand_table", no_table)
    slow = verifier.check(Program(program.tensors, program.instructions, program.target))
    assert fast == slow
    faulted = {v.index for v in slow if v.rule != "race"}
    rules = {v.rule for v in slow}
    assert {"ap-bounds", "ap-form", "partition-align", "psum-bank", "overlap"} <= rules
    assert 100 < len(faulted) < 600 and len(suspects) == 1
    assert set(suspects[0].tolist()) <= set(range(len(program.instructions)))


def test_a_field_beyond_the_table_or_one_missing_is_refused_after_an_instruction_of_its_form_passed():
    """An instruction of a form that passed, but with one field more (an AP) or its last one missing, still sees
    every rule."""
    rng = random.Random(5)
    good = _instruction(rng)
    while good.opcode != "tensor_tensor" or verifier.check(Program(TENSORS, (good,), TARGET)):
        good = _instruction(rng)
    extra = good.replace(args=(*good.args, ("extra", good["dst"])))
    found = verifier.check(Program(TENSORS, (good, extra), TARGET))
    assert [(v.index, v.rule) for v in found] == [(1, "fields")]
    short = good.replace(args=good.args[:-1])   # its last field (op, not an AP) left out
    found = verifier.check(Program(TENSORS, (good, short), TARGET))
    assert [(v.index, v.rule) for v in found] == [(1, "fields")]


def test_an_on_chip_partition_stride_is_refused_after_an_instruction_of_its_form_passed():
    rng = random.Random(6)
    good = _instruction(rng)
    while good.opcode != "tensor_tensor" or verifier.check(Program(TENSORS, (good,), TARGET)):
        good = _instruction(rng)
    bad = good.replace(args=tuple((k, replace(v, partition_stride=5)) if k == "in1" else (k, v) for k, v in good.args))
    found = verifier.check(Program(TENSORS, (good, bad), TARGET))
    assert [(v.index, v.rule) for v in found] == [(1, "ap-form")]


def test_instructions_of_one_form_have_one_form_key():
    """verify._forms (field rows and the table's instruction forms) is at least as fine as _form_key, what the
    rules read but places: instructions of one form have equal keys (forms also tell in-place operands apart)."""
    rng = random.Random(12)
    instructions = []
    for _ in range(600):
        ins = _instruction(rng)
        if ins.opcode == "tensor_tensor":
            ins = ins.replace(args=tuple((k, rng.choice((AluOp.ADD, AluOp.MUL))) if k == "op" else (k, v)
                                         for k, v in ins.args))
        instructions.append(ins)
        instructions.append(Instruction.make(   # immediates, an enum and an optional operand, all varied
            "activation", Engine.ACT, dst=_sbuf(rng, 32, ((1, 64),)), src=_sbuf(rng, 32, ((1, 64),)),
            func=rng.choice((ActFunc.EXP, ActFunc.TANH)), scale=rng.choice((0.5, 1, 1.0, 2.0)),
            bias=rng.choice((0.0, 3.0)), bias_ap=rng.choice((None, _sbuf(rng, 32, ((1, 1),))))))
    program = Program(TENSORS, tuple(instructions), TARGET)
    forms = verifier._forms(program, operand_table(program)).tolist()
    keys: dict = {}
    for ins, form in zip(program.instructions, forms):
        assert keys.setdefault(form, verifier._form_key(ins)) == verifier._form_key(ins)
    assert len(set(keys.values())) > 25   # the queue is not in the key: it is checked apart, like places


@pytest.mark.parametrize("queue", [16, -1, True, 2**63])
def test_a_queue_out_of_range_is_refused_after_an_instruction_of_its_form_passed(queue):
    """The queue is not part of a form (the rule is checked on every instruction apart): a DMA on a queue out of
    range, or not an integer, after the same DMA on a valid queue; a compute engine on a queue but 0 likewise."""
    rng = random.Random(7)
    good = _instruction(rng)
    while good.opcode != "dma_copy" or verifier.check(Program(TENSORS, (good,), TARGET)):
        good = _instruction(rng)
    found = verifier.check(Program(TENSORS, (good, good.replace(queue=queue)), TARGET))
    assert {(v.index, v.rule) for v in found} - {(1, "race")} == {(1, "queue")}   # on two queues, they may race
    while good.opcode != "tensor_tensor" or verifier.check(Program(TENSORS, (good,), TARGET)):
        good = _instruction(rng)
    found = verifier.check(Program(TENSORS, (good, good.replace(queue=1 if queue is not True else queue)), TARGET))
    assert [(v.index, v.rule) for v in found] == [(1, "queue")]
