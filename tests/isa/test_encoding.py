"""The binary encoding: round trips over generated programs, the documented layout byte for byte, and
malformed input, which must raise EncodingError naming the byte offset (never another exception, a hang
or a huge allocation)."""
import dataclasses
import math
import re
import struct
import time

import numpy as np
import pytest
import strategies
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import assert_programs_identical, float_from_f32_bits, programs

from trnc.errors import EncodingError
from trnc.isa import encoding, verify
from trnc.isa.ap import AP, Engine, Mem
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.isa.decoding import decode
from trnc.isa.encoding import LAYOUT_DOC, MAGIC, encode, f32_bits, f32_value
from trnc.isa.enums import ActFunc, ReduceOp
from trnc.isa.opcodes import TABLE, Kind, opspec
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind
from trnc.isa.rows import instruction_rows, parts

# ---------------------------------------------------------------------------------------------
# Round trips


@settings(max_examples=1000, deadline=None)
@given(programs())
def test_decode_inverts_encode(program):
    data = encode(program)
    decoded = decode(data)
    assert_programs_identical(decoded, program)
    assert encode(decoded) == data
    for ins in decoded.instructions:   # the rows the decoder packs are those the instruction would pack itself
        assert ins.rows == instruction_rows(ins)
        assert None not in parts(ins.rows)


@pytest.mark.parametrize("spec", TABLE, ids=lambda op: op.name)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip_of_every_opcode(spec, data):
    program = data.draw(programs(max_instructions=4, min_instructions=1, opcodes=(spec,)))
    assert_programs_identical(decode(encode(program)), program)


@settings(max_examples=150, deadline=None)
@given(programs(valid_only=True))
def test_valid_programs_pass_the_verifier_and_round_trip(program):
    """The generators' valid mode (tests/strategies.py) agrees with isa/verify.py."""
    assert [v.describe(program) for v in verify.check(program)] == []
    assert_programs_identical(decode(encode(program)), program)


# ---------------------------------------------------------------------------------------------
# F32 immediates


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_f32_bits_and_value_invert_each_other_on_every_pattern(bits):
    value = f32_value(bits)
    assert f32_bits(value) == bits
    assert struct.pack("<d", value) == struct.pack("<d", float_from_f32_bits(bits))
    if not math.isnan(value):
        assert value == float(np.array(bits, dtype=np.uint32).view(np.float32))


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=False))
def test_f32_bits_rounds_doubles_like_numpy(x):
    with np.errstate(over="ignore"):
        expected = int(np.array(x, dtype=np.float64).astype(np.float32).view(np.uint32))
    assert f32_bits(x) == expected


@pytest.mark.parametrize("double_bits, f32", [
    (0x7FF8000000000000, 0x7FC00000),   # float("nan")
    (0xFFF8000000000000, 0xFFC00000),   # -nan keeps its sign
    (0x7FF0000000000001, 0x7FC00000),   # payload only in the low 29 bits: the quiet NaN of that sign
    (0xFFF0000000000001, 0xFFC00000),
    (0x7FF0000020000000, 0x7F800001),   # a signalling fp32 NaN stays signalling
])
def test_f32_bits_of_nan_doubles(double_bits, f32):
    assert f32_bits(struct.unpack("<d", struct.pack("<Q", double_bits))[0]) == f32


# ---------------------------------------------------------------------------------------------
# The layout, byte for byte, from the documented table


def _name(text: bytes) -> bytes:
    return struct.pack("<H", len(text)) + text


def _tensor(name=b"x", kind=1, dtype=DType.BF16.code, shape=(2, 3), rank=None) -> bytes:
    return _name(name) + struct.pack("<BBB", kind, dtype, len(shape) if rank is None else rank) + \
        b"".join(struct.pack("<Q", s) for s in shape)


def _ap(tag=1, dtype=DType.FP32.code, start=0, partitions=4, tensor=-1, pstride=0, offset=0, dims=((1, 8),),
        ndims=None) -> bytes:
    head = struct.pack("<BBBIIiqq", tag, dtype, len(dims) if ndims is None else ndims, start, partitions, tensor,
                       pstride, offset)
    return head + b"".join(struct.pack("<qI", s, c) for s, c in dims)


def _instr(opcode, engine, fields: bytes, queue=0, waits=(), signals=(), code=None, nwaits=None) -> bytes:
    head = struct.pack("<HBBHH", opspec(opcode).code if code is None else code, engine, queue,
                       len(waits) if nwaits is None else nwaits, len(signals))
    return head + fields + b"".join(struct.pack("<HI", s, v) for s, v in waits) + \
        b"".join(struct.pack("<H", s) for s in signals)


_X_BYTES = _tensor()


def _program(tensors=(_X_BYTES,), instrs=(), target=b"trn1", version=1, magic=MAGIC, ntensors=None,
             ninstrs=None) -> bytes:
    return (magic + struct.pack("<H", version) + _name(target)
            + struct.pack("<I", len(tensors) if ntensors is None else ntensors) + b"".join(tensors)
            + struct.pack("<I", len(instrs) if ninstrs is None else ninstrs) + b"".join(instrs))


def _memset(ap_bytes=None, value=0x80000000) -> bytes:
    return _instr("memset", 2, (_ap(start=32, offset=16) if ap_bytes is None else ap_bytes) + struct.pack("<I", value),
                  waits=((3, 7),), signals=(9,))


def test_layout_doc_is_the_module_docstring_table():
    assert LAYOUT_DOC in encoding.__doc__
    rows = [line.split(" | ") for line in LAYOUT_DOC.splitlines()[2:]]
    parts = {row[0].strip("| ") for row in rows}
    assert {"program", "name", "tensor", "instruction", "wait", "field", "ap", "ap_body", "ap_dim"} <= parts
    assert {row[1] for row in rows if row[0] == "| field"} == {k.value for k in Kind}


def test_encoding_matches_the_documented_layout_byte_for_byte():
    sbuf = AP(Mem.SBUF, DType.FP32, 4, ((1, 8),), offset=16, start_partition=32)
    hbm = AP(Mem.HBM, DType.BF16, 2, ((1, 3),), tensor=0, partition_stride=3)
    column = AP(Mem.PSUM, DType.FP32, 4, (), offset=2048, start_partition=64)
    program = Program(
        (TensorDecl("x", TensorKind.OUTPUT, DType.BF16, (2, 3)),),
        (Instruction.make("memset", Engine.DVE, dst=sbuf, value=-0.0, waits=((3, 7),), signals=(9,)),
         Instruction.make("dma_copy", queue=5, dst=hbm, src=AP(Mem.SBUF, DType.BF16, 2, ((-1, 3),), offset=4)),
         Instruction.make("activation", dst=sbuf, src=sbuf, func=ActFunc.EXP, scale=f32_value(0x7FC00001),
                          bias=0.5, accum=column),
         Instruction.make("iota", Engine.POOL, dst=sbuf, base=-5, partition_step=2, steps=(1, -1, 0, 7))),
        "trn1")
    dst = _ap(start=32, offset=16)
    expected = _program(instrs=(
        _memset(),
        _instr("dma_copy", 4, _ap(tag=3, dtype=DType.BF16.code, partitions=2, tensor=0, pstride=3, dims=((1, 3),))
               + _ap(dtype=DType.BF16.code, partitions=2, offset=4, dims=((-1, 3),)), queue=5),
        _instr("activation", 1, dst + dst + struct.pack("<BI", ActFunc.EXP, 0x7FC00001) + b"\0"
               + struct.pack("<I", 0x3F000000) + b"\0" + _ap(tag=2, start=64, offset=2048, dims=())),
        _instr("iota", 3, dst + struct.pack("<ii4i", -5, 2, 1, -1, 0, 7)),
    ))
    assert encode(program) == expected
    assert_programs_identical(decode(expected), program)


# ---------------------------------------------------------------------------------------------
# Malformed input


def _rich_program(copies: int = 2) -> Program:
    """Valid instructions of every opcode, optional operands present and absent, waits and signals."""
    tensors = (TensorDecl("t0", TensorKind.INPUT, DType.BF16, (64, 64)),
               TensorDecl("t1", TensorKind.OUTPUT, DType.FP32, (8, 16)))
    hw = get_target("trn3")
    instrs = [strategies.valid_instruction(strategies.Rand(seed), op, hw, tensors).replace(
        waits=((seed % 3, seed),), signals=(seed,)) for seed in range(copies) for op in TABLE]
    return Program(tensors, tuple(instrs), "trn3")


SMALL = encode(_rich_program(copies=1))


def _offset(message: str) -> int:
    m = re.match(r"byte (\d+): ", message)
    assert m, f"no byte offset in {message!r}"
    return int(m.group(1))


def test_every_truncation_is_an_encoding_error_at_or_before_the_cut():
    for n in range(len(SMALL)):
        with pytest.raises(EncodingError) as info:
            decode(SMALL[:n])
        assert _offset(str(info.value)) <= n


def test_every_single_byte_corruption_is_refused_or_decodes_to_exactly_those_bytes():
    """A decoder that let a corruption through would give a program that does not encode to the same bytes."""
    for i in range(len(SMALL)):
        for new in {SMALL[i] ^ 0x01, SMALL[i] ^ 0xFF}:
            data = SMALL[:i] + bytes([new]) + SMALL[i + 1:]
            try:
                program = decode(data)
            except EncodingError as e:
                _offset(str(e))
                continue
            assert encode(program) == data


@settings(max_examples=300, deadline=None)
@given(programs(max_instructions=4), st.data())
def test_mutated_encodings_are_refused_or_round_trip(program, data):
    blob = bytearray(encode(program))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(blob)))
        action = data.draw(st.sampled_from(["overwrite", "insert", "delete"]))
        chunk = data.draw(st.binary(min_size=1, max_size=8))
        if action == "overwrite":
            blob[at:at + len(chunk)] = chunk
        elif action == "insert":
            blob[at:at] = chunk
        else:
            del blob[at:at + len(chunk)]
    try:
        decoded = decode(bytes(blob))
    except EncodingError as e:
        _offset(str(e))
        return
    assert encode(decoded) == bytes(blob)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_random_bytes_are_refused(tail, with_header):
    data = (MAGIC + b"\x01\x00" + tail) if with_header else tail
    try:
        decoded = decode(data)
    except EncodingError as e:
        _offset(str(e))
        return
    assert encode(decoded) == data


_TENSOR_AT = len(_program(tensors=())) - 4           # the first tensor (after the tensor count)
_INSTR_AT = len(_program()) + 0                       # the first instruction (after the instruction count)
_FIELDS_AT = _INSTR_AT + 8                            # its first field


def _with_instr(instr: bytes) -> bytes:
    return _program(instrs=(instr,))


MALFORMED = [
    ("empty input", b"", 0, "truncated header"),
    ("not a trnc file", b"PK\x03\x04" + bytes(40), 0, "bad magic"),
    ("wrong magic", _program(magic=b"TRNCISB\0"), 0, "bad magic"),
    ("unsupported version", _program(version=2), 8, "unsupported format version 2"),
    ("version zero", _program(version=0), 8, "unsupported format version 0"),
    ("target longer than the input", MAGIC + b"\x01\x00\xff\xfftrn1", 10, "exceeds"),
    ("target not UTF-8", _program(target=b"\xff\xfe"), 12, "not UTF-8"),
    ("target not a name", _program(target=b"trn 1"), 12, "not a name"),
    ("empty target", _program(target=b""), 12, "not a name"),
    ("tensor count past the input", _program(ntensors=2**32 - 1), 16, "tensor count 4294967295"),
    ("tensor kind", _program(tensors=(_tensor(kind=9),)), _TENSOR_AT + 3, "unknown tensor kind 9"),
    ("tensor dtype", _program(tensors=(_tensor(dtype=99),)), _TENSOR_AT + 4, "unknown dtype code 99"),
    ("tensor rank past the input", _program(tensors=(_tensor(shape=(), rank=200),)), _TENSOR_AT + 5, "rank 200 needs"),
    ("reserved tensor name", _program(tensors=(_tensor(name=b"sbuf"),)), _TENSOR_AT, "reserved"),
    ("duplicate tensor name", _program(tensors=(_tensor(), _tensor())), _TENSOR_AT + len(_tensor()), "declared twice"),
    ("tensor name not UTF-8", _program(tensors=(_tensor(name=b"a\xc3"),)), _TENSOR_AT + 2, "not UTF-8"),
    ("instruction count past the input", _program(ninstrs=2**32 - 1), _INSTR_AT - 4, "instruction count 4294967295"),
    ("unknown opcode", _with_instr(_instr("memset", 2, b"", code=0xFFFF)), _INSTR_AT, "unknown opcode 65535"),
    ("opcode zero", _with_instr(_instr("memset", 2, b"", code=0)), _INSTR_AT, "unknown opcode 0"),
    ("unknown engine", _with_instr(_instr("memset", 9, _ap() + bytes(4))), _INSTR_AT + 2, "unknown engine 9"),
    ("queue on a compute engine", _with_instr(_instr("memset", 2, _ap() + bytes(4), queue=3)), _INSTR_AT + 3,
     "only DMA instructions have a queue"),
    ("wait count past the input", _with_instr(_instr("memset", 2, _ap() + bytes(4), nwaits=0xFFFF)), _INSTR_AT + 4,
     "65535 waits"),
    ("bool not 0 or 1", _with_instr(_instr("matmul", 0, _ap(tag=2) + _ap() + _ap() + b"\x02\x00")),
     _FIELDS_AT + 3 * len(_ap()), "bool byte is 2"),
    ("enum value out of range", _with_instr(_instr("tensor_tensor", 2, _ap() * 3 + b"\xc8")),
     _FIELDS_AT + 3 * len(_ap()), "200 is not a AluOp"),
    ("memory tag", _with_instr(_instr("memset", 2, _ap(tag=7) + bytes(4))), _FIELDS_AT, "unknown memory tag 7"),
    ("required operand absent", _with_instr(_instr("memset", 2, b"\x00" + bytes(4))), _FIELDS_AT, "required"),
    ("operand dtype", _with_instr(_instr("memset", 2, _ap(dtype=99) + bytes(4))), _FIELDS_AT + 1,
     "unknown dtype code 99"),
    ("five free dims", _with_instr(_instr("memset", 2, _ap(ndims=5) + bytes(4))), _FIELDS_AT + 2, "5 free dims"),
    ("zero partitions", _with_instr(_instr("memset", 2, _ap(partitions=0) + bytes(4))), _FIELDS_AT + 7,
     "partitions is 0"),
    ("zero count", _with_instr(_instr("memset", 2, _ap(dims=((1, 2), (5, 0))) + bytes(4))), _FIELDS_AT + 31 + 12 + 8,
     "dim 1 has count 0"),
    ("HBM tensor index past the declarations", _with_instr(_instr("memset", 2, _ap(tag=3, tensor=1) + bytes(4))),
     _FIELDS_AT + 11, "tensor index 1 outside"),
    ("HBM tensor index negative", _with_instr(_instr("memset", 2, _ap(tag=3, tensor=-1) + bytes(4))),
     _FIELDS_AT + 11, "tensor index -1 outside"),
    ("HBM start partition", _with_instr(_instr("memset", 2, _ap(tag=3, tensor=0, start=5) + bytes(4))),
     _FIELDS_AT + 3, "start_partition 5 of an HBM"),
    ("on-chip tensor index", _with_instr(_instr("memset", 2, _ap(tensor=0) + bytes(4))), _FIELDS_AT + 11,
     "on-chip operand has tensor -1"),
    ("on-chip partition stride", _with_instr(_instr("memset", 2, _ap(pstride=4) + bytes(4))), _FIELDS_AT + 11,
     "on-chip operand has tensor -1"),
    ("truncated immediate", _with_instr(_memset())[:-10], _FIELDS_AT + len(_ap(start=32, offset=16)),
     "truncated immediate fields"),
    ("trailing garbage", _with_instr(_memset()) + b"\x00", len(_with_instr(_memset())), "1 bytes of trailing garbage"),
]


def test_the_hand_built_base_program_is_valid():
    """The malformed cases differ from this program in one field each."""
    program = decode(_with_instr(_memset()))
    assert program.instructions[0]["dst"] == AP(Mem.SBUF, DType.FP32, 4, ((1, 8),), offset=16, start_partition=32)
    assert program.instructions[0].waits == ((3, 7),) and program.instructions[0].signals == (9,)


@pytest.mark.parametrize("data, offset, fragment", [case[1:] for case in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_input_names_the_offset_and_the_problem(data, offset, fragment):
    start = time.perf_counter()
    with pytest.raises(EncodingError) as info:
        decode(data)
    assert time.perf_counter() - start < 1.0    # counts are checked against the input, not looped over
    assert _offset(str(info.value)) == offset, str(info.value)
    assert fragment in str(info.value)


def test_decode_refuses_what_is_not_bytes():
    with pytest.raises(EncodingError, match="expected bytes"):
        decode("TRNCISA")


# ---------------------------------------------------------------------------------------------
# encode refuses programs that are not well-formed


_SBUF = AP(Mem.SBUF, DType.FP32, 4, ((1, 8),))
_HBM = AP(Mem.HBM, DType.BF16, 2, ((1, 3),), tensor=0, partition_stride=3)
_X = TensorDecl("x", TensorKind.INPUT, DType.BF16, (2, 3))


def _one(instr, tensors=(_X,), target="trn2") -> Program:
    return Program(tensors, (instr,), target)


def _memset_with(**changes) -> Instruction:
    return Instruction.make("memset", Engine.DVE, dst=dataclasses.replace(_SBUF, **changes))


def _with_arg(opcode, engine, name, value, **fields) -> Instruction:
    instr = Instruction.make(opcode, engine, **fields)
    return instr.replace(args=tuple((k, value if k == name else v) for k, v in instr.args))


ILL_FORMED = [
    ("on-chip AP with a tensor", _one(_memset_with(tensor=0)), "tensor index (on-chip"),
    ("on-chip AP with a partition stride", _one(_memset_with(partition_stride=2)), "partition_stride (on-chip"),
    ("HBM AP past the tensors", _one(Instruction.make("dma_copy", dst=_SBUF, src=dataclasses.replace(_HBM, tensor=1))),
     "tensor index (the program declares 1 tensors) = 1 is outside [0, 0]"),
    ("HBM AP with a start partition", _one(Instruction.make("dma_copy", dst=_SBUF, src=dataclasses.replace(
        _HBM, start_partition=2))), "start_partition (HBM"),
    ("zero partitions", _one(_memset_with(partitions=0)), "partitions = 0"),
    ("zero count", _one(_memset_with(dims=((1, 0),))), "count = 0"),
    ("five dims", _one(_memset_with(dims=((1, 2),) * 5)), "at most 4"),
    ("stride past i64", _one(_memset_with(dims=((2**63, 2),))), "stride = 9223372036854775808 is outside"),
    ("float offset", _one(_memset_with(offset=1.5)), "offset must be an integer"),
    ("dims as a list", _one(_memset_with(dims=[(1, 2)])), "dims must be a tuple"),
    ("queue on a compute engine", _one(Instruction.make("memset", Engine.DVE, queue=1, dst=_SBUF)), "queue of engine dve"),
    ("DMA queue past u8", _one(Instruction.make("dma_copy", queue=256, dst=_SBUF, src=_SBUF)), "queue of engine dma"),
    ("unknown opcode", _one(Instruction.make("memset", dst=_SBUF).replace(opcode="memclear")), "unknown opcode"),
    ("engine not an Engine", _one(Instruction.make("memset", dst=_SBUF).replace(engine=2)), "engine must be an Engine"),
    ("enum of the wrong type", _one(_with_arg("tensor_tensor", Engine.DVE, "op", ReduceOp.MAX, dst=_SBUF, in0=_SBUF,
                                              in1=_SBUF)), "'op' must be a AluOp"),
    ("enum as an int", _one(_with_arg("tensor_tensor", Engine.DVE, "op", 1, dst=_SBUF, in0=_SBUF, in1=_SBUF)),
     "'op' must be a AluOp"),
    ("bool 2", _one(_with_arg("matmul", Engine.PE, "accumulate", 2, dst=_SBUF, stationary=_SBUF, moving=_SBUF)),
     "'accumulate' must be a bool"),
    ("i32 past its range", _one(Instruction.make("iota", dst=_SBUF, base=2**31)), "'base' = 2147483648 is outside"),
    ("negative u32", _one(Instruction.make("tensor_copy", dst=_SBUF, src=_SBUF, seed=-1)), "'seed' = -1 is outside"),
    ("i32x4 of three", _one(_with_arg("iota", Engine.POOL, "steps", (1, 2, 3), dst=_SBUF)), "tuple of 4 int32"),
    ("f32 given as text", _one(Instruction.make("memset", dst=_SBUF, value="1.0")), "'value' must be a float"),
    ("fields out of order", _one(Instruction.make("dma_copy", dst=_SBUF, src=_SBUF).replace(
        args=(("src", _SBUF), ("dst", _SBUF)))), "args must be"),
    ("required operand missing", _one(Instruction.make("dma_copy", dst=_SBUF, src=_SBUF).replace(
        args=(("dst", _SBUF), ("src", None)))), "'src' is required"),
    ("wait semaphore past u16", _one(Instruction.make("memset", dst=_SBUF, waits=((70000, 1),))), "wait semaphore"),
    ("negative wait value", _one(Instruction.make("memset", dst=_SBUF, waits=((1, -1),))), "wait value"),
    ("negative signal", _one(Instruction.make("memset", dst=_SBUF, signals=(-1,))), "signal semaphore"),
    ("reserved tensor name", Program((TensorDecl("psum", TensorKind.INPUT, DType.FP32, (1,)),), ()), "reserved"),
    ("duplicate tensor names", Program((_X, _X), ()), "declared twice"),
    ("tensor name with a space", Program((TensorDecl("a b", TensorKind.INPUT, DType.FP32, (1,)),), ()), "not a name"),
    ("negative tensor size", Program((TensorDecl("a", TensorKind.INPUT, DType.FP32, (-1,)),), ()), "dimension = -1"),
    ("tensor kind not a TensorKind", Program((TensorDecl("a", 0, DType.FP32, (1,)),), ()), "kind must be a TensorKind"),
    ("target with a space", Program((), (), "trn 2"), "target 'trn 2' is not a name"),
    ("instructions as a list", Program((), [], "trn2"), "must be tuples"),
]


@pytest.mark.parametrize("program, fragment", [case[1:] for case in ILL_FORMED], ids=[c[0] for c in ILL_FORMED])
def test_encode_refuses_ill_formed_programs(program, fragment):
    with pytest.raises(EncodingError) as info:
        encode(program)
    assert fragment in str(info.value)


def test_equivalent_value_types_encode_like_the_canonical_ones():
    """numpy ints, 0/1 for bools and ints for f32 are accepted and decode to the canonical types."""
    canonical = _one(Instruction.make("matmul", dst=_SBUF, stationary=_SBUF, moving=_SBUF, accumulate=True))
    loose = _one(_with_arg("matmul", Engine.PE, "accumulate", 1, dst=AP(Mem.SBUF, DType.FP32, np.int64(4), ((1, 8),)),
                           stationary=_SBUF, moving=_SBUF))
    assert encode(loose) == encode(canonical)
    assert decode(encode(loose)).instructions[0]["accumulate"] is True
    huge = decode(encode(_one(Instruction.make("memset", dst=_SBUF, value=10**400))))
    assert huge.instructions[0]["value"] == math.inf


def test_error_messages_name_the_instruction():
    program = Program((_X,), (Instruction.make("memset", dst=_SBUF), Instruction.make("iota", dst=_SBUF, base=2**40)))
    with pytest.raises(EncodingError, match=r"instruction 1 \(iota\): field 'base'"):
        encode(program)


# ---------------------------------------------------------------------------------------------
# Speed


def test_a_100k_instruction_program_encodes_and_decodes_in_seconds():
    base = _rich_program()
    program = Program(base.tensors, base.instructions * (100_000 // len(base.instructions) + 1), base.target)
    start = time.process_time()
    data = encode(program)
    encoded = time.process_time()
    decoded = decode(data)
    done = time.process_time()
    assert encoded - start < 10 and done - encoded < 10, (encoded - start, done - encoded)
    assert len(decoded.instructions) == len(program.instructions) >= 100_000
    tail = slice(-len(base.instructions), None)
    assert_programs_identical(Program(decoded.tensors, decoded.instructions[tail], decoded.target),
                              Program(base.tensors, program.instructions[tail], base.target))
