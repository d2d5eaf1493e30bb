"""The opcode table: the single source of truth for the ISA.

One row per opcode: its number, the engines that may run it, its fields in encoding order, its
cost function and its semantics. The encoder, decoder, assembler, disassembler, verifier, the
reference interpreter's dispatch and isa/SPEC.md all derive from this table; no other file holds
an opcode number.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from trnc.isa import cost
from trnc.isa.ap import Engine
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


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    doc: str
    out: bool = False          # AP written by the instruction
    optional: bool = False     # AP that may be absent (None)
    enum: type | None = None
    default: object = None     # default of a non-AP field

    def __post_init__(self):
        if self.default is None and self.kind is not Kind.AP:
            defaults = {Kind.F32: 0.0, Kind.I32: 0, Kind.U32: 0, Kind.BOOL: False, Kind.I32X4: (0, 0, 0, 0)}
            object.__setattr__(self, "default", self.enum(0) if self.kind is Kind.ENUM else defaults[self.kind])


def out(name, doc, optional=False):
    return Field(name, Kind.AP, doc, out=True, optional=optional)


def inp(name, doc, optional=False):
    return Field(name, Kind.AP, doc, optional=optional)


def imm(name, kind, doc, enum_type=None, default=None):
    return Field(name, kind, doc, enum=enum_type, default=default)


@dataclass(frozen=True)
class OpSpec:
    name: str
    code: int
    engines: tuple[Engine, ...]
    fields: tuple[Field, ...]
    cost: Callable
    summary: str
    semantics: str

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def aps(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.kind is Kind.AP)


ANY_COMPUTE = (Engine.DVE, Engine.ACT, Engine.POOL)

TABLE: tuple[OpSpec, ...] = (
    OpSpec("dma_copy", 1, (Engine.DMA,),
           (out("dst", "HBM or SBUF"), inp("src", "HBM or SBUF")), cost.dma,
           "dst = src, converting through fp32 when the dtypes differ",
           "for each element e in order: dst[e] = src[e] if dtypes equal (bits) else convert(fp32(src[e]), dst.dtype)"),
    OpSpec("dma_gather", 2, (Engine.DMA,),
           (out("dst", "SBUF [P, F]"), inp("table", "HBM rows [R, F]: partition dim = rows"),
            inp("index", "SBUF int32 [P, 1]")), cost.dma_gather,
           "dst[p, :] = table[index[p], :]; an index outside [0, R) is an execution fault",
           "for p: r = index[p, 0]; fault unless 0 <= r < R; dst[p, :] = table[r, :] (bits)"),
    OpSpec("matmul", 3, (Engine.PE,),
           (out("dst", "PSUM fp32 [M, N], one bank"), inp("stationary", "SBUF [K, M] or [K, 2, M] double-row"),
            inp("moving", "SBUF [K, N] or [K, 2, N] double-row"),
            imm("accumulate", Kind.BOOL, "add into dst instead of overwriting"),
            imm("double_row", Kind.BOOL, "fp8 only: K = 2 x partitions (targets with fp8 double-row)")),
           cost.pe_matmul,
           "dst[M, N] (+)= stationary.T @ moving with exact products and fp32 accumulation in k order",
           "for m, n: acc = dst[m, n] if accumulate else +0.0; for r in row groups, for k in partitions: "
           "acc = fp32(acc + fp32(s[k, r, m] * v[k, r, n])); dst[m, n] = acc"),
    OpSpec("matmul_mx", 4, (Engine.PE,),
           (out("dst", "PSUM fp32 [M, N], one bank"),
            inp("stationary", "SBUF MX elements [K, R, M] or [K, M], K a multiple of 32, R <= 4"),
            inp("stationary_scale", "SBUF e8m0 [K/32, R, M]"),
            inp("moving", "SBUF MX elements [K, R, N] or [K, N]"), inp("moving_scale", "SBUF e8m0 [K/32, R, N]"),
            imm("accumulate", Kind.BOOL, "add into dst instead of overwriting")),
           cost.pe_matmul,
           "MX matmul: per block of 32 partitions, fp32 sum of exact products times both E8M0 scales",
           "for m, n: acc = dst[m, n] if accumulate else +0.0; for r, for block b: "
           "part = fp32 sequential sum over k in b of s[k, r, m] * v[k, r, n]; "
           "acc = fp32(acc + fp32(f64(part) * 2^(ss[b, r, m] + sv[b, r, n] - 254))) (NaN if a scale is 0xFF)"),
    OpSpec("transpose", 5, (Engine.PE,),
           (out("dst", "PSUM [F, P], dtype = src dtype or fp32"), inp("src", "SBUF [P <= 128, F <= 128]")),
           cost.pe_transpose,
           "dst[f, p] = src[p, f]: the identity matmul, moving bits exactly (Inf, NaN, -0 kept)",
           "for p, f: dst[f, p] = src[p, f] (bits; widened exactly when dst is fp32)"),
    OpSpec("activation", 6, (Engine.ACT,),
           (out("dst", "SBUF or PSUM"), inp("src", "SBUF or PSUM"),
            imm("func", Kind.ENUM, "activation function", ActFunc),
            imm("scale", Kind.F32, "immediate scale (used when scale_ap is absent)", default=1.0),
            inp("scale_ap", "per-partition scale [P, 1]", optional=True),
            imm("bias", Kind.F32, "immediate bias (used when bias_ap is absent)"),
            inp("bias_ap", "per-partition bias [P, 1]", optional=True),
            out("accum", "fp32 [P, 1]: sum of f(...) along the free axis", optional=True)),
           cost.activation,
           "dst = func(src * scale + bias), optionally accum[p] = sum over the free axis of the fp32 result",
           "for p: acc = +0.0; for e in order: y = func(fp32(fp32(fp32(src[p, e]) * scale) + bias)); "
           "dst[p, e] = convert(y); acc = fp32(acc + y); accum[p] = acc"),
    OpSpec("tensor_tensor", 7, (Engine.DVE, Engine.POOL),
           (out("dst", ""), inp("in0", ""), inp("in1", ""), imm("op", Kind.ENUM, "ALU op", AluOp)),
           cost.tensor_tensor,
           "dst = in0 op in1, elementwise in fp32",
           "for e: dst[e] = convert(op(fp32(in0[e]), fp32(in1[e])))"),
    OpSpec("tensor_scalar", 8, ANY_COMPUTE,
           (out("dst", ""), inp("src", ""),
            imm("op0", Kind.ENUM, "first op", AluOp), imm("scalar0", Kind.F32, "its immediate operand"),
            inp("scalar0_ap", "per-partition operand [P, 1] instead of scalar0", optional=True),
            imm("reverse0", Kind.BOOL, "compute scalar op0 x instead of x op0 scalar"),
            imm("op1", Kind.ENUM, "second op (bypass: none)", AluOp), imm("scalar1", Kind.F32, "its operand"),
            inp("scalar1_ap", "per-partition operand [P, 1] instead of scalar1", optional=True),
            imm("reverse1", Kind.BOOL, "compute scalar op1 t instead of t op1 scalar")),
           cost.any_engine,
           "dst = (src op0 scalar0) op1 scalar1, scalars immediate or per partition",
           "for p, e: t = op0(fp32(src[p, e]), s0[p]) (operands swapped if reverse0); "
           "t = op1(t, s1[p]) (swapped if reverse1); dst[p, e] = convert(t)"),
    OpSpec("tensor_reduce", 9, (Engine.DVE,),
           (out("dst", "src shape without the reduced free dims"), inp("src", ""),
            imm("op", Kind.ENUM, "reduction", ReduceOp),
            imm("axes", Kind.U32, "bit j set: reduce free dim j of src (dim 0 outermost)")),
           cost.reduce,
           "dst = reduce(src) over the chosen free axes, in fp32, in row-major order",
           "for each kept index: acc = first element; for the rest in row-major order: acc = op(acc, fp32(x)); "
           "dst = convert(acc)"),
    OpSpec("tensor_copy", 10, ANY_COMPUTE,
           (out("dst", ""), inp("src", ""), imm("rounding", Kind.ENUM, "rne or sr", Rounding),
            imm("seed", Kind.U32, "seed of stochastic rounding")),
           cost.any_engine,
           "dst = src, converting the dtype (round to nearest even, or stochastic)",
           "for p, e: dst[p, e] = bits if dtypes equal else convert(fp32(src[p, e]), rounding, rand(seed, p, e))"),
    OpSpec("memset", 11, (Engine.DVE, Engine.POOL),
           (out("dst", ""), imm("value", Kind.F32, "fill value, converted to dst dtype")),
           cost.any_engine,
           "dst = value",
           "for e: dst[e] = convert(value)"),
    OpSpec("iota", 12, (Engine.POOL,),
           (out("dst", "SBUF"), imm("base", Kind.I32, "value at index 0"),
            imm("partition_step", Kind.I32, "added per partition"),
            imm("steps", Kind.I32X4, "added per index of each free dim")),
           cost.gpsimd,
           "dst[p, i...] = base + p * partition_step + sum(i_j * steps_j) in int32, converted",
           "v = int32 wrapping arithmetic; dst = convert(v) (int dst: exact; float dst: RNE)"),
    OpSpec("select", 13, (Engine.DVE,),
           (out("dst", ""), inp("pred", "nonzero = true"), inp("on_true", ""), inp("on_false", "")),
           cost.two_inputs,
           "dst = on_true where pred != 0 else on_false",
           "for e: dst[e] = convert(fp32(on_true[e]) if fp32(pred[e]) != 0 else fp32(on_false[e]))"),
    OpSpec("affine_select", 14, (Engine.POOL,),
           (out("dst", "SBUF"), inp("src", "SBUF"), imm("cmp", Kind.ENUM, "comparison of the expression with 0", AluOp),
            imm("fill", Kind.F32, "value where the comparison is false"),
            imm("base", Kind.I32, ""), imm("partition_step", Kind.I32, ""),
            imm("steps", Kind.I32X4, "per free dim")),
           cost.gpsimd,
           "dst = src where cmp(base + p*partition_step + sum(i_j*steps_j), 0) else fill (e.g. causal masks)",
           "for p, i: v = int32 expression; dst = convert(fp32(src) if cmp(v, 0) else fill)"),
    OpSpec("partition_reduce", 15, (Engine.POOL,),
           (out("dst", "SBUF [1, F]"), inp("src", "SBUF [P, F]"), imm("op", Kind.ENUM, "reduction", ReduceOp)),
           cost.partition_reduce,
           "dst[0, f] = reduce over partitions of src[:, f], fp32 in partition order",
           "for f: acc = fp32(src[0, f]); for p = 1..P-1: acc = op(acc, fp32(src[p, f])); dst[0, f] = convert(acc)"),
    OpSpec("partition_broadcast", 16, (Engine.POOL,),
           (out("dst", "SBUF [P, F]"), inp("src", "SBUF [1, F]")),
           cost.gpsimd,
           "dst[p, f] = src[0, f] for every partition p",
           "for p, f: dst[p, f] = bits if dtypes equal else convert(fp32(src[0, f]))"),
    OpSpec("quantize_mx", 17, (Engine.DVE,),
           (out("dst", "SBUF MX elements [P, F], P a multiple of 32"), out("scale", "SBUF e8m0 [P/32, F]"),
            inp("src", "SBUF or PSUM fp32/bf16/fp16 [P, F]"),
            imm("scale_mode", Kind.ENUM, "floor (OCP), trn_alt or rceil", ScaleMode)),
           cost.quantize_mx,
           "MX quantize along partitions: per 32-partition block and column, an E8M0 scale and RNE elements",
           "for block b, column f: amax = max |x|; S = scale(amax, mode) (0xFF if not finite); "
           "dst = cast_sat(fp32(x * 2^(127 - S))) (precision.md 7.3)"),
)

BY_NAME = {op.name: op for op in TABLE}
BY_CODE = {op.code: op for op in TABLE}


def opspec(name: str) -> OpSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown opcode '{name}'; expected one of {', '.join(BY_NAME)}") from None
