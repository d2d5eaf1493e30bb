"""The MX matmul kernel (tile stage): x [..., M, K] @ a weight quantized in MX blocks of 32 along K (elements [K, N]
and E8M0 scales [K / 32, N], constants from passes/graph/quantize.py), on trn3's matmul_mx, with the elementwise
epilogue applied as PSUM is evacuated.

The activation is quantized on the device: each 128-row K-tile of x^T loads with K on the partitions (its DMA
reads x's rows with a stride, as the matmul kernel's operands do) and quantize_mx (VectorE) turns it into MX
elements and one scale per 32 partitions and column. Tokens go on the stationary side (128 per matmul, M on the
PSUM partitions) and the weight's columns on the moving side (512 per matmul, one fp32 PSUM bank); each matmul_mx
takes up to four whole K-tiles as row groups ([128, R, X] operands, 512 rows of K at the rate of 128).

Blocking: a block of up to BLOCK_ROWS tokens is quantized once over all of K (one byte per element, at most
OPERAND_BYTES per partition); then for each panel of up to 512 columns the weight's K-tiles load once and serve
the block's 128-token tiles. So x is read once and the weight once per block of tokens.

Numerics: matmul_mx's (isa/opcodes.py): per row group and block of 32, the fp32 sum of exact products times both
scales, accumulated in fp32 in K order; the quantization is runtime/mx.py's, bit for bit.
"""
from __future__ import annotations


import math

from trnc import ir
from trnc.isa.config import MOVING_FMAX, PARTITIONS
from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.isa.enums import ScaleMode
from trnc.passes.tile.kernels import boxes, engines
from trnc.passes.tile.kernels.elementwise import Operand, emit_chain, immediate, load_operand
from trnc.passes.tile.kernels.matmul_plan import batch_indices
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

ROW_GROUPS = 4           # K-tiles per matmul_mx (its R): 512 rows of K
BLOCK_ROWS = 1024        # tokens quantized together at most, each weight panel loaded once for them
OPERAND_BYTES = 32 * 1024   # bytes per partition of a block's quantized tokens, and of a weight panel


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> None:
    mm = kernel.nodes[0]
    x, elems, scales = (views[i] for i in mm.inputs)
    elem, mode = DType.from_text(mm.attrs["elem"]), ScaleMode.from_text(mm.attrs["scale_mode"])
    *batch, m, k = x.shape
    n = elems.shape[1]
    inside = set(kernel.nodes)
    loads = {i: views[i].expand(out.shape) for node in kernel.nodes[1:] for i in node.inputs
             if i not in inside and immediate(i) is None}
    groups = _groups(k)
    x_dtype = kernel.compute_dtype or x.dtype
    k_tiles = math.ceil(k / PARTITIONS)       # one byte per element and K-tile, per partition
    block = max(PARTITIONS, min(BLOCK_ROWS, OPERAND_BYTES // k_tiles // PARTITIONS * PARTITIONS))
    panel = max(1, min(MOVING_FMAX, OPERAND_BYTES // k_tiles))
    nb = len(batch)
    for index in batch_indices(tuple(batch)):
        xt = _select(x, index).permute((1, 0))                       # [K, M]
        for r0 in range(0, m, block):
            rows = min(block, m - r0)
            quantized = [_quantize(kb, xt, group, (r0, rows), x_dtype, elem, mode) for group in groups]
            for c0 in range(0, n, panel):
                cols = min(panel, n - c0)
                weight = [_weight(kb, elems, scales, group, (c0, cols), elem) for group in groups]
                for t0 in range(r0, r0 + rows, PARTITIONS):
                    tokens = min(PARTITIONS, r0 + rows - t0)
                    psum = kb.psum("acc", tokens, (cols,))
                    for g, ((q, qs), (w, ws)) in enumerate(zip(quantized, weight)):
                        kb.emit("matmul_mx", dst=psum, stationary=q.narrow(2, t0 - r0, tokens),
                                stationary_scale=qs.narrow(2, t0 - r0, tokens), moving=w, moving_scale=ws,
                                accumulate=g > 0)
                    box = (*((i, 1) for i in index), (t0, tokens), (c0, cols))
                    result = kb.sbuf("out", out.dtype, tokens, (cols,))
                    if kernel.nodes[1:]:
                        operands = {mm: Operand(psum, False)}
                        operands.update({i: load_operand(kb, v, nb, box, f"e_{i.name}") for i, v in loads.items()})
                        emit_chain(kb, kernel.nodes[1:], operands, result)
                    else:
                        engines.write(kb, result, psum)
                    boxes.spread(kb, out.box_ap(nb, box), result)


def _groups(k: int) -> list[tuple[int, int, int]]:
    """K as matmuls: (start, rows per row group, row groups); up to ROW_GROUPS whole 128-row K-tiles together, a
    shorter last tile (a multiple of 32 rows, as K is) alone, since row groups share a partition count."""
    whole, rest = divmod(k, PARTITIONS)
    groups = [(g * PARTITIONS, PARTITIONS, min(ROW_GROUPS, whole - g)) for g in range(0, whole, ROW_GROUPS)]
    return groups + ([(whole * PARTITIONS, rest, 1)] if rest else [])


def _select(view: HbmView, index: tuple[int, ...]) -> HbmView:
    """The [M, K] matrix of batch index `index` of a [..., M, K] view."""
    for i in index:
        view = HbmView(view.tensor, view.dtype, view.shape[1:], view.strides[1:], view.offset + i * view.strides[0])
    return view


def _quantize(kb: TileBuilder, xt: HbmView, group: tuple[int, int, int], cols: tuple[int, int], dtype: DType,
              elem: DType, mode: ScaleMode) -> tuple[Tile, Tile]:
    """The K rows of `group` of x^T over token columns `cols`, loaded and quantized row group by row group:
    (elements [rows, R, X], scales [rows / 32, R, X])."""
    start, rows, count = group
    q = kb.sbuf("xq", elem, rows, (count, cols[1]))
    s = kb.sbuf("xs", DType.E8M0, rows // MX_BLOCK, (count, cols[1]))
    for r in range(count):
        src = kb.sbuf("x", dtype, rows, (cols[1],))
        engines.load(kb, src, xt.box_ap(0, ((start + r * rows, rows), cols)), lambda d, a: boxes.spread(kb, d, a))
        kb.emit("quantize_mx", dst=q.select(1, r), scale=s.select(1, r), src=src, scale_mode=mode)
    return q, s


def _weight(kb: TileBuilder, elems: HbmView, scales: HbmView, group: tuple[int, int, int], cols: tuple[int, int],
            elem: DType) -> tuple[Tile, Tile]:
    """The K rows of `group` of the quantized weight over columns `cols`: (elements [rows, R, X], scales
    [rows / 32, R, X]), one DMA each (the HBM side reads row group r at rows start + r * rows)."""
    start, rows, count = group
    q = kb.sbuf("w", elem, rows, (count, cols[1]))
    boxes.spread(kb, q, _grouped(elems, start, rows, count).box_ap(1, ((0, count), (0, rows), cols)))
    s = kb.sbuf("ws", DType.E8M0, rows // MX_BLOCK, (count, cols[1]))
    blocks = rows // MX_BLOCK
    kb.dma(s, _grouped(scales, start // MX_BLOCK, blocks, count).box_ap(1, ((0, count), (0, blocks), cols)))
    return q, s


def _grouped(view: HbmView, start: int, rows: int, count: int) -> HbmView:
    """Rows [start, start + rows * count) of a [K, N] view as [count, rows, N]."""
    return HbmView(view.tensor, view.dtype, (count, rows, view.shape[1]),
                   (rows * view.strides[0], view.strides[0], view.strides[1]), view.offset + start * view.strides[0])
