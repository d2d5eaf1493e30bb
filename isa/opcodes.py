"""The opcode table: the single source of truth for the ISA.

One row per opcode: its number, the engines that may run it, its fields in encoding order (each
operand with its role, the memories it may lie in, whether it must stay in one PSUM bank, where
it may be e8m0, and the values an engine limits it to), its cost function and its semantics.
ENGINE_MEMS, the memories each engine reaches, sits beside it. The encoder, decoder, assembler,
disassembler, verifier, the reference interpreter's dispatch and isa/SPEC.md all derive from
these tables; no other file holds an opcode number or restates an operand's rules.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from trnc.isa import cost
from trnc.isa.ap import Engine, Mem
from trnc.isa.enums import ActFunc, AluOp, ReduceOp, Rounding, ScaleMode


class Kind(enum.Enum):
    """Field kinds, each with a fixed binary form (isa/encoding.py) and text form (isa/asm.py)."""

    AP = "ap"          # an access pattern
    F32 = "f32"        # a float32 immediate
    I32 = "i32"
    U32 = "u32"
    BOOL = "bool"
    I32X4 = "i32x4"    # four int32: one per free dim
    ENUM = "enum"


class Role(enum.Enum):
    """What an AP operand is to its instruction: the shape rules of elementwise opcodes read it."""

    DATA = "data"                    # the elements computed on
    PER_PARTITION = "per-partition"  # one value per partition, [P, 1]
    MX_SCALE = "mx-scale"            # e8m0 block scales of MX data


class E8m0(enum.Enum):
    """Where an AP operand may be e8m0, a block scale rather than a value (spec_intro.md "Writing")."""

    NEVER = "never"
    SCALE = "scale"    # always: the operand is an MX scale
    COPY = "copy"      # when every other e8m0-capable operand is e8m0 too: the bits are copied
    DECODE = "decode"  # always: the scale is read as its value 2^(code-127)


# Memories each engine can reach (neuroncore.md 2.1-2.5, 3): TensorE reads SBUF and writes PSUM, GpSimd
# cannot access PSUM, DMA moves between HBM and SBUF.
_S, _P, _H = frozenset({Mem.SBUF}), frozenset({Mem.PSUM}), frozenset({Mem.HBM})
ENGINE_MEMS: Mapping[Engine, frozenset[Mem]] = {
    Engine.PE: _S | _P, Engine.ACT: _S | _P, Engine.DVE: _S | _P, Engine.POOL: _S, Engine.DMA: _S | _H}


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    doc: str
    out: bool = False          # AP written by the instruction
    optional: bool = False     # AP that may be absent (None)
    enum: type | None = None
    default: object = None     # default of a non-AP field
    role: Role = Role.DATA     # of an AP
    mems: frozenset[Mem] | None = None   # where an AP may lie, within its engine's reach; None: all of it
    one_bank: bool = False     # a PSUM AP must stay within one bank (spec_intro.md "Memories")
    e8m0: E8m0 = E8m0.NEVER
    limits: tuple[tuple[Engine, frozenset], ...] = ()   # (engine, the enum values it supports) for this field
    needs: str = ""            # of a bool field: the HwConfig feature a target needs when it is set

    def __post_init__(self):
        if self.default is None and self.kind is not Kind.AP:
            defaults = {Kind.F32: 0.0, Kind.I32: 0, Kind.U32: 0, Kind.BOOL: False, Kind.I32X4: (0, 0, 0, 0)}
            object.__setattr__(self, "default", self.enum(0) if self.kind is Kind.ENUM else defaults[self.kind])

    def allowed_on(self, engine: Engine) -> frozenset | None:
        """The values of this enum field that `engine` supports, or None when it supports them all."""
        return dict(self.limits).get(engine)


def out(name, doc, optional=False, **rules):
    return Field(name, Kind.AP, doc, out=True, optional=optional, **rules)


def inp(name, doc, optional=False, **rules):
    return Field(name, Kind.AP, doc, optional=optional, **rules)


def per_partition(name, doc, write=False):
    return Field(name, Kind.AP, doc, out=write, optional=True, role=Role.PER_PARTITION)


def mx_scale(name, doc, write=False):
    return Field(name, Kind.AP, doc, out=write, role=Role.MX_SCALE, mems=_S, e8m0=E8m0.SCALE)


def imm(name, kind, doc, enum_type=None, default=None, limits=(), needs=""):
    return Field(name, kind, doc, enum=enum_type, default=default, limits=limits, needs=needs)


@dataclass(frozen=True)
class OpSpec:
    name: str
    code: int
    engines: tuple[Engine, ...]
    fields: tuple[Field, ...]
    cost: Callable
    summary: str
    semantics: str
    elementwise: bool = False   # data operands correspond element by element (spec_intro.md "Access patterns")
    needs: str = ""             # the HwConfig feature a target needs to run the opcode at all

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @functools.cached_property
    def aps(self) -> tuple[Field, ...]:
        """The AP fields (cached: the verifier asks for them on every operand of every instruction)."""
        return tuple(f for f in self.fields if f.kind is Kind.AP)

    @functools.cached_property
    def ap_slots(self) -> tuple[tuple[int, str, bool], ...]:
        """(position among the fields, name, written) of each AP field: where Instruction.operands finds them."""
        return tuple((k, f.name, f.out) for k, f in enumerate(self.fields) if f.kind is Kind.AP)

    def memories(self, f: Field, engine: Engine) -> frozenset[Mem]:
        """Where operand `f` may lie when `engine` runs this opcode: the engine's reach, narrowed by the field."""
        reach = ENGINE_MEMS[engine]
        return reach if f.mems is None else reach & f.mems

    def engines_for(self, mems: Mapping[str, Mem], values: Mapping[str, object]) -> tuple[Engine, ...]:
        """The engines of this row that can run an instance with operands in `mems` (field -> memory) and
        enum fields `values` (absent ones at their default)."""
        def runs(engine: Engine) -> bool:
            fields = ((f, f.allowed_on(engine)) for f in self.fields)
            return all(m in self.memories(self.field(name), engine) for name, m in mems.items()) and \
                all(values.get(f.name, f.default) in allowed for f, allowed in fields if allowed is not None)
        return tuple(e for e in self.engines if runs(e))


ANY_COMPUTE = (Engine.DVE, Engine.ACT, Engine.POOL)
# ScalarE's tensor_scalar does only multiply and add (neuroncore.md 2.3: trn2 supports (mult, add),
# (mult, None), (add, None)); trnc applies the trn2 limit to every target.
_ACT_MUL_ADD = ((Engine.ACT, frozenset({AluOp.BYPASS, AluOp.ADD, AluOp.MUL})),)

TABLE: tuple[OpSpec, ...] = (
    OpSpec("dma_copy", 1, (Engine.DMA,),
           (out("dst", "", e8m0=E8m0.COPY), inp("src", "", e8m0=E8m0.COPY)), cost.dma,
           "dst = src, converting through fp32 when the dtypes differ",
           "for each element e in order: dst[e] = src[e] if dtypes equal (bits) else convert(fp32(src[e]), dst.dtype)",
           elementwise=True),
    OpSpec("dma_gather", 2, (Engine.DMA,),
           (out("dst", "[P, F]", mems=_S), inp("table", "rows [R, F]: partition dim = rows", mems=_H),
            inp("index", "int32 [P, 1]", mems=_S, role=Role.PER_PARTITION)), cost.dma_gather,
           "dst[p, :] = table[index[p], :]; an index outside [0, R) is an execution fault",
           "for p: r = index[p, 0]; fault unless 0 <= r < R; dst[p, :] = table[r, :] (bits)"),
    OpSpec("matmul", 3, (Engine.PE,),
           (out("dst", "fp32 [M, N]", mems=_P, one_bank=True),
            inp("stationary", "[K, M] or [K, 2, M] double-row", mems=_S),
            inp("moving", "[K, N] or [K, 2, N] double-row", mems=_S),
            imm("accumulate", Kind.BOOL, "add into dst instead of overwriting"),
            imm("double_row", Kind.BOOL, "fp8 only: K = 2 x partitions", needs="fp8_double_row")),
           cost.pe_matmul,
           "dst[M, N] (+)= stationary.T @ moving by fused multiply-adds into fp32 in k order",
           "for m, n: acc = dst[m, n] if accumulate else +0.0; for r in row groups, for k in partitions: "
           "acc = fp32(acc + s[k, r, m] * v[k, r, n]) (the exact product, one rounding); dst[m, n] = acc"),
    OpSpec("matmul_mx", 4, (Engine.PE,),
           (out("dst", "fp32 [M, N]", mems=_P, one_bank=True),
            inp("stationary", "MX elements [K, R, M] or [K, M], K a multiple of 32, R <= 4", mems=_S),
            mx_scale("stationary_scale", "e8m0 [K/32, R, M]"),
            inp("moving", "MX elements [K, R, N] or [K, N]", mems=_S), mx_scale("moving_scale", "e8m0 [K/32, R, N]"),
            imm("accumulate", Kind.BOOL, "add into dst instead of overwriting")),
           cost.pe_matmul,
           "MX matmul: per block of 32 partitions, fp32 sum of exact products times both E8M0 scales",
           "for m, n: acc = dst[m, n] if accumulate else +0.0; for r, for block b: "
           "part = fp32 sequential sum over k in b of s[k, r, m] * v[k, r, n]; "
           "acc = fp32(acc + fp32(f64(part) * 2^(ss[b, r, m] + sv[b, r, n] - 254))) (NaN if a scale is 0xFF)",
           needs="mx"),
    OpSpec("transpose", 5, (Engine.PE,),
           (out("dst", "[F, P], dtype = src dtype or fp32", mems=_P, one_bank=True),
            inp("src", "[P <= 128, F <= 128]", mems=_S)),
           cost.pe_transpose,
           "dst[f, p] = src[p, f]: the identity matmul, moving bits exactly (Inf, NaN, -0 kept)",
           "for p, f: dst[f, p] = src[p, f] (bits; widened exactly when dst is fp32)"),
    OpSpec("activation", 6, (Engine.ACT,),
           (out("dst", ""), inp("src", ""),
            imm("func", Kind.ENUM, "activation function", ActFunc),
            imm("scale", Kind.F32, "immediate scale (used when scale_ap is absent)", default=1.0),
            per_partition("scale_ap", "per-partition scale [P, 1]"),
            imm("bias", Kind.F32, "immediate bias (used when bias_ap is absent)"),
            per_partition("bias_ap", "per-partition bias [P, 1]"),
            per_partition("accum", "fp32 [P, 1]: sum of f(...) along the free axis", write=True)),
           cost.activation,
           "dst = func(src * scale + bias), optionally accum[p] = sum over the free axis of the fp32 result",
           "for p: acc = +0.0; for e in order: y = func(fp32(fp32(fp32(src[p, e]) * scale) + bias)); "
           "dst[p, e] = convert(y); acc = fp32(acc + y); accum[p] = acc", elementwise=True),
    OpSpec("tensor_tensor", 7, (Engine.DVE, Engine.POOL),
           (out("dst", ""), inp("in0", ""), inp("in1", ""), imm("op", Kind.ENUM, "ALU op", AluOp)),
           cost.tensor_tensor,
           "dst = in0 op in1, elementwise in fp32",
           "for e: dst[e] = convert(op(fp32(in0[e]), fp32(in1[e])))", elementwise=True),
    OpSpec("tensor_scalar", 8, ANY_COMPUTE,
           (out("dst", ""), inp("src", ""),
            imm("op0", Kind.ENUM, "first op", AluOp, limits=_ACT_MUL_ADD),
            imm("scalar0", Kind.F32, "its immediate operand"),
            per_partition("scalar0_ap", "per-partition operand [P, 1] instead of scalar0"),
            imm("reverse0", Kind.BOOL, "compute scalar op0 x instead of x op0 scalar"),
            imm("op1", Kind.ENUM, "second op (bypass: none)", AluOp, limits=_ACT_MUL_ADD),
            imm("scalar1", Kind.F32, "its operand"),
            per_partition("scalar1_ap", "per-partition operand [P, 1] instead of scalar1"),
            imm("reverse1", Kind.BOOL, "compute scalar op1 t instead of t op1 scalar")),
           cost.any_engine,
           "dst = (src op0 scalar0) op1 scalar1, scalars immediate or per partition",
           "for p, e: t = op0(fp32(src[p, e]), s0[p]) (operands swapped if reverse0); "
           "t = op1(t, s1[p]) (swapped if reverse1); dst[p, e] = convert(t)", elementwise=True),
    OpSpec("tensor_reduce", 9, (Engine.DVE,),
           (out("dst", "src shape without the reduced free dims"), inp("src", ""),
            imm("op", Kind.ENUM, "reduction", ReduceOp),
            imm("axes", Kind.U32, "bit j set: reduce free dim j of src (dim 0 outermost)")),
           cost.reduce,
           "dst = reduce(src) over the chosen free axes, in fp32, in row-major order",
           "for each kept index: acc = first element; for the rest in row-major order: acc = op(acc, fp32(x)); "
           "dst = convert(acc)"),
    OpSpec("tensor_copy", 10, ANY_COMPUTE,
           (out("dst", "", e8m0=E8m0.COPY), inp("src", "", e8m0=E8m0.DECODE),
            imm("rounding", Kind.ENUM, "rne or sr", Rounding),
            imm("seed", Kind.U32, "seed of stochastic rounding")),
           cost.any_engine,
           "dst = src, converting the dtype (round to nearest even, or stochastic)",
           "for p, e: dst[p, e] = bits if dtypes equal else convert(fp32(src[p, e]), rounding, rand(seed, p, e))",
           elementwise=True),
    OpSpec("memset", 11, (Engine.DVE, Engine.POOL),
           (out("dst", ""), imm("value", Kind.F32, "fill value, converted to dst dtype")),
           cost.any_engine,
           "dst = value",
           "for e: dst[e] = convert(value)", elementwise=True),
    OpSpec("iota", 12, (Engine.POOL,),
           (out("dst", ""), imm("base", Kind.I32, "value at index 0"),
            imm("partition_step", Kind.I32, "added per partition"),
            imm("steps", Kind.I32X4, "added per index of each free dim")),
           cost.gpsimd,
           "dst[p, i...] = base + p * partition_step + sum(i_j * steps_j) in int32, converted",
           "v = int32 wrapping arithmetic; dst = convert(v) (int dst: exact; float dst: RNE)", elementwise=True),
    OpSpec("select", 13, (Engine.DVE,),
           (out("dst", ""), inp("pred", "nonzero = true"), inp("on_true", ""), inp("on_false", "")),
           cost.two_inputs,
           "dst = on_true where pred != 0 else on_false",
           "for e: dst[e] = convert(fp32(on_true[e]) if fp32(pred[e]) != 0 else fp32(on_false[e]))", elementwise=True),
    OpSpec("affine_select", 14, (Engine.POOL,),
           (out("dst", ""), inp("src", ""), imm("cmp", Kind.ENUM, "comparison of the expression with 0", AluOp),
            imm("fill", Kind.F32, "value where the comparison is false"),
            imm("base", Kind.I32, ""), imm("partition_step", Kind.I32, ""),
            imm("steps", Kind.I32X4, "per free dim")),
           cost.gpsimd,
           "dst = src where cmp(base + p*partition_step + sum(i_j*steps_j), 0) else fill (e.g. causal masks)",
           "for p, i: v = int32 expression; dst = convert(fp32(src) if cmp(v, 0) else fill)", elementwise=True),
    OpSpec("partition_reduce", 15, (Engine.POOL,),
           (out("dst", "[1, F]"), inp("src", "[P, F]"), imm("op", Kind.ENUM, "reduction", ReduceOp)),
           cost.partition_reduce,
           "dst[0, f] = reduce over partitions of src[:, f], fp32 in partition order",
           "for f: acc = fp32(src[0, f]); for p = 1..P-1: acc = op(acc, fp32(src[p, f])); dst[0, f] = convert(acc)"),
    OpSpec("partition_broadcast", 16, (Engine.POOL,),
           (out("dst", "[P, F]"), inp("src", "[1, F]")),
           cost.gpsimd,
           "dst[p, f] = src[0, f] for every partition p",
           "for p, f: dst[p, f] = bits if dtypes equal else convert(fp32(src[0, f]))"),
    OpSpec("quantize_mx", 17, (Engine.DVE,),
           (out("dst", "MX elements [P, F], P a multiple of 32", mems=_S),
            mx_scale("scale", "e8m0 [P/32, F]", write=True),
            inp("src", "fp32/bf16/fp16 [P, F]"),
            imm("scale_mode", Kind.ENUM, "floor (OCP), trn_alt or rceil", ScaleMode)),
           cost.quantize_mx,
           "MX quantize along partitions: per 32-partition block and column, an E8M0 scale and RNE elements",
           "for block b, column f: amax = max |x|; S = scale(amax, mode) (0xFF if not finite); "
           "dst = cast_sat(fp32(x * 2^(127 - S))) (precision.md 7.3)", needs="mx"),
    OpSpec("random", 18, (Engine.POOL,),
           (out("dst", "fp32"), inp("seed", "int32 [1, 1]: the run's seed, read by every partition", mems=_S),
            imm("stream", Kind.U32, "which stream of the seed: each random instruction of a program its own"),
            imm("base", Kind.I32, "counter at index 0"), imm("partition_step", Kind.I32, "added per partition"),
            imm("steps", Kind.I32X4, "added per index of each free dim")),
           cost.gpsimd,
           "dst = uniform draws in (0, 1) from a counter-based hash of (seed, stream, counter)",
           "k = rand(seed, stream, 0); for p, i: v = base + p*partition_step + sum(i_j*steps_j) (int32 wrapping); "
           "dst[p, i] = fp32(2 * (rand(k, 0, v) >> 9) + 1) * 2^-24"),
)

BY_NAME = {op.name: op for op in TABLE}
BY_CODE = {op.code: op for op in TABLE}


def opspec(name: str) -> OpSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown opcode '{name}'; expected one of {', '.join(BY_NAME)}") from None
