"""Lowerings of TensorE's matmul and matmul_mx: fp32 accumulation in the reference's exact order.

For every output row m the kernel keeps the N accumulators of that row in a stack array, loads them
from dst (accumulate) or sets +0.0, then for each row group r and each partition k of the contraction
adds fp32(s[k, r, m] * v[k, r, n]) to accumulator n, the loop over n innermost so that LLVM vectorizes
it across n; each accumulator still sees its additions in k order, one rounding each, as
runtime/reference_ops.matmul does. Products of bf16, fp16 and fp8 values are exact in fp32.
"""
from __future__ import annotations

from llvmlite import ir

from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.runtime.jit import kernels_values as values
from trnc.runtime.jit.kernels import (
    F32, KernelBuilder, KernelSig, Layout, Stream, flat_stream, i64, lowering, stream,
)

ZERO = ir.Constant(F32, 0.0)


def _groups(lay: Layout, grouped: bool) -> tuple[int, int, Stream]:
    """(row groups R, byte stride between groups, stream over the rest of the free dims) of a matmul input."""
    if not grouped:
        return 1, 0, Stream(lay.pstride, lay.dims)
    (gstride, groups), rest = lay.dims[0], lay.dims[1:]
    return groups, gstride, Stream(lay.pstride, rest)


def _accumulators(kb: KernelBuilder, sig: KernelSig, m) -> tuple[ir.Value, Layout]:
    """The row's accumulators: a stack array of N floats, from dst row m or +0.0."""
    dst = sig.layout("dst")
    n = dst.free_size
    acc = kb.alloca(F32, n, name="acc")
    dbase = kb.base("dst")
    with kb.elements([stream(dst), flat_stream(dst.counts)], [kb.mul(m, dst.pstride), i64(0)], n) as (doff, j):
        init = values.load_f32(kb, dbase, doff, dst.dtype) if sig.static("accumulate") else ZERO
        kb.b.store(init, kb.b.gep(acc, [j], inbounds=True))
    return acc, dst


def _store_row(kb: KernelBuilder, acc, dst: Layout, m) -> None:
    dbase = kb.base("dst")
    with kb.elements([stream(dst), flat_stream(dst.counts)], [kb.mul(m, dst.pstride), i64(0)],
                     dst.free_size) as (doff, j):
        values.store_f32(kb, kb.b.load(kb.b.gep(acc, [j], inbounds=True)), dbase, doff, dst.dtype)


@lowering("matmul", statics=("accumulate", "double_row"))
def matmul(kb: KernelBuilder, sig: KernelSig) -> None:
    st, mv = sig.layout("stationary"), sig.layout("moving")
    grouped = bool(sig.static("double_row"))
    groups, st_gstride, st_rest = _groups(st, grouped)
    _, mv_gstride, mv_rest = _groups(mv, grouped)
    sbase, vbase = kb.base("stationary"), kb.base("moving")
    b = kb.b
    dst = sig.layout("dst")
    with kb.loop(dst.partitions, "m") as m:
        acc, dst = _accumulators(kb, sig, m)
        s_m = kb.stream_offset(m, st_rest)
        with kb.loop(groups, "r") as r, kb.loop(st.partitions, "k") as k:
            s = values.load_f32(kb, sbase, kb.add(kb.add(kb.mul(k, st.pstride), kb.mul(r, st_gstride)), s_m), st.dtype)
            starts = [kb.add(kb.mul(k, mv.pstride), kb.mul(r, mv_gstride)), i64(0)]
            with kb.elements([mv_rest, flat_stream((dst.free_size,))], starts, dst.free_size) as (voff, j):
                v = values.load_f32(kb, vbase, voff, mv.dtype)
                slot = b.gep(acc, [j], inbounds=True)
                b.store(b.fadd(b.load(slot), b.fmul(s, v)), slot)
        _store_row(kb, acc, dst, m)


@lowering("matmul_mx", statics=("accumulate",))
def matmul_mx(kb: KernelBuilder, sig: KernelSig) -> None:
    """Per row group r and block b: part = fp32 sum from +0.0 of the exact products in partition order;
    acc = fp32(acc + fp32(f64(part) * 2^(ss + sv - 254))), NaN when either scale is 0xFF."""
    st, mv = sig.layout("stationary"), sig.layout("moving")
    sts, mvs = sig.layout("stationary_scale"), sig.layout("moving_scale")
    # Each input is [K, R, X] when it has two free dims, else [K, X] with R = 1; its scales have its free shape.
    groups, st_gstride, st_rest = _groups(st, len(st.dims) == 2)
    _, mv_gstride, mv_rest = _groups(mv, len(mv.dims) == 2)
    _, sts_gstride, sts_rest = _groups(sts, len(st.dims) == 2)
    _, mvs_gstride, mvs_rest = _groups(mvs, len(mv.dims) == 2)
    sbase, vbase, ssbase, svbase = (kb.base(x) for x in ("stationary", "moving", "stationary_scale", "moving_scale"))
    b = kb.b
    dst = sig.layout("dst")
    n = dst.free_size
    part = kb.alloca(F32, n, name="part")
    with kb.loop(dst.partitions, "m") as m:
        acc, dst = _accumulators(kb, sig, m)
        s_m, ss_m = kb.stream_offset(m, st_rest), kb.stream_offset(m, sts_rest)
        with kb.loop(groups, "r") as r, kb.loop(st.partitions // MX_BLOCK, "blk") as blk:
            with kb.loop(n, "z") as j:
                b.store(ZERO, b.gep(part, [j], inbounds=True))
            with kb.loop(MX_BLOCK, "k") as kk:
                k = b.add(b.mul(blk, i64(MX_BLOCK)), kk)
                s = values.load_f32(kb, sbase, kb.add(kb.add(b.mul(k, i64(st.pstride)), kb.mul(r, st_gstride)), s_m),
                                    st.dtype)
                starts = [kb.add(b.mul(k, i64(mv.pstride)), kb.mul(r, mv_gstride)), i64(0)]
                with kb.elements([mv_rest, flat_stream((n,))], starts, n) as (voff, j):
                    v = values.load_f32(kb, vbase, voff, mv.dtype)
                    slot = b.gep(part, [j], inbounds=True)
                    b.store(b.fadd(b.load(slot), b.fmul(s, v)), slot)
            ss = kb.load_bits(ssbase, kb.add(kb.add(b.mul(blk, i64(sts.pstride)), kb.mul(r, sts_gstride)), ss_m),
                              DType.E8M0)
            starts = [kb.add(b.mul(blk, i64(mvs.pstride)), kb.mul(r, mvs_gstride)), i64(0)]
            with kb.elements([mvs_rest, flat_stream((n,))], starts, n) as (soff, j):
                sv = kb.load_bits(svbase, soff, DType.E8M0)
                scaled = values.scaled_block_sum(kb, b.load(b.gep(part, [j], inbounds=True)), ss, sv)
                slot = b.gep(acc, [j], inbounds=True)
                b.store(values.add(kb, b.load(slot), scaled), slot)
        _store_row(kb, acc, dst, m)
