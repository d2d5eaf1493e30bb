"""The program verifier: the machine's rules as tables, checked on every instruction before a program runs.

A program that passes `verify` cannot make the runtime touch memory outside its buffers, uses
every engine and memory only as the hardware allows, and computes the same result under every
legal interleaving of its queues (the ordering checks live in isa/races.py). The rules come from
isa/spec_intro.md, the opcode table and ../shared/reference/neuroncore.md.

The rules are tables, in the manner of tinygrad's `spec_*` pattern tables: `spec_operand` runs on
every operand of every instruction (AP form, memory, partition alignment, bounds, e8m0 placement),
`spec_instruction` on every instruction (engine and queue), and `spec_shape` / `spec_dtype` are keyed
by opcode. The facts these generic rules apply (memories, roles, one-bank operands, e8m0 placement,
engine limits on enum fields) are read from the opcode rows, so this file states none of them again.
Each rule yields (rule id, message) pairs; the rule ids are short kebab-case names that tests and
users can match on.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from numbers import Integral, Real

from trnc.errors import VerifyError
from trnc.isa import races
from trnc.isa.ap import AP, MAX_AP_ELEMENTS, MAX_COUNT, MAX_FREE_DIMS, STRIDE_LIMIT, Engine, Mem
from trnc.isa.config import DMA_QUEUES, MOVING_FMAX, PE_COLUMNS, TARGETS, HwConfig, get_target
from trnc.isa.decoding import no_gc
from trnc.isa.dtypes import MATMUL_DTYPES, MX_BLOCK, MX_FORMATS, DType
from trnc.isa.enums import COMPARISONS, AluOp, Rounding
from trnc.isa.opcodes import BY_NAME, TABLE, E8m0, Kind, Role
from trnc.isa.program import Instruction, Program

ERROR_LIMIT = 20         # violations spelled out in one VerifyError message

Problem = tuple[str, str]   # (rule id, message)


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


@dataclass(frozen=True)
class _Ctx:
    program: Program
    hw: HwConfig


def _fsize(ap: AP) -> int:
    return math.prod(c for _, c in ap.dims)


def _shape(ap: AP) -> str:
    return f"[{', '.join(str(d) for d in ap.shape)}]"


def _names(items) -> str:
    return ", ".join(sorted(x.text for x in items))


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
                yield "fields", f"{f.name} = {v!r} is not a {f.enum.__name__}; expected one of {_names(f.enum)}"
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

def _engine(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    engines = ins.spec.engines
    if ins.engine not in engines:
        yield "engine", f"{ins.opcode} runs on {_names(engines)}, not {ins.engine.text}"


def _queue(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins.engine is Engine.DMA:
        if not 0 <= ins.queue < DMA_QUEUES:
            yield "queue", f"DMA queue {ins.queue} is outside [0, {DMA_QUEUES})"
    elif ins.queue != 0:
        yield "queue", f"queue {ins.queue} on {ins.engine.text}: compute engines have one queue, number 0"


spec_instruction: tuple[Callable[[_Ctx, Instruction], Iterator[Problem]], ...] = (_engine, _queue)


# -- rules on every operand --------------------------------------------------------------------------

def _ap_form(ctx: _Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
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
        yield "ap-form", (f"{name}: spans {ap.num_elements} elements ({ap.partitions} partitions x {_fsize(ap)}); "
                          f"at most 2^32, so every instruction's work is bounded")
    if ap.mem is Mem.HBM:
        if abs(ap.partition_stride) >= STRIDE_LIMIT:
            yield "ap-form", f"{name}: partition stride {ap.partition_stride} is outside (-2^31, 2^31)"
        if write and ap.partitions > 1 and ap.partition_stride == 0:
            yield "ap-form", f"{name}: written over {ap.partitions} partitions with partition stride 0"
    elif ap.partition_stride != 0:
        yield "ap-form", f"{name}: an on-chip AP has no partition stride ({ap.partition_stride}); it must be 0"
    yield from _ap_place(ctx, ins, name, ap, write)


def _ap_place(ctx: _Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
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


def _memory(ctx: _Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    allowed = ins.spec.memories(ins.spec.field(name), ins.engine)
    if ap.mem not in allowed:
        yield "memory", (f"{name} is in {ap.mem.text}; {ins.opcode} on {ins.engine.text} takes it from "
                         f"{_names(allowed)}")


def aligned_starts(partitions: int) -> tuple[int, ...]:
    """Legal start partitions of a compute-engine AP (neuroncore.md 3, "Partition rules")."""
    if partitions > 64:
        return (0,)
    if partitions > 32:
        return (0, 64)
    return (0, 32, 64, 96)


def _partition_align(ctx: _Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    if ins.engine is Engine.DMA or ap.mem is Mem.HBM:
        return
    starts = aligned_starts(ap.partitions)
    if ap.start_partition not in starts:
        yield "partition-align", (f"{name} starts at partition {ap.start_partition} with {ap.partitions} "
                                  f"partitions; compute engines allow starts {set(starts)}")


def _bounds(ctx: _Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
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


def _e8m0(ctx: _Ctx, ins: Instruction, name: str, ap: AP, write: bool) -> Iterator[Problem]:
    if ap.dtype is DType.E8M0 and not _e8m0_allowed(ins, name):
        yield "dtype", (f"{name} is e8m0; e8m0 is only an MX scale (quantize_mx scale, matmul_mx scales), "
                        "copied bit for bit (dma_copy, tensor_copy with both sides e8m0) or decoded by tensor_copy")


spec_operand = (_ap_form, _memory, _partition_align, _bounds, _e8m0)
# The operand rules that read an AP's place (offset, start partition, tensor); every other rule reads only
# the instruction's form (_form_key), so instructions of one form differ only in these.
place_operand = (_ap_place, _partition_align, _bounds)


# -- shapes, keyed by opcode -------------------------------------------------------------------------

def _elementwise(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    """The data operands of an elementwise row correspond element by element, its per-partition ones are [P, 1]."""
    data = [f.name for f in ins.spec.aps if f.role is Role.DATA]
    per_partition = [f.name for f in ins.spec.aps if f.role is Role.PER_PARTITION]
    first = ins[data[0]]
    for name in data[1:]:
        ap = ins[name]
        if ap.partitions != first.partitions or _fsize(ap) != _fsize(first):
            yield "shape", (f"{name} {_shape(ap)} ({ap.partitions} x {_fsize(ap)} elements) does not match "
                            f"{data[0]} {_shape(first)} ({first.partitions} x {_fsize(first)}); elementwise "
                            "operands need equal partitions and free sizes")
    for name in per_partition:
        ap = ins[name]
        if ap is not None and (ap.partitions != first.partitions or _fsize(ap) != 1):
            yield "shape", f"{name} is {_shape(ap)}; a per-partition operand is [{first.partitions}, 1]"


def _steps(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    yield from _elementwise(ctx, ins)
    yield from _step_dims(ins)


def _step_dims(ins: Instruction) -> Iterator[Problem]:
    """The counter's steps (iota, affine_select, random) step only dims dst has."""
    nd = len(ins["dst"].dims)
    if any(ins["steps"][nd:]):
        yield "shape", f"steps {list(ins['steps'])} step free dims beyond the {nd} of dst {_shape(ins['dst'])}"


def _want(name: str, what: str, got: int, allowed: str) -> Problem:
    return "shape", f"{name} {what} is {got}; {allowed}"


def _matmul(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    st, mv = ins["stationary"], ins["moving"]
    k, m, n = st.partitions, _fsize(st), _fsize(mv)
    if mv.partitions != k:
        yield _want("moving", "partitions", mv.partitions, f"it must equal stationary's (the contraction K = {k})")
    if ins["double_row"]:
        for name, ap in (("stationary", st), ("moving", mv)):
            if not ap.dims or ap.dims[0][1] != 2:
                yield "shape", f"double_row needs {name}'s first free dim to count 2 ([K, 2, X]); it is {_shape(ap)}"
        m, n = m // 2, n // 2
    yield from _result_shape(ins, m, n)


def _result_shape(ins: Instruction, m: int, n: int) -> Iterator[Problem]:
    """The PE array's limits on M and N, and the [M, N] result they give."""
    dst = ins["dst"]
    if m > PE_COLUMNS:
        yield _want("stationary", "free size M", m, f"at most {PE_COLUMNS} (PE columns)")
    if n > MOVING_FMAX:
        yield _want("moving", "free size N", n, f"at most {MOVING_FMAX} (one PSUM bank of fp32)")
    if (dst.partitions, _fsize(dst)) != (m, n):
        yield "shape", f"dst is {_shape(dst)}; {ins.opcode} writes [M, N] = [{m}, {n}] (M partitions, N elements each)"


def _mx_groups(name: str, ap: AP) -> Iterator[Problem]:
    if len(ap.dims) not in (1, 2):
        yield "shape", f"{name} {_shape(ap)} must have free dims (R, X) or (X,)"
    elif len(ap.dims) == 2 and ap.dims[0][1] > 4:
        yield _want(name, "row-group count R", ap.dims[0][1], "at most 4")


def _matmul_mx(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    st, mv = ins["stationary"], ins["moving"]
    k = st.partitions
    if mv.partitions != k:
        yield _want("moving", "partitions", mv.partitions, f"it must equal stationary's (the contraction K = {k})")
    if k % MX_BLOCK:
        yield _want("stationary", "partitions K", k, f"a multiple of {MX_BLOCK} (one e8m0 scale per block)")
    yield from _mx_groups("stationary", st)
    yield from _mx_groups("moving", mv)
    groups = [ap.free_shape[0] if len(ap.dims) == 2 else 1 for ap in (st, mv)]
    if groups[0] != groups[1]:
        yield "shape", f"stationary has {groups[0]} row groups and moving {groups[1]}; they must match"
    m, n = st.free_shape[-1] if st.dims else 1, mv.free_shape[-1] if mv.dims else 1
    yield from _result_shape(ins, m, n)
    for name, data in (("stationary_scale", st), ("moving_scale", mv)):
        scale = ins[name]
        if scale.partitions != k // MX_BLOCK or scale.free_shape != data.free_shape:
            yield "shape", (f"{name} is {_shape(scale)}; it must be [{k // MX_BLOCK}, "
                            f"{', '.join(map(str, data.free_shape))}] (K/{MX_BLOCK} partitions, the data's free shape)")


def _transpose(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    p, f = src.partitions, _fsize(src)
    if f > PE_COLUMNS:
        yield _want("src", "free size", f, f"at most {PE_COLUMNS}")
    if (dst.partitions, _fsize(dst)) != (f, p):
        yield "shape", f"dst is {_shape(dst)}; the transpose of src {_shape(src)} is [{f}, {p}]"


def _tensor_reduce(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst, axes = ins["src"], ins["dst"], ins["axes"]
    nd = len(src.dims)
    if axes == 0 or axes >> nd:
        yield "shape", (f"axes {axes:#b} must name at least one and only free dims of src {_shape(src)} "
                        f"(bits 0..{nd - 1})")
        return
    kept = math.prod(c for j, (_, c) in enumerate(src.dims) if not axes >> j & 1)
    if dst.partitions != src.partitions or _fsize(dst) != kept:
        yield "shape", (f"dst is {_shape(dst)}; reducing src {_shape(src)} over axes {axes:#b} leaves "
                        f"[{src.partitions}, {kept}] elements")


def _partition_reduce(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    if dst.partitions != 1 or _fsize(dst) != _fsize(src):
        yield "shape", f"dst is {_shape(dst)}; the partition reduction of src {_shape(src)} is [1, {_fsize(src)}]"


def _partition_broadcast(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    if src.partitions != 1:
        yield _want("src", "partitions", src.partitions, "a broadcast reads one partition")
    if _fsize(dst) != _fsize(src):
        yield "shape", f"dst free size {_fsize(dst)} differs from src's {_fsize(src)}"


def _random(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    seed = ins["seed"]
    if seed.partitions != 1 or _fsize(seed) != 1:
        yield "shape", f"seed is {_shape(seed)}; it must be [1, 1] (one int32 that every partition reads)"
    yield from _step_dims(ins)


def _dma_gather(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    dst, table, index = ins["dst"], ins["table"], ins["index"]
    if index.partitions != dst.partitions or _fsize(index) != 1:
        yield "shape", f"index is {_shape(index)}; it must be [{dst.partitions}, 1] (one row per dst partition)"
    if _fsize(dst) != _fsize(table):
        yield "shape", f"dst free size {_fsize(dst)} differs from the table's row size {_fsize(table)}"


def _quantize_mx(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst, scale = ins["src"], ins["dst"], ins["scale"]
    p, f = src.partitions, _fsize(src)
    if p % MX_BLOCK:
        yield _want("src", "partitions", p, f"a multiple of {MX_BLOCK} (one scale per block of partitions)")
    if (dst.partitions, _fsize(dst)) != (p, f):
        yield "shape", f"dst is {_shape(dst)}; it must hold src's [{p}, {f}] elements"
    if (scale.partitions, _fsize(scale)) != (p // MX_BLOCK, f):
        yield "shape", f"scale is {_shape(scale)}; it must be [{p // MX_BLOCK}, {f}] (P/{MX_BLOCK} partitions)"


spec_shape: dict[str, Callable[[_Ctx, Instruction], Iterator[Problem]]] = {
    **{op.name: _elementwise for op in TABLE if op.elementwise},
    "iota": _steps, "affine_select": _steps,
    "matmul": _matmul, "matmul_mx": _matmul_mx, "transpose": _transpose, "tensor_reduce": _tensor_reduce,
    "partition_reduce": _partition_reduce, "partition_broadcast": _partition_broadcast,
    "dma_gather": _dma_gather, "quantize_mx": _quantize_mx, "random": _random,
}


# -- dtypes and immediates, keyed by opcode ----------------------------------------------------------

def _dtype_in(name: str, ap: AP, allowed, what: str) -> Iterator[Problem]:
    if ap.dtype not in allowed:
        yield "dtype", f"{name} is {ap.dtype.text}; {what} must be one of {_names(allowed)}"


def _need(ctx: _Ctx, flag: str, what: str) -> Iterator[Problem]:
    if not getattr(ctx.hw, flag):
        have = [name for name, hw in TARGETS.items() if getattr(hw, flag)]
        yield "target", f"{what} needs a target with {flag} ({', '.join(have)}); {ctx.hw.name} has none"


def _features(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    """The target features the row asks for: the opcode's, and those of its bool fields that are set."""
    if ins.spec.needs:
        yield from _need(ctx, ins.spec.needs, ins.opcode)
    for f in ins.spec.fields:
        if f.needs and ins[f.name]:
            yield from _need(ctx, f.needs, f"{ins.opcode} {f.name}")


def _matmul_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    st, mv = ins["stationary"], ins["moving"]
    yield from _dtype_in("stationary", st, MATMUL_DTYPES, "a matmul input")
    yield from _dtype_in("moving", mv, MATMUL_DTYPES, "a matmul input")
    if (st.dtype is DType.FP32) != (mv.dtype is DType.FP32):
        yield "dtype", f"stationary is {st.dtype.text}, moving {mv.dtype.text}; fp32 must be on both inputs or neither"
    yield from _dtype_in("dst", ins["dst"], {DType.FP32}, "a matmul result in PSUM")
    if ins["double_row"] and not (st.dtype.is_fp8 and mv.dtype.is_fp8):
        yield "dtype", f"double_row takes fp8 inputs; stationary is {st.dtype.text}, moving {mv.dtype.text}"


def _matmul_mx_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    for name in ("stationary", "moving"):
        yield from _dtype_in(name, ins[name], MX_FORMATS, "an MX element type")
    for name in ("stationary_scale", "moving_scale"):
        yield from _dtype_in(name, ins[name], {DType.E8M0}, "an MX scale")
    yield from _dtype_in("dst", ins["dst"], {DType.FP32}, "a matmul result in PSUM")


def _quantize_mx_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    yield from _dtype_in("src", ins["src"], {DType.FP32, DType.BF16, DType.FP16}, "quantize_mx's input")
    yield from _dtype_in("dst", ins["dst"], MX_FORMATS, "an MX element type")
    yield from _dtype_in("scale", ins["scale"], {DType.E8M0}, "an MX scale")


def _transpose_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    if dst.dtype is not src.dtype and not (dst.dtype is DType.FP32 and src.dtype.is_float):
        yield "dtype", (f"dst is {dst.dtype.text} and src {src.dtype.text}; transpose keeps the dtype or widens "
                        "a float to fp32")


def _gather_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["dst"].dtype is not ins["table"].dtype:
        yield "dtype", (f"dst is {ins['dst'].dtype.text} and the table {ins['table'].dtype.text}; a gather moves "
                        "bits and cannot convert")
    yield from _dtype_in("index", ins["index"], {DType.INT32}, "a gather index")


def _activation_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["accum"] is not None:
        yield from _dtype_in("accum", ins["accum"], {DType.FP32}, "the activation accumulator")


def _tensor_copy_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["rounding"] == Rounding.SR and not ins["dst"].dtype.is_float:
        yield "dtype", f"rounding=sr needs a float dst; dst is {ins['dst'].dtype.text}"


def _random_dtypes(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    yield from _dtype_in("dst", ins["dst"], {DType.FP32}, "a random draw")
    yield from _dtype_in("seed", ins["seed"], {DType.INT32}, "the seed")


def _affine_select_ops(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["cmp"] not in COMPARISONS:
        yield "op", f"cmp is {AluOp(ins['cmp']).text}; affine_select compares with one of {_names(COMPARISONS)}"


spec_dtype: dict[str, Callable[[_Ctx, Instruction], Iterator[Problem]]] = {
    "matmul": _matmul_dtypes, "matmul_mx": _matmul_mx_dtypes, "quantize_mx": _quantize_mx_dtypes,
    "transpose": _transpose_dtypes, "dma_gather": _gather_dtypes, "activation": _activation_dtypes,
    "tensor_copy": _tensor_copy_dtypes, "affine_select": _affine_select_ops, "random": _random_dtypes,
}


def _engine_limits(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    """Enum fields whose row limits the values on this engine (ScalarE's tensor_scalar: only mult and add)."""
    for f in ins.spec.fields:
        allowed = f.allowed_on(ins.engine)
        if allowed is not None and ins[f.name] not in allowed:
            yield "op", (f"{f.name} is {f.enum(ins[f.name]).text}; {ins.opcode} on {ins.engine.text} supports "
                         f"{_names(allowed)}")


def _psum_bank(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    """Operands the row keeps within one PSUM bank (matmul and transpose results) do not cross one."""
    bank = ctx.hw.psum_bank_bytes
    for f in ins.spec.aps:
        ap = ins[f.name]
        if not f.one_bank or ap is None or ap.mem is not Mem.PSUM:
            continue
        lo, hi = ap.byte_range()
        if lo // bank != (hi - 1) // bank:
            yield "psum-bank", (f"{f.name} reaches bytes [{lo}, {hi}) of each partition, crossing PSUM banks "
                                f"{lo // bank} to {(hi - 1) // bank}; {ins.opcode} writes within one {bank}-byte bank")


# -- the driver ---------------------------------------------------------------------------------------

def _instruction(ctx: _Ctx, ins: Instruction) -> tuple[list[Problem], bool]:
    """Problems of one instruction, and whether its operands are sound enough for the ordering checks."""
    if ins.opcode not in BY_NAME:
        return [("opcode", f"unknown opcode '{ins.opcode}'; expected one of {', '.join(BY_NAME)}")], False
    problems = list(_field_problems(ins))
    if not problems and not isinstance(ins.engine, Engine):
        problems.append(("engine", f"engine {ins.engine!r} is not one of {_names(Engine)}"))
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
        problems.extend(_features(ctx, ins))
        problems.extend(spec_dtype.get(ins.opcode, lambda c, i: ())(ctx, ins))
        problems.extend(_engine_limits(ctx, ins))
        problems.extend(_psum_bank(ctx, ins))
        problems.extend(races.operand_overlap(ins))
    return problems, formed


def _form_key(ins: Instruction) -> tuple:
    """Everything the rules read but the places of the access patterns."""
    return (ins.opcode, ins.engine, ins.queue,
            tuple((k, (v.mem, v.dtype, v.partitions, v.dims, v.partition_stride) if isinstance(v, AP) else v)
                  for k, v in ins.args))


def _place_problems(ctx: _Ctx, ins: Instruction) -> Iterator[Problem]:
    """The rules that read places, on an instruction whose form has passed every rule elsewhere."""
    for name, ap, write in ins.operands():
        for rule in place_operand:
            yield from rule(ctx, ins, name, ap, write)
    yield from _psum_bank(ctx, ins)
    yield from races.operand_overlap(ins)


def check(program: Program, hw: HwConfig | None = None) -> list[Violation]:
    """Every violation of the machine's rules in `program`, ordered by instruction index.

    The ordering checks (semaphores, deadlocks, races) run on the instructions whose operands are well
    formed; a race is reported once per pair of instructions, at the later one in the happens-before order.
    """
    ctx = _Ctx(program, hw if hw is not None else _target(program))
    found, sound = [], []   # violations; the instructions whose operands are well formed
    # Once an instruction of a form passes every rule, the others of that form (a kernel's tiles at other
    # offsets) run only the place rules (place_operand), and every rule when one of those fails.
    passed: set[tuple] = set()
    with no_gc():   # hundreds of thousands of small live objects: collecting would free none
        for i, ins in enumerate(program.instructions):
            try:
                key = _form_key(ins)
                seen = key in passed
            except (TypeError, AttributeError):   # unhashable or ill-typed fields: an ill-formed instruction
                key, seen = None, False
            if seen and next(_place_problems(ctx, ins), None) is None:
                problems, ok = [], True
            else:
                problems, ok = _instruction(ctx, ins)
                if not problems and key is not None:
                    passed.add(key)
            found.extend(Violation(i, rule, msg) for rule, msg in problems)
            if ok:
                sound.append(i)
        ordering, problems = races.order(program)
        found.extend(Violation(*p) for p in problems)
        if ordering is not None:
            describe = partial(assembly, program)
            found.extend(Violation(*p) for p in races.find_races(program, ordering, sound, describe))
    found.sort(key=lambda v: v.index)
    return found


def verify(program: Program, hw: HwConfig | None = None) -> None:
    """Raise VerifyError naming each broken rule (index, assembly, rule id, specifics); return if none."""
    found = check(program, hw)
    if not found:
        return
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
