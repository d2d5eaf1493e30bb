"""The verifier's rules keyed by opcode (isa/verify.py runs them): the shapes an opcode's operands must have
with one another, the dtypes and immediates it takes, host features, engine limits on enum fields and PSUM
banks; and the context and helpers every rule shares. Each rule yields (rule id, message) pairs."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trnc.isa.ap import AP, Mem
from trnc.isa.config import MOVING_FMAX, PE_COLUMNS, TARGETS, HwConfig
from trnc.isa.dtypes import MATMUL_DTYPES, MX_BLOCK, MX_FORMATS, DType
from trnc.isa.enums import COMPARISONS, AluOp, Rounding
from trnc.isa.opcodes import TABLE, Role
from trnc.isa.program import Instruction, Program

Problem = tuple[str, str]   # (rule id, message)


@dataclass(frozen=True)
class Ctx:
    program: Program
    hw: HwConfig


def fsize(ap: AP) -> int:
    """Elements per partition."""
    return math.prod(c for _, c in ap.dims)


def shape_text(ap: AP) -> str:
    """'[P, F1, F2]' for messages."""
    return f"[{', '.join(str(d) for d in ap.shape)}]"


def listed(items) -> str:
    """Enum members' texts, sorted and comma-separated, for messages."""
    return ", ".join(sorted(x.text for x in items))


# -- shapes, keyed by opcode -------------------------------------------------------------------------

def _elementwise(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    """The data operands of an elementwise row correspond element by element, its per-partition ones are [P, 1]."""
    data = [f.name for f in ins.spec.aps if f.role is Role.DATA]
    per_partition = [f.name for f in ins.spec.aps if f.role is Role.PER_PARTITION]
    first = ins[data[0]]
    for name in data[1:]:
        ap = ins[name]
        if ap.partitions != first.partitions or fsize(ap) != fsize(first):
            yield "shape", (f"{name} {shape_text(ap)} ({ap.partitions} x {fsize(ap)} elements) does not match "
                            f"{data[0]} {shape_text(first)} ({first.partitions} x {fsize(first)}); elementwise "
                            "operands need equal partitions and free sizes")
    for name in per_partition:
        ap = ins[name]
        if ap is not None and (ap.partitions != first.partitions or fsize(ap) != 1):
            yield "shape", f"{name} is {shape_text(ap)}; a per-partition operand is [{first.partitions}, 1]"


def _steps(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    yield from _elementwise(ctx, ins)
    yield from _step_dims(ins)


def _step_dims(ins: Instruction) -> Iterator[Problem]:
    """The counter's steps (iota, affine_select, random) step only dims dst has."""
    nd = len(ins["dst"].dims)
    if any(ins["steps"][nd:]):
        yield "shape", f"steps {list(ins['steps'])} step free dims beyond the {nd} of dst {shape_text(ins['dst'])}"


def _want(name: str, what: str, got: int, allowed: str) -> Problem:
    return "shape", f"{name} {what} is {got}; {allowed}"


def _matmul(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    st, mv = ins["stationary"], ins["moving"]
    k, m, n = st.partitions, fsize(st), fsize(mv)
    if mv.partitions != k:
        yield _want("moving", "partitions", mv.partitions, f"it must equal stationary's (the contraction K = {k})")
    if ins["double_row"]:
        for name, ap in (("stationary", st), ("moving", mv)):
            if not ap.dims or ap.dims[0][1] != 2:
                yield "shape", (f"double_row needs {name}'s first free dim to count 2 ([K, 2, X]); "
                                f"it is {shape_text(ap)}")
        m, n = m // 2, n // 2
    yield from _result_shape(ins, m, n)


def _result_shape(ins: Instruction, m: int, n: int) -> Iterator[Problem]:
    """The PE array's limits on M and N, and the [M, N] result they give."""
    dst = ins["dst"]
    if m > PE_COLUMNS:
        yield _want("stationary", "free size M", m, f"at most {PE_COLUMNS} (PE columns)")
    if n > MOVING_FMAX:
        yield _want("moving", "free size N", n, f"at most {MOVING_FMAX} (one PSUM bank of fp32)")
    if (dst.partitions, fsize(dst)) != (m, n):
        yield "shape", (f"dst is {shape_text(dst)}; {ins.opcode} writes [M, N] = [{m}, {n}] "
                        "(M partitions, N elements each)")


def _mx_groups(name: str, ap: AP) -> Iterator[Problem]:
    if len(ap.dims) not in (1, 2):
        yield "shape", f"{name} {shape_text(ap)} must have free dims (R, X) or (X,)"
    elif len(ap.dims) == 2 and ap.dims[0][1] > 4:
        yield _want(name, "row-group count R", ap.dims[0][1], "at most 4")


def _matmul_mx(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
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
            yield "shape", (f"{name} is {shape_text(scale)}; it must be [{k // MX_BLOCK}, "
                            f"{', '.join(map(str, data.free_shape))}] (K/{MX_BLOCK} partitions, the data's free shape)")


def _transpose(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    p, f = src.partitions, fsize(src)
    if f > PE_COLUMNS:
        yield _want("src", "free size", f, f"at most {PE_COLUMNS}")
    if (dst.partitions, fsize(dst)) != (f, p):
        yield "shape", f"dst is {shape_text(dst)}; the transpose of src {shape_text(src)} is [{f}, {p}]"


def _tensor_reduce(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst, axes = ins["src"], ins["dst"], ins["axes"]
    nd = len(src.dims)
    if axes == 0 or axes >> nd:
        yield "shape", (f"axes {axes:#b} must name at least one and only free dims of src {shape_text(src)} "
                        f"(bits 0..{nd - 1})")
        return
    kept = math.prod(c for j, (_, c) in enumerate(src.dims) if not axes >> j & 1)
    if dst.partitions != src.partitions or fsize(dst) != kept:
        yield "shape", (f"dst is {shape_text(dst)}; reducing src {shape_text(src)} over axes {axes:#b} leaves "
                        f"[{src.partitions}, {kept}] elements")


def _partition_reduce(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    if dst.partitions != 1 or fsize(dst) != fsize(src):
        yield "shape", (f"dst is {shape_text(dst)}; the partition reduction of src {shape_text(src)} "
                        f"is [1, {fsize(src)}]")


def _partition_broadcast(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    if src.partitions != 1:
        yield _want("src", "partitions", src.partitions, "a broadcast reads one partition")
    if fsize(dst) != fsize(src):
        yield "shape", f"dst free size {fsize(dst)} differs from src's {fsize(src)}"


def _random(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    seed = ins["seed"]
    if seed.partitions != 1 or fsize(seed) != 1:
        yield "shape", f"seed is {shape_text(seed)}; it must be [1, 1] (one int32 that every partition reads)"
    yield from _step_dims(ins)


def _dma_gather(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    dst, table, index = ins["dst"], ins["table"], ins["index"]
    if index.partitions != dst.partitions or fsize(index) != 1:
        yield "shape", f"index is {shape_text(index)}; it must be [{dst.partitions}, 1] (one row per dst partition)"
    if fsize(dst) != fsize(table):
        yield "shape", f"dst free size {fsize(dst)} differs from the table's row size {fsize(table)}"


def _quantize_mx(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst, scale = ins["src"], ins["dst"], ins["scale"]
    p, f = src.partitions, fsize(src)
    if p % MX_BLOCK:
        yield _want("src", "partitions", p, f"a multiple of {MX_BLOCK} (one scale per block of partitions)")
    if (dst.partitions, fsize(dst)) != (p, f):
        yield "shape", f"dst is {shape_text(dst)}; it must hold src's [{p}, {f}] elements"
    if (scale.partitions, fsize(scale)) != (p // MX_BLOCK, f):
        yield "shape", f"scale is {shape_text(scale)}; it must be [{p // MX_BLOCK}, {f}] (P/{MX_BLOCK} partitions)"


spec_shape: dict[str, Callable[[Ctx, Instruction], Iterator[Problem]]] = {
    **{op.name: _elementwise for op in TABLE if op.elementwise},
    "iota": _steps, "affine_select": _steps,
    "matmul": _matmul, "matmul_mx": _matmul_mx, "transpose": _transpose, "tensor_reduce": _tensor_reduce,
    "partition_reduce": _partition_reduce, "partition_broadcast": _partition_broadcast,
    "dma_gather": _dma_gather, "quantize_mx": _quantize_mx, "random": _random,
}


# -- dtypes and immediates, keyed by opcode ----------------------------------------------------------

def _dtype_in(name: str, ap: AP, allowed, what: str) -> Iterator[Problem]:
    if ap.dtype not in allowed:
        yield "dtype", f"{name} is {ap.dtype.text}; {what} must be one of {listed(allowed)}"


def _need(ctx: Ctx, flag: str, what: str) -> Iterator[Problem]:
    if not getattr(ctx.hw, flag):
        have = [name for name, hw in TARGETS.items() if getattr(hw, flag)]
        yield "target", f"{what} needs a target with {flag} ({', '.join(have)}); {ctx.hw.name} has none"


def features(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    """The target features the row asks for: the opcode's, and those of its bool fields that are set."""
    if ins.spec.needs:
        yield from _need(ctx, ins.spec.needs, ins.opcode)
    for f in ins.spec.fields:
        if f.needs and ins[f.name]:
            yield from _need(ctx, f.needs, f"{ins.opcode} {f.name}")


def _matmul_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    st, mv = ins["stationary"], ins["moving"]
    yield from _dtype_in("stationary", st, MATMUL_DTYPES, "a matmul input")
    yield from _dtype_in("moving", mv, MATMUL_DTYPES, "a matmul input")
    if (st.dtype is DType.FP32) != (mv.dtype is DType.FP32):
        yield "dtype", f"stationary is {st.dtype.text}, moving {mv.dtype.text}; fp32 must be on both inputs or neither"
    yield from _dtype_in("dst", ins["dst"], {DType.FP32}, "a matmul result in PSUM")
    if ins["double_row"] and not (st.dtype.is_fp8 and mv.dtype.is_fp8):
        yield "dtype", f"double_row takes fp8 inputs; stationary is {st.dtype.text}, moving {mv.dtype.text}"


def _matmul_mx_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    for name in ("stationary", "moving"):
        yield from _dtype_in(name, ins[name], MX_FORMATS, "an MX element type")
    for name in ("stationary_scale", "moving_scale"):
        yield from _dtype_in(name, ins[name], {DType.E8M0}, "an MX scale")
    yield from _dtype_in("dst", ins["dst"], {DType.FP32}, "a matmul result in PSUM")


def _quantize_mx_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    yield from _dtype_in("src", ins["src"], {DType.FP32, DType.BF16, DType.FP16}, "quantize_mx's input")
    yield from _dtype_in("dst", ins["dst"], MX_FORMATS, "an MX element type")
    yield from _dtype_in("scale", ins["scale"], {DType.E8M0}, "an MX scale")


def _transpose_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    src, dst = ins["src"], ins["dst"]
    if dst.dtype is not src.dtype and not (dst.dtype is DType.FP32 and src.dtype.is_float):
        yield "dtype", (f"dst is {dst.dtype.text} and src {src.dtype.text}; transpose keeps the dtype or widens "
                        "a float to fp32")


def _gather_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["dst"].dtype is not ins["table"].dtype:
        yield "dtype", (f"dst is {ins['dst'].dtype.text} and the table {ins['table'].dtype.text}; a gather moves "
                        "bits and cannot convert")
    yield from _dtype_in("index", ins["index"], {DType.INT32}, "a gather index")


def _activation_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["accum"] is not None:
        yield from _dtype_in("accum", ins["accum"], {DType.FP32}, "the activation accumulator")


def _tensor_copy_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["rounding"] == Rounding.SR and not ins["dst"].dtype.is_float:
        yield "dtype", f"rounding=sr needs a float dst; dst is {ins['dst'].dtype.text}"


def _random_dtypes(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    yield from _dtype_in("dst", ins["dst"], {DType.FP32}, "a random draw")
    yield from _dtype_in("seed", ins["seed"], {DType.INT32}, "the seed")


def _affine_select_ops(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    if ins["cmp"] not in COMPARISONS:
        yield "op", f"cmp is {AluOp(ins['cmp']).text}; affine_select compares with one of {listed(COMPARISONS)}"


spec_dtype: dict[str, Callable[[Ctx, Instruction], Iterator[Problem]]] = {
    "matmul": _matmul_dtypes, "matmul_mx": _matmul_mx_dtypes, "quantize_mx": _quantize_mx_dtypes,
    "transpose": _transpose_dtypes, "dma_gather": _gather_dtypes, "activation": _activation_dtypes,
    "tensor_copy": _tensor_copy_dtypes, "affine_select": _affine_select_ops, "random": _random_dtypes,
}


def engine_limits(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
    """Enum fields whose row limits the values on this engine (ScalarE's tensor_scalar: only mult and add)."""
    for f in ins.spec.fields:
        allowed = f.allowed_on(ins.engine)
        if allowed is not None and ins[f.name] not in allowed:
            yield "op", (f"{f.name} is {f.enum(ins[f.name]).text}; {ins.opcode} on {ins.engine.text} supports "
                         f"{listed(allowed)}")


def psum_bank(ctx: Ctx, ins: Instruction) -> Iterator[Problem]:
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
