"""Data movement kernels (tile stage): view copies and cat straight from HBM to HBM, and gather (embedding).

A copy never passes through SBUF: one DMA reads any strided view (permuted, expanded, sliced) and writes
another, converting the dtype on the way when the two differ. HBM access patterns have no partition
limit, only at most four free dims of at most 65535 each, so the copy is cut into boxes
(passes/tile/kernels/boxes.py) of a sixteenth of it (between 64 KiB and 1 MiB), which the scheduler spreads
over the DMA queues. Views the tile pass can express without a copy (reshape, permute, expand, slice)
never reach here; `cat` copies each input into its slice of the output. The exception: a conversion that
rounds stochastically (Options.rounding), which no DMA does, goes through SBUF box by box (_copy_on_chip).
A gather loads 128 indices at a time onto the partitions of an int32 column and lets `dma_gather` fetch the
table rows they name, a block of columns at a time, then stores the block (engines.store: converted as the
program rounds).
"""
from __future__ import annotations

import math
from dataclasses import replace

from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa import cost
from trnc.isa.ap import AP, Mem
from trnc.isa.config import DMA_QUEUES
from trnc.isa.dtypes import DType
from trnc.passes.tile.kernels import boxes, engines
from trnc.passes.tile.tiles import HbmView, TileBuilder

MAX_DMA_BYTES = 1 << 20    # per DMA of a copy; a copy spreads over all queues when it is large enough
GATHER_COLUMNS = 4096      # table columns per gathered block (16 KiB per partition in fp32)
ROW = 2048                 # elements per row when a contiguous run is cut into rows
ON_CHIP_FREE = 4096        # elements per partition of a box of a copy through SBUF (_copy_on_chip)


def copy_view(kb: TileBuilder, src: HbmView, dst: HbmView) -> None:
    """Copy `src` into `dst` (same shape; dtypes may differ: the DMA converts) by HBM-to-HBM DMAs."""
    if src.shape != dst.shape:
        raise ValueError(f"copy_view of shape {src.shape} into {dst.shape}")
    if math.prod(dst.shape) == 0:
        return
    if engines.rounds(kb, dst.dtype, src.dtype):
        _copy_on_chip(kb, src, dst)
        return
    space = boxes.simplify([dst, src])
    regions = [space]
    if len(space.shape) == 1 and space.shape[0] > ROW:   # one contiguous run: rows, so a DMA has a useful shape
        regions = boxes.split(space, 0, ROW)
    itemsize = cost.dma_nbytes(1, dst.dtype, src.dtype)
    total = cost.dma_nbytes(math.prod(dst.shape), dst.dtype, src.dtype)
    budget = min(MAX_DMA_BYTES, max(boxes.MIN_DMA_BYTES, math.ceil(total / DMA_QUEUES))) // itemsize
    for region in regions:
        views = region.views
        chunks = list(boxes.plan(region.shape, 0, 1, budget, lambda box, v=views: boxes.aps_fit(v, 0, box)))
        chunks[0] = max(1, budget // math.prod(chunks[1:]))
        for box in boxes.boxes(region.shape, chunks):
            kb.dma(views[0].box_ap(0, box), views[1].box_ap(0, box))


def _copy_on_chip(kb: TileBuilder, src: HbmView, dst: HbmView) -> None:
    """copy_view for a conversion that rounds stochastically, which no DMA does: box by box through SBUF, each
    loaded by engines.load (in fp32, then rounded into a tile of dst's dtype) and stored as it is."""
    space = boxes.simplify([dst, src])
    views, shape = space.views, space.shape
    pdim = max(range(len(shape)), key=lambda d: (shape[d], d))
    chunks = boxes.plan(shape, pdim, boxes.pchunk(shape[pdim]), ON_CHIP_FREE,
                        lambda box: boxes.aps_fit(views, pdim, box))

    def load(box):
        tile = kb.sbuf("copy", dst.dtype, boxes.partitions(box, pdim), (boxes.free_size(box, pdim),))
        engines.load(kb, tile, views[1].box_ap(pdim, box), lambda d, a: boxes.spread(kb, d, a))
        return tile

    def store(box, tile):
        boxes.spread(kb, views[0].box_ap(pdim, box), tile)
    boxes.pipelined(boxes.boxes(shape, chunks, boxes.partition_first(len(shape), pdim)), load, store)


def _cat(kb: TileBuilder, node: ir.Node, views: dict[ir.Node, HbmView], out: HbmView) -> None:
    dim = node.attrs["dim"] % len(node.shape)
    start = 0
    for x in node.inputs:
        size = x.shape[dim]
        if size:
            copy_view(kb, views[x], out.narrow(dim, start, start + size))
        start += size


def _gather(kb: TileBuilder, node: ir.Node, views: dict[ir.Node, HbmView], out: HbmView) -> None:
    table_node, index_node = node.inputs
    table, index = views[table_node], views[index_node]
    if len(table.shape) != 2:
        raise UnsupportedOpError(f"gather from a {len(table.shape)}-d table %{table_node.name}{node.where()}: "
                                 "the table must be [rows, columns]; reshape it first")
    rows, columns = table.shape
    if math.prod(index.shape) == 0 or columns == 0:
        return
    # the output without its last dim walks with the index: one space for both, its largest dim on the partitions
    out_rows = HbmView(out.tensor, out.dtype, index.shape, out.strides[:-1], out.offset)
    space = boxes.simplify([index, out_rows])
    pdim = max(range(len(space.shape)), key=lambda d: space.shape[d])
    chunks = [1] * len(space.shape)
    chunks[pdim] = boxes.pchunk(space.shape[pdim])
    width = min(columns, GATHER_COLUMNS)

    def load(box):
        idx = kb.sbuf("index", DType.INT32, box[pdim][1], (1,))
        kb.dma(idx, space.views[0].box_ap(pdim, box))
        return idx

    def finish(box, idx):
        store = space.views[1].box_ap(pdim, box)
        for c0 in range(0, columns, width):
            n = min(width, columns - c0)
            block = kb.sbuf("rows", table.dtype, idx.partitions, (n,))
            table_ap = AP(Mem.HBM, table.dtype, rows, ((table.strides[1], n),),
                          (table.offset + c0 * table.strides[1]) * table.dtype.itemsize,
                          tensor=table.tensor, partition_stride=table.strides[0])
            pieces = max(1, min(DMA_QUEUES, idx.partitions, block.partitions * n * table.dtype.itemsize
                                // boxes.MIN_DMA_BYTES))
            step = math.ceil(idx.partitions / pieces)
            for p0 in range(0, idx.partitions, step):      # in pieces, so the rows come in over several queues
                k = min(step, idx.partitions - p0)
                kb.emit("dma_gather", dst=block.narrow(0, p0, k), table=table_ap, index=idx.narrow(0, p0, k))
            engines.store(kb, replace(store, dims=((out.strides[-1], n),),
                                      offset=store.offset + c0 * out.strides[-1] * out.dtype.itemsize), block,
                          lambda d, t: boxes.spread(kb, d, t))

    boxes.pipelined(boxes.boxes(space.shape, chunks), load, finish)


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> None:
    node = kernel.output
    if node.op == "cat":
        _cat(kb, node, views, out)
    elif node.op == "gather":
        _gather(kb, node, views, out)
    else:
        raise UnsupportedOpError(f"%{node.name} = {node.op}: a movement kernel lowers cat and gather; the tile "
                                 f"pass turns the other movement ops into views or copies{node.where()}")

