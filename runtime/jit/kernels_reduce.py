"""Lowerings of the folding opcodes: tensor_reduce, partition_reduce, and quantize_mx (a block amax fold).

A fold starts from the first element and applies acc = op(acc, x) to the rest in row-major order
(partition order for partition_reduce), one fp32 operation each, as runtime/reference_ops._fold does.
"""
from __future__ import annotations

from trnc.isa.dtypes import MX_BLOCK
from trnc.runtime.jit import kernels_values as values
from trnc.runtime.jit.kernels import (
    F32, I32, KernelBuilder, KernelSig, Stream, flat_stream, i64, lowering, partition_blocks, partition_starts,
    stream,
)


def _fold_into(kb: KernelBuilder, acc, op: int, x, first) -> None:
    """acc = x on the first element, else op(acc, x)."""
    b = kb.b
    b.store(b.select(first, x, values.fold(kb, op, b.load(acc), x)), acc)


FOLD_LANES = 16   # partitions folded side by side: independent chains, each in its own order


@lowering("tensor_reduce", statics=("op", "axes"))
def tensor_reduce(kb: KernelBuilder, sig: KernelSig) -> None:
    """For each kept index (row-major over the kept dims) fold the reduced dims' elements in row-major order;
    FOLD_LANES partitions at a time, so one fold's latency serves them all."""
    dst = sig.layout("dst")
    for lanes, count, first in partition_blocks(dst.partitions, min(FOLD_LANES, dst.partitions)):
        _fold_blocks(kb, sig, lanes, count, first)


def _fold_blocks(kb: KernelBuilder, sig: KernelSig, lanes: int, count: int, first: int) -> None:
    """`count` blocks of `lanes` partitions from partition `first`, each block's folds side by side."""
    dst, src = sig.layout("dst"), sig.layout("src")
    axes = sig.static("axes")
    kept = tuple(d for j, d in enumerate(src.dims) if not axes >> j & 1)
    reduced = tuple(d for j, d in enumerate(src.dims) if axes >> j & 1)
    kept_size = dst.free_size
    reduced_size = src.free_size // kept_size
    dbase, sbase = kb.base("dst"), kb.base("src")
    b = kb.b
    accs = [kb.alloca(F32, name=f"acc{k}") for k in range(lanes)]
    with kb.loop(count, "block") as block:
        starts = partition_starts(kb, kb.add(kb.mul(block, lanes), i64(first)), [dst, src])
        with kb.elements([stream(dst), Stream(0, kept)], starts, kept_size) as (doff, soff):
            for acc in accs:
                b.store(values.f32(kb, 0.0), acc)
            inner = [Stream(0, reduced), flat_stream((reduced_size,))]
            with kb.elements(inner, [soff, i64(0)], reduced_size) as (xoff, j):
                first_element = b.icmp_unsigned("==", j, i64(0))
                for k, acc in enumerate(accs):
                    x = values.load_f32(kb, sbase, kb.add(xoff, i64(k * src.pstride)), src.dtype)
                    _fold_into(kb, acc, sig.static("op"), x, first_element)
            for k, acc in enumerate(accs):
                values.store_f32(kb, b.load(acc), dbase, kb.add(doff, i64(k * dst.pstride)), dst.dtype)


@lowering("partition_reduce", statics=("op",))
def partition_reduce(kb: KernelBuilder, sig: KernelSig) -> None:
    """dst[0, f] = fold over p = 0..P-1 of fp32(src[p, f])."""
    dst, src = sig.layout("dst"), sig.layout("src")
    dbase, sbase = kb.base("dst"), kb.base("src")
    b = kb.b
    acc = kb.alloca(F32, name="acc")
    with kb.elements([stream(dst), stream(src)], [i64(0), i64(0)], dst.free_size) as (doff, soff):
        b.store(values.f32(kb, 0.0), acc)
        with kb.loop(src.partitions, "p") as p:
            x = values.load_f32(kb, sbase, kb.add(soff, kb.mul(p, src.pstride)), src.dtype)
            _fold_into(kb, acc, sig.static("op"), x, b.icmp_unsigned("==", p, i64(0)))
        values.store_f32(kb, b.load(acc), dbase, doff, dst.dtype)


@lowering("quantize_mx", statics=("scale_mode",))
def quantize_mx(kb: KernelBuilder, sig: KernelSig) -> None:
    """Per block of 32 partitions and column: the amax fold, the E8M0 scale, then the 32 element codes."""
    dst, scale, src = sig.layout("dst"), sig.layout("scale"), sig.layout("src")
    dbase, cbase, sbase = kb.base("dst"), kb.base("scale"), kb.base("src")
    b = kb.b
    amax = kb.alloca(I32, name="amax")
    with kb.loop(scale.partitions, "blk") as blk:
        first = b.mul(blk, i64(MX_BLOCK))
        starts = [kb.mul(first, dst.pstride), kb.mul(first, src.pstride), kb.mul(blk, scale.pstride)]
        with kb.elements([stream(dst), stream(src), stream(scale)], starts, dst.free_size) as (doff, soff, coff):
            b.store(values.u32(kb, 0), amax)
            with kb.loop(MX_BLOCK, "k") as k:
                x = values.load_f32(kb, sbase, kb.add(soff, b.mul(k, i64(src.pstride))), src.dtype)
                b.store(values.amax_fold(kb, b.load(amax), x), amax)
            s = values.scale_code(kb, b.load(amax), dst.dtype, sig.static("scale_mode"))
            kb.store_bits(s, cbase, coff, scale.dtype)
            with kb.loop(MX_BLOCK, "k") as k:
                x = values.load_f32(kb, sbase, kb.add(soff, b.mul(k, i64(src.pstride))), src.dtype)
                code = values.quantize_element(kb, x, s, dst.dtype)
                kb.store_bits(code, dbase, kb.add(doff, b.mul(k, i64(dst.pstride))), dst.dtype)
