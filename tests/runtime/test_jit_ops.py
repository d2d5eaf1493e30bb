"""The JIT against the reference interpreter, bit for bit, on every opcode; the comparison the dtype matrix uses too.

Each case is one random valid instruction (tests/strategies.py `valid_instruction`: every legal
engine, memory and dtype, dims permuted and reversed, so negative strides and HBM partition strides
occur) on random data: memories start from random bytes, and every operand is then filled with
values of its dtype (normal values across many binades, zeros, infinities, NaNs and raw bit
patterns). The same state runs through runtime/reference.Machine and through the JIT, and the whole
of SBUF, PSUM and HBM must agree afterwards: written operands bit for bit with NaN by class, every
other byte exactly (so a stray write fails too).

Hypothesis draws the cases: a seed per case (which `Rand` expands into the instruction and its data)
and, for the opcodes in ENUM_FIELDS, the enum value. Runs are derandomized, so CI sees the same cases every
time. A seed is opaque (a smaller seed is no simpler case), so failures are reported at once, with the
seed and the instruction's assembly, instead of shrunk. tests/runtime/test_jit_dtypes.py adds the cases
that make every legal (opcode, operand, dtype) combination run.
"""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from strategies import Rand, valid_instruction
from trnc.isa import (
    AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, ReduceOp, ScaleMode, TensorDecl, TensorKind,
    get_target, opspec,
)
from trnc.isa.asm import format_instruction
from trnc.isa.dtypes import VALUE_DTYPES
from trnc.isa.verify import verify
from trnc.runtime.convert import bits_equal_or_both_nan, from_fp32
from trnc.runtime.jit import kernels_vector
from trnc.runtime.jit.executor import load
from trnc.runtime.reference import Machine

pytestmark = pytest.mark.usefixtures("private_cache")

TARGET = "trn3"     # has every opcode (MX) and fp8 double-row matmul
HW = get_target(TARGET)
TENSORS = tuple(TensorDecl(f"t_{d.text}", TensorKind.INPUT, d, (64, 128))
                for d in sorted(VALUE_DTYPES, key=lambda d: d.code))
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0], dtype=np.float32)
_BACKGROUND = np.random.default_rng(1234)
SBUF_BYTES = _BACKGROUND.integers(0, 256, (HW.partitions, HW.sbuf_bytes_per_partition), dtype=np.uint8)
PSUM_BYTES = _BACKGROUND.integers(0, 256, (HW.partitions, HW.psum_bytes_per_partition), dtype=np.uint8)
SEEDS = st.integers(0, 2**32 - 1)
# Settings of every JIT differential test: repeatable, no deadline (a case compiles kernels), no shrinking.
HYPOTHESIS = {"deadline": None, "derandomize": True, "database": None, "phases": (Phase.explicit, Phase.generate)}


def random_values(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """n storage values of `dtype`: mostly normal values over many binades, some specials and raw bit patterns."""
    if dtype.is_int:
        info = np.iinfo(dtype.storage)
        wide = rng.integers(info.min, info.max, n, endpoint=True, dtype=np.int64)
        small = rng.integers(max(info.min, -300), min(info.max, 300), n, endpoint=True)
        return np.where(rng.random(n) < 0.3, wide, small).astype(dtype.storage)
    if dtype is DType.E8M0:
        codes = np.where(rng.random(n) < 0.8, rng.integers(100, 155, n), rng.integers(0, 256, n))
        return codes.astype(np.uint8).view(dtype.storage)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-10, 10, n))).astype(np.float32)
    x = np.where(rng.random(n) < 0.06, rng.choice(SPECIALS, n), x)
    codes = from_fp32(x, dtype).view(UINT[dtype.itemsize])
    raw_bits = 4 if dtype is DType.FP4_E2M1 else 8 * dtype.itemsize
    raw = rng.integers(0, 2 ** raw_bits, n, dtype=np.uint64).astype(UINT[dtype.itemsize])
    return np.where(rng.random(n) < 0.1, raw, codes).view(dtype.storage)


def fill_operands(m: Machine, ins: Instruction, rng: np.random.Generator, gather_ok: bool = True) -> None:
    """Random values in every operand; gather indices inside the table (unless gather_ok is False)."""
    for name, ap, _ in sorted(ins.operands(), key=lambda o: not o[2]):
        if ins.opcode == "dma_gather" and name == "index":
            rows = ins["table"].partitions
            lo, hi = (0, rows) if gather_ok else (rows, rows + 5)
            values = rng.integers(lo, hi, ap.num_elements).astype(np.int32)
        else:
            values = random_values(rng, ap.dtype, ap.num_elements)
        m.write(ap, values.reshape(ap.partitions, -1))


_BUFFERS: dict[str, np.ndarray] = {}


def reset(name: str, source: np.ndarray) -> np.ndarray:
    """The buffer `name`, kept across cases, now holding a copy of `source`: allocating a fresh 30 MiB SBUF
    for every case costs about as much as the JIT's work."""
    buf = _BUFFERS.get(name)
    if buf is None or buf.shape != source.shape:
        buf = _BUFFERS[name] = np.empty_like(source)
    np.copyto(buf, source)
    return buf


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Byte equality of two equal-shape memories, 8 bytes at a time when rows allow (SBUF is 30 MiB)."""
    if a.shape[-1] % 8 == 0 and a.flags.c_contiguous and b.flags.c_contiguous:
        return bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))
    return bool(np.array_equal(a, b))


def check_against_reference(ins: Instruction, seed: int, tensors: tuple[TensorDecl, ...] = TENSORS) -> None:
    """Run `ins` from the same random state on both; assert every written operand and every other byte agree."""
    program = Program(tensors, (ins,), TARGET)
    verify(program)
    rng = np.random.default_rng(seed)
    ref = Machine(program)
    ref.sbuf, ref.psum = reset("reference sbuf", SBUF_BYTES), reset("reference psum", PSUM_BYTES)
    fill_operands(ref, ins, rng)
    jit = copy.copy(ref)       # reads and writes the JIT's memories, set next
    jit.sbuf, jit.psum = reset("jit sbuf", ref.sbuf), reset("jit psum", ref.psum)
    jit.hbm = {i: a.copy() for i, a in ref.hbm.items()}
    ref.execute(ins)
    load(program, verified=True).execute(jit.sbuf, jit.psum, [jit.hbm[i] for i in range(len(tensors))])
    for name, ap, write in ins.operands():
        if not write:
            continue
        want, got = ref.read(ap).reshape(ap.partitions, -1), jit.read(ap).reshape(ap.partitions, -1)
        same = bits_equal_or_both_nan(got, want, ap.dtype)
        if not same.all():
            p, e = (int(v[0]) for v in np.nonzero(~same))
            bits = UINT[ap.dtype.itemsize]
            pytest.fail(f"{name} differs at element (p={p}, e={e}) of {int((~same).sum())}: JIT "
                        f"{got[p, e]!r} (0x{int(got[p, e:e + 1].view(bits)[0]):x}), reference {want[p, e]!r} "
                        f"(0x{int(want[p, e:e + 1].view(bits)[0]):x}) [seed {seed}]\n    "
                        f"{format_instruction(ins, program)}")
        jit.write(ap, want)    # NaN payloads may differ; make them equal before the byte comparison
    for what, a, b in [("sbuf", jit.sbuf, ref.sbuf), ("psum", jit.psum, ref.psum)] + \
            [(f"tensor {i}", jit.hbm[i], ref.hbm[i]) for i in range(len(tensors))]:
        if not same_bytes(a, b):
            where = np.argwhere(a != b)[0]
            pytest.fail(f"the JIT changed {what} at {tuple(int(x) for x in where)}, outside the written operands "
                        f"[seed {seed}]\n    {format_instruction(ins, program)}")


# Enum fields whose value hypothesis draws (any value is legal on the drawn engine).
ENUM_FIELDS = {"activation": ("func", ActFunc), "tensor_tensor": ("op", AluOp), "tensor_reduce": ("op", ReduceOp),
               "partition_reduce": ("op", ReduceOp), "quantize_mx": ("scale_mode", ScaleMode)}


def random_instruction(opcode: str, seed: int, pins: dict | None = None) -> Instruction:
    """A random valid instruction; `pins` fixes fields (tests/strategies.py `valid_instruction`)."""
    return valid_instruction(Rand(seed), opspec(opcode), HW, TENSORS, pins)


CASES = {   # opcode -> hypothesis examples
    "dma_copy": 24, "dma_gather": 12, "matmul": 16, "matmul_mx": 10, "transpose": 16, "activation": 28,
    "tensor_tensor": 34, "tensor_scalar": 20, "tensor_reduce": 15, "tensor_copy": 24, "memset": 12, "iota": 12,
    "select": 12, "affine_select": 12, "partition_reduce": 12, "partition_broadcast": 12, "quantize_mx": 12,
    "random": 12,
}


def test_cases_cover_every_opcode():
    from trnc.isa.opcodes import TABLE
    assert set(CASES) == {op.name for op in TABLE}


@pytest.mark.parametrize("opcode", sorted(CASES))
def test_random_instructions_match_the_reference(opcode):
    field, enum = ENUM_FIELDS.get(opcode, (None, None))

    @settings(max_examples=CASES[opcode], **HYPOTHESIS)
    @given(seed=SEEDS, value=st.sampled_from(list(enum)) if enum else st.none())
    def case(seed, value):
        check_against_reference(random_instruction(opcode, seed, {field: value} if enum else None), seed)

    case()


def test_negative_strides_and_hbm_partition_strides_occur():
    """The generator really draws the access patterns the differential tests claim to cover."""
    aps = [ap for op in ("dma_copy", "tensor_tensor") for seed in range(40)
           for _, ap, _ in random_instruction(op, seed).operands()]
    assert any(s < 0 for ap in aps for s, c in ap.dims if c > 1)
    assert any(ap.partition_stride not in (0,) and ap.tensor >= 0 and ap.partitions > 1 for ap in aps)


def in_place_cases() -> list[Instruction]:
    """Instructions whose written operand is the same access pattern as a read one (the verifier allows it)."""
    tile = AP(Mem.SBUF, DType.BF16, 64, ((-1, 8), (8, 4)), offset=6000)        # reversed and transposed
    column = AP(Mem.SBUF, DType.FP32, 64, ((1, 1),), offset=9000)
    index = AP(Mem.SBUF, DType.INT32, 16, ((1, 1),), offset=9600)
    table = AP(Mem.HBM, DType.INT32, 16, ((1, 1),), offset=0, tensor=TENSORS.index(
        next(t for t in TENSORS if t.dtype is DType.INT32)), partition_stride=3)
    return [
        Instruction.make("tensor_tensor", Engine.DVE, dst=tile, in0=tile, in1=tile, op=AluOp.MUL),
        Instruction.make("activation", Engine.ACT, dst=tile, src=tile, func=ActFunc.EXP, scale_ap=column,
                         accum=column, bias=0.25),
        Instruction.make("tensor_scalar", Engine.DVE, dst=column, src=column, op0=AluOp.SUB, scalar0_ap=column,
                         op1=AluOp.ADD, scalar1=1.0),
        Instruction.make("select", Engine.DVE, dst=tile, pred=tile, on_true=AP(Mem.SBUF, DType.FP8_E4M3, 64, ((1, 32),),
                                                                                offset=20000), on_false=tile),
        Instruction.make("dma_gather", Engine.DMA, dst=index, table=table, index=index),
    ]


@pytest.mark.parametrize("case", range(5))
def test_in_place_instructions_match_the_reference(case):
    check_against_reference(in_place_cases()[case], 100 + case)


def test_in_place_operand_with_repeated_elements_reads_before_writing():
    """dst identical to src, an AP reaching elements twice: the instruction must read everything first."""
    ap = AP(Mem.SBUF, DType.INT32, 4, ((1, 3), (1, 3)), offset=64)   # elements 0,1,2,1,2,3,2,3,4
    for opcode, fields in [("tensor_copy", {}), ("tensor_scalar", {"op0": AluOp.ADD, "scalar0": 1.0})]:
        ins = Instruction.make(opcode, Engine.DVE, dst=ap, src=ap, **fields)
        check_against_reference(ins, 7)


@pytest.mark.parametrize("free", [kernels_vector.ACCUM_BUFFER, kernels_vector.ACCUM_BUFFER + 8])
def test_activation_sums_accum_in_order_on_both_sides_of_its_stack_buffer(free):
    """Up to ACCUM_BUFFER elements a partition, y is summed by a second loop over a stack buffer; beyond,
    in the same loop. Both must give the reference's ordered fp32 sum (and dst) bit for bit."""
    dst = AP(Mem.SBUF, DType.BF16, 2, ((1, free),), offset=0)
    src = AP(Mem.SBUF, DType.FP32, 2, ((1, free),), offset=2 * free + 64)
    accum = AP(Mem.SBUF, DType.FP32, 2, ((1, 1),), offset=6 * free + 128)
    ins = Instruction.make("activation", Engine.ACT, dst=dst, src=src, func=ActFunc.EXP, accum=accum, bias=-1.5)
    check_against_reference(ins, free)


@pytest.mark.parametrize("fault", ["operand", "stray"])
def test_a_wrong_jit_fails_with_the_assembly_and_the_first_difference(fault, monkeypatch):
    """The harness itself: a JIT that writes one wrong element, or one byte outside the written operands, fails
    the check, which names the instruction in assembly and where the first difference is."""
    dst = AP(Mem.SBUF, DType.FP32, 4, ((1, 8),), offset=64)
    src = AP(Mem.SBUF, DType.BF16, 4, ((1, 8),), offset=4096)
    ins = Instruction.make("tensor_copy", Engine.DVE, dst=dst, src=src)
    real_load = load

    class WrongJit:
        def __init__(self, jit):
            self.jit = jit

        def execute(self, sbuf, psum, hbm):
            self.jit.execute(sbuf, psum, hbm)
            if fault == "operand":     # element (2, 5) becomes 1 + 2^-23, which no bf16 value widens to
                sbuf[2, 64 + 4 * 5:64 + 4 * 6] = np.array([1 + 2**-23], np.float32).view(np.uint8)
            else:
                sbuf[3, 100000] ^= 1

    monkeypatch.setitem(globals(), "load", lambda program, **kw: WrongJit(real_load(program, **kw)))
    asm = re.escape(format_instruction(ins, Program(TENSORS, (ins,), TARGET)))
    where = r"dst differs at element \(p=2, e=5\) of 1: " if fault == "operand" else r"changed sbuf at \(3, 100000\)"
    with pytest.raises(pytest.fail.Exception, match=rf"(?s){where}.*\[seed 5\]\n    {asm}$"):
        check_against_reference(ins, 5)


def _hbm(dtype: DType) -> int:
    return TENSORS.index(next(t for t in TENSORS if t.dtype is dtype))


TRANSPOSING_COPIES = [   # (dst, src): one side's partitions adjacent elements, its free elements far apart
    (AP(Mem.SBUF, DType.FP32, 40, ((1, 12),), offset=512),   # runs shorter than a tile
     AP(Mem.HBM, DType.FP32, 40, ((128, 12),), offset=4, tensor=_hbm(DType.FP32), partition_stride=1)),
    (AP(Mem.SBUF, DType.BF16, 40, ((1, 20),), offset=512),
     AP(Mem.HBM, DType.FP32, 40, ((128, 20),), offset=0, tensor=_hbm(DType.FP32), partition_stride=1)),
    (AP(Mem.HBM, DType.BF16, 70, ((480, 4), (-96, 5)), offset=1024, tensor=_hbm(DType.BF16), partition_stride=1),
     AP(Mem.SBUF, DType.BF16, 70, ((1, 20),), offset=2048)),
    (AP(Mem.HBM, DType.FP32, 128, ((64, 64),), offset=0, tensor=_hbm(DType.FP32), partition_stride=1),
     AP(Mem.SBUF, DType.FP8_E4M3, 128, ((2, 64),), offset=4096)),
]


@pytest.mark.parametrize("case", range(len(TRANSPOSING_COPIES)))
def test_transposing_copies_move_partitions_in_blocks_and_match_the_reference(case):
    from trnc.runtime.jit.kernels import layout_of
    from trnc.runtime.jit.kernels_move import _tiling, partition_block
    dst, src = (layout_of(ap, HW) for ap in TRANSPOSING_COPIES[case])
    assert _tiling(dst, src) is None and partition_block(dst, src) > 1   # the blocked loop is what runs
    check_against_reference(Instruction.make("dma_copy", Engine.DMA, dst=TRANSPOSING_COPIES[case][0],
                                             src=TRANSPOSING_COPIES[case][1]), 300 + case)


TILED_COPIES = [   # (dst, src): bit copies moved as 16 x 16 tiles, with partitions and runs left over
    (AP(Mem.SBUF, DType.BF16, 40, ((1, 37),), offset=512),
     AP(Mem.HBM, DType.BF16, 40, ((128, 37),), offset=2, tensor=_hbm(DType.BF16), partition_stride=1)),
    (AP(Mem.SBUF, DType.FP32, 128, ((32, 3), (1, 20)), offset=256),
     AP(Mem.HBM, DType.FP32, 128, ((2688, 3), (128, 20)), offset=0, tensor=_hbm(DType.FP32), partition_stride=1)),
    (AP(Mem.HBM, DType.BF16, 48, ((128, 33),), offset=64, tensor=_hbm(DType.BF16), partition_stride=1),
     AP(Mem.SBUF, DType.BF16, 48, ((1, 33),), offset=2048)),
    (AP(Mem.HBM, DType.FP32, 32, ((-256, 16),), offset=4 * 256 * 15, tensor=_hbm(DType.FP32), partition_stride=1),
     AP(Mem.SBUF, DType.FP32, 32, ((1, 16),), offset=0)),
]


@pytest.mark.parametrize("case", range(len(TILED_COPIES)))
def test_transposing_bit_copies_move_tiles_and_match_the_reference(case):
    from trnc.runtime.jit.kernels import layout_of
    from trnc.runtime.jit.kernels_move import _tiling
    dst, src = TILED_COPIES[case]
    assert _tiling(layout_of(dst, HW), layout_of(src, HW)) is not None   # the register transpose is what runs
    check_against_reference(Instruction.make("dma_copy", Engine.DMA, dst=dst, src=src), 310 + case)


def test_a_copy_whose_destination_repeats_an_element_is_not_tiled():
    from trnc.runtime.jit.kernels import layout_of
    from trnc.runtime.jit.kernels_move import _tiling
    dst = AP(Mem.HBM, DType.BF16, 32, ((8, 16),), offset=0, tensor=_hbm(DType.BF16), partition_stride=1)
    src = AP(Mem.SBUF, DType.BF16, 32, ((1, 16),), offset=0)
    assert _tiling(layout_of(dst, HW), layout_of(src, HW)) is None   # partition 8 meets element 1 of partition 0


FOLDS = [   # partition counts around the fold blocks (runtime/jit FOLD_LANES = 16): whole blocks, a rest, only a rest
    Instruction.make("tensor_reduce", Engine.DVE, dst=AP(Mem.SBUF, DType.FP32, 37, ((1, 3),), offset=8192),
                     src=AP(Mem.SBUF, DType.BF16, 37, ((1, 3), (3, 50)), offset=1024), op=ReduceOp.SUM, axes=0b10),
    Instruction.make("tensor_reduce", Engine.DVE, dst=AP(Mem.SBUF, DType.FP32, 128, ((1, 1),), offset=8192),
                     src=AP(Mem.SBUF, DType.FP32, 128, ((1, 300),), offset=0), op=ReduceOp.MAX, axes=0b1),
    Instruction.make("tensor_reduce", Engine.DVE, dst=AP(Mem.SBUF, DType.FP32, 7, ((1, 1),), offset=8192),
                     src=AP(Mem.SBUF, DType.FP32, 7, ((1, 300),), offset=0), op=ReduceOp.SUM, axes=0b1),
    Instruction.make("activation", Engine.ACT, dst=AP(Mem.SBUF, DType.BF16, 37, ((1, 300),), offset=4096),
                     src=AP(Mem.SBUF, DType.FP32, 37, ((1, 300),), offset=0), func=ActFunc.EXP,
                     accum=AP(Mem.SBUF, DType.FP32, 37, ((1, 1),), offset=8192)),
    Instruction.make("activation", Engine.ACT, dst=AP(Mem.SBUF, DType.FP32, 128, ((1, 1200),), offset=0),
                     src=AP(Mem.SBUF, DType.FP32, 128, ((1, 1200),), offset=0), func=ActFunc.SQUARE,
                     accum=AP(Mem.SBUF, DType.FP32, 128, ((1, 1),), offset=8192)),
]


@pytest.mark.parametrize("case", range(len(FOLDS)))
def test_folds_run_partitions_side_by_side_and_keep_each_ones_order(case):
    """Sums of random fp32 values depend on their order: any change of a partition's order shows in the bits."""
    check_against_reference(FOLDS[case], 400 + case)
