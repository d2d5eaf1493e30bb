"""Row-wise kernels of the tile stage: softmax, log_softmax, layer_norm and rms_norm over the last axis.

Every leading index is a row; rows go on the partitions, 128 per tile, and the last axis C lies
along the free axis, so each statistic of a row (max, sum, mean, variance) is one free-axis
reduction and each per-row constant is a per-partition operand ([P, 1]) of the next instruction.
x stays in its own dtype on chip (engines read every dtype into fp32); everything is computed
and accumulated in fp32 and written once, in the output's dtype (under stochastic rounding the last pass
writes fp32 and engines.write rounds it into the output's dtype).

Per row tile (P rows, C columns), the passes over the [P, C] data are:
- softmax:     max (DVE), exp(x - max) with the row sum accumulated (ACT), times 1/sum (any engine);
- log_softmax: max (DVE), exp(x - max) for its row sum only (ACT), x - max - log(sum) (DVE/POOL);
- layer_norm:  sum(x0 - x) with x0 the row's first element (ACT, see _norm), (x - mean)^2
  with its row sum accumulated (ACT), (x - mean) * rstd (any engine), then * weight and + bias
  (DVE/POOL), the weight and bias rows loaded once per kernel and copied to all partitions; the
  kernel's last row tile does these passes and its store in two column halves, which shortens the tail;
- rms_norm:    x^2 with its row sum accumulated (ACT), x * rstd (any engine), then * weight as above.

Row tiles are boxes of the input view: the leading dims are merged wherever the view's strides
allow, the longest leading dim goes on the partitions, and when it is shorter than 128 several of
its runs share a tile (one DMA each). Each DMA thus names one box and needs one free dim (C). When
the producing matmul kept x in SBUF (plan.py hands_rows_on_chip), a row tile is read there instead.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterator

from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.ap import Engine
from trnc.isa.config import PARTITIONS
from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc, AluOp, ReduceOp
from trnc.passes.tile.kernels import engines
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

FP32 = DType.FP32
# tensor_scalar with sub/div is not a ScalarE op (the limits of tensor_scalar's op0/op1 in isa/opcodes.py)
DVE_POOL = (Engine.DVE, Engine.POOL)
PSUM_READERS = (Engine.ACT, Engine.DVE)   # GpSimdE cannot reach PSUM
SBUF_ALIGN = 64    # passes/tile/allocate.py rounds every SBUF buffer up to this many bytes
DMA_CHUNK = 1 << 15   # bytes per DMA: a tile's transfer spreads over queues and the first rows arrive early


def merged_rows(*views: HbmView) -> tuple[HbmView, ...]:
    """The views (of one shape [*lead, C]) as [*rows, C], their leading dims merged where the strides of every
    one allow and size-1 dims dropped; a 1-D shape becomes [1, C].

    The element order is unchanged, so row r of each result is row r of the flattened shape and the views
    pair row for row: an input and an output written through a permuted view (lower.py storage_for) merge
    only the dims that both can merge.
    """
    shape = views[0].shape
    lead = [d for d, s in enumerate(shape[:-1]) if s != 1]
    groups: list[list[int]] = []     # runs of leading dims, innermost last, each merged into one
    for d in reversed(lead):
        if groups and all(v.strides[d] == v.strides[groups[-1][0]] * shape[groups[-1][0]] for v in views):
            groups[-1].insert(0, d)
        else:
            groups.append([d])
    groups.reverse()

    def merge(view: HbmView) -> HbmView:
        if not groups:
            return HbmView(view.tensor, view.dtype, (1, shape[-1]), (0, view.strides[-1]), view.offset)
        sizes = tuple(math.prod(shape[d] for d in g) for g in groups)
        strides = tuple(view.strides[g[-1]] for g in groups)
        return HbmView(view.tensor, view.dtype, sizes + shape[-1:], strides + view.strides[-1:], view.offset)
    return tuple(merge(v) for v in views)


def row_tiles(rows: tuple[int, ...]) -> Iterator[tuple[int, int, list[tuple[int, tuple]]]]:
    """Row tiles over leading dims `rows`: (pdim, partitions, [(first partition, box over rows)]).

    The longest leading dim `pdim` goes on the partitions. When it has 128 or more rows each tile is
    a run of 128 along it; else runs of consecutive other indices share a tile.
    """
    pdim = max(range(len(rows)), key=lambda d: (rows[d], d))
    n = rows[pdim]
    outer = list(itertools.product(*(range(s) if d != pdim else range(1) for d, s in enumerate(rows))))
    if n >= PARTITIONS:
        for index in outer:
            for r0 in range(0, n, PARTITIONS):
                count = min(PARTITIONS, n - r0)
                yield pdim, count, [(0, _box(index, pdim, r0, count))]
        return
    group = PARTITIONS // n
    for g0 in range(0, len(outer), group):
        chunk = outer[g0:g0 + group]
        yield pdim, n * len(chunk), [(j * n, _box(index, pdim, 0, n)) for j, index in enumerate(chunk)]


def _box(index: tuple[int, ...], pdim: int, r0: int, count: int) -> tuple[tuple[int, int], ...]:
    return tuple((r0, count) if d == pdim else (i, 1) for d, i in enumerate(index))


def check_row_fits(kb: TileBuilder, node: ir.Node, bytes_per_column: int) -> None:
    """Raise when one row tile (bytes_per_column bytes per element of C, per partition) cannot fit in SBUF."""
    c = node.shape[-1]
    capacity = kb.hw.sbuf_bytes_per_partition
    if c * bytes_per_column + 4 * SBUF_ALIGN > capacity:
        limit = (capacity - 4 * SBUF_ALIGN) // bytes_per_column
        raise UnsupportedOpError(
            f"{node.op} over a last axis of {c} elements{node.where()}: a row tile needs {c * bytes_per_column} "
            f"bytes per partition and {kb.hw.name}'s SBUF has {capacity}; at most {limit} elements fit. "
            f"Split the last axis or reduce it in parts.")


def broadcast_rows(kb: TileBuilder, name: str, view: HbmView, partitions: int) -> Tile:
    """A [partitions, C] tile whose every partition holds the 1-D `view`.

    One row is loaded and GpSimdE copies it to every partition (partition_broadcast): a DMA that
    read the row once per partition (partition stride 0) would move `partitions` times the bytes,
    about 0.4 MB for a fp32 row of 768, where the broadcast costs one ~0.8 us instruction.
    """
    (c,) = view.shape
    row = kb.sbuf(f"{name}_row", view.dtype, 1, (c,))
    kb.dma(row, view.box_ap(None, ((0, c),)))
    tile = kb.sbuf(name, view.dtype, partitions, (c,))
    kb.emit("partition_broadcast", dst=tile, src=row)
    return tile


class _Rows:
    """The input and output views as [*rows, C] and the DMAs of one row tile between them and SBUF."""

    def __init__(self, kb: TileBuilder, x: HbmView, out: HbmView):
        self.kb = kb
        self.x, self.out = merged_rows(x, out)
        self.c = x.shape[-1]

    def tiles(self) -> Iterator[dict]:
        """Row tiles as dicts that the stages of a lowering fill in: parts, pdim, segments, then tiles."""
        for pdim, parts, segments in row_tiles(self.x.shape[:-1]):
            yield {"pdim": pdim, "parts": parts, "segments": segments}

    def load(self, tile: dict) -> None:
        """The row tile in x's own dtype (a converting DMA would move the wider type's bytes), or its place
        in SBUF when the producer kept x there (plan.py hands_rows_on_chip)."""
        pdim = tile["pdim"]
        kept = self.kb.program.on_chip(self.x)
        if kept is not None:
            tile["x"] = _kept_rows(kept, tile)
            return
        tile["x"] = x = self.kb.sbuf("x", self.x.dtype, tile["parts"], (self.c,))
        for p0, box in tile["segments"]:
            count = box[pdim][1]
            self.kb.dma_split(x.narrow(0, p0, count), self.x.box_ap(pdim, box + ((0, self.c),)), DMA_CHUNK)

    def store(self, tile: dict, columns: tuple[int, int] | None = None) -> None:
        """The row tile's result, or its `columns` (start, count)."""
        pdim, (c0, width) = tile["pdim"], columns or (0, self.c)
        for p0, box in tile["segments"]:
            count = box[pdim][1]
            self.kb.dma_split(self.out.box_ap(pdim, box + ((c0, width),)),
                              tile["y"].narrow(0, p0, count).narrow(1, c0, width), DMA_CHUNK)


def _kept_rows(kept: Tile, tile: dict) -> Tile:
    """The rows of one row tile in the SBUF tile that holds x ([128, R / 128, C]: row r on partition r % 128,
    in block r // 128; TileProgram.on_chip)."""
    (p0, box), = tile["segments"]
    r0, count = box[tile["pdim"]]
    if p0 or r0 % PARTITIONS:
        raise ValueError(f"row tile at row {r0} does not start a 128-row block of {kept.buffer}")
    return kept.select(1, r0 // PARTITIONS).narrow(0, 0, count)


def pipelined(items: list, stages) -> None:
    """Emit `stage(item)` for every (delay, stage) of `stages`, each `delay` items behind the first.

    Engines run their queues in program order, so emitting a tile's work all at once would make
    every engine wait for the previous engine's step of the same tile; staggered, the loads of
    later tiles and their first steps run while the last steps of earlier tiles finish.
    """
    depth = max(delay for delay, _ in stages)
    for step in range(len(items) + depth):
        for delay, stage in stages:
            if 0 <= step - delay < len(items):
                stage(items[step - delay])


def _softmax(kb: TileBuilder, node: ir.Node, rows: _Rows, log: bool) -> None:
    check_row_fits(kb, node, rows.x.dtype.itemsize + 4 + node.dtype.itemsize)
    c = rows.c

    def statistics(tile: dict) -> None:
        parts, x = tile["parts"], tile["x"]
        tile["e"], tile["y"] = kb.sbuf("e", FP32, parts, (c,)), kb.sbuf("y", node.dtype, parts, (c,))
        tile["max"], nmx, tile["sum"] = (kb.sbuf(n, FP32, parts, (1,)) for n in ("max", "nmax", "sum"))
        kb.emit("tensor_reduce", dst=tile["max"], src=x, op=ReduceOp.MAX, axes=1)
        kb.emit("tensor_scalar", dst=nmx, src=tile["max"], op0=AluOp.MUL, scalar0=-1.0)
        kb.emit("activation", dst=tile["e"], src=x, func=ActFunc.EXP, bias_ap=nmx, accum=tile["sum"])

    def finish(tile: dict) -> None:
        parts, y = tile["parts"], tile["y"]
        stochastic = engines.stochastic(kb, y.dtype)    # y computed in e (fp32), then rounded by engines.write
        dst = tile["e"] if stochastic else y
        if log:   # y = (x - max) - log(sum); e was needed only for the sum
            log_sum = kb.sbuf("logsum", FP32, parts, (1,))
            kb.emit("activation", dst=log_sum, src=tile["sum"], func=ActFunc.LOG)
            kb.emit("tensor_scalar", DVE_POOL, dst=dst, src=tile["x"], op0=AluOp.SUB, scalar0_ap=tile["max"],
                    op1=AluOp.SUB, scalar1_ap=log_sum)
        else:
            inv = kb.sbuf("inv", FP32, parts, (1,))
            kb.emit("tensor_scalar", DVE_POOL, dst=inv, src=tile["sum"], op0=AluOp.DIV, scalar0=1.0, reverse0=True)
            kb.emit("tensor_scalar", dst=dst, src=tile["e"], op0=AluOp.MUL, scalar0_ap=inv)
        if stochastic:
            engines.write(kb, y, dst)
        rows.store(tile)

    pipelined(list(rows.tiles()), ((0, rows.load), (1, statistics), (2, finish)))


def _norm(kb: TileBuilder, kernel: ir.Kernel, views: dict, rows: _Rows, plan: ir.KernelPlan) -> Tile | None:
    """The layer or RMS norm's instructions (an RMS norm: no mean, x * rstd); returns the transposed copy for
    the next matmul when the plan asks for one and the rows allow it. When that matmul is the only reader
    (plan.keep), the copy is all it computes: no weight and bias rows, no row-major result, no store."""
    node = kernel.output
    centered = node.op == "layer_norm"
    _, *params = node.inputs
    has_weight, has_bias = bool(node.attrs.get("has_weight")), bool(node.attrs.get("has_bias"))
    weight = params[0] if has_weight else None
    bias = params[-1] if has_bias else None
    eps = node.attrs.get("eps")
    c, eps = rows.c, 1e-5 if eps is None else float(eps)
    # each of weight and bias: the row broadcast to every partition and the one-row tile it came from, whose
    # space, freed, is a hole the next buffers of the row may not fit (the fuzzer: SBUF full at 15210 bf16)
    param_bytes = 2 * sum(p.dtype.itemsize for p in (weight, bias) if p is not None)
    check_row_fits(kb, node, rows.x.dtype.itemsize + 4 + node.dtype.itemsize + param_bytes)
    tiles = list(rows.tiles())
    params = [views[p] if p is not None else None for p in (weight, bias)]
    transposes = plan.transposed and _transpose_allowed(kb, rows, node.dtype, *params)
    only_copy = transposes and plan.keep
    w = broadcast_rows(kb, "weight", views[weight], tiles[0]["parts"]) if weight is not None and not only_copy \
        else None
    b = broadcast_rows(kb, "bias", views[bias], tiles[0]["parts"]) if bias is not None and not only_copy else None
    copy = _TransposedCopy(kb, rows, node.dtype, *params) if transposes else None
    scaled = weight is not None or bias is not None

    def statistics(tile: dict) -> None:
        parts, x = tile["parts"], tile["x"]
        tile["y"] = y = kb.sbuf("y", node.dtype, parts, (c,))
        if not centered:
            sq, tile["rstd"] = kb.sbuf("sqsum", FP32, parts, (1,)), kb.sbuf("rstd", FP32, parts, (1,))
            kb.emit("activation", dst=y, src=x, func=ActFunc.SQUARE, accum=sq)
            kb.emit("activation", dst=tile["rstd"], src=sq, func=ActFunc.RSQRT, scale=1.0 / c, bias=eps)
            return
        shifted, tile["nmean"], sq, tile["rstd"] = (kb.sbuf(n, FP32, parts, (1,))
                                                    for n in ("shifted", "nmean", "sqsum", "rstd"))
        # mean = x0 - sum(x0 - x) / C with x0 the row's first element: the sum runs over values the size of
        # the spread, not of the mean, so it keeps its precision when |mean| >> std (y is scratch here)
        first = x.narrow(1, 0, 1)
        kb.emit("activation", dst=y, src=x, func=ActFunc.COPY, scale=-1.0, bias_ap=first, accum=shifted)
        kb.emit("tensor_scalar", DVE_POOL, dst=tile["nmean"], src=shifted, op0=AluOp.DIV, scalar0=float(c),
                op1=AluOp.SUB, scalar1_ap=first)
        kb.emit("activation", dst=y, src=x, func=ActFunc.SQUARE, bias_ap=tile["nmean"], accum=sq)
        kb.emit("activation", dst=tile["rstd"], src=sq, func=ActFunc.RSQRT, scale=1.0 / c, bias=eps)

    def finish(tile: dict) -> None:
        parts, y = tile["parts"], tile["y"]
        steps = [(AluOp.MUL, t.narrow(0, 0, parts)) for t in (w,) if t is not None] + \
                [(AluOp.ADD, t.narrow(0, 0, parts)) for t in (b,) if t is not None]
        stochastic = engines.stochastic(kb, y.dtype)    # the last step into t (fp32), then engines.write
        whole = kb.sbuf("t", FP32, parts, (c,)) if scaled or stochastic else y
        # the kernel's last row tile goes in column halves: two engines share its passes, and the first half
        # stores while the second computes (the kernel's tail after its last statistics is shorter)
        last = tile is tiles[-1] and len(tiles) > 1 and copy is None and c >= PARTITIONS
        for c0, width in ((0, c // 2), (c // 2, c - c // 2)) if last else ((0, c),):
            t = whole.narrow(1, c0, width)
            normalize = dict(op0=AluOp.ADD, scalar0_ap=tile["nmean"], op1=AluOp.MUL, scalar1_ap=tile["rstd"]) \
                if centered else dict(op0=AluOp.MUL, scalar0_ap=tile["rstd"])
            kb.emit("tensor_scalar", dst=t, src=tile["x"].narrow(1, c0, width), **normalize)
            if copy is not None:
                copy.add(tile, t)
            if only_copy:
                continue
            for i, (op, param) in enumerate(steps):
                # in place but for the transposed copy's tiles, which read t while the steps run
                dst = y.narrow(1, c0, width) if i == len(steps) - 1 and not stochastic else \
                    t if copy is None else kb.sbuf("tw", FP32, parts, (width,))
                kb.emit("tensor_tensor", dst=dst, in0=t, in1=param.narrow(1, c0, width), op=op)
                t = dst
            if stochastic:
                engines.write(kb, y.narrow(1, c0, width), t)
            rows.store(tile, (c0, width))

    pipelined(tiles, ((0, rows.load), (1, statistics), (2, finish)))
    return copy.tile if copy is not None else None


class _TransposedCopy:
    """The transpose of a norm's result (layer or RMS) in SBUF for the next matmul (plan.py hands_transpose_on_chip):
    one [128, C / 128, R] tile, column c on partition c % 128, in block c // 128, which lower.py registers in
    the program's `transposed`. Each normalized fp32 row tile goes through TensorE in [128, 128] blocks (bits
    moved exactly) and the weight and bias, now per-partition operands, are applied as each block leaves
    PSUM: fp32 multiply, then add, then one rounding, as the row-major result computes them, so both
    copies hold the same values (without weight and bias, the result's own bits)."""

    def __init__(self, kb: TileBuilder, rows: _Rows, dtype: DType, weight: HbmView | None, bias: HbmView | None):
        self.kb = kb
        r, c = rows.x.shape
        self.tile = kb.sbuf("transposed", dtype, PARTITIONS, (c // PARTITIONS, r))
        self.params = [(op, _columns(kb, name, view)) for op, name, view in
                       ((AluOp.MUL, "weight_cols", weight), (AluOp.ADD, "bias_cols", bias)) if view is not None]

    def add(self, tile: dict, t: Tile) -> None:
        """Blocks of the normalized row tile `t` ([128, C] fp32), through TensorE into their place."""
        (_, box), = tile["segments"]
        r0, parts = box[tile["pdim"]]
        for j in range(self.tile.shape[1]):
            block = self.kb.psum("tr", PARTITIONS, (parts,))
            self.kb.emit("transpose", dst=block, src=t.narrow(1, j * PARTITIONS, PARTITIONS))
            dst = self.tile.select(1, j).narrow(1, r0, parts)
            fields = {}
            for k, (op, cols) in enumerate(self.params):
                fields.update({f"op{k}": op, f"scalar{k}_ap": cols.narrow(1, j, 1)})
            self.kb.emit("tensor_scalar" if fields else "tensor_copy", PSUM_READERS, dst=dst, src=block, **fields)


def _transpose_allowed(kb: TileBuilder, rows: _Rows, dtype: DType, weight: HbmView | None,
                       bias: HbmView | None) -> bool:
    """Whether the rows allow the transposed copy (one row dim, whole row tiles, C whole blocks of 128, the
    result stored as a whole [R, C] tensor) and the result rounds to nearest: rounded stochastically, the two
    copies would draw different bits, so the next matmul reads the HBM one."""
    out = rows.out
    if engines.stochastic(kb, dtype) or len(rows.x.shape) != 2 or out.offset or out.strides != (rows.c, 1):
        return False
    r, c = rows.x.shape
    return not (r % PARTITIONS or c % PARTITIONS or any(v is not None and v.shape != (c,) for v in (weight, bias)))


def _columns(kb: TileBuilder, name: str, view: HbmView) -> Tile:
    """The 1-D [C] `view` as fp32 per-partition columns [128, C / 128]: element c on partition c % 128."""
    (c,) = view.shape
    tile = kb.sbuf(name, FP32, PARTITIONS, (c // PARTITIONS,))
    stride = view.strides[0]
    src = HbmView(view.tensor, view.dtype, (PARTITIONS, c // PARTITIONS), (stride, stride * PARTITIONS), view.offset)
    kb.dma(tile, src.box_ap(0, ((0, PARTITIONS), (0, c // PARTITIONS))))
    return tile


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> Tile | None:
    """Lower a softmax, log_softmax, layer_norm or rms_norm kernel (one node) over the last axis; returns the SBUF tile
    of a transposed hand-over the plan asked for, when made."""
    node = kernel.output
    x = node.inputs[0]
    if math.prod(node.shape) == 0:
        return None
    rows = _Rows(kb, views[x], out)
    if node.op in ir.OPS_NORM:
        return _norm(kb, kernel, views, rows, plan)
    if node.op in ("softmax", "log_softmax"):
        _softmax(kb, node, rows, log=node.op == "log_softmax")
        return None
    raise UnsupportedOpError(f"the row-wise kernel has no lowering for {node.op}{node.where()}")
