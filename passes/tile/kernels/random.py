"""Random kernels (tile stage): a `random` node's uniform draws in (0, 1), 128 rows at a time, written to HBM.

Element i of the node (its row-major index) is the draw of counter i in the node's stream under the run's
seed (the `random` opcode), so the values do not depend on how the kernel is tiled, and the IR interpreter
(trnc/interpret.py) computes the same bits. The node's elements are laid out as rows of ROW counters: a tile
holds up to 128 rows, one `random` instruction fills it (counter = first + p * ROW + j) and one DMA stores
it. The seed is the program's SEED tensor, which each kernel loads into SBUF once.
"""
from __future__ import annotations

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.isa.program import TensorKind
from trnc.passes.tile.kernels import engines
from trnc.passes.tile.kernels.movement import copy_view
from trnc.passes.tile.tiles import PARTITIONS, HbmView, TileBuilder

ROW = 2048   # counters per partition of a tile: 8 KiB of fp32, long enough to hide GpSimdE's fixed cost
INT32_COUNTERS = 2 ** 31   # counters are int32: a node of more elements would repeat draws


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> None:
    node = kernel.output
    n = node.numel
    if n == 0:
        return
    if n >= INT32_COUNTERS:
        raise ValueError(f"random node %{node.name} of {n} elements: counters are int32")
    flat = out.reshape((n,))
    target = flat if flat is not None else kb.tensor(f"t_{node.name}_r", TensorKind.SCRATCH, out.dtype, (n,))
    seed = kb.sbuf("seed", DType.INT32, 1, (1,))
    kb.dma(seed, kb.seed_tensor().reshape((1, 1)).box_ap(0, ((0, 1), (0, 1))))
    row = min(ROW, n)
    rows, rest = divmod(n, row)
    for r0 in range(0, rows, PARTITIONS):
        parts = min(PARTITIONS, rows - r0)
        _draw(kb, node, seed, target.narrow(0, r0 * row, (r0 + parts) * row).reshape((parts, row)), r0 * row, row)
    if rest:
        _draw(kb, node, seed, target.narrow(0, rows * row, n).reshape((1, rest)), rows * row, rest)
    if flat is None:
        copy_view(kb, target.reshape(node.shape), out)


def _draw(kb: TileBuilder, node: ir.Node, seed, dst: HbmView, first: int, row: int) -> None:
    """Counters first + p * row + j of dst [P, row] drawn into a tile and stored."""
    parts = dst.shape[0]
    tile = kb.sbuf(f"u{first}", DType.FP32, parts, (row,))
    kb.emit("random", dst=tile, seed=seed, stream=node.attrs["stream"], base=first, partition_step=row,
            steps=(1, 0, 0, 0))
    engines.store(kb, dst.box_ap(0, ((0, parts), (0, row))), tile)
