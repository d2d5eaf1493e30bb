"""Box tiling shared by the elementwise, reduce and movement lowerings (tile stage).

A kernel that walks several HBM views of one shape together (its output and inputs) first
simplifies their common index space the way TensorIterator does: size-1 dims go, and neighbouring
dims that are contiguous for every view merge into one, so a [B, S, H] tensor read contiguously is
one dim and a permuted input keeps the dims apart. One dim then goes on the partitions and the space
is cut into boxes (a (start, count) per dim) small enough for an on-chip tile and a DMA access
pattern (at most four free dims, each count at most 65535). The boxes follow per-dim chunk sizes, so
a loop over them is a plain product of ranges.
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

from trnc.isa import cost
from trnc.isa.ap import MAX_COUNT
from trnc.isa.config import DMA_QUEUES, PARTITIONS
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

Box = tuple[tuple[int, int], ...]
MIN_DMA_BYTES = 64 * 1024   # smaller pieces would spend more of their time on the ~600 ns fixed cost


@dataclass(frozen=True)
class Space:
    """Views of one shape walked together; `groups[d]` lists the original dims that dim d holds."""

    views: tuple[HbmView, ...]
    groups: tuple[tuple[int, ...], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.views[0].shape

    def dim_of(self, original: int) -> int | None:
        """The dim holding original dim `original`, or None when it was dropped (size 1)."""
        for d, group in enumerate(self.groups):
            if original in group:
                return d
        return None

    def numel(self) -> int:
        return math.prod(self.shape)


def _with_dims(view: HbmView, shape, strides, offset: int | None = None) -> HbmView:
    return replace(view, shape=tuple(shape), strides=tuple(strides),
                   offset=view.offset if offset is None else offset)


def simplify(views: list[HbmView]) -> Space:
    """Drop size-1 dims and merge neighbours contiguous in every view; a scalar space becomes one dim of 1."""
    shape = views[0].shape
    keep = [d for d, size in enumerate(shape) if size != 1]
    dims: list[list[int]] = []      # groups of original dims, outermost first
    for d in keep:
        if dims and all(v.strides[dims[-1][-1]] == v.strides[d] * shape[d] for v in views):
            dims[-1].append(d)
        else:
            dims.append([d])
    if not dims:
        return Space(tuple(_with_dims(v, (1,), (0,)) for v in views), ((),))
    new_shape = [math.prod(shape[d] for d in group) for group in dims]
    out = tuple(_with_dims(v, new_shape, [v.strides[group[-1]] for group in dims]) for v in views)
    return Space(out, tuple(tuple(g) for g in dims))


def split(space: Space, dim: int, inner: int) -> list[Space]:
    """Dim `dim` (size n) as (n // inner, inner), plus a region for the n % inner elements left over, shaped
    (n % inner, 1) so that every region has the same dims and one chunking serves them all."""
    n = space.shape[dim]
    outer, rest = divmod(n, inner)
    groups = space.groups[:dim] + (space.groups[dim], space.groups[dim]) + space.groups[dim + 1:]
    main = tuple(_with_dims(v, v.shape[:dim] + (outer, inner) + v.shape[dim + 1:],
                            v.strides[:dim] + (v.strides[dim] * inner, v.strides[dim]) + v.strides[dim + 1:])
                 for v in space.views)
    regions = [Space(main, groups)]
    if rest:
        tail = tuple(_with_dims(v, v.shape[:dim] + (rest, 1) + v.shape[dim + 1:],
                                v.strides[:dim] + (v.strides[dim], v.strides[dim]) + v.strides[dim + 1:],
                                v.offset + outer * inner * v.strides[dim]) for v in space.views)
        regions.append(Space(tail, groups))
    return regions


def split_rows(space: Space, pdim: int, budget: int) -> list[Space]:
    """Regions with several rows of the partition dim on each partition when one row leaves a box at most
    half full ([N] flat, [2048, 768] with 4096 elements a box): the dim becomes (N / f, f), f rows side by
    side in the free axis, f chosen so the partition tiles come out (nearly) full. Bigger boxes mean fewer
    instructions and DMAs of a useful size."""
    n = space.shape[pdim]
    free = space.numel() // n
    if n < 2 * PARTITIONS or 2 * free > budget:
        return [space]
    widest = min(budget // free, n // PARTITIONS)
    tiles = math.ceil(n / (PARTITIONS * widest))
    inner = math.ceil(n / (PARTITIONS * tiles))
    return split(space, pdim, inner) if inner >= 2 else [space]


def aps_fit(views, pdim: int | None, box: Box) -> bool:
    """True when every view can give this box as one access pattern (at most four free dims of at most
    MAX_COUNT elements each)."""
    try:
        return all(count <= MAX_COUNT for v in views for _, count in v.box_ap(pdim, box).dims)
    except ValueError:
        return False


def plan(shape, pdim: int | None, pchunk: int, budget: int, fits: Callable[[Box], bool]) -> tuple[int, ...]:
    """Chunk sizes per dim: `pchunk` on the partition dim, then the free dims grown innermost first, each
    whole while the box stays within `budget` elements per partition and `fits`, the first that does not
    cut to what is left, halved until it fits; the dims outside it go one index at a time."""
    chunks = [1] * len(shape)
    if pdim is not None:
        chunks[pdim] = pchunk

    def box_with(d: int, count: int) -> Box:
        return tuple((0, count if e == d else c) for e, c in enumerate(chunks))

    total = 1
    for d in reversed(range(len(shape))):
        if d == pdim or shape[d] == 1:
            continue
        if total * shape[d] <= budget and fits(box_with(d, shape[d])):
            chunks[d] = shape[d]
            total *= shape[d]
            continue
        count = min(shape[d], budget // total)
        while count >= 2 and not fits(box_with(d, count)):   # e.g. beyond an AP dim's 65535 elements
            count //= 2
        if count >= 2:
            chunks[d] = count
        break
    return tuple(chunks)


def boxes(shape, chunks, order=None) -> Iterator[Box]:
    """Every box of the chunking; dims in `order` vary slowest first (default: dim order)."""
    order = list(order) if order is not None else list(range(len(shape)))
    ranges = [range(0, shape[d], chunks[d]) for d in order]
    for starts in itertools.product(*ranges):
        box = [(0, 0)] * len(shape)
        for d, start in zip(order, starts):
            box[d] = (start, min(chunks[d], shape[d] - start))
        yield tuple(box)


def partition_first(ndim: int, pdim: int | None) -> list[int]:
    """Loop order with the partition dim outermost, so the tiles of one partition chunk come together."""
    rest = [d for d in range(ndim) if d != pdim]
    return ([pdim] if pdim is not None else []) + rest


def free_size(box: Box, pdim: int | None) -> int:
    return math.prod(c for d, (_, c) in enumerate(box) if d != pdim)


def partitions(box: Box, pdim: int | None) -> int:
    return box[pdim][1] if pdim is not None else 1


def pchunk(size: int) -> int:
    return min(size, PARTITIONS)


def pipelined(items: Iterable, load: Callable, finish: Callable, ahead: int = 2) -> None:
    """Emit `load(item)` `ahead` items before `finish(item, loaded)`. The scheduler places instructions in
    program order on in-order queues, so a load emitted after the previous box's stores would queue behind
    them (and they behind that box's compute); emitted earlier, it prefetches while the engines compute."""
    pending: deque = deque()
    for item in items:
        pending.append((item, load(item)))
        if len(pending) > ahead:
            finish(*pending.popleft())
    while pending:
        finish(*pending.popleft())


def spread(kb: TileBuilder, dst, src) -> None:
    """One transfer between a tile and HBM as up to one DMA per queue, in equal pieces: each queue then moves
    one large piece, rather than some queues two pieces and others one. Pieces are groups of partitions, or,
    for a write whose partitions step less than its outermost free dim (a transposed layout), ranges of that
    free dim, so that each piece still covers its own span of HBM bytes: the scheduler orders writes whose
    spans overlap, which would run interleaved pieces one after another."""
    row = cost.dma_nbytes(max(dst.free_size, src.free_size), dst.dtype, src.dtype)
    parts = dst.partitions
    pieces = max(1, min(DMA_QUEUES, row * parts // MIN_DMA_BYTES))
    hbm, tile = (dst, src) if isinstance(src, Tile) else (src, dst)
    outer = hbm.dims[0]
    if hbm is dst and parts > 1 and outer[1] > 1 and abs(hbm.partition_stride) < abs(outer[0]):
        count = outer[1]
        step = math.ceil(count / min(pieces, count))
        rows = tile.reshape(count, tile.free_size // count)
        for i in range(0, count, step):
            n = min(step, count - i)
            part_hbm = replace(hbm, dims=((outer[0], n),) + hbm.dims[1:],
                               offset=hbm.offset + i * outer[0] * hbm.dtype.itemsize)
            part_tile = rows.narrow(1, i, n)
            kb.dma(*((part_hbm, part_tile) if hbm is dst else (part_tile, part_hbm)))
        return
    kb.dma_split(dst, src, max_bytes=math.ceil(parts / min(pieces, parts)) * row)
