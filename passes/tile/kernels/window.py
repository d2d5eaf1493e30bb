"""Sliding-window kernels (tile stage): the geometry, input bands and evacuation that convolution (conv.py) and
pooling share, and the pooling lowering.

A window op reads x [N, C, H, W] and writes [N, C', OH, OW]. Output (oh, ow) reads tap (i, j) of its window at
(oh * sh + i * dh, ow * sw + j * dw) of the placed input, which holds x[h, w] at (pt + h * lh, pl + w * lw)
(lh, lw > 1 only for a transposed convolution's zeros between inputs) and the fill value elsewhere: 0 for a
convolution and a sum, -inf for a max.

Channels lie on the partitions, as they do in HBM's NCHW rows, so loads are whole rows of a channel and nothing
is transposed between layers. An input band is one SBUF tile [channels, rows, columns] of the placed input, the
part a rectangle of outputs reads: its padding is written there by memset, never in HBM, and every tap of the
window is an access pattern over the band (free dims: output rows sh * columns apart, output columns sw apart),
so no tap costs a copy. A band serves several output blocks (one PSUM bank each for a convolution), which
share its halo rows; the next band loads while the engines work on this one.

An image the plan keeps in SBUF (ir.KernelPlan.keep, TileProgram.resident: [channels, C / 128, N, H, W]) is
written there by its producer's evacuation instead of being stored, and its readers take their bands from it: as
a view when the band needs no padding (a 1x1 convolution, an unpadded window), else copied into a padded band
by an engine (a DMA where the channels change partitions); an epilogue reads its operand from it as a view.

Pooling: max (NaN wins, as in torch) or sum over the taps, on the vector engines in fp32, one instruction per
tap; an average is a sum that legalize divides, and the division fuses into the evacuation like any epilogue.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trnc import ir
from trnc.isa.config import PARTITIONS
from trnc.isa.verify import aligned_starts
from trnc.isa.dtypes import DType
from trnc.isa.enums import AluOp
from trnc.passes.tile.kernels import boxes, engines
from trnc.passes.tile.kernels.elementwise import Operand, emit_chain, immediate, load_operand
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

BAND_BYTES = 32 * 1024    # bytes per partition of one input band: two in flight leave SBUF to weights and outputs
COPY_FREE = 1024          # elements per partition of one engine copy of a band from a resident image
POOL_FREE = 512           # outputs per partition of one pooling block: the blocks spread over the engines
Block = tuple[int, int, int, int]   # output rows (start, count) and columns (start, count)


@dataclass(frozen=True)
class Window:
    """The geometry of a window node along H and W: each pair is (along H, along W)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]    # top, bottom, left, right
    dilation: tuple[int, int]
    input_dilation: tuple[int, int]
    size: tuple[int, int]                 # H, W of the input
    out: tuple[int, int]                  # OH, OW

    @staticmethod
    def of(node: ir.Node) -> "Window":
        a = node.attrs
        kernel = a["kernel"] if node.op == "pool" else node.inputs[1].shape[1:3]
        return Window(tuple(kernel), tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]),
                      tuple(a.get("input_dilation", (1, 1))), node.inputs[0].shape[2:], node.shape[2:])

    @property
    def taps(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]

    def span(self, d: int, count: int) -> int:
        """Placed-input elements along dim d that `count` consecutive outputs read."""
        return (count - 1) * self.stride[d] + self.dilation[d] * (self.kernel[d] - 1) + 1

    def band_bytes(self, rows: int, cols: int, itemsize: int) -> int:
        return self.span(0, rows) * self.span(1, cols) * itemsize

    def inputs_in(self, d: int, lo: int, count: int) -> tuple[int, int, int]:
        """(first input index, number of inputs, position of the first in [lo, lo + count)) of the inputs that the
        placed range [lo, lo + count) holds along dim d."""
        before, step, size = self.padding[2 * d], self.input_dilation[d], self.size[d]
        first = max(0, -(-(lo - before) // step))
        last = min(size - 1, (lo + count - 1 - before) // step)
        return first, max(0, last - first + 1), before + first * step - lo

    def tap_range(self, d: int, tap: int, o0: int, count: int) -> tuple[int, int]:
        """(first output, number of outputs) of [o0, o0 + count) whose tap `tap` reads an input, not the fill
        (input dilation 1)."""
        before, stride = self.padding[2 * d], self.stride[d]
        offset = tap * self.dilation[d] - before
        lo = max(o0, -(-(-offset) // stride))
        hi = min(o0 + count - 1, (self.size[d] - 1 - offset) // stride)
        return lo, max(0, hi - lo + 1)


def output_blocks(out: tuple[int, int], free: int) -> tuple[int, int]:
    """(rows, columns) of an output block of at most `free` outputs: whole rows where they fit."""
    cols = min(out[1], free)
    return min(out[0], max(1, free // cols)), cols


def bands(win: Window, block: tuple[int, int], channel_tiles: int, itemsize: int) -> list[tuple[Block, list[Block]]]:
    """The bands over the outputs, each with its output blocks: as many rows of blocks as keep the band of
    `channel_tiles` tiles within BAND_BYTES (at least one block)."""
    rows, cols = block
    per_band = 1
    while (per_band + 1) * rows <= win.out[0] and \
            channel_tiles * win.band_bytes((per_band + 1) * rows, cols, itemsize) <= BAND_BYTES:
        per_band += 1
    result = []
    for c0 in range(0, win.out[1], cols):
        width = min(cols, win.out[1] - c0)
        for r0 in range(0, win.out[0], rows * per_band):
            height = min(rows * per_band, win.out[0] - r0)
            blocks = [(r, min(rows, r0 + height - r), c0, width) for r in range(r0, r0 + height, rows)]
            result.append(((r0, height, c0, width), blocks))
    return result


def resident_image(kb: TileBuilder, view: HbmView) -> Tile | None:
    """The SBUF tile that holds the image `view` reads when the plan keeps it there (the view must be the whole
    tensor, as ir.reads_image has its readers read it), else None."""
    image = kb.program.resident.get(view.tensor)
    if image is not None and (view.offset or not view.is_contiguous or len(view.shape) != 4):
        raise ValueError(f"view {view} does not read the resident image {image.buffer} whole")
    return image


def image_region(image: Tile, n: int, channels: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int],
                 steps: tuple[int, int] = (1, 1)) -> list[tuple[int, Tile]]:
    """Channels (start, count), rows and columns (start, count, every steps-th) of image n of a resident tile, as
    views [channels, rows, columns], one per 128-channel block the channels span: (offset in the region, view)."""
    _, _, batch, height, width = image.shape
    views, c, end = [], channels[0], channels[0] + channels[1]
    while c < end:
        block, p0 = divmod(c, PARTITIONS)
        count = min(end - c, PARTITIONS - p0)
        offset = (((block * batch + n) * height + rows[0]) * width + cols[0]) * image.dtype.itemsize
        views.append((c - channels[0], replace(image, partitions=count, start_partition=image.start_partition + p0,
                                               dims=((steps[0] * width, rows[1]), (steps[1], cols[1])),
                                               offset=image.offset + offset)))
        c += count
    return views


def copy_region(kb: TileBuilder, views: list[tuple[int, Tile]], dst: Tile) -> None:
    """Copy image views (image_region) into `dst` [channels, rows, columns]: on the engines where the partitions
    stay, in pieces of at most COPY_FREE elements per partition so that several engines share a large band; by
    DMA where the partitions change (the engines work within partitions)."""
    for at, view in views:
        part = dst.narrow(0, at, view.partitions)
        if part.start_partition != view.start_partition or view.start_partition not in aligned_starts(view.partitions):
            kb.dma(part, view)
            continue
        rows, cols = view.shape[1:]
        step = max(1, COPY_FREE // cols)
        for r in range(0, rows, step):
            count = min(step, rows - r)
            engines.emit(kb, "tensor_copy", dst=part.narrow(1, r, count), src=view.narrow(1, r, count))


def load_band(kb: TileBuilder, win: Window, x: HbmView, n: int, channels: tuple[int, int], band: Block,
              dtype: DType, fill: float, name: str) -> Tile:
    """The placed input that the outputs of `band` read, channels (start, count) of image n, as an SBUF tile
    [channels, rows, columns] of `dtype`: the inputs by one DMA (which converts), or from the resident image,
    the rest `fill` by memset. A conversion that rounds stochastically assembles the band in fp32 first
    (engines.landing and rounded)."""
    (r0, rows, c0, cols), (c_start, count) = band, channels
    height, width = win.span(0, rows), win.span(1, cols)
    h0, nh, at_row = win.inputs_in(0, r0 * win.stride[0], height)
    w0, nw, at_col = win.inputs_in(1, c0 * win.stride[1], width)
    lh, lw = win.input_dilation
    image = resident_image(kb, x)
    if image is not None:
        views = image_region(image, n, channels, (h0, nh), (w0, nw))
        whole = (nh, nw, at_row, at_col, lh, lw) == (height, width, 0, 0, 1, 1)
        if whole and len(views) == 1 and views[0][1].start_partition == 0 and image.dtype == dtype:
            return views[0][1]      # the band is a view of the image: no copy, no padding
    tile = kb.sbuf(name, engines.landing(kb, dtype, x.dtype), count, (height, width))
    if not nh or not nw or lh > 1 or lw > 1:
        engines.emit(kb, "memset", dst=tile, value=fill)
    else:
        strips = [((0, at_row), (0, width)), ((at_row + nh, height - at_row - nh), (0, width)),
                  ((at_row, nh), (0, at_col)), ((at_row, nh), (at_col + nw, width - at_col - nw))]
        for (r, nr), (c, nc) in strips:
            if nr > 0 and nc > 0:
                engines.emit(kb, "memset", dst=tile.narrow(1, r, nr).narrow(2, c, nc), value=fill)
    if nh and nw:
        dst = replace(tile, dims=((lh * width, nh), (lw, nw)),
                      offset=tile.offset + (at_row * width + at_col) * tile.dtype.itemsize)
        if image is not None:
            copy_region(kb, image_region(image, n, channels, (h0, nh), (w0, nw)), dst)
        else:
            boxes.spread(kb, dst, x.box_ap(1, ((n, 1), (c_start, count), (h0, nh), (w0, nw))))
    return engines.rounded(kb, tile, dtype)


def tap(band_tile: Tile, win: Window, band: Block, block: Block, i: int, j: int) -> Tile:
    """The [channels, rows, columns] view of `band_tile` (loaded for `band`) that tap (i, j) of the outputs of
    `block` reads."""
    width = band_tile.dims[0][0]
    row = (block[0] - band[0]) * win.stride[0] + i * win.dilation[0]
    col = (block[2] - band[2]) * win.stride[1] + j * win.dilation[1]
    return replace(band_tile, dims=((win.stride[0] * width, block[1]), (win.stride[1], block[3])),
                   offset=band_tile.offset + (row * width + col) * band_tile.dtype.itemsize)


class Evacuation:
    """Writes output blocks of a window kernel: the epilogue (the elementwise nodes fused after the window node,
    their other inputs loaded per block, a per-channel one once per channel tile) from the accumulator into an
    SBUF tile of the output dtype, then one store; or, when the plan keeps the image, into the resident tile
    (`image`), never stored."""

    def __init__(self, kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
                 plan: ir.KernelPlan):
        self.kb, self.node, self.epilogue, self.out = kb, kernel.nodes[0], kernel.nodes[1:], out
        inside = set(kernel.nodes)
        self.loads = {i: views[i].expand(out.shape) for e in self.epilogue for i in e.inputs
                      if i not in inside and immediate(i) is None}
        self.cache: dict = {}
        batch, channels, height, width = out.shape
        self.image = kb.sbuf("image", out.dtype, min(channels, PARTITIONS),
                             (-(-channels // PARTITIONS), batch, height, width)) if plan.keep else None

    def __call__(self, acc: Tile, n: int, channels: tuple[int, int], block: Block) -> None:
        """Write the outputs of `block`, channels (start, count) of image n, from `acc` [channels, outputs]."""
        box = ((n, 1), channels, block[:2], block[2:])
        targets = [] if self.image is None else image_region(self.image, n, channels, block[:2], block[2:])
        direct = len(targets) == 1 and targets[0][1].start_partition == 0
        result = targets[0][1] if direct else self.kb.sbuf("out", self.out.dtype, channels[1],
                                                           (block[1] * block[3],))
        if self.epilogue:
            operands = {self.node: Operand(acc, False)}
            operands.update({i: self._load(i, view, box) for i, view in self.loads.items()})
            emit_chain(self.kb, self.epilogue, operands, result)
        else:
            engines.write(self.kb, result, acc)
        if self.image is None:
            boxes.spread(self.kb, self.out.box_ap(1, box), result)
        elif not direct:
            for at, view in targets:
                self.kb.dma(view, result.narrow(0, at, view.partitions).reshape(block[1], block[3]))

    def _load(self, node: ir.Node, view: HbmView, box) -> Operand:
        """The operand from the resident image it is, or load_operand, once per channel tile for an operand
        constant over the block (a bias, a BN scale)."""
        image = resident_image(self.kb, view)
        if image is not None:
            (n, _), channels, rows, cols = box
            views = image_region(image, n, channels, rows, cols)
            if len(views) == 1 and views[0][1].start_partition == 0:
                return Operand(views[0][1], False)
            tile = self.kb.sbuf(f"e_{node.name}", image.dtype, channels[1], (rows[1], cols[1]))
            copy_region(self.kb, views, tile)
            return Operand(tile, False)
        per_channel = all(view.strides[d] == 0 or view.shape[d] == 1 for d in (2, 3))
        key = (node, box[0] if view.strides[0] and view.shape[0] > 1 else None, box[1]) if per_channel else None
        if key in self.cache:
            return self.cache[key]
        operand = load_operand(self.kb, view, 1, box, f"e_{node.name}")
        if key is not None:
            self.cache[key] = operand
        return operand


def channel_tiles(count: int, start: int = 0) -> list[tuple[int, int]]:
    """(start, count) of the 128-channel tiles of `count` channels from `start`."""
    return [(start + c, min(PARTITIONS, count - c)) for c in range(0, count, PARTITIONS)]


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> Tile | None:
    """A pooling kernel: per image, channel tile and band, each block's taps folded into an fp32 accumulator
    with max or add, then evacuated through the epilogue. Returns the resident image when the plan keeps it."""
    node = kernel.nodes[0]
    win, x = Window.of(node), views[node.inputs[0]]
    op, fill = (AluOp.MAX, -math.inf) if node.attrs["op"] == "max" else (AluOp.ADD, 0.0)
    evacuate = Evacuation(kb, kernel, views, out, plan)
    block = output_blocks(win.out, POOL_FREE)
    work = [(n, channels, band, blocks) for n in range(x.shape[0]) for channels in channel_tiles(x.shape[1])
            for band, blocks in bands(win, block, 1, x.dtype.itemsize)]

    def load(item):
        n, channels, band, _ = item
        return load_band(kb, win, x, n, channels, band, x.dtype, fill, "band")

    def finish(item, band_tile: Tile):
        n, channels, band, blocks = item
        for blk in blocks:
            acc = kb.sbuf("acc", DType.FP32, channels[1], (blk[1], blk[3]))
            for k, (i, j) in enumerate(win.taps):
                view = tap(band_tile, win, band, blk, i, j)
                if k == 0:
                    engines.emit(kb, "tensor_copy", dst=acc, src=view)
                else:
                    engines.emit(kb, "tensor_tensor", dst=acc, in0=acc, in1=view, op=op)
            evacuate(acc.reshape(blk[1] * blk[3]), n, channels, blk)

    boxes.pipelined(work, load, finish, ahead=1)
    return evacuate.image
