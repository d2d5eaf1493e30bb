"""The assembly text: round trips over generated programs, a golden program, the f32 text form, the
one-line forms used in messages, and bad lines, each an EncodingError naming its line."""
import math
import re
import struct
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import assert_programs_identical, float_from_f32_bits, programs

from trnc.errors import EncodingError
from trnc.isa import asm
from trnc.isa.ap import AP, QUEUES, Engine, Mem, queue_index, queue_name
from trnc.isa.asm import format_ap, format_f32, format_instruction, format_program, parse_program
from trnc.isa.config import DMA_QUEUES
from trnc.isa.dtypes import DType
from trnc.isa.encoding import encode
from trnc.isa.enums import ActFunc, AluOp, ReduceOp, Rounding
from trnc.isa.opcodes import TABLE
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind

# ---------------------------------------------------------------------------------------------
# Round trips


@settings(max_examples=1000, deadline=None)
@given(programs())
def test_parse_inverts_format(program):
    text = format_program(program)
    parsed = parse_program(text)
    assert_programs_identical(parsed, program)
    assert encode(parsed) == encode(program)
    assert format_program(parsed) == text


@pytest.mark.parametrize("spec", TABLE, ids=lambda op: op.name)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_text_round_trip_of_every_opcode(spec, data):
    program = data.draw(programs(max_instructions=4, min_instructions=1, opcodes=(spec,)))
    assert_programs_identical(parse_program(format_program(program)), program)


# ---------------------------------------------------------------------------------------------
# A golden program, written by hand


GOLDEN = """
# a small kernel: load, matmul, evacuate with GELU, store
.target trn3
.tensor a input bf16 [128, 512]
.tensor out.y output fp32 [128,512]

dma0  dma_copy dst=sbuf[0:128]+0:bf16[1,512] src=a[512;128]+0:bf16[1,512] signal=s0
pe    matmul dst=psum[0:128]+2048:fp32[1,512] stationary=sbuf[0:128]:bf16[1,128] \
moving=sbuf[0:128]+0:bf16[1,512] accumulate=true wait=s0>=1 signal=s1   # K=128, M=128, N=512
act   activation src=psum[0:128]+2048:fp32[1,512] dst=sbuf[0:128]+1024:fp32[1,512] func=gelu scale=0.5 \
bias_ap=sbuf[0:128]+4096:fp32 wait=s1>=1 signal=s2
pool  iota dst=sbuf[32:64]-4:int32[-1,4][4,2] base=0x10 partition_step=-3 steps=1,0,0,0
dve   tensor_scalar dst=sbuf[0:1]+8:fp8_e4m3 src=sbuf[0:1]+8:fp8_e4m3 op0=mul scalar0=-0.0 op1=max scalar1=nan:0x7fc00001
dve   tensor_reduce dst=sbuf[0:4]+0:fp32[1,2] src=psum[0:4]+0:bf16[2,2][1,2] op=max axes=2
act   tensor_copy dst=sbuf[0:4]+0:bf16[1,2] src=sbuf[0:4]+64:fp32[1,2] rounding=sr seed=4294967295
dma15 dma_copy dst=out.y[512;128]+0:fp32[1,512] src=sbuf[0:128]+1024:fp32[1,512] wait=s2>=1,s9>=0
"""


def test_golden_program_parses_to_the_expected_instructions():
    sbuf = AP(Mem.SBUF, DType.BF16, 128, ((1, 512),))
    out = AP(Mem.SBUF, DType.FP32, 128, ((1, 512),), offset=1024)
    acc = AP(Mem.PSUM, DType.FP32, 128, ((1, 512),), offset=2048)
    expected = Program(
        (TensorDecl("a", TensorKind.INPUT, DType.BF16, (128, 512)),
         TensorDecl("out.y", TensorKind.OUTPUT, DType.FP32, (128, 512))),
        (Instruction.make("dma_copy", Engine.DMA, queue=0, dst=sbuf, signals=(0,),
                          src=AP(Mem.HBM, DType.BF16, 128, ((1, 512),), tensor=0, partition_stride=512)),
         Instruction.make("matmul", dst=acc, stationary=AP(Mem.SBUF, DType.BF16, 128, ((1, 128),)), moving=sbuf,
                          accumulate=True, waits=((0, 1),), signals=(1,)),
         Instruction.make("activation", dst=out, src=acc, func=ActFunc.GELU, scale=0.5,
                          bias_ap=AP(Mem.SBUF, DType.FP32, 128, (), offset=4096), waits=((1, 1),), signals=(2,)),
         Instruction.make("iota", Engine.POOL, dst=AP(Mem.SBUF, DType.INT32, 32, ((-1, 4), (4, 2)), offset=-4,
                                                       start_partition=32),
                          base=16, partition_step=-3, steps=(1, 0, 0, 0)),
         Instruction.make("tensor_scalar", Engine.DVE, dst=AP(Mem.SBUF, DType.FP8_E4M3, 1, (), offset=8),
                          src=AP(Mem.SBUF, DType.FP8_E4M3, 1, (), offset=8), op0=AluOp.MUL, scalar0=-0.0,
                          op1=AluOp.MAX, scalar1=float_from_f32_bits(0x7FC00001)),
         Instruction.make("tensor_reduce", dst=AP(Mem.SBUF, DType.FP32, 4, ((1, 2),)),
                          src=AP(Mem.PSUM, DType.BF16, 4, ((2, 2), (1, 2))), op=ReduceOp.MAX, axes=2),
         Instruction.make("tensor_copy", Engine.ACT, dst=AP(Mem.SBUF, DType.BF16, 4, ((1, 2),)),
                          src=AP(Mem.SBUF, DType.FP32, 4, ((1, 2),), offset=64), rounding=Rounding.SR, seed=2**32 - 1),
         Instruction.make("dma_copy", Engine.DMA, queue=15, dst=AP(Mem.HBM, DType.FP32, 128, ((1, 512),), tensor=1,
                                                                     partition_stride=512),
                          src=out, waits=((2, 1), (9, 0)))),
        "trn3")
    parsed = parse_program(GOLDEN)
    assert_programs_identical(parsed, expected)
    assert struct.pack("<d", parsed.instructions[4]["scalar1"]) == struct.pack("<d", float_from_f32_bits(0x7FC00001))
    assert math.copysign(1.0, parsed.instructions[4]["scalar0"]) == -1.0


def test_docstring_example_is_in_the_printers_own_form():
    doc = asm.__doc__
    example = textwrap.dedent(doc[doc.index("    .target trn2"):doc.index("(each instruction")]).strip() + "\n"
    program = parse_program(example)
    assert [i.opcode for i in program.instructions] == ["dma_copy", "matmul", "activation", "dma_copy"]
    assert format_program(program) == example


def test_printer_omits_defaults_and_absent_operands_and_names_hbm_tensors():
    program = parse_program(GOLDEN)
    lines = format_program(program).splitlines()
    assert lines[:3] == [".target trn3", ".tensor a input bf16 [128, 512]", ".tensor out.y output fp32 [128, 512]"]
    assert lines[4] == "dma0  dma_copy dst=sbuf[0:128]+0:bf16[1,512] src=a[512;128]+0:bf16[1,512] signal=s0"
    assert "scale_ap" not in lines[6] and "bias=" not in lines[6] and "scale=0.5" in lines[6]
    assert "double_row" not in lines[5] and "accumulate=1" in lines[5]


# ---------------------------------------------------------------------------------------------
# f32 text


@pytest.mark.parametrize("bits, text", [
    (0x3DCCCCCD, "0.1"), (0x80000000, "-0.0"), (0x00000000, "0.0"), (0x3F800000, "1.0"),
    (0x7F800000, "inf"), (0xFF800000, "-inf"), (0x7FC00000, "nan"), (0x7FC00001, "nan:0x7fc00001"),
    (0xFFC00000, "nan:0xffc00000"), (0x7F800001, "nan:0x7f800001"), (0x7F7FFFFF, "3.4028235e+38"),
    (0x00000001, "1e-45"), (0x4B800001, "1.6777218e+07"), (0x42F6E979, "123.456"),
])
def test_f32_text_is_the_shortest_that_reads_back(bits, text):
    assert format_f32(float_from_f32_bits(bits)) == text


@settings(max_examples=1000, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_every_f32_pattern_reads_back_from_its_text(bits):
    text = format_f32(float_from_f32_bits(bits))
    program = parse_program(f"dve memset dst=sbuf[0:1]+0:fp32 value={text}")
    value = program.instructions[0]["value"]
    assert struct.pack("<d", value) == struct.pack("<d", float_from_f32_bits(bits))
    if not math.isnan(value):
        assert len(text.split("e")[0].strip("-").replace(".", "").strip("0")) <= 9   # at most 9 significant digits


@pytest.mark.parametrize("text, bits", [
    ("1", 0x3F800000), ("1.", 0x3F800000), (".5", 0x3F000000), ("+2.5", 0x40200000), ("1e3", 0x447A0000),
    ("NaN", 0x7FC00000), ("INF", 0x7F800000), ("1e39", 0x7F800000), ("-1e-50", 0x80000000),
    ("0.1", 0x3DCCCCCD), ("nan:0xFF812345", 0xFF812345),
])
def test_f32_text_accepts_other_spellings(text, bits):
    value = parse_program(f"dve memset dst=sbuf[0:1]+0:fp32 value={text}").instructions[0]["value"]
    assert struct.pack("<d", value) == struct.pack("<d", float_from_f32_bits(bits))
    if not math.isnan(value):
        assert np.float32(value).view(np.uint32) == bits


# ---------------------------------------------------------------------------------------------
# One-line forms for messages


def test_format_ap_standalone():
    hbm = AP(Mem.HBM, DType.BF16, 4, ((1, 8), (-8, 2)), offset=6, tensor=0, partition_stride=16)
    assert format_ap(hbm) == "hbm@0[16;4]+6:bf16[1,8][-8,2]"
    assert format_ap(hbm, Program((TensorDecl("w", TensorKind.CONST, DType.BF16, (64,)),), ())) == \
        "w[16;4]+6:bf16[1,8][-8,2]"
    assert format_ap(AP(Mem.PSUM, DType.FP32, 32, (), offset=-4, start_partition=96)) == "psum[96:128]-4:fp32"


def test_format_instruction_never_raises_on_ill_typed_values():
    """The verifier prints instructions it rejects; a wrong value prints as ?repr."""
    instr = Instruction.make("tensor_tensor", Engine.DVE, dst=AP(Mem.SBUF, DType.FP32, 1, ()),
                             in0=AP(Mem.HBM, DType.FP32, 1, (), tensor=7), in1=AP(Mem.SBUF, DType.FP32, 1, ()))
    instr = instr.replace(args=tuple((k, "bogus" if k == "op" else v) for k, v in instr.args))
    line = format_instruction(instr, Program((), (instr,)))
    assert line == "dve   tensor_tensor dst=sbuf[0:1]+0:fp32 in0=hbm@7[0;1]+0:fp32 in1=sbuf[0:1]+0:fp32 op=?'bogus'"
    matmul = Instruction.make("matmul", dst=AP(Mem.PSUM, DType.FP32, 1, ()), stationary=AP(Mem.SBUF, DType.BF16, 1, ()),
                              moving=AP(Mem.SBUF, DType.BF16, 1, ()))
    bad = matmul.replace(args=tuple((k, {"accumulate": 2, "double_row": 1}.get(k, v)) for k, v in matmul.args))
    assert format_instruction(bad).endswith(" accumulate=?2 double_row=1")
    iota = Instruction.make("iota", dst=AP(Mem.SBUF, DType.INT32, 1, ()))
    iota = iota.replace(args=tuple((k, {"base": 1.5, "steps": (1, 2.0, 0, 0)}.get(k, v)) for k, v in iota.args))
    assert format_instruction(iota).endswith(" base=?1.5 steps=?(1, 2.0, 0, 0)")


def test_format_program_refuses_what_it_cannot_write():
    on_chip_with_tensor = AP(Mem.SBUF, DType.FP32, 1, (), tensor=0)
    program = Program((TensorDecl("a", TensorKind.INPUT, DType.FP32, (1,)),),
                      (Instruction.make("memset", dst=on_chip_with_tensor),))
    with pytest.raises(EncodingError, match="on-chip"):
        format_program(program)


# ---------------------------------------------------------------------------------------------
# The grammar's latitude


def test_comments_blank_lines_tabs_crlf_field_order_and_defaults():
    text = ("# header\r\n\r\n.target\ttrn1   # the default is trn2\r\n"
            ".tensor  x  scratch  int8  [ 3 ,4 ]\r\n"
            "  dve\tmemset   value=2.5   dst=x[4;3]:int8[1,4]  \r\n"
            "pool tensor_copy src=sbuf[0:2]+0:fp32 dst=sbuf[64:66]+0:bf16\n")
    program = parse_program(text)
    assert program.target == "trn1"
    assert program.tensors == (TensorDecl("x", TensorKind.SCRATCH, DType.INT8, (3, 4)),)
    assert program.instructions[0] == Instruction.make(
        "memset", Engine.DVE, dst=AP(Mem.HBM, DType.INT8, 3, ((1, 4),), tensor=0, partition_stride=4), value=2.5)
    assert program.instructions[1] == Instruction.make(
        "tensor_copy", Engine.POOL, dst=AP(Mem.SBUF, DType.BF16, 2, (), start_partition=64),
        src=AP(Mem.SBUF, DType.FP32, 2, ()))
    assert parse_program("").instructions == () and parse_program("").target == "trn2"


def test_no_field_uses_a_name_the_grammar_reserves():
    for op in TABLE:
        for f in op.fields:
            assert f.name not in ("wait", "signal") and re.fullmatch(r"[a-z][a-z0-9_]*", f.name), (op.name, f.name)


# ---------------------------------------------------------------------------------------------
# Bad lines


_HEAD = ".tensor a input bf16 [128, 512]\n"
BAD_LINES = [
    ("dve matmull dst=sbuf[0:1]+0:fp32", "unknown opcode 'matmull'; expected one of dma_copy, dma_gather"),
    ("dve memset dst=sbuf[0:1]+0:fp32 valu=1", "memset has no field 'valu'; its fields are dst, value, plus wait"),
    ("dma0 dma_copy dst=sbuf[0:1]+0:fp32 src=b[0;1]+0:fp32", "unknown tensor 'b' (declared so far: a; on chip"),
    ("dve memset dst=sbuf[0:1]+0:fp32 value=1.2.3", "field 'value': expected an f32"),
    ("dve memset dst=sbuf[0:1]+0:fp32 value=nan:0x3f800000", "0x3f800000 is not the bit pattern of a NaN"),
    ("pool iota dst=sbuf[0:1]+0:fp32 base=12x", "field 'base': expected an integer"),
    ("pool iota dst=sbuf[0:1]+0:fp32 base=2147483648", "field 'base' = 2147483648 is outside"),
    ("act tensor_copy dst=sbuf[0:1]+0:fp32 src=sbuf[0:1]+0:fp32 seed=-1", "field 'seed' = -1 is outside"),
    ("pool iota dst=sbuf[0:1]+0:fp32 steps=1,2,3", "expected four integers"),
    ("pe matmul dst=psum[0:1]+0:fp32 stationary=sbuf[0:1]+0:bf16 moving=sbuf[0:1]+0:bf16 accumulate=2",
     "field 'accumulate': expected 0, 1, true or false"),
    ("act activation dst=sbuf[0:1]+0:fp32 src=sbuf[0:1]+0:fp32 func=relu6", "unknown ActFunc 'relu6'; expected one of"),
    ("gpu memset dst=sbuf[0:1]+0:fp32", "unknown queue 'gpu'; expected one of pe, act, dve, pool or dmaN"),
    ("dma256 dma_copy dst=sbuf[0:1]+0:fp32 src=sbuf[0:1]+0:fp32", "queue of engine dma = 256 is outside"),
    ("dve memset value=1", "memset needs operand 'dst'"),
    ("dve memset dst=sbuf[0:1]+0:fp32 dst=sbuf[0:1]+0:fp32", "'dst' given twice"),
    ("dve memset dst=sbuf[0:1]+0:fp32 value", "expected FIELD=VALUE, got 'value'"),
    ("dve", "expected QUEUE OPCODE"),
    ("dve memset dst=sbuf[5:5]+0:fp32", "0 <= START < END"),
    ("dve memset dst=sbuf[0;4]+0:fp32", "0 <= START < END"),
    ("dve memset dst=a[0:4]+0:bf16", "an HBM operand is TENSOR[PARTITION_STRIDE;PARTITIONS]"),
    ("dve memset dst=sbuf[0:4]+0:bf17", "unknown dtype 'bf17'"),
    ("dve memset dst=sbuf[0:4]+0:fp32[1]", "expected a free dim [STRIDE,COUNT], got '[1]'"),
    ("dve memset dst=sbuf[0:4]+0:fp32[1,0]", "count = 0 is outside"),
    ("dve memset dst=sbuf[0:4]+0:fp32[1,1][1,1][1,1][1,1][1,1]", "at most 4"),
    ("dve memset dst=sbuf[0:4]0:fp32", "expected an access pattern"),
    ("dve memset dst=sbuf[0:1]+0:fp32 wait=s0>1", "expected a wait sN>=V, got 's0>1'"),
    ("dve memset dst=sbuf[0:1]+0:fp32 signal=0", "expected a semaphore sN, got '0'"),
    ("dve memset dst=sbuf[0:1]+0:fp32 signal=s70000", "signal semaphore = 70000 is outside"),
    (".tensor sbuf input fp32 [1]", "tensor name 'sbuf' is reserved"),
    (".tensor a input fp32 [1]", "tensor name 'a' is declared twice"),
    (".tensor b inputs fp32 [1]", "unknown tensor kind 'inputs'; expected one of input, output, const, scratch"),
    (".tensor b input fp64 [1]", "unknown dtype 'fp64'"),
    (".tensor b input fp32 [1, x]", "shape: expected an integer"),
    (".tensor b input fp32", "expected .tensor NAME KIND DTYPE [D0, D1, ...]"),
    (".tensor 9b input fp32 [1]", "tensor name '9b' is not a name"),
    (".target trn2", "second .target"),
    (".target", "target '' is not a name"),
    (".include x", "unknown directive '.include'; expected .target or .tensor"),
]


@pytest.mark.parametrize("line, fragment", BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_bad_lines_name_the_line_its_text_and_what_was_expected(line, fragment):
    text = f".target trn1\n{_HEAD}\n{line}   # the bad line\n"
    with pytest.raises(EncodingError) as info:
        parse_program(text)
    message = str(info.value)
    assert message.startswith("line 4: "), message
    assert fragment in message, message
    assert f"4 | {line}" in message


def test_parse_refuses_what_is_not_text():
    with pytest.raises(EncodingError, match="expected assembly text"):
        parse_program(b".target trn2")


def test_every_queue_has_one_name_that_parses_back():
    """isa/ap.py names the queues once; assembly, the reference's order and the schedule's indices use it."""
    queues = [(e, q) for e in Engine for q in (range(DMA_QUEUES) if e is Engine.DMA else (0,))]
    assert [queue_name(e, q) for e, q in queues] == list(QUEUES)
    for e, q in queues:
        assert QUEUES[queue_index(e, q)] == Instruction("memset", e, (), q).queue_name
        assert asm._queue(queue_name(e, q)) == (e, q)
