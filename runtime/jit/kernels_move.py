"""Lowerings of the data-movement opcodes: dma_copy, tensor_copy, dma_gather, transpose, partition_broadcast,
memset, iota and random.

Same-dtype moves copy the storage bits (NaN payloads included, spec_intro.md "Writing"); a move between
dtypes reads fp32 and converts on write through runtime/jit/kernels_values.py, like runtime/reference_ops._move.
"""
from __future__ import annotations

import contextlib

import numpy as np
from llvmlite import ir

from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding
from trnc.runtime.convert import from_fp32
from trnc.runtime.jit import kernels_values as values
from trnc.runtime.jit.kernels import (
    CACHE_LINE, FAULT_GATHER_INDEX, I32, I64, INT_OF_SIZE, FieldColumns, KernelBuilder, KernelSig, Layout, Nest,
    Stream, canonical, flat_stream, i64, lowering, partition_blocks, partition_starts, plan, stream,
)

TILE = 16   # partitions x free elements a transposing copy moves as one tile of vectors


def move_element(kb: KernelBuilder, src: Layout, src_base, src_off, dst: Layout, dst_base, dst_off,
                 rounding: Rounding = Rounding.RNE, rand=None) -> None:
    """dst = src: the bits when the dtypes are equal, else convert(fp32(src), dst.dtype)."""
    if src.dtype is dst.dtype:
        kb.store_bits(kb.load_bits(src_base, src_off, src.dtype), dst_base, dst_off, dst.dtype)
        return
    x = values.load_f32(kb, src_base, src_off, src.dtype)
    values.store_f32(kb, x, dst_base, dst_off, dst.dtype, rounding, rand)


def partition_block(dst: Layout, src: Layout) -> int:
    """Partitions a copy moves together, element by element: when one side's partitions are adjacent elements
    and its free elements a cache line or more apart (a transposing DMA), so that each of its cache lines is
    visited once rather than once per partition (GPT-2's activation transposes ran at 1.8 GB/s, 4.5 ms)."""
    for lay in (src, dst):
        dims = canonical(lay.dims)
        if 0 < abs(lay.pstride) < CACHE_LINE and dims and min(abs(s) for s, _ in dims) >= CACHE_LINE:
            return min(CACHE_LINE // abs(lay.pstride), dst.partitions)
    return 1


def _copy(kb: KernelBuilder, sig: KernelSig, rounding: Rounding = Rounding.RNE, seed=None) -> None:
    """dst = src element by element; a copy's elements are independent (its operands are one access pattern or
    disjoint), so their order is free: tiles of a transposing copy (_tiling), else blocks of partition_block
    partitions, then the rest one by one."""
    dst, src = sig.layout("dst"), sig.layout("src")
    dbase, sbase = kb.base("dst"), kb.base("src")
    streams = [stream(dst), stream(src)] + ([flat_stream(dst.counts)] if seed is not None else [])
    tiling = _tiling(dst, src) if seed is None else None
    lanes = TILE if tiling else partition_block(dst, src) if seed is None else 1   # a rounding stream is per partition
    for lanes, count, first in partition_blocks(dst.partitions, lanes):
        if tiling and lanes == TILE:
            _tiles(kb, dst, src, count, *tiling)
            continue
        with kb.loop(count, "block") as block:
            p = kb.add(kb.mul(block, lanes), i64(first))
            starts = partition_starts(kb, p, [dst, src]) + ([i64(0)] if seed is not None else [])
            with kb.elements(streams, starts, dst.free_size) as offs:
                rand = values.sr_rand(kb, seed, p, offs[2]) if seed is not None else None
                for k in range(lanes):
                    move_element(kb, src, sbase, kb.add(offs[1], i64(k * src.pstride)), dst, dbase,
                                 kb.add(offs[0], i64(k * dst.pstride)), rounding, rand)


def _distinct(lay: Layout) -> bool:
    """Every element of `lay` at its own bytes (each stride, by size, clears the span of the smaller ones)."""
    span = lay.dtype.itemsize
    for s, c in sorted((abs(s), c) for s, c in ((lay.pstride, lay.partitions), *canonical(lay.dims))):
        if c > 1 and s < span:
            return False
        span += s * (c - 1)
    return True


def _tiling(dst: Layout, src: Layout) -> tuple[Nest, bool] | None:
    """(loop nest, whether src is the side of adjacent partitions) when the copy is a transpose that moves
    TILE x TILE tiles through vector registers: a bit copy of 2- or 4-byte elements whose one side has its
    partitions adjacent and the other its innermost free elements (GPT-2's activation and weight transposes:
    element by element they ran at 3 GB/s). dst must reach each element once, as the order changes."""
    size = dst.dtype.itemsize
    if src.dtype is not dst.dtype or size not in (2, 4) or dst.partitions < TILE or not _distinct(dst):
        return None
    nest = plan([stream(dst), stream(src)], dst.free_size)
    if not nest.counts or nest.counts[-1] < TILE:   # None: no common nest; (): one element
        return None
    d_in, s_in = nest.strides[-1]
    if src.pstride == size and d_in == size and dst.pstride >= TILE * size:
        return nest, True
    if dst.pstride == size and s_in == size and abs(d_in) >= TILE * size:
        return nest, False
    return None


def _transposed(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The columns of a square tile of row vectors: at each level h = T/2 .. 1 the off-diagonal h x h blocks
    of each 2h x 2h block swap (rows i and i + h exchange their halves), one shuffle per row."""
    t, rows = len(rows), list(rows)
    h = t // 2
    while h:
        low = ir.Constant(ir.VectorType(I32, t), [j + t - h if j & h else j for j in range(t)])
        high = ir.Constant(ir.VectorType(I32, t), [j + t if j & h else j + h for j in range(t)])
        for i in (i for i in range(t) if not i & h):
            rows[i], rows[i + h] = (b.shuffle_vector(rows[i], rows[i + h], low),
                                    b.shuffle_vector(rows[i], rows[i + h], high))
        h //= 2
    return rows


def _tiles(kb: KernelBuilder, dst: Layout, src: Layout, count: int, nest: Nest, src_adjacent: bool) -> None:
    """`count` blocks of TILE partitions of a transposing copy: per innermost run of TILE elements, TILE vector
    loads along the side read whole, a register transpose, TILE vector stores; the run's tail element by element."""
    b, size = kb.b, dst.dtype.itemsize
    vec = ir.VectorType(INT_OF_SIZE[size], TILE)
    dbase, sbase = kb.base("dst"), kb.base("src")
    d_in, s_in = nest.strides[-1]
    # the side of adjacent partitions is loaded or stored a free element at a time, the other a partition at a time
    src_steps = [j * s_in for j in range(TILE)] if src_adjacent else [q * src.pstride for q in range(TILE)]
    dst_steps = [q * dst.pstride for q in range(TILE)] if src_adjacent else [j * d_in for j in range(TILE)]
    runs, tail = divmod(nest.counts[-1], TILE)
    with kb.loop(count, "block") as block, contextlib.ExitStack() as stack:
        p = kb.mul(block, TILE)
        offs = [kb.mul(p, dst.pstride), kb.mul(p, src.pstride)]
        for level, n in enumerate(nest.counts[:-1]):
            i = stack.enter_context(kb.loop(n, f"o{level}"))
            offs = [kb.add(o, kb.mul(i, st)) for o, st in zip(offs, nest.strides[level])]
        with kb.loop(runs, "run") as run:
            e = kb.mul(run, TILE)
            d0, s0 = kb.add(offs[0], kb.mul(e, d_in)), kb.add(offs[1], kb.mul(e, s_in))
            rows = [b.load(kb.at(sbase, kb.add(s0, i64(step)), vec), align=size) for step in src_steps]
            for step, column in zip(dst_steps, _transposed(b, rows)):
                b.store(column, kb.at(dbase, kb.add(d0, i64(step)), vec), align=size)
        if tail:
            with kb.loop(tail, "tail") as t:
                e = kb.add(t, i64(runs * TILE))
                d0, s0 = kb.add(offs[0], kb.mul(e, d_in)), kb.add(offs[1], kb.mul(e, s_in))
                for q in range(TILE):
                    move_element(kb, src, sbase, kb.add(s0, i64(q * src.pstride)), dst, dbase,
                                 kb.add(d0, i64(q * dst.pstride)))


@lowering("dma_copy")
def dma_copy(kb: KernelBuilder, sig: KernelSig) -> None:
    _copy(kb, sig)


def _copy_is_sr(sig: KernelSig) -> bool:
    return sig.static("rounding") == Rounding.SR and sig.layout("src").dtype is not sig.layout("dst").dtype


@lowering("tensor_copy", statics=("rounding",), dynamics=lambda fields: (fields.int("seed"),))
def tensor_copy(kb: KernelBuilder, sig: KernelSig) -> None:
    if _copy_is_sr(sig):
        _copy(kb, sig, Rounding.SR, kb.dynamic(0))
    else:
        _copy(kb, sig)


@lowering("dma_gather")
def dma_gather(kb: KernelBuilder, sig: KernelSig) -> None:
    """Check every index first (a fault writes nothing), then copy row index[p] of the table to dst[p]."""
    dst, table, index = sig.layout("dst"), sig.layout("table"), sig.layout("index")
    dbase, tbase, ibase = kb.base("dst"), kb.base("table"), kb.base("index")
    b = kb.b
    with kb.loop(dst.partitions, "check") as p:
        row = b.sext(kb.load_bits(ibase, kb.mul(p, index.pstride), DType.INT32), I64)
        bad = b.or_(b.icmp_signed("<", row, i64(0)), b.icmp_signed(">=", row, i64(table.partitions)))
        with b.if_then(bad, likely=False):
            kb.fail(FAULT_GATHER_INDEX, [p, row])
    with kb.loop(dst.partitions, "p") as p:
        row = b.sext(kb.load_bits(ibase, kb.mul(p, index.pstride), DType.INT32), I64)
        starts = [kb.mul(p, dst.pstride), b.mul(row, i64(table.pstride))]
        with kb.elements([stream(dst), stream(table)], starts, dst.free_size) as (doff, toff):
            kb.store_bits(kb.load_bits(tbase, toff, table.dtype), dbase, doff, dst.dtype)


@lowering("transpose")
def transpose(kb: KernelBuilder, sig: KernelSig) -> None:
    """dst[f, p] = src[p, f], written in dst's (f, p) order."""
    dst, src = sig.layout("dst"), sig.layout("src")
    dbase, sbase = kb.base("dst"), kb.base("src")
    column = Stream(0, ((src.pstride, src.partitions),))   # src[p, f] for p = 0.. at fixed f
    with kb.loop(dst.partitions, "f") as f:
        starts = [kb.mul(f, dst.pstride), kb.flat_offset(f, src)]
        with kb.elements([stream(dst), column], starts, dst.free_size) as (doff, soff):
            move_element(kb, src, sbase, soff, dst, dbase, doff)


@lowering("partition_broadcast")
def partition_broadcast(kb: KernelBuilder, sig: KernelSig) -> None:
    dst, src = sig.layout("dst"), sig.layout("src")
    dbase, sbase = kb.base("dst"), kb.base("src")
    with kb.loop(dst.partitions, "p") as p:
        with kb.elements([stream(dst), stream(src)], [kb.mul(p, dst.pstride), i64(0)], dst.free_size) as offs:
            move_element(kb, src, sbase, offs[1], dst, dbase, offs[0])


def _memset_bits(fields: FieldColumns) -> tuple[np.ndarray]:
    """The fill value converted once, here, to the dst dtype's storage bits (runtime/convert.py)."""
    with np.errstate(over="ignore", invalid="ignore"):   # to inf, and NaN, as np.float32 rounds them
        value = fields.double("value").astype(np.float32)
    dtype = fields.operand_dtype("dst")
    bits = np.zeros(len(value), dtype=np.int64)
    for code in np.unique(dtype).tolist():
        at, target = dtype == code, DType.from_code(code)
        bits[at] = from_fp32(value[at], target).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[target.itemsize])
    return (bits,)


@lowering("memset", dynamics=_memset_bits)
def memset(kb: KernelBuilder, sig: KernelSig) -> None:
    dst = sig.layout("dst")
    dbase = kb.base("dst")
    bits = kb.b.trunc(kb.dynamic(0), INT_OF_SIZE[dst.dtype.itemsize])
    with kb.loop(dst.partitions, "p") as p:
        with kb.elements([stream(dst)], [kb.mul(p, dst.pstride)], dst.free_size) as (doff,):
            kb.store_bits(bits, dbase, doff, dst.dtype)


def affine_stream(sig: KernelSig, lay: Layout) -> Stream:
    """base + p * partition_step + sum(i_j * steps_j), without base, over the dims of `lay` (iota, affine_select)."""
    steps = sig.static("steps")
    return Stream(sig.static("partition_step"), tuple((steps[j], c) for j, c in enumerate(lay.counts)))


def affine_value(kb: KernelBuilder, base, offset):
    """The int32 value of the affine expression: (base + offset) mod 2^32, as i32."""
    return kb.b.trunc(kb.b.add(base, offset), I32)


@lowering("iota", statics=("partition_step", "steps"), dynamics=lambda fields: (fields.int("base"),))
def iota(kb: KernelBuilder, sig: KernelSig) -> None:
    """dst = base + p * partition_step + sum(i_j * steps_j) in int32 wrapping arithmetic, converted."""
    dst = sig.layout("dst")
    dbase, base = kb.base("dst"), kb.dynamic(0)
    affine = affine_stream(sig, dst)
    with kb.loop(dst.partitions, "p") as p:
        starts = [kb.mul(p, dst.pstride), kb.mul(p, affine.pstride)]
        with kb.elements([stream(dst), affine], starts, dst.free_size) as (doff, voff):
            v = affine_value(kb, base, voff)
            if dst.dtype is DType.INT32:
                kb.store_bits(v, dbase, doff, dst.dtype)
            else:
                values.store_f32(kb, values.int32_to_f32(kb, v), dbase, doff, dst.dtype)


@lowering("random", statics=("partition_step", "steps"),
          dynamics=lambda fields: (fields.int("stream"), fields.int("base")))
def random(kb: KernelBuilder, sig: KernelSig) -> None:
    """dst = the uniform draw of (seed, stream, counter) for the counter of each element (runtime/convert.py)."""
    dst = sig.layout("dst")
    dbase = kb.base("dst")
    seed = kb.load_bits(kb.base("seed"), i64(0), DType.INT32)
    key = values.random_key(kb, seed, kb.dynamic(0))
    affine = affine_stream(sig, dst)
    with kb.loop(dst.partitions, "p") as p:
        starts = [kb.mul(p, dst.pstride), kb.mul(p, affine.pstride)]
        with kb.elements([stream(dst), affine], starts, dst.free_size) as (doff, voff):
            values.store_f32(kb, values.uniform(kb, key, affine_value(kb, kb.dynamic(1), voff)), dbase, doff,
                             DType.FP32)
