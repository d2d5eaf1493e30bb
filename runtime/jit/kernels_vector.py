"""Lowerings of the elementwise compute opcodes: activation, tensor_tensor, tensor_scalar, select, affine_select.

Every element is read as fp32, computed with the fp32 algorithms of runtime/fp32math.py (through
runtime/jit/kernels_values.py) and converted on write, element by element in (p, e) order. Per-partition
operands (scale_ap, bias_ap, scalar*_ap) are read once at the start of each partition and activation's
accum is written at its end, so an operand that is both read and written sees its old value.
"""
from __future__ import annotations


from llvmlite import ir

from trnc.isa.enums import AluOp
from trnc.runtime.jit import kernels_values as values
from trnc.runtime.jit.kernels import (
    F32, KernelBuilder, KernelSig, flat_stream, i64, lowering, partition_blocks, partition_starts, stream,
)
from trnc.runtime.jit.kernels_move import affine_stream, affine_value


def _per_partition(kb: KernelBuilder, sig: KernelSig, name: str, p, immediate: int) -> ir.Value:
    """A [P, 1] operand's fp32 value at partition p, or the dynamic f32 immediate number `immediate`."""
    lay = sig.layout(name)
    if lay is None:
        return kb.dynamic_f32(immediate)
    return values.load_f32(kb, kb.base(name), kb.mul(p, lay.pstride), lay.dtype)


ACCUM_BUFFER = 16384   # most fp32 values of y a block of partitions keeps on the stack (64 KiB) for accum's sums
FOLD_LANES = 16        # partitions whose sums run side by side: independent chains, each in its own order


@lowering("activation", statics=("func",), dynamics=lambda fields: (fields.f32("scale"), fields.f32("bias")))
def activation(kb: KernelBuilder, sig: KernelSig) -> None:
    """y = func(fp32(fp32(x * scale) + bias)); dst = convert(y); accum[p] = fp32 sum of y from +0.0 in order.

    The sum's order allows no vectorization along a partition, and in the same loop it would keep the function's
    code scalar too; so, up to ACCUM_BUFFER elements a block of partitions, y also goes to a stack buffer that a
    second loop sums, the block's partitions side by side (one add latency then serves FOLD_LANES sums).
    """
    dst, accum = sig.layout("dst"), sig.layout("accum")
    lanes = max(1, min(FOLD_LANES, dst.partitions, ACCUM_BUFFER // dst.free_size)) if accum is not None else 1
    ys = kb.alloca(F32, lanes * dst.free_size, name="ys") \
        if accum is not None and dst.free_size <= ACCUM_BUFFER else None
    for width, count, first in partition_blocks(dst.partitions, lanes):
        _activation_blocks(kb, sig, width, count, first, ys)


def _activation_blocks(kb: KernelBuilder, sig: KernelSig, lanes: int, count: int, first: int, ys) -> None:
    """`count` blocks of `lanes` partitions from partition `first`: y of each partition, then the block's sums."""
    dst, src, accum = sig.layout("dst"), sig.layout("src"), sig.layout("accum")
    dbase, sbase = kb.base("dst"), kb.base("src")
    b = kb.b
    size = dst.free_size
    acc = kb.alloca(F32, name="acc")
    streams = [stream(dst), stream(src)] + ([flat_stream(dst.counts)] if ys is not None else [])
    with kb.loop(count, "block") as block:
        with kb.loop(lanes, "lane") as lane:
            p = kb.add(kb.add(kb.mul(block, lanes), lane), i64(first))
            scale = _per_partition(kb, sig, "scale_ap", p, 0)
            bias = _per_partition(kb, sig, "bias_ap", p, 1)
            b.store(ir.Constant(F32, 0.0), acc)
            starts = partition_starts(kb, p, [dst, src]) + ([kb.mul(lane, size)] if ys is not None else [])
            with kb.elements(streams, starts, size) as offs:
                x = values.load_f32(kb, sbase, offs[1], src.dtype)
                y = values.activation(kb, sig.static("func"), values.add(kb, values.mul(kb, x, scale), bias))
                values.store_f32(kb, y, dbase, offs[0], dst.dtype)
                if ys is not None:
                    b.store(y, b.gep(ys, [offs[2]], inbounds=True))
                elif accum is not None:
                    b.store(values.add(kb, b.load(acc), y), acc)
            if accum is not None and ys is None:
                values.store_f32(kb, b.load(acc), kb.base("accum"), kb.mul(p, accum.pstride), accum.dtype)
        if ys is not None:
            sums = [kb.alloca(F32, name=f"sum{k}") for k in range(lanes)]
            for total in sums:
                b.store(ir.Constant(F32, 0.0), total)
            with kb.loop(size, "sum") as e:
                for k, total in enumerate(sums):
                    y = b.load(b.gep(ys, [kb.add(e, i64(k * size))], inbounds=True))
                    b.store(values.add(kb, b.load(total), y), total)
            for k, total in enumerate(sums):
                p = kb.add(kb.mul(block, lanes), i64(first + k))
                values.store_f32(kb, b.load(total), kb.base("accum"), kb.mul(p, accum.pstride), accum.dtype)


@lowering("tensor_tensor", statics=("op",))
def tensor_tensor(kb: KernelBuilder, sig: KernelSig) -> None:
    dst, in0, in1 = sig.layout("dst"), sig.layout("in0"), sig.layout("in1")
    bases = [kb.base(n) for n in ("dst", "in0", "in1")]
    with kb.loop(dst.partitions, "p") as p:
        lays = [dst, in0, in1]
        with kb.elements([stream(x) for x in lays], partition_starts(kb, p, lays), dst.free_size) as offs:
            a = values.load_f32(kb, bases[1], offs[1], in0.dtype)
            c = values.load_f32(kb, bases[2], offs[2], in1.dtype)
            values.store_f32(kb, values.alu(kb, sig.static("op"), a, c), bases[0], offs[0], dst.dtype)


@lowering("tensor_scalar", statics=("op0", "reverse0", "op1", "reverse1"),
          dynamics=lambda fields: (fields.f32("scalar0"), fields.f32("scalar1")))
def tensor_scalar(kb: KernelBuilder, sig: KernelSig) -> None:
    """t = op0(x, s0) (swapped if reverse0); t = op1(t, s1) (swapped if reverse1); dst = convert(t)."""
    dst, src = sig.layout("dst"), sig.layout("src")
    dbase, sbase = kb.base("dst"), kb.base("src")

    def apply(op, t, s, reverse):
        return values.alu(kb, op, s, t) if reverse else values.alu(kb, op, t, s)

    with kb.loop(dst.partitions, "p") as p:
        s0 = _per_partition(kb, sig, "scalar0_ap", p, 0)
        s1 = _per_partition(kb, sig, "scalar1_ap", p, 1)
        with kb.elements([stream(dst), stream(src)], partition_starts(kb, p, [dst, src]), dst.free_size) as offs:
            t = values.load_f32(kb, sbase, offs[1], src.dtype)
            t = apply(sig.static("op0"), t, s0, sig.static("reverse0"))
            t = apply(sig.static("op1"), t, s1, sig.static("reverse1"))
            values.store_f32(kb, t, dbase, offs[0], dst.dtype)


@lowering("select")
def select(kb: KernelBuilder, sig: KernelSig) -> None:
    """dst = convert(fp32(on_true) if fp32(pred) != 0 else fp32(on_false)); NaN counts as nonzero."""
    names = ("dst", "pred", "on_true", "on_false")
    lays = [sig.layout(n) for n in names]
    bases = [kb.base(n) for n in names]
    with kb.loop(lays[0].partitions, "p") as p:
        with kb.elements([stream(x) for x in lays], partition_starts(kb, p, lays), lays[0].free_size) as offs:
            pred, yes, no = (values.load_f32(kb, bases[k], offs[k], lays[k].dtype) for k in (1, 2, 3))
            y = kb.b.select(values.nonzero(kb, pred), yes, no)
            values.store_f32(kb, y, bases[0], offs[0], lays[0].dtype)


# The comparisons affine_select may use (isa.enums.COMPARISONS), on the signed int32 expression.
INT_PREDICATES = {AluOp.EQ: "==", AluOp.NE: "!=", AluOp.LT: "<", AluOp.LE: "<=", AluOp.GT: ">", AluOp.GE: ">="}


@lowering("affine_select", statics=("cmp", "partition_step", "steps"),
          dynamics=lambda fields: (fields.int("base"), fields.f32("fill")))
def affine_select(kb: KernelBuilder, sig: KernelSig) -> None:
    """dst = convert(fp32(src) if cmp(base + p*partition_step + sum(i_j*steps_j), 0) else fill)."""
    dst, src = sig.layout("dst"), sig.layout("src")
    dbase, sbase = kb.base("dst"), kb.base("src")
    base, fill = kb.dynamic(0), kb.dynamic_f32(1)
    affine = affine_stream(sig, dst)
    predicate = INT_PREDICATES[sig.static("cmp")]
    with kb.loop(dst.partitions, "p") as p:
        starts = partition_starts(kb, p, [dst, src]) + [kb.mul(p, affine.pstride)]
        with kb.elements([stream(dst), stream(src), affine], starts, dst.free_size) as (doff, soff, voff):
            v = affine_value(kb, base, voff)
            keep = kb.b.icmp_signed(predicate, v, ir.Constant(v.type, 0))
            x = values.load_f32(kb, sbase, soff, src.dtype)
            values.store_f32(kb, kb.b.select(keep, x, fill), dbase, doff, dst.dtype)
