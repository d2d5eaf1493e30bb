"""The matmul kernel's operand loads (tile stage, passes/tile/kernels/matmul.py): a region of one operand over
all of K loaded in k order in chunks sized by the kernel's DMA slack, a resident panel as blocks of regions, and
the order in which TensorE first needs them. An operand the kernel quantizes loads in its own dtype and one
tensor_scalar writes it in fp8. Under stochastic rounding an operand converted on load (fp32 into bf16) lands in
fp32 and engines.write rounds it (engines.load)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from trnc.isa.config import PARTITIONS
from trnc.isa.dtypes import DType
from trnc.isa.enums import AluOp
from trnc.passes.tile.kernels import engines
from trnc.passes.tile.kernels.matmul_plan import BLOCK_TILES
from trnc.passes.tile.tiles import Tile

if TYPE_CHECKING:
    from trnc.passes.tile.kernels.matmul import _Emitter

SEGMENT_BYTES = 8 * 1024   # bytes per partition of an operand region's SBUF buffers
Cols = tuple[int, int]     # (start, count) along M or N


def subtiles(x0: int, width: int, tile: int) -> list[Cols]:
    return [(x0 + c, min(tile, width - c)) for c in range(0, width, tile)]


def blocks(count: int) -> list[list[int]]:
    return [list(range(b, min(b + BLOCK_TILES, count))) for b in range(0, count, BLOCK_TILES)]


class Region:
    """Columns `cols` of operand `side` over all of K, loaded in k order in chunks of k-tiles.

    K-tile kt is first needed at kernel PE time use0 + kt * per_kt (seconds of TensorE work, at full rate).
    With `segments`, the k-tiles go in SBUF buffers of up to SEGMENT_BYTES per partition, each holding one
    or more chunks (a region's k-tiles live together, and buffers of one size fragment SBUF less than
    buffers of every chunk's size); else each chunk has its own buffer (the streamed fallback, whose chunks
    die one after the other)."""

    def __init__(self, e: "_Emitter", side: str, index: tuple[int, ...], cols: Cols, use: tuple[float, float],
                 segments: bool = True):
        self.e, self.side, self.index, self.cols = e, side, index, cols
        self.use0, self.per_kt = use
        self.segment = max(1, SEGMENT_BYTES // (cols[1] * e.dtype.itemsize)) if segments else 0   # k-tiles
        self.tiles: list[tuple[Tile, int]] = []      # per k-tile: its buffer and its index in it
        self.kt = 0                                  # the next k-tile to load

    @property
    def done(self) -> bool:
        return self.kt >= self.e.k_tiles

    @property
    def next_use(self) -> float:
        return self.use0 + self.kt * self.per_kt

    @property
    def nbytes(self) -> int:
        return self.e.gemm.k * self.cols[1] * self.e.load_itemsize[self.side]

    def emit_next(self) -> int:
        """Load the next chunk: as many k-tiles as one DMA of `dma_bytes` holds, or one k-tile in several
        DMAs when it is larger. Returns the chunk's bytes."""
        e, (x0, width) = self.e, self.cols
        kept = e.kb.program.on_chip(e.kx[self.side])
        if kept is not None:      # the operand is in SBUF already (lower.py): no DMA
            self.tiles += [(kept.narrow(2, x0, width), kt) for kt in range(self.kt, e.k_tiles)]
            self.kt = e.k_tiles
            return 0
        full = e.gemm.k // PARTITIONS
        k_tile_bytes = PARTITIONS * width * e.load_itemsize[self.side]
        target = e.dma_bytes(self.next_use, k_tile_bytes)
        batch = tuple((i, 1) for i in self.index)
        room = self.segment - self.kt % self.segment if self.segment else full
        if self.kt < full:
            count, rows = max(1, min(full - self.kt, room, target // k_tile_bytes)), PARTITIONS
            src = e.split[self.side].box_ap(e.nb + 1, (*batch, (self.kt, count), (0, PARTITIONS), (x0, width)))
        else:       # the partial last k-tile
            count, rows = 1, e.gemm.k - full * PARTITIONS
            src = e.kx[self.side].box_ap(e.nb, (*batch, (self.kt * PARTITIONS, rows), (x0, width)))
        if not self.segment:
            tile, first = e.kb.sbuf(e.name(self.side), e.dtype, rows, (count, width)), 0
        elif self.kt % self.segment:
            tile, first = self.tiles[-1][0], self.kt % self.segment
        else:
            size = min(self.segment, e.k_tiles - self.kt)
            tile, first = e.kb.sbuf(e.name(self.side), e.dtype, min(PARTITIONS, e.gemm.k), (size, width)), 0
        dst = tile.narrow(0, 0, rows).narrow(1, first, count)
        if self.side == e.quantized:        # loaded as it is, then x * scale rounded to the operand's fp8
            stage = e.kb.sbuf(e.name("stage"), src.dtype, rows, (count, width))
            e.dma(stage, src, target)
            scale = e.scale if isinstance(e.scale, float) else e.scale.narrow(0, 0, rows)
            stochastic = engines.stochastic(e.kb, dst.dtype)     # then the product rounds by engines.write
            scaled = e.kb.sbuf(e.name("scaled"), DType.FP32, rows, (count, width)) if stochastic else dst
            engines.emit(e.kb, "tensor_scalar", dst=scaled, src=stage, op0=AluOp.MUL,
                         **({"scalar0": scale} if isinstance(scale, float) else {"scalar0_ap": scale}))
            if stochastic:
                engines.write(e.kb, dst, scaled)
        else:       # converted to the operand's dtype as the program rounds (engines.load)
            engines.load(e.kb, dst, src, lambda d, a: e.dma(d, a, target))
        self.tiles += [(tile, first + j) for j in range(count)]
        self.kt += count
        return rows * count * width * e.load_itemsize[self.side]

    def fill(self, until: float) -> None:
        """Load the chunks first needed before PE time `until`."""
        while not self.done and self.next_use < until:
            self.emit_next()

    def at(self, kt: int, offset: int, width: int) -> Tile:
        """Columns [offset, offset + width) of the region's k-tile kt, as a [rows, width] tile."""
        while self.kt <= kt:
            self.emit_next()
        tile, j = self.tiles[kt]
        rows = min(PARTITIONS, self.e.gemm.k - kt * PARTITIONS)
        return tile.narrow(0, 0, rows).narrow(2, offset, width).select(1, j)

    def pair(self, kt: int, offset: int, width: int) -> Tile | None:
        """K-tiles kt and kt + 1 as one [128, 2, width] operand of a double-row matmul, when both are whole and
        lie side by side in one buffer; else None."""
        if (kt + 2) * PARTITIONS > self.e.gemm.k:
            return None
        while self.kt <= kt + 1:
            self.emit_next()
        (tile, j), (other, k) = self.tiles[kt], self.tiles[kt + 1]
        if other.buffer is not tile.buffer or k != j + 1 or tile.offset != other.offset:
            return None
        return tile.narrow(2, offset, width).narrow(1, j, 2)


@dataclass
class Later:
    """A load for `emit_by_use` that is not a region: `emit` once, at PE time `next_use`."""

    next_use: float
    emit: Callable[[], object]
    done: bool = False

    def emit_next(self) -> int:
        self.emit()
        self.done = True
        return 0


def emit_by_use(loads: list) -> None:
    """Emit every chunk of `loads` (regions, Later) in the order TensorE or the evacuations first need them."""
    while True:
        pending = [load for load in loads if not load.done]
        if not pending:
            return
        min(pending, key=lambda load: load.next_use).emit_next()


class Panel:
    """Columns [x0, x0 + width) of the resident side for one batch group: sub-tiles one matmul wide, in blocks
    of BLOCK_TILES, one region per block. `uses` holds each block's (use0, per_kt) at the job's first step."""

    def __init__(self, e: "_Emitter", job, uses: list[tuple[float, float]]):
        (index, *_), x0, width = job
        self.subtiles = subtiles(x0, width, e.plan.tile(e.plan.resident))
        self.blocks = blocks(len(self.subtiles))
        self.regions = [Region(e, e.plan.resident, index, (self.subtiles[blk[0]][0],
                                                            sum(self.subtiles[r][1] for r in blk)), use)
                        for blk, use in zip(self.blocks, uses)]
        self.nbytes = sum(region.nbytes for region in self.regions)
        self.emitted = 0

    def advance(self, upto: float) -> None:
        """Load chunks, in block order, until `upto` bytes of the panel are loaded."""
        for region in self.regions:
            while not region.done and self.emitted < upto:
                self.emitted += region.emit_next()

    def operand(self, b: int, r: int) -> tuple[Region, int, int]:
        """Sub-tile r (of block b) as (region, column offset, width)."""
        region = self.regions[b]
        x0, width = self.subtiles[r]
        return region, x0 - region.cols[0], width
