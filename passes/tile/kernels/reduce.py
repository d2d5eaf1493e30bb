"""Reduce kernels (tile stage): sum, max or min of one tensor (or of its magnitudes) over any set of axes,
accumulated in fp32.

The input and the output (seen in the input's index space, with stride 0 along the reduced dims) are
simplified together (passes/tile/kernels/boxes.py), which keeps kept and reduced dims apart and merges runs
of each. Two ways to use the 128 partitions, whichever the cost estimate favours:

- kept on the partitions: each partition reduces its own rows along the free axis (tensor_reduce with a
  bitmask of the reduced free dims); long reductions go a box at a time, each box's partial folded into
  an fp32 accumulator (tensor_tensor), then stored;
- reduced on the partitions (full reductions, or few outputs from many inputs): a reduced dim is cut
  over the partitions (split into rows when it is one long run), every partition reduces its share of
  the free axis into the accumulator, and partition_reduce (GpSimdE) folds the partitions at the end.

The fp32 accumulator is stored with one DMA, which converts to the output dtype (under stochastic rounding
engines.store rounds it into a tile of that dtype first); a kernel with an elementwise
epilogue (the fuse pass joins the nodes that read the result: the mean's scale, the fp8 scale from an amax)
computes it on the accumulator first (elementwise.py's chain), its other inputs seen in the same index space.
"""
from __future__ import annotations

import math

from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc, AluOp, ReduceOp
from trnc.passes.tile.kernels import boxes, engines
from trnc.passes.tile.kernels.elementwise import Operand, emit_chain, immediate, load_operand
from trnc.passes.tile.kernels.engines import emit
from trnc.passes.tile.kernels.movement import copy_view
from trnc.passes.tile.tiles import HbmView, TileBuilder

MAX_FREE = 4096          # input elements per partition in one box
COMBINE = {ReduceOp.SUM: AluOp.ADD, ReduceOp.MAX: AluOp.MAX, ReduceOp.MIN: AluOp.MIN}


def reduced_axes(node: ir.Node) -> set[int]:
    """The input dims `node` reduces; no axes (None or empty) means all of them, as in torch."""
    rank = len(node.inputs[0].shape)
    axes = node.attrs.get("axes")
    if not axes:
        return set(range(rank))
    return {a % rank for a in ([axes] if isinstance(axes, int) else axes)}


def _input_dim(node: ir.Node, out_dim) -> int | None:
    """The input dim that output dim `out_dim` comes from, or None."""
    if not isinstance(out_dim, int) or isinstance(out_dim, bool):
        return None
    axes = reduced_axes(node)
    kept = list(range(len(node.inputs[0].shape))) if node.attrs.get("keepdim") else \
        [d for d in range(len(node.inputs[0].shape)) if d not in axes]
    return kept[out_dim] if -len(kept) <= out_dim < len(kept) else None


def candidates(kernel: ir.Kernel) -> list[int]:
    """Output dims worth putting on the partitions (kept dims of size > 1), the two largest: the layout pass
    lowers each one to cost it."""
    node = kernel.nodes[0]
    dims = [d for d, size in enumerate(node.shape) if size > 1 and _input_dim(node, d) not in reduced_axes(node)]
    return sorted(dims, key=lambda d: -node.shape[d])[:2]


def _runs(box: boxes.Box, pdim: int, reduced: list[bool]) -> list[tuple[bool, int]]:
    """The free dims of a box's tile as (reduced?, count), neighbours of one kind merged (the tile is dense)."""
    runs: list[tuple[bool, int]] = []
    for d, (_, count) in enumerate(box):
        if d == pdim or count == 1:
            continue
        if runs and runs[-1][0] == reduced[d]:
            runs[-1] = (reduced[d], runs[-1][1] * count)
        else:
            runs.append((reduced[d], count))
    return runs


def _choose(space: boxes.Space, reduced: list[bool], hint: int | None) -> int:
    """The partition dim: a kept dim (the layout's, or the largest), unless putting a reduced dim there is
    cheaper by the estimate of elements each partition works through (plus partition_reduce's cost)."""
    shape = space.shape
    kept = [d for d in range(len(shape)) if not reduced[d]]
    red = [d for d in range(len(shape)) if reduced[d]]
    best_red = max(red, key=lambda d: shape[d])
    if not kept:
        return best_red
    total_kept = math.prod(shape[d] for d in kept)
    total_red = math.prod(shape[d] for d in red)
    pdim = hint if hint in kept else max(kept, key=lambda d: shape[d])
    by_kept = math.ceil(shape[pdim] / boxes.PARTITIONS) * (total_kept // shape[pdim]) * total_red
    by_reduced = math.ceil(total_red / boxes.PARTITIONS) * total_kept + 8 * total_kept + 150
    return best_red if by_reduced < by_kept else pdim


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> None:
    node, epilogue = kernel.nodes[0], kernel.nodes[1:]
    x = views[node.inputs[0]]
    if math.prod(x.shape) == 0:
        raise UnsupportedOpError(f"{node.attrs['op']} over an empty tensor %{node.inputs[0].name} "
                                 f"{list(x.shape)}{node.where()}: trnc does not lower empty reductions")
    axes = reduced_axes(node)
    kept = [d for d in range(len(x.shape)) if d not in axes]
    inside = set(kernel.nodes)
    extra = [i for n in epilogue for i in n.inputs if i not in inside and immediate(i) is None]

    def in_x_space(view: HbmView) -> HbmView:
        """A view of the output's shape seen in x's index space, with stride 0 along the reduced dims."""
        view = view.expand(node.shape)
        strides = iter(view.strides if not node.attrs.get("keepdim") else [view.strides[d] for d in kept])
        return HbmView(view.tensor, view.dtype, x.shape, tuple(0 if d in axes else next(strides)
                                                               for d in range(len(x.shape))), view.offset)
    out_x = in_x_space(out)
    space = boxes.simplify([x, out_x, *(in_x_space(views[i]) for i in extra)])
    reduced = [st == 0 for st in space.views[1].strides]
    if not any(r and size > 1 for r, size in zip(reduced, space.shape)) and not node.attrs.get("abs"):
        copy_view(kb, x, out_x)       # only size-1 dims reduced: a copy (fuse adds no epilogue then)
        return
    hint = _input_dim(node, plan.partition_dim)
    pdim = _choose(space, reduced, space.dim_of(hint) if hint is not None else None)
    if reduced[pdim]:
        # n // 128 rows a partition: the first partition tile is full, so it sets the accumulator's partitions
        regions = boxes.split(space, pdim, space.shape[pdim] // boxes.PARTITIONS) \
            if space.shape[pdim] >= 2 * boxes.PARTITIONS else [space]
        groups = [regions]          # all regions fold into the same outputs
    else:
        regions = boxes.split_rows(space, pdim, MAX_FREE)
        groups = [[r] for r in regions]
    if len(regions[0].shape) > len(space.shape):
        reduced.insert(pdim + 1, reduced[pdim])
    _Reduction(kb, node, groups, pdim, reduced, dict(zip(extra, range(2, 2 + len(extra)))), epilogue).run()


class _Reduction:
    """The boxes of a reduction in order, each loaded (ahead), reduced and folded into the accumulator of its
    kept box; `groups` are lists of regions (boxes.split) whose boxes fold into the same outputs."""

    def __init__(self, kb: TileBuilder, node: ir.Node, groups: list[list[boxes.Space]], pdim: int,
                 reduced: list[bool], extra: dict[ir.Node, int], epilogue: list[ir.Node]):
        self.kb, self.groups, self.pdim, self.reduced = kb, groups, pdim, reduced
        self.node, self.extra, self.epilogue = node, extra, epilogue   # extra: input -> its index in views
        self.op = ReduceOp.from_text(node.attrs["op"])
        self.abs = bool(node.attrs.get("abs"))     # over |x|: the quantize pass's amax
        self.acc = None          # the fp32 accumulator of the kept box being reduced
        main = groups[0][0]
        self.views = main.views
        self.chunks = boxes.plan(main.shape, pdim, boxes.pchunk(main.shape[pdim]), MAX_FREE, self.fits)

    def store_box(self, box: boxes.Box) -> boxes.Box:
        return tuple((start, 1) if self.reduced[d] else (start, count) for d, (start, count) in enumerate(box))

    def fits(self, box: boxes.Box) -> bool:
        x, *outs = self.views
        return boxes.aps_fit([x], self.pdim, box) and boxes.aps_fit(outs, self.pdim, self.store_box(box)) \
            and len(_runs(box, self.pdim, self.reduced)) <= 4

    def items(self):
        """(x view, box, (output-side views, kept box) when the box is the last of its kept box else None)."""
        rank = len(self.chunks)
        order = boxes.partition_first(rank, None if self.reduced[self.pdim] else self.pdim)
        for group in self.groups:
            shape = group[0].shape
            whole = [self.chunks[d] if not self.reduced[d] else shape[d] for d in range(rank)]
            for kept_box in boxes.boxes(shape, whole, order):
                work = []
                for region in group:
                    split = [self.chunks[d] if self.reduced[d] else region.shape[d] for d in range(rank)]
                    for red_box in boxes.boxes(region.shape, split):
                        box = tuple(red_box[d] if self.reduced[d] else kept_box[d] for d in range(rank))
                        work.append((region.views[0], box))
                for k, (x, box) in enumerate(work):
                    yield x, box, (group[0].views[1:], kept_box) if k == len(work) - 1 else None

    def run(self) -> None:
        boxes.pipelined(self.items(), self.load, self.finish)

    def load(self, item):
        x, box, _ = item
        tile = self.kb.sbuf("x", x.dtype, boxes.partitions(box, self.pdim), (boxes.free_size(box, self.pdim),))
        boxes.spread(self.kb, tile, x.box_ap(self.pdim, box))
        if self.abs:
            emit(self.kb, "activation", dst=tile, src=tile, func=ActFunc.ABS)
        return tile

    def finish(self, item, tile) -> None:
        """Reduce the box's free axis and fold it into the accumulator (the first box of a kept box starts
        it); after the last box, store the accumulator."""
        _, box, store = item
        parts = tile.partitions
        runs = _runs(box, self.pdim, self.reduced)
        kept = math.prod(c for r, c in runs if not r)
        axes = sum(1 << j for j, (r, _) in enumerate(runs) if r)
        target = self.kb.sbuf("acc" if self.acc is None else "part", DType.FP32, parts, (kept,))
        if axes:
            emit(self.kb, "tensor_reduce", dst=target, src=tile.reshape(*(c for _, c in runs)), op=self.op,
                 axes=axes)
        elif self.acc is None:
            emit(self.kb, "tensor_copy", dst=target, src=tile)
        else:
            target = tile
        if self.acc is None:
            self.acc = target
        else:
            rows = self.acc.narrow(0, 0, parts)
            emit(self.kb, "tensor_tensor", dst=rows, in0=rows, in1=target, op=COMBINE[self.op])
        if store is not None:
            self.store(self.acc, *store)
            self.acc = None

    def store(self, acc, outs: tuple[HbmView, ...], kept_box: boxes.Box) -> None:
        box = self.store_box(kept_box)
        target = outs[0].box_ap(self.pdim, box)
        if self.reduced[self.pdim]:      # fold the partitions
            total = self.kb.sbuf("total", DType.FP32, 1, (acc.free_size,))
            emit(self.kb, "partition_reduce", dst=total, src=acc, op=self.op)
            acc = total
        if self.epilogue:
            operands = {self.node: Operand(acc, False)}
            operands.update({i: load_operand(self.kb, outs[k - 1], self.pdim, box, f"e_{i.name}")
                             for i, k in self.extra.items()})
            result = self.kb.sbuf("out", outs[0].dtype, acc.partitions, (acc.free_size,))
            emit_chain(self.kb, self.epilogue, operands, result)
            acc = result
        engines.store(self.kb, target, acc, lambda d, t: boxes.spread(self.kb, d, t))
