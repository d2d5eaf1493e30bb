"""The convolution kernel (tile stage): conv2d on TensorE, depthwise on the vector engines.

kernel.nodes[0] is a `conv` node (x [N, C_in, H, W], weight [C_in / groups, KH, KW, C_out]: legalize lays the
weight out so that a tile of input channels is a tile of its rows), the rest an elementwise epilogue (bias,
batch norm's scale and shift, activation, residual add) applied as each output block is evacuated
(window.Evacuation). Channels lie on the partitions throughout (window.py), and there are three schemes:

- shifted windows: an input band holds up to 128 input channels on the partitions; each tap (i, j) is one
  matmul of the weight slice [channels, C_out tile] (stationary) by the tap's access pattern over the band
  [channels, rows, columns] (moving), and every tap of every channel tile accumulates into one PSUM bank per
  output block. The input is read once (plus the halo rows between bands) and nothing is copied, at the
  price of one matmul per tap and channel tile, each using only C_in rows of the PE array.
- im2col, for fewer than 128 input channels without groups: the contraction packs (tap, channel) pairs,
  128 // C_in taps per k-tile, each tap's strided window DMAed from HBM into its own partitions. One matmul
  per k-tile instead of one per tap (a 7x7 stem over 3 channels: 2 where shifted windows take 49), at the
  price of reading the input once per tap, in one DMA per tap and tile. `choose_scheme` estimates both with
  isa/cost.py (TensorE time of the matmuls; DMA time of the bytes plus a fixed cost per DMA, over the
  queues) and takes the one whose sum is lower: the sum rather than the slower of the two, since a CNN's DMA
  queues are busy with the weights of the layers around the kernel, so its extra bytes cost time even when its
  own matmuls would hide them (ResNet-50's 3x3 convolutions over 64 channels: im2col halves their matmuls and
  triples the model's activation reads).
- depthwise (one input and one output channel per group), on the vector engines: per tap a multiply by the
  tap's per-channel weight and an add, in fp32. Not as diagonal matmuls, whatever they would cost: a zero off
  the diagonal times an infinite input is NaN, which would spread over every channel of the tile where
  torch keeps it in one. Other grouped convolutions run shifted windows group by group, so each group's
  channels start at partition 0.

Weights load once per kernel, one tile per tile of input channels over all output channels, when they take at
most WEIGHT_BYTES per partition; else once per C_out tile, the input bands then loaded once per C_out tile.

Numerics: operands in the compute dtype (bf16 under auto_cast), products and sums in fp32. On TensorE each
output is one fp32 accumulation in the order (channel tile, tap (row-major), channel), products exact for bf16
and rounded once for fp32; on the vector engines tap by tap, each product rounded, then added.
"""
from __future__ import annotations

import math

from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa import cost
from trnc.isa.config import DMA_QUEUES, MOVING_FMAX, PARTITIONS, HwConfig
from trnc.isa.dtypes import MATMUL_DTYPES, DType
from trnc.isa.enums import AluOp
from trnc.passes.tile.kernels import boxes, engines
from trnc.passes.tile.kernels.window import (Evacuation, Window, bands, channel_tiles, image_region, load_band,
                                             output_blocks, resident_image, tap)
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

WEIGHT_BYTES = 64 * 1024    # bytes per partition of weights kept for the whole kernel
WEIGHT_DMA_BYTES = 256 * 1024   # bytes per weight DMA at most: the ~600 ns fixed cost a twentieth of its time
IM2COL_FREE = 8192          # outputs per partition of one im2col tile: sixteen PSUM blocks, one DMA per tap
DEPTHWISE_FREE = 2048       # outputs per partition of one depthwise block


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> Tile | None:
    """Emit the kernel; returns the resident image when the plan keeps the result in SBUF (window.py)."""
    conv = kernel.nodes[0]
    dtype = kernel.compute_dtype or conv.inputs[0].dtype
    if dtype not in MATMUL_DTYPES:
        raise UnsupportedOpError(f"conv %{conv.name} with operands in {dtype.text}: TensorE takes "
                                 f"{', '.join(sorted(d.text for d in MATMUL_DTYPES))}{conv.where()}")
    win = Window.of(conv)
    x, w = views[conv.inputs[0]], views[conv.inputs[1]]
    evacuate = Evacuation(kb, kernel, views, out, plan)
    groups = conv.attrs["groups"]
    if w.shape[0] == 1 and w.shape[3] == groups:
        _depthwise(kb, win, x, w, dtype, evacuate)
    elif choose_scheme(win, x, w.shape, groups, dtype, kb.hw) == "im2col":
        _im2col(kb, win, x, w, dtype, evacuate)
    else:
        for group in range(groups):
            _shifted(kb, win, x, w, dtype, evacuate, group, groups)
    return evacuate.image


def choose_scheme(win: Window, x: HbmView, weight: tuple[int, ...], groups: int, dtype: DType,
                  hw: HwConfig) -> str:
    """"im2col" or "shifted" (see the module docstring): the lower TensorE time plus DMA time by isa/cost.py."""
    cin, kh, kw, cout = weight
    if groups != 1 or win.input_dilation != (1, 1) or cin >= PARTITIONS:
        return "shifted"
    rows, cols = output_blocks(win.out, MOVING_FMAX)
    blocks = x.shape[0] * math.ceil(win.out[0] / rows) * math.ceil(win.out[1] / cols)
    per_matmul = cost.matmul_cycles(min(cout, PARTITIONS), rows * cols, dtype is DType.FP32)
    matmuls = blocks * math.ceil(cout / PARTITIONS) * per_matmul / hw.clock_hz["pe"]
    taps, outputs = kh * kw, x.shape[0] * win.out[0] * win.out[1]
    rate = cost.dma_rate(hw, DMA_QUEUES)
    tiles = x.shape[0] * math.ceil(win.out[0] * win.out[1] / IM2COL_FREE)
    shifted = matmuls * taps + cost.dma_nbytes(math.prod(x.shape), x.dtype, dtype) / rate
    im2col = (matmuls * math.ceil(taps / (PARTITIONS // cin)) + cost.dma_nbytes(taps * outputs * cin, x.dtype, dtype)
              / rate + taps * tiles * hw.dma_fixed_ns * 1e-9 / DMA_QUEUES)
    return "im2col" if im2col < shifted else "shifted"


def _weights(kb: TileBuilder, w: HbmView, dtype: DType, rows: tuple[int, int], cols: tuple[int, int]) -> Tile:
    """Weight rows (input channels) and columns (output channels) as a [channels, taps, outputs] tile, in DMAs of
    up to WEIGHT_DMA_BYTES (weights load ahead of their use, so a few large ones beat many small ones)."""
    _, kh, kw, _ = w.shape
    tile = kb.sbuf("w", dtype, rows[1], (kh * kw, cols[1]))
    engines.load(kb, tile, w.box_ap(0, (rows, (0, kh), (0, kw), cols)),
                 lambda d, a: kb.dma_split(d, a, WEIGHT_DMA_BYTES))
    return tile


def _shifted(kb: TileBuilder, win: Window, x: HbmView, w: HbmView, dtype: DType, evacuate: Evacuation,
             group: int, groups: int) -> None:
    """Shifted windows for one group: its input channels from partition 0, its output channels' tiles."""
    cin_g, kh, kw, cout = w.shape
    cout_g = cout // groups
    cin_tiles, cout_tiles = channel_tiles(cin_g), channel_tiles(cout_g, group * cout_g)
    resident = len(cin_tiles) * kh * kw * cout_g * dtype.itemsize <= WEIGHT_BYTES
    band_list = bands(win, output_blocks(win.out, MOVING_FMAX), len(cin_tiles), dtype.itemsize)
    work = [(n, band, blocks) for n in range(x.shape[0]) for band, blocks in band_list]
    for part in [cout_tiles] if resident else [[co] for co in cout_tiles]:
        span = (part[0][0], sum(count for _, count in part))
        whole = [_weights(kb, w, dtype, ci, span) for ci in cin_tiles]     # every output channel of `part`
        weights = {co: [t.narrow(2, co[0] - span[0], co[1]) for t in whole] for co in part}

        def load(item):
            n, band, _ = item
            return [load_band(kb, win, x, n, (group * cin_g + c0, count), band, dtype, 0.0, "band")
                    for c0, count in cin_tiles]

        def finish(item, band_tiles: list[Tile], part=part, weights=weights):
            n, band, blocks = item
            for co in part:
                for blk in blocks:
                    psum = kb.psum("acc", co[1], (blk[1] * blk[3],))
                    steps = [(k, t, i, j) for k in range(len(cin_tiles)) for t, (i, j) in enumerate(win.taps)]
                    for s, (k, t, i, j) in enumerate(steps):
                        kb.emit("matmul", dst=psum, stationary=weights[co][k].select(1, t),
                                moving=tap(band_tiles[k], win, band, blk, i, j), accumulate=s > 0)
                    evacuate(psum, n, co, blk)

        boxes.pipelined(work, load, finish, ahead=1)


def _im2col(kb: TileBuilder, win: Window, x: HbmView, w: HbmView, dtype: DType, evacuate: Evacuation) -> None:
    """(tap, channel) pairs on the partitions, 128 // C_in taps per k-tile; each tap's window DMAed from HBM."""
    cin = w.shape[0]
    per_tile = PARTITIONS // cin
    k_tiles = [win.taps[k:k + per_tile] for k in range(0, len(win.taps), per_tile)]
    cout_tiles = channel_tiles(w.shape[3])
    weights = {}
    for k, taps in enumerate(k_tiles):
        for co in cout_tiles:
            tile = kb.sbuf("w", engines.landing(kb, dtype, w.dtype), len(taps) * cin, (co[1],))
            for q, (i, j) in enumerate(taps):
                kb.dma(tile.narrow(0, q * cin, cin), w.box_ap(0, ((0, cin), (i, 1), (j, 1), co)))
            weights[k, co] = engines.rounded(kb, tile, dtype)
    rows, cols = output_blocks(win.out, MOVING_FMAX)
    per_col_tile = max(1, IM2COL_FREE // (rows * cols)) * rows
    work = [(n, (r0, min(per_col_tile, win.out[0] - r0), c0, min(cols, win.out[1] - c0)))
            for n in range(x.shape[0]) for c0 in range(0, win.out[1], cols)
            for r0 in range(0, win.out[0], per_col_tile)]

    def load(item):
        n, region = item
        return [_columns(kb, win, x, n, region, taps, cin, dtype) for taps in k_tiles]

    def finish(item, columns: list[Tile]):
        n, (r0, height, c0, width) = item
        for co in cout_tiles:
            for b0 in range(r0, r0 + height, rows):
                blk = (b0, min(rows, r0 + height - b0), c0, width)
                psum = kb.psum("acc", co[1], (blk[1] * width,))
                for k, tile in enumerate(columns):
                    kb.emit("matmul", dst=psum, stationary=weights[k, co], moving=tile.narrow(1, b0 - r0, blk[1]),
                            accumulate=k > 0)
                evacuate(psum, n, co, blk)

    boxes.pipelined(work, load, finish, ahead=1)


def _columns(kb: TileBuilder, win: Window, x: HbmView, n: int, region, taps, cin: int, dtype: DType) -> Tile:
    """The im2col tile [(tap, channel), rows, columns] of image n over the outputs of `region`: each tap's inputs
    by one DMA of a strided window (from HBM, or from the resident image), its outputs over the padding zero."""
    r0, height, c0, width = region
    image = resident_image(kb, x)
    tile = kb.sbuf("cols", engines.landing(kb, dtype, x.dtype), len(taps) * cin, (height, width))
    ranges = [(win.tap_range(0, i, r0, height), win.tap_range(1, j, c0, width)) for i, j in taps]
    if any(rn != height or cn != width for (_, rn), (_, cn) in ranges):
        engines.emit(kb, "memset", dst=tile, value=0.0)
    for q, ((i, j), ((rl, rn), (cl, cn))) in enumerate(zip(taps, ranges)):
        if not rn or not cn:
            continue
        (sh, sw), (dh, dw), (pt, _, pl, _) = win.stride, win.dilation, win.padding
        h0, w0 = rl * sh + i * dh - pt, cl * sw + j * dw - pl
        dst = tile.narrow(0, q * cin, cin).narrow(1, rl - r0, rn).narrow(2, cl - c0, cn)
        if image is not None:
            for at, view in image_region(image, n, (0, cin), (h0, rn), (w0, cn), (sh, sw)):
                kb.dma(dst.narrow(0, at, view.partitions), view)
            continue
        window = x.narrow(2, h0, h0 + (rn - 1) * sh + 1, sh).narrow(3, w0, w0 + (cn - 1) * sw + 1, sw)
        kb.dma(dst, window.box_ap(1, ((n, 1), (0, cin), (0, rn), (0, cn))))
    return engines.rounded(kb, tile, dtype)


def _depthwise(kb: TileBuilder, win: Window, x: HbmView, w: HbmView, dtype: DType, evacuate: Evacuation) -> None:
    """One channel per group on the vector engines: acc = sum over taps of weight[c, tap] * tap view, in fp32."""
    _, kh, kw, channels = w.shape
    block = output_blocks(win.out, DEPTHWISE_FREE)
    band_list = bands(win, block, 1, dtype.itemsize)
    for chans in channel_tiles(channels):
        weights = kb.sbuf("w", dtype, chans[1], (kh * kw,))
        engines.load(kb, weights, w.box_ap(3, ((0, 1), (0, kh), (0, kw), chans)))
        work = [(n, band, blocks) for n in range(x.shape[0]) for band, blocks in band_list]

        def load(item, chans=chans):
            n, band, _ = item
            return load_band(kb, win, x, n, chans, band, dtype, 0.0, "band")

        def finish(item, band_tile: Tile, chans=chans, weights=weights):
            n, band, blocks = item
            for blk in blocks:
                acc = kb.sbuf("acc", DType.FP32, chans[1], (blk[1], blk[3]))
                for t, (i, j) in enumerate(win.taps):
                    dst = acc if t == 0 else kb.sbuf("tap", DType.FP32, chans[1], (blk[1], blk[3]))
                    engines.emit(kb, "tensor_scalar", dst=dst, src=tap(band_tile, win, band, blk, i, j),
                                 op0=AluOp.MUL, scalar0_ap=weights.narrow(1, t, 1))
                    if t:
                        engines.emit(kb, "tensor_tensor", dst=acc, in0=acc, in1=dst, op=AluOp.ADD)
                evacuate(acc.reshape(blk[1] * blk[3]), n, chans, blk)

        boxes.pipelined(work, load, finish, ahead=1)
