"""Lowerings of TensorE's matmul and matmul_mx: fp32 accumulation in the reference's exact order.

matmul is register-blocked. Every accumulator still sees its multiply-adds in the spec's order (row group r
outermost, then partition k), each one llvm.fma (one rounding, as runtime/reference_ops.matmul computes);
only the order in which different accumulators advance changes, which cannot change any of them. The kernel
first widens the whole stationary operand to fp32 in a stack buffer, laid out per block of MR output rows as
[r * K + k][row]; then, per block of NR output columns, it widens that column panel of moving to fp32 as
[r * K + k][column] (zero-padded to whole vectors) and, for each block of rows, runs the micro-kernel:
MR x NR/L accumulators held as <L x float> values across the entire k loop (phi nodes, so registers); per k
one vector load of the panel per L columns, reused by the MR rows, and one broadcast of s[k, row] per row,
reused by the NR columns. Widening goes through the conversion code of every other kernel
(runtime/jit/kernels_values.py), so every dtype, stride, double_row and remainder of M or N takes the same
path. No fast-math flags (no reassociation): the fma is the explicit intrinsic, one instruction on a host
with FMA (on one without, LLVM calls the C library's exact fmaf, slowly).
Stack use is at most 161 KiB (stationary 128 x 256 fp32 for fp8 double_row, its rows padded to whole blocks,
plus a 256 x NR panel; cache-line aligned, so no vector load splits a line), well inside a thread's default
stack.
The micro-kernel's shape follows the host's vector width (Blocking).

matmul_mx keeps the row-at-a-time form: per output row, N accumulators in a stack array, the loop over n
innermost so that LLVM vectorizes it.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from llvmlite import ir

from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.runtime.jit import kernels_values as values
from trnc.runtime.jit.codegen import codegen
from trnc.runtime.jit.kernels import (
    CACHE_LINE, F32, I32, I64, KernelBuilder, KernelSig, Layout, Stream, canonical, flat_stream, i64, lowering,
    stream,
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


# -- matmul: packing and the register-blocked micro-kernel ------------------------------------------------

UNROLL = 4                       # k steps per iteration of the micro-kernel's loop


@dataclass(frozen=True)
class Blocking:
    """The micro-kernel's shape for a vector width: L fp32 lanes, MR rows (a broadcast each per k), NR columns
    (NR / L vector loads per k). MR x NR / L accumulators plus the loads fit the host's vector registers:
    12 of 16 with AVX2 (6 x 16 ran at 81 GFLOP/s against 76 for 4 x 16 on a Zen 3), 16 of 32 with AVX-512."""

    lanes: int
    mr: int
    nr: int

    @property
    def vec(self) -> ir.VectorType:
        return ir.VectorType(F32, self.lanes)

    @property
    def zero(self) -> ir.Constant:
        return ir.Constant(self.vec, [0.0] * self.lanes)

    @property
    def splat(self) -> ir.Constant:
        return ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes)


BLOCKINGS = {8: Blocking(8, 6, 16), 16: Blocking(16, 8, 32)}


def blocking() -> Blocking:
    """The blocking for this host's vector width (its features are in the kernel cache's key)."""
    return BLOCKINGS[codegen().f32_lanes]


@dataclass(frozen=True)
class _Operand:
    """A matmul input as [K, R, X]: its layout, row groups R, byte stride between groups, stream over X."""

    lay: Layout
    groups: int
    gstride: int
    rest: Stream

    @classmethod
    def of(cls, lay: Layout, grouped: bool) -> "_Operand":
        return cls(lay, *_groups(lay, grouped))

    @property
    def rows(self) -> int:
        """Steps of the contraction, r * K + k."""
        return self.groups * self.lay.partitions


def _free_offset(kb: KernelBuilder, e: ir.Value, s: Stream) -> ir.Value:
    """Byte offset of free element e of stream s: affine (so vectorizable) when s is one dim after merging."""
    dims = canonical(s.dims)
    if len(dims) <= 1:
        return kb.mul(e, dims[0][0]) if dims else i64(0)
    return kb.stream_offset(e, s)


def _rows(kb: KernelBuilder, op: _Operand) -> Iterator[tuple[ir.Value, ir.Value]]:
    """Loops over r and k (r outermost); yields (r * K + k, byte offset of the row's element 0)."""
    with kb.loop(op.groups, "r") as r, kb.loop(op.lay.partitions, "k") as k:
        yield kb.add(kb.mul(r, op.lay.partitions), k), kb.add(kb.mul(k, op.lay.pstride), kb.mul(r, op.gstride))


def _pack_stationary(kb: KernelBuilder, st: _Operand, m_count: int, bl: Blocking) -> ir.Value:
    """An fp32 copy of stationary: element (kk, m) at index (m // MR) * rows * MR + kk * MR + m % MR, the last
    block's missing rows +0.0. Blocks outermost, so the buffer is written in order (steps outermost scattered
    each step's runs over the blocks, 4 KiB apart: 1 ns per element); a full block's run of a step is one
    vector store, of one vector load when its fp32 elements are adjacent, else of MR loads that LLVM vectorizes
    when affine."""
    b, mr = kb.b, bl.mr
    buf = kb.alloca(F32, -(-m_count // mr) * mr * st.rows, name="spack", align=CACHE_LINE)
    base = kb.base("stationary")
    dims = canonical(st.rest.dims)
    fp32_run = st.lay.dtype is DType.FP32 and (len(dims) == 0 or (len(dims) == 1 and dims[0][0] == 4))
    run = ir.VectorType(F32, mr)

    def element(row: ir.Value, m: ir.Value) -> ir.Value:
        return values.load_f32(kb, base, kb.add(row, _free_offset(kb, m, st.rest)), st.lay.dtype)

    for m0, rows in _row_blocks(kb, m_count, mr):
        for kk, row in _rows(kb, st):
            first = kb.add(kb.mul(m0, st.rows), kb.mul(kk, mr))   # m0 = (m // MR) * MR
            if rows < mr:
                for i in range(mr):
                    x = element(row, kb.add(m0, i64(i))) if i < rows else ZERO
                    b.store(x, b.gep(buf, [kb.add(first, i64(i))], inbounds=True))
                continue
            if fp32_run:
                x = b.load(kb.at(base, kb.add(row, kb.mul(m0, 4)), run), align=4)
            else:
                x = ir.Constant(run, None)
                for i in range(mr):
                    x = b.insert_element(x, element(row, kb.add(m0, i64(i))), ir.Constant(I32, i))
            b.store(x, _vector_at(kb, buf, first, run), align=4)
    return buf


def _pack_panel(kb: KernelBuilder, mv: _Operand, panel: ir.Value, n0: ir.Value, cols: int, width: int) -> None:
    """fp32 copy of moving columns [n0, n0 + cols): element (kk, j) at index kk * width + j, zeros up to width.
    An affine row is a loop, which LLVM vectorizes with its dtype widening (bf16 packed 3.4x faster than as
    a static run). A windowed moving's (a convolution's) column offsets need a division each, so they are
    computed once per panel, the same in every row, and its rows are static runs."""
    b = kb.b
    base = kb.base("moving")
    affine = len(canonical(mv.rest.dims)) <= 1
    offsets = None if affine else [_free_offset(kb, kb.add(n0, i64(j)), mv.rest) for j in range(cols)]
    for kk, row in _rows(kb, mv):
        at = kb.mul(kk, width)
        if offsets is None:
            with kb.loop(cols, "col") as j:
                v = values.load_f32(kb, base, kb.add(row, _free_offset(kb, kb.add(n0, j), mv.rest)), mv.lay.dtype)
                b.store(v, b.gep(panel, [kb.add(at, j)], inbounds=True))
        else:
            for j, offset in enumerate(offsets):
                v = values.load_f32(kb, base, kb.add(row, offset), mv.lay.dtype)
                b.store(v, b.gep(panel, [kb.add(at, i64(j))], inbounds=True))
        for j in range(cols, width):
            b.store(ZERO, b.gep(panel, [kb.add(at, i64(j))], inbounds=True))


def _vector_at(kb: KernelBuilder, buf: ir.Value, index: ir.Value, vec: ir.VectorType) -> ir.Value:
    return kb.b.bitcast(kb.b.gep(buf, [index], inbounds=True), vec.as_pointer())


def _fma(kb: KernelBuilder, vec: ir.VectorType) -> ir.Function:
    """The llvm.fma declaration for `vec` in the kernel's module."""
    name = f"llvm.fma.v{vec.count}f32"
    module = kb.b.module
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(vec, [vec, vec, vec]), name=name)


class _Tile:
    """One micro-kernel call: rows [m0, m0 + rows) x columns [n0, n0 + cols) of dst."""

    def __init__(self, kb: KernelBuilder, sig: KernelSig, bl: Blocking, m0: ir.Value, rows: int, n0: ir.Value,
                 cols: int):
        self.kb, self.b, self.sig, self.bl = kb, kb.b, sig, bl
        self.fma = _fma(kb, bl.vec)
        self.dst = sig.layout("dst")
        self.m0, self.rows, self.n0, self.cols = m0, rows, n0, cols
        self.vectors = -(-cols // bl.lanes)
        dims = canonical(self.dst.dims)
        self.contiguous = self.dst.dtype is DType.FP32 and len(dims) <= 1 and all(s == 4 for s, _ in dims)

    def _offset(self, i: int, c: int) -> ir.Value:
        """Byte offset in dst of tile element (i, c)."""
        kb = self.kb
        n = kb.add(self.n0, i64(c))
        return kb.add(kb.mul(kb.add(self.m0, i64(i)), self.dst.pstride), _free_offset(kb, n, stream(self.dst)))

    def _whole(self, v: int) -> bool:
        return self.contiguous and (v + 1) * self.bl.lanes <= self.cols

    def load(self) -> list[list[ir.Value]]:
        """The initial accumulators: dst (accumulate) or +0.0; lanes past the last column are +0.0."""
        if not self.sig.static("accumulate"):
            return [[self.bl.zero] * self.vectors for _ in range(self.rows)]
        kb, b, base, lanes = self.kb, self.b, self.kb.base("dst"), self.bl.lanes
        out = []
        for i in range(self.rows):
            row = []
            for v in range(self.vectors):
                if self._whole(v):
                    row.append(b.load(kb.at(base, self._offset(i, v * lanes), self.bl.vec), align=4))
                    continue
                x = self.bl.zero
                for lane in range(min(lanes, self.cols - v * lanes)):
                    e = values.load_f32(kb, base, self._offset(i, v * lanes + lane), self.dst.dtype)
                    x = b.insert_element(x, e, ir.Constant(I32, lane))
                row.append(x)
            out.append(row)
        return out

    def store(self, accs: list[list[ir.Value]]) -> None:
        kb, b, base, lanes = self.kb, self.b, self.kb.base("dst"), self.bl.lanes
        for i, row in enumerate(accs):
            for v, x in enumerate(row):
                if self._whole(v):
                    b.store(x, kb.at(base, self._offset(i, v * lanes), self.bl.vec), align=4)
                    continue
                for lane in range(min(lanes, self.cols - v * lanes)):
                    e = b.extract_element(x, ir.Constant(I32, lane))
                    values.store_f32(kb, e, base, self._offset(i, v * lanes + lane), self.dst.dtype)

    def step(self, accs, spack: ir.Value, sblock: ir.Value, panel: ir.Value, width: int, kk: ir.Value):
        """accs after the contraction step kk: acc[i][v] = fma(s[kk, i], v[kk, v-th vector], acc)."""
        kb, b, bl = self.kb, self.b, self.bl
        moving = [b.load(_vector_at(kb, panel, kb.add(kb.mul(kk, width), i64(v * bl.lanes)), bl.vec), align=4)
                  for v in range(self.vectors)]
        out = []
        for i, row in enumerate(accs):
            s = b.load(b.gep(spack, [kb.add(sblock, kb.add(kb.mul(kk, bl.mr), i64(i)))], inbounds=True))
            s = b.shuffle_vector(b.insert_element(ir.Constant(bl.vec, None), s, ir.Constant(I32, 0)),
                                 ir.Constant(bl.vec, None), bl.splat)
            out.append([b.call(self.fma, [s, x, acc]) for acc, x in zip(row, moving)])
        return out

    def run(self, spack: ir.Value, sblock: ir.Value, panel: ir.Value, width: int, steps: int) -> None:
        """Load the accumulators, run every contraction step in order with them in registers, store them."""
        accs = self.load()
        loops, rest = divmod(steps, UNROLL)
        if loops > 1:
            accs = self._loop(accs, spack, sblock, panel, width, loops)
        elif loops == 1:
            for u in range(UNROLL):
                accs = self.step(accs, spack, sblock, panel, width, i64(u))
        for u in range(loops * UNROLL, steps):
            accs = self.step(accs, spack, sblock, panel, width, i64(u))
        self.store(accs)

    def _loop(self, accs, spack, sblock, panel, width: int, loops: int):
        """`loops` iterations of UNROLL steps, the accumulators as phi nodes (so they live in registers)."""
        b = self.b
        before = b.block
        body = b.function.append_basic_block("kk.body")
        b.branch(body)
        b.position_at_end(body)
        it = b.phi(I64, name="kk")
        it.add_incoming(i64(0), before)
        phis = [[b.phi(self.bl.vec) for _ in row] for row in accs]
        for prow, row in zip(phis, accs):
            for phi, acc in zip(prow, row):
                phi.add_incoming(acc, before)
        out = phis
        for u in range(UNROLL):
            out = self.step(out, spack, sblock, panel, width, b.add(b.mul(it, i64(UNROLL)), i64(u)))
        nxt = b.add(it, i64(1), flags=("nuw", "nsw"))
        it.add_incoming(nxt, b.block)
        for prow, row in zip(phis, out):
            for phi, acc in zip(prow, row):
                phi.add_incoming(acc, b.block)
        end = b.function.append_basic_block("kk.end")
        b.cbranch(b.icmp_unsigned("<", nxt, i64(loops)), body, end)
        b.position_at_end(end)
        return out


def _row_blocks(kb: KernelBuilder, count: int, mr: int) -> Iterator[tuple[ir.Value, int]]:
    """(first row, rows) of each block of MR rows of `count`, the last one possibly shorter."""
    full, tail = divmod(count, mr)
    if full:
        with kb.loop(full, "mb") as mb:
            yield kb.mul(mb, mr), mr
    if tail:
        yield i64(full * mr), tail


@lowering("matmul", statics=("accumulate", "double_row"))
def matmul(kb: KernelBuilder, sig: KernelSig) -> None:
    grouped = bool(sig.static("double_row"))
    st, mv = _Operand.of(sig.layout("stationary"), grouped), _Operand.of(sig.layout("moving"), grouped)
    dst = sig.layout("dst")
    m_count, n_count = dst.partitions, dst.free_size
    bl = blocking()
    mr, nr = bl.mr, bl.nr
    spack = _pack_stationary(kb, st, m_count, bl)
    panel = kb.alloca(F32, st.rows * nr, name="panel", align=CACHE_LINE)

    def columns(n0: ir.Value, cols: int) -> None:
        width = -(-cols // bl.lanes) * bl.lanes
        _pack_panel(kb, mv, panel, n0, cols, width)
        for m0, rows in _row_blocks(kb, m_count, mr):
            _Tile(kb, sig, bl, m0, rows, n0, cols).run(spack, kb.mul(m0, st.rows), panel, width, st.rows)

    full, tail = divmod(n_count, nr)
    if full:
        with kb.loop(full, "nb") as nb:
            columns(kb.mul(nb, nr), nr)
    if tail:
        columns(i64(full * nr), tail)


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
