"""Hypothesis strategies for random Programs, shared by the ISA tests (encoding, assembly, verifier).

`programs()` draws well-formed programs: what the binary and text forms accept, over every opcode
of the table and the full width of every value (extreme ints, every fp32 bit pattern including NaN
payloads, -0.0 and inf, APs in every memory and dtype with 0-4 free dims, negative and zero
strides). Most are not valid machine programs. `programs(valid_only=True)` draws programs built to
pass the verifier: legal engines, memories, dtypes and shapes per opcode, operands in bounds and
disjoint within an instruction, and a semaphore chain that orders every instruction after the
previous one (so there are no races).

Hypothesis draws the structure (instruction count, each opcode, one seed per instruction) and a
seeded, edge-biased generator (`Rand`) fills in the values. A hypothesis draw costs about 0.1 ms,
and a program has thousands of values, so drawing each through hypothesis would make 1000 examples
take minutes; this way failures still shrink to the fewest, simplest instructions.

Values are compared with `assert_programs_identical`, which compares floats by their bits: Program
equality says NaN != NaN and -0.0 == 0.0, and neither is what a round trip must preserve.
"""
from __future__ import annotations

import math
import random
import struct
from collections.abc import Mapping

import numpy as np
from hypothesis import strategies as st

from trnc.isa.ap import AP, MAX_FREE_DIMS, Engine, Mem
from trnc.isa.config import DMA_QUEUES, MOVING_FMAX, PE_COLUMNS, PSUM_BANK_BYTES, TARGETS, HwConfig, get_target
from trnc.isa.dtypes import MATMUL_DTYPES, MX_BLOCK, MX_FORMATS, VALUE_DTYPES, DType
from trnc.isa.enums import COMPARISONS, AluOp, Rounding
from trnc.isa.opcodes import TABLE, Kind, OpSpec, opspec
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind

# Value ranges of the binary layout (isa/encoding.py LAYOUT_DOC), restated so tests check the code against them.
U8, U16, U32, U64 = 2**8 - 1, 2**16 - 1, 2**32 - 1, 2**64 - 1
I32 = (-2**31, 2**31 - 1)
I64 = (-2**63, 2**63 - 1)
RESERVED = frozenset({"sbuf", "psum"})

# fp32 bit patterns mixed into every f32 value: zeros, infinities, quiet and signalling NaNs of both
# signs with payloads, the smallest subnormal, the largest finite value, one.
SPECIAL_F32_BITS = (0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FC00001,
                    0x7F800001, 0xFF812345, 0x7FFFFFFF, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x3F800000)
# Name characters: ASCII, and letters and a digit from other scripts (names are UTF-8 in the encoding).
_NAME_FIRST = "abcdxyzABXYZ_" + "éßΩжあ中"
_NAME_REST = _NAME_FIRST + "0123456789._" + "٣"


def float_from_f32_bits(bits: int) -> float:
    """The Python float holding fp32 `bits`; a NaN's payload goes to the top of the double's mantissa."""
    if bits & 0x7F800000 == 0x7F800000 and bits & 0x7FFFFF:
        sign, payload = bits >> 31, bits & 0x7FFFFF
        return struct.unpack("<d", struct.pack("<Q", sign << 63 | 0x7FF << 52 | payload << 29))[0]
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


class Rand:
    """Seeded random values biased to the edges: often the bounds, mostly small values, sometimes anything."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def int(self, lo: int, hi: int, small_lo: int = -4, small_hi: int = 130) -> int:
        x = self.r.random()
        if x < 0.1:
            return self.r.choice((lo, hi))
        if x < 0.75:
            return self.r.randint(max(lo, small_lo), min(hi, small_hi))
        return self.r.randint(lo, hi)

    def size(self, hi: int) -> int:
        """1..hi, with 1 and hi often."""
        x = self.r.random()
        return 1 if x < 0.15 else hi if x < 0.3 else self.r.randint(1, hi)

    def uniform(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def choice(self, items):
        return self.r.choice(list(items))

    def coin(self) -> bool:
        return self.r.random() < 0.5

    def permutation(self, n: int) -> list[int]:
        return self.r.sample(range(n), n)

    def f32(self) -> float:
        """Any fp32 value: special values, any bit pattern, or a short decimal."""
        x = self.r.random()
        if x < 0.3:
            bits = self.r.choice(SPECIAL_F32_BITS)
        elif x < 0.7:
            bits = self.r.getrandbits(32)
        else:
            return float(np.float32(self.r.randint(-1000, 1000) / self.r.choice((1, 2, 10, 1024))))
        return float_from_f32_bits(bits)

    def name(self) -> str:
        while True:
            text = self.r.choice(_NAME_FIRST) + "".join(self.r.choice(_NAME_REST) for _ in range(self.r.randint(0, 8)))
            if text not in RESERVED:
                return text


# ---------------------------------------------------------------------------------------------
# Well-formed programs


def random_tensors(rng: Rand, max_size: int = 6) -> tuple[TensorDecl, ...]:
    """0..max_size declarations with unique names, every kind and dtype, ranks 0-5 and sizes up to u64."""
    names: list[str] = []
    for _ in range(rng.uniform(0, max_size)):
        name = rng.name()
        if name not in names:
            names.append(name)
    return tuple(TensorDecl(n, rng.choice(TensorKind), rng.choice(DType),
                            tuple(rng.int(0, U64, 0, 600) for _ in range(rng.uniform(0, 5)))) for n in names)


def random_ap(rng: Rand, ntensors: int) -> AP:
    """Any well-formed AP: every memory (HBM only when a tensor exists), dtype, 0-4 dims, extreme values."""
    dims = tuple((rng.int(*I64, -3, 600), rng.int(1, U32, 1, 600)) for _ in range(rng.uniform(0, MAX_FREE_DIMS)))
    common = {"dtype": rng.choice(DType), "partitions": rng.int(1, U32, 1, 128), "dims": dims,
              "offset": rng.int(*I64, -64, 4096)}
    if ntensors and rng.r.random() < 0.3:
        return AP(Mem.HBM, tensor=rng.uniform(0, ntensors - 1), partition_stride=rng.int(*I64, -8, 4096), **common)
    return AP(rng.choice((Mem.SBUF, Mem.PSUM)), start_partition=rng.int(0, U32, 0, 127), **common)


def _random_value(rng: Rand, kind: Kind, enum, optional: bool, ntensors: int):
    if kind is Kind.AP:
        return None if optional and rng.coin() else random_ap(rng, ntensors)
    if kind is Kind.F32:
        return rng.f32()
    if kind is Kind.BOOL:
        return rng.coin()
    if kind is Kind.ENUM:
        return rng.choice(enum)
    if kind is Kind.I32X4:
        return tuple(rng.int(*I32) for _ in range(4))
    return rng.int(*I32) if kind is Kind.I32 else rng.int(0, U32, 0, 70)


def random_instruction(rng: Rand, spec: OpSpec, ntensors: int) -> Instruction:
    """`spec` on one of its engines, with random fields, waits and signals."""
    engine = rng.choice(spec.engines)
    queue = rng.int(0, U8, 0, DMA_QUEUES - 1) if engine is Engine.DMA else 0
    args = tuple((f.name, _random_value(rng, f.kind, f.enum, f.optional, ntensors)) for f in spec.fields)
    waits = tuple((rng.int(0, U16, 0, 20), rng.int(0, U32, 0, 20)) for _ in range(rng.uniform(0, 4)))
    signals = tuple(rng.int(0, U16, 0, 20) for _ in range(rng.uniform(0, 4)))
    return Instruction(spec.name, engine, args, queue, waits, signals)


_SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def programs(draw, max_instructions: int = 12, valid_only: bool = False, opcodes: tuple[OpSpec, ...] | None = None,
             min_instructions: int = 0) -> Program:
    """A random Program of min..max instructions whose opcodes come from `opcodes` (default: all).

    valid_only=True draws programs that pass isa/verify.py (see `valid_programs`).
    """
    if valid_only:
        return draw(valid_programs(max_instructions, opcodes, min_instructions))
    rng = Rand(draw(_SEEDS))
    target = rng.choice(sorted(TARGETS)) if rng.r.random() < 0.8 else rng.name()
    tensors = random_tensors(rng)
    specs = draw(st.lists(st.sampled_from(opcodes or TABLE), min_size=min_instructions, max_size=max_instructions))
    instrs = tuple(random_instruction(Rand(draw(_SEEDS)), spec, len(tensors)) for spec in specs)
    return Program(tensors, instrs, target)


# ---------------------------------------------------------------------------------------------
# Comparison


def program_key(program: Program) -> tuple:
    """Everything a round trip must preserve, floats by their bits and values with their type."""
    def value(v):
        if isinstance(v, float):
            return "float", struct.pack("<d", v)
        return type(v).__name__, v
    return (program.target, program.tensors,
            tuple((i.opcode, i.engine, i.queue, i.waits, i.signals, tuple((k, value(v)) for k, v in i.args))
                  for i in program.instructions))


def assert_programs_identical(got: Program, want: Program) -> None:
    a, b = program_key(got), program_key(want)
    if a == b:
        return
    assert a[:2] == b[:2], f"target/tensors differ:\n{a[:2]}\n{b[:2]}"
    assert len(a[2]) == len(b[2]), f"{len(a[2])} instructions, expected {len(b[2])}"
    for n, (x, y) in enumerate(zip(a[2], b[2])):
        assert x == y, f"instruction {n} differs:\n{got.instructions[n]}\n{want.instructions[n]}"


# ---------------------------------------------------------------------------------------------
# Valid programs: the rules of isa/verify.py, restated from spec_intro.md, the opcode table's operand docs
# and neuroncore.md (engine memories, partition alignment), so that a disagreement shows up as a test failure.

_ENGINE_MEMS = {Engine.PE: (Mem.SBUF, Mem.PSUM), Engine.ACT: (Mem.SBUF, Mem.PSUM), Engine.DVE: (Mem.SBUF, Mem.PSUM),
                Engine.POOL: (Mem.SBUF,), Engine.DMA: (Mem.SBUF, Mem.HBM)}
_DATA_DTYPES = sorted(VALUE_DTYPES, key=lambda d: d.code)   # e8m0 only where MX scales go
_FP8 = (DType.FP8_E4M3, DType.FP8_E5M2)
_MAX_P, _MAX_F = 128, 48


def _starts(partitions: int) -> list[int]:
    """Start partitions compute engines accept: quadrant-aligned, by partition count (neuroncore.md 3)."""
    step = 128 if partitions > 64 else 64 if partitions > 32 else 32
    return [s for s in range(0, 128, step) if s + partitions <= 128]


_SLOTS = 8   # each on-chip memory is cut into this many regions, one per operand of an instruction


class _Builder:
    """Draws operands that fit one instruction of `engine` on the target `hw`.

    The operands of one instruction never overlap (the verifier allows a written operand only disjoint
    from the others or identical to one): each on-chip operand takes its own region of its memory (in
    PSUM, its own bank) and each HBM operand its own tensor.

    `pins` (field name -> dtype of that AP field, or the value of a field that shapes the operands)
    override what the builder draws; the draws are made all the same, so without pins the builder draws
    exactly what it always did."""

    def __init__(self, rng: Rand, hw: HwConfig, tensors: tuple[TensorDecl, ...], engine: Engine,
                 pins: Mapping[str, object] | None = None):
        self.rng, self.hw, self.tensors, self.engine = rng, hw, tensors, engine
        self.pins = dict(pins or {})
        self.slots = {Mem.SBUF: rng.permutation(_SLOTS), Mem.PSUM: rng.permutation(hw.psum_banks)}
        self.slot_bytes = {Mem.SBUF: hw.sbuf_bytes_per_partition // _SLOTS // 64 * 64, Mem.PSUM: PSUM_BANK_BYTES}
        self.free_tensors = set(range(len(tensors)))

    def split(self, n: int, max_dims: int = MAX_FREE_DIMS) -> tuple[int, ...]:
        """Counts of 0..max_dims free dims whose product is n (no dims only when n == 1)."""
        if n == 1 and self.rng.coin():
            return ()
        counts, rest = [], n
        for _ in range(self.rng.uniform(0, max_dims - 1)):
            d = self.rng.choice([k for k in range(1, rest + 1) if rest % k == 0])
            counts.append(d)
            rest //= d
        return (*counts, rest)

    def layout(self, counts: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """Strides of a bijective layout of `counts` onto elements [0, prod): contiguous in a random order of
        the dims, each dim possibly reversed; and the element offset of index 0."""
        strides, step = [0] * len(counts), 1
        for j in reversed(self.rng.permutation(len(counts))):
            strides[j], step = step, step * counts[j]
        base = 0
        for j, c in enumerate(counts):
            if c > 1 and self.rng.coin():
                base += strides[j] * (c - 1)
                strides[j] = -strides[j]
        return tuple(strides), base

    def mem(self, *allowed: Mem) -> Mem:
        return self.rng.choice([m for m in _ENGINE_MEMS[self.engine] if not allowed or m in allowed])

    def pin(self, name: str | None, drawn):
        """`drawn`, unless field `name` is pinned."""
        return self.pins.get(name, drawn)

    def dtype(self, choices=None, name: str | None = None) -> DType:
        return self.pin(name, self.rng.choice(sorted(choices, key=lambda d: d.code) if choices else _DATA_DTYPES))

    def on_chip(self, mem: Mem, dtype: DType, partitions: int, counts: tuple[int, ...]) -> AP:
        """An operand in a region of `mem` no other operand of the instruction uses (in PSUM: one bank)."""
        strides, base = self.layout(counts)
        isz, nbytes = dtype.itemsize, math.prod(counts) * dtype.itemsize
        lo = self.slots[mem].pop() * self.slot_bytes[mem]
        offset = lo + self.rng.uniform(0, (self.slot_bytes[mem] - nbytes) // isz) * isz
        starts = range(129 - partitions) if self.engine is Engine.DMA else _starts(partitions)
        return AP(mem, dtype, partitions, tuple(zip(strides, counts)), offset + base * isz,
                  start_partition=self.rng.choice(starts))

    def hbm(self, tensor: int, partitions: int, counts: tuple[int, ...]) -> AP:
        decl = self.tensors[tensor]
        self.free_tensors.discard(tensor)
        strides, base = self.layout((partitions, *counts))
        start = self.rng.uniform(0, decl.num_elements - partitions * math.prod(counts))
        return AP(Mem.HBM, decl.dtype, partitions, tuple(zip(strides[1:], counts)),
                  (start + base) * decl.dtype.itemsize, tensor=tensor, partition_stride=strides[0])

    def takes(self, name: str | None, tensor: int) -> bool:
        """Whether operand `name` may live in `tensor`: one of its pinned dtype, else of a value dtype (e8m0 is
        only an MX scale, so only a pinned operand goes to an e8m0 tensor)."""
        dtype = self.tensors[tensor].dtype
        return dtype is self.pins[name] if name in self.pins else dtype is not DType.E8M0

    def operand(self, partitions: int, free: int, name: str | None = None) -> AP:
        """An operand of `partitions` x `free` elements in one of the engine's memories (in SBUF instead of HBM
        when no free tensor is big enough or of the pinned dtype)."""
        fits = [i for i in sorted(self.free_tensors)
                if self.tensors[i].num_elements >= partitions * free and self.takes(name, i)]
        mem = self.mem()
        if mem is Mem.HBM and fits:
            return self.hbm(self.rng.choice(fits), partitions, self.split(free))
        return self.on_chip(Mem.SBUF if mem is Mem.HBM else mem, self.dtype(name=name), partitions, self.split(free))

    def column(self, partitions: int, dtype: DType | None = None, name: str | None = None) -> AP:
        """A per-partition [P, 1] operand, on chip."""
        return self.on_chip(self.mem(Mem.SBUF, Mem.PSUM), self.pin(name, dtype or self.dtype()), partitions,
                            self.split(1))

    def columns(self, partitions: int, names: tuple[str, ...]) -> dict:
        """Optional per-partition operands, each present half the time (always when pinned)."""
        return {name: self.column(partitions, name=name) if self.rng.coin() or name in self.pins else None
                for name in names}

    def size(self, hi: int = _MAX_P) -> int:
        return self.rng.size(hi)

    def f32(self, bound: float) -> float:
        return float(np.float32(self.rng.r.uniform(-bound, bound)))


def _elementwise(b: _Builder, data: tuple[str, ...], columns: tuple[str, ...] = (), **extra) -> dict:
    p, f = b.size(), b.size(_MAX_F)
    fields = {name: b.operand(p, f, name) for name in data}
    fields.update(b.columns(p, columns))
    return {**fields, **extra}


def _matmul(b: _Builder) -> dict:
    double = b.pin("double_row", b.hw.fp8_double_row and b.rng.coin())
    dtype = b.dtype(_FP8 if double else MATMUL_DTYPES, "stationary")
    narrow = _FP8 if double else MATMUL_DTYPES - {DType.FP32}
    other = b.pin("moving", dtype if dtype is DType.FP32 else b.dtype(narrow))
    k, m, n = b.size(), b.size(PE_COLUMNS), b.size(MOVING_FMAX)
    rows = (2,) if double else ()
    return {"dst": b.on_chip(Mem.PSUM, b.pin("dst", DType.FP32), m, b.split(n)),
            "stationary": b.on_chip(Mem.SBUF, dtype, k, (*rows, *b.split(m, MAX_FREE_DIMS - len(rows)))),
            "moving": b.on_chip(Mem.SBUF, other, k, (*rows, *b.split(n, MAX_FREE_DIMS - len(rows)))),
            "accumulate": b.rng.coin(), "double_row": double}


def _matmul_mx(b: _Builder) -> dict:
    k, m, n = MX_BLOCK * b.size(4), b.size(PE_COLUMNS), b.size(MOVING_FMAX)
    groups = b.rng.choice([(), (1,), (2,), (3,), (4,)])
    st_shape, mv_shape = (*groups, m), (*groups, n)
    return {"dst": b.on_chip(Mem.PSUM, b.pin("dst", DType.FP32), m, b.split(n)),
            "stationary": b.on_chip(Mem.SBUF, b.dtype(MX_FORMATS, "stationary"), k, st_shape),
            "stationary_scale": b.on_chip(Mem.SBUF, b.pin("stationary_scale", DType.E8M0), k // MX_BLOCK, st_shape),
            "moving": b.on_chip(Mem.SBUF, b.dtype(MX_FORMATS, "moving"), k, mv_shape),
            "moving_scale": b.on_chip(Mem.SBUF, b.pin("moving_scale", DType.E8M0), k // MX_BLOCK, mv_shape),
            "accumulate": b.rng.coin()}


def _transpose(b: _Builder) -> dict:
    p, f = b.size(), b.size(PE_COLUMNS)
    src = b.dtype(name="src")
    dst = b.dtype({src, DType.FP32} if src.is_float else {src}, "dst")
    return {"dst": b.on_chip(Mem.PSUM, dst, f, b.split(p)), "src": b.on_chip(Mem.SBUF, src, p, b.split(f))}


def _tensor_reduce(b: _Builder) -> dict:
    p = b.size()
    counts = tuple(b.size(4) for _ in range(b.rng.uniform(1, MAX_FREE_DIMS)))   # <= 1 KiB: fits a PSUM bank
    axes = b.rng.uniform(1, 2 ** len(counts) - 1)
    kept = math.prod(c for j, c in enumerate(counts) if not axes >> j & 1)
    return {"dst": b.operand(p, kept, "dst"), "src": b.on_chip(b.mem(), b.dtype(name="src"), p, counts),
            "op": b.rng.choice(opspec("tensor_reduce").field("op").enum), "axes": axes}


def _with_steps(b: _Builder, data: tuple[str, ...], **extra) -> dict:
    """iota and affine_select: steps only for the free dims dst has."""
    fields = _elementwise(b, data, **extra)
    return {**fields, **_counter(b, fields["dst"])}


def _counter(b: _Builder, dst: AP) -> dict:
    """base, partition_step and steps of a counter over dst (iota, affine_select, random)."""
    nd = len(dst.dims)
    steps = (*(b.rng.uniform(-100, 100) for _ in range(nd)), *[0] * (4 - nd))
    return {"steps": steps, "base": b.rng.uniform(-1000, 1000), "partition_step": b.rng.uniform(-100, 100)}


def _random(b: _Builder) -> dict:
    p, f = b.size(), b.size(_MAX_F)
    dst = b.on_chip(Mem.SBUF, b.pin("dst", DType.FP32), p, b.split(f))
    seed = b.on_chip(Mem.SBUF, b.pin("seed", DType.INT32), 1, b.split(1))
    return {"dst": dst, "seed": seed, "stream": b.rng.uniform(0, U32), **_counter(b, dst)}


def _quantize_mx(b: _Builder) -> dict:
    p, f = MX_BLOCK * b.size(4), b.size(_MAX_F)
    return {"dst": b.on_chip(Mem.SBUF, b.dtype(MX_FORMATS, "dst"), p, b.split(f)),
            "scale": b.on_chip(Mem.SBUF, b.pin("scale", DType.E8M0), p // MX_BLOCK, b.split(f)),
            "src": b.on_chip(b.mem(), b.dtype({DType.FP32, DType.BF16, DType.FP16}, "src"), p, b.split(f))}


def _dma_gather(b: _Builder) -> dict:
    """Only drawn when a tensor exists; every valid-mode tensor has at least one element. A pinned table dtype
    that no big enough tensor has is not honoured."""
    p, f = b.size(), b.size(min(_MAX_F, max(t.num_elements for t in b.tensors)))
    tables = [i for i, t in enumerate(b.tensors) if t.num_elements >= f]
    table = b.rng.choice([i for i in tables if b.takes("table", i)] or tables)
    rows = b.size(min(_MAX_P, b.tensors[table].num_elements // f))
    return {"dst": b.on_chip(Mem.SBUF, b.pin("dst", b.tensors[table].dtype), p, b.split(f)),
            "table": b.hbm(table, rows, b.split(f)), "index": b.column(p, DType.INT32, "index")}


def _tensor_scalar(b: _Builder) -> dict:
    ops = (AluOp.BYPASS, AluOp.ADD, AluOp.MUL) if b.engine is Engine.ACT else tuple(AluOp)
    return _elementwise(b, ("dst", "src"), ("scalar0_ap", "scalar1_ap"), op0=b.rng.choice(ops),
                        op1=b.rng.choice(ops), scalar0=b.f32(10), scalar1=b.f32(10),
                        reverse0=b.rng.coin(), reverse1=b.rng.coin())


def _tensor_copy(b: _Builder) -> dict:
    fields = _elementwise(b, ("dst", "src"))
    sr = fields["dst"].dtype.is_float and b.rng.coin()
    return {**fields, "rounding": Rounding.SR if sr else Rounding.RNE, "seed": b.rng.uniform(0, U32)}


def _activation(b: _Builder) -> dict:
    fields = _elementwise(b, ("dst", "src"), ("scale_ap", "bias_ap"))
    accum = b.column(fields["dst"].partitions, DType.FP32, "accum") if b.rng.coin() or "accum" in b.pins else None
    return {**fields, "accum": accum, "scale": b.f32(4), "bias": b.f32(4),
            "func": b.rng.choice(opspec("activation").field("func").enum)}


def _partitions_to_one(b: _Builder, reduce: bool) -> dict:
    """partition_reduce ([P, F] -> [1, F], with its op) and partition_broadcast ([1, F] -> [P, F])."""
    p, f = b.size(), b.size(_MAX_F)
    many, one = b.operand(p, f, "src" if reduce else "dst"), b.operand(1, f, "dst" if reduce else "src")
    if reduce:
        return {"dst": one, "src": many, "op": b.rng.choice(opspec("partition_reduce").field("op").enum)}
    return {"dst": many, "src": one}


_VALID = {
    "dma_copy": lambda b: _elementwise(b, ("dst", "src")), "dma_gather": _dma_gather, "matmul": _matmul,
    "matmul_mx": _matmul_mx, "transpose": _transpose, "activation": _activation,
    "tensor_tensor": lambda b: _elementwise(b, ("dst", "in0", "in1"), op=b.rng.choice(AluOp)),
    "tensor_scalar": _tensor_scalar, "tensor_reduce": _tensor_reduce, "tensor_copy": _tensor_copy,
    "memset": lambda b: _elementwise(b, ("dst",), value=b.f32(100)),
    "iota": lambda b: _with_steps(b, ("dst",)),
    "select": lambda b: _elementwise(b, ("dst", "pred", "on_true", "on_false")),
    "affine_select": lambda b: _with_steps(b, ("dst", "src"), cmp=b.rng.choice(sorted(COMPARISONS)), fill=b.f32(100)),
    "partition_reduce": lambda b: _partitions_to_one(b, True),
    "partition_broadcast": lambda b: _partitions_to_one(b, False),
    "quantize_mx": _quantize_mx, "random": _random,
}
_NEEDS = {"matmul_mx": "mx", "quantize_mx": "mx"}   # opcodes that exist only on targets with this HwConfig flag


def valid_instruction(rng: Rand, spec: OpSpec, hw: HwConfig, tensors: tuple[TensorDecl, ...],
                      pins: Mapping[str, object] | None = None) -> Instruction:
    """`spec` on one of its engines with operands of legal memory, dtype, shape and bounds (no waits or signals).

    `pins` fixes fields: an AP field's pin is its dtype, any other field's pin is its value. Pinned operands
    keep legal memories, shapes and bounds, but the pinned values themselves may be illegal, which is how a
    test asks the verifier what it accepts. A pinned HBM operand takes a tensor of its dtype, or moves to
    SBUF; a gather table pinned to a dtype no tensor has keeps a drawn tensor (callers compare)."""
    engine = rng.choice(spec.engines)
    queue = rng.uniform(0, DMA_QUEUES - 1) if engine is Engine.DMA else 0
    fields = _VALID[spec.name](_Builder(rng, hw, tensors, engine, pins))
    fields.update((k, v) for k, v in (pins or {}).items() if spec.field(k).kind is not Kind.AP)
    return Instruction.make(spec.name, engine, queue=queue, **fields)


@st.composite
def valid_programs(draw, max_instructions: int = 12, opcodes: tuple[OpSpec, ...] | None = None,
                   min_instructions: int = 0) -> Program:
    """A program that passes isa/verify.py: valid instructions (`valid_instruction`) and a semaphore chain, one
    semaphore per queue, ordering each instruction after the previous one. Opcodes the target lacks and dma_gather
    without tensors are left out. Gather indices are data, which the verifier does not check."""
    rng = Rand(draw(_SEEDS))
    hw = get_target(rng.choice(sorted(TARGETS)))
    tensors = tuple(TensorDecl(f"t{i}", rng.choice(TensorKind), rng.choice(_DATA_DTYPES),
                               tuple(rng.size(16) for _ in range(rng.uniform(1, 3)))) for i in range(rng.uniform(0, 4)))
    allowed = [op for op in (opcodes or TABLE) if (op.name not in _NEEDS or getattr(hw, _NEEDS[op.name]))
               and (tensors or op.name != "dma_gather")]
    specs = draw(st.lists(st.sampled_from(allowed), min_size=min_instructions, max_size=max_instructions)) \
        if allowed else []
    instrs: list[Instruction] = []
    semaphore: dict[str, int] = {}
    signalled: dict[str, int] = {}
    for spec in specs:
        instr = valid_instruction(Rand(draw(_SEEDS)), spec, hw, tensors)
        name = instr.queue_name
        waits = ()
        if instrs and instrs[-1].queue_name != name:
            prev = instrs[-1].queue_name
            waits = ((semaphore[prev], signalled[prev]),)
        semaphore.setdefault(name, len(semaphore))
        signalled[name] = signalled.get(name, 0) + 1
        instrs.append(instr.replace(waits=waits, signals=(semaphore[name],)))
    return Program(tensors, tuple(instrs), hw.name)
