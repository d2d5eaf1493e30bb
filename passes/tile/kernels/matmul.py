"""The matmul kernel of the tile stage: a (batched) matmul and its elementwise epilogue as tile instructions.

kernel.nodes[0] is the matmul (a [..., M, K] @ b [..., K, N], batch dims broadcast), the rest an
elementwise epilogue evaluated on each PSUM tile as it is evacuated (passes/tile/kernels/elementwise.py).
matmul_plan.py decides the orientation and the blocking; this module emits it. DMA is what limits
transformer-sized GEMMs (a DMA costs ~600 ns plus its bytes at ~23 B/ns on one of 16 queues, neuroncore.md
2.5), so most of this module decides the order and the size of DMAs:

- blocks: the sub-tiles of a resident panel meet each streamed tile in blocks of BLOCK_TILES, k
  outermost: per k-tile, one matmul into each of the block's PSUM banks. The first matmuls need one
  k-tile of each operand rather than all of K of one of them, so both operands stream in k order and
  TensorE starts after the first DMAs; one block's banks are evacuated while the next accumulates.
- loads: an operand region ([K, width]: a streamed tile, or a block of a panel) loads in k order, in
  chunks of k-tiles, one DMA each (the HBM side reads partition k % 128, free dims (k-tile, column)), or
  several when one k-tile is larger than a DMA should be. The kernel knows when TensorE first needs each
  k-tile (its PE time at full rate) and estimates when the queues get to each DMA; `dma_bytes` sizes a
  chunk's DMAs by that slack: up to DMA_MAX when the data is needed long after, DMA_MIN (the throughput)
  when TensorE is waiting for DMA anyway, DMA_FIRST for the kernel's first wave, so TensorE starts early.
  The kernel's first loads (the first streamed tile, the first panel, the first block's epilogue
  inputs) are emitted in the order TensorE and the evacuations need them; later, the next streamed tile
  goes out one step ahead (before the current step's stores take the queues), the next block's epilogue
  inputs one block ahead, and the next panel's loads spread over the current panel's steps. Buffers are
  segments of up to SEGMENT_BYTES (matmul_loads.py), each fresh, so DMA runs ahead of TensorE until SBUF is full.
- evacuation: the epilogue chain (or a copy) from PSUM into one SBUF tile per block in the output dtype,
  the sub-tile a free axis. Epilogue inputs load the same way, one tile per input and block, dims that do
  not change the input loaded once (a per-feature bias is a [P, sub-tiles] tile of per-partition
  columns), and once per panel when they do not change along the streamed side.
- stores: one per block in pieces of whole rows of M. The scheduler orders HBM accesses by their byte
  rows (isa/races.py footprints, along the dim of largest stride): pieces of different rows or column
  blocks are apart and run side by side, with M or N on the partitions, so they can be large
  (STORE_BYTES). Near the end of the kernel pieces shrink to what the queues move before TensorE
  finishes, down to one wave over the queues for the last block, which goes one sub-tile at a time when
  M is on the partitions (store_bytes). An output stored feature-major (lower.py) is whole rows per
  sub-tile, stored in disjoint pieces of partitions.
- kept results: a result the plan keeps on chip for the next kernel (ir.KernelPlan.keep) is
  evacuated straight into one SBUF tile and never stored: [128, N / 128, M] for the next matmul, whose
  operand regions over it take their k-tiles from that tile instead of loading them, or, with M on the
  partitions, [128, M / 128, N] for a row-wise kernel, which reads its row tiles there (TileProgram.kept).
  The plan then has b resident in one panel, so each step completes whole rows (make_plan row_tiles).

An operand the matmul quantizes (attrs quantize: the fp8 matmuls of passes/graph/quantize.py) loads in its own
dtype and one tensor_scalar per chunk writes x * scale in fp8 (rounding as the program does), so the quantization
overlaps TensorE's work on earlier k-tiles; the plan counts that side's loads at their own width.

fp8 operands on a target with double-row matmuls go two whole k-tiles per matmul ([128, 2, X] operands: 256
rows of K at the cost of 128) where both lie side by side in one buffer.

Numerics: each output element is one fp32 accumulation over k = 0..K-1 in order (products exact
for bf16 and fp8, rounded once for fp32), which is what the numpy reference and the JIT compute bit for bit.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Callable

from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa import cost
from trnc.isa.config import DMA_QUEUES, PARTITIONS
from trnc.isa.dtypes import MATMUL_DTYPES, DType
from trnc.passes.tile.kernels import engines
from trnc.passes.tile.kernels.elementwise import Operand, emit_chain, immediate, load_operand
from trnc.passes.tile.kernels.matmul_loads import Later, Panel, Region, blocks, emit_by_use, subtiles
from trnc.passes.tile.kernels.matmul_plan import (BLOCK_TILES, Gemm, Plan, batch_indices, batch_offset,
                                             choose_orientation, dma_nbytes, gemm_of, make_plan, shape_cycles)
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

DMA_FIRST = 32 * 1024     # bytes per DMA of the kernel's first wave (one per queue): TensorE starts after ~2 us
DMA_MIN = 64 * 1024       # bytes per load DMA after that at least: the ~600 ns fixed cost is under a fifth of it
DMA_MAX = 512 * 1024      # bytes per load DMA at most: 23 us on one queue, the fixed cost 3% of it
SLACK_SHARE = 0.5         # a load DMA may take this share of its slack (dma_bytes) on one queue
LOOKAHEAD = 8e-6          # seconds of TensorE work the streamed fallback loads ahead of its matmuls
STORE_BYTES = 128 * 1024  # bytes per store DMA
TAIL_BYTES = 8 * 1024     # bytes per store DMA at least

Cols = tuple[int, int]    # (start, count) along M or N


def candidates(kernel: ir.Kernel) -> list[str]:
    """The output dim the PSUM partitions may hold: M ("m") or N ("n"), the likely better first (the layout
    pass keeps the first of equal estimates): fewer TensorE cycles, then more epilogue inputs that are
    per-partition operands of the evacuation (a per-feature bias with N on the partitions) rather than
    full tiles, which cost a second pass on VectorE and 128 times their bytes in DMA."""
    mm = kernel.nodes[0]
    (m, n), k = mm.shape[-2:], mm.inputs[0].shape[-1]
    inside = set(kernel.nodes)
    ext = {i for node in kernel.nodes[1:] for i in node.inputs if i not in inside and immediate(i) is None}

    def constant_along(i: ir.Node, dim: int) -> bool:
        return len(i.shape) < -dim or i.shape[dim] == 1

    def rank(orientation: str):
        other = -2 if orientation == "n" else -1       # the output dim off the partitions
        return (shape_cycles(mm.shape[:-2], m, n, k, orientation), -sum(constant_along(i, other) for i in ext))
    return sorted(["m", "n"], key=rank)


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          kernel_plan: ir.KernelPlan) -> Tile | None:
    """Emit the kernel: operands read through `views`, the epilogue's result written to `out`; returns the SBUF
    tile that holds the result instead when the plan keeps it there and the blocking allows it."""
    mm = kernel.nodes[0]
    dtype = kernel.compute_dtype or mm.inputs[0].dtype
    if dtype not in MATMUL_DTYPES:
        raise UnsupportedOpError(f"matmul %{mm.name} with operands in {dtype.text}: TensorE takes "
                                 f"{', '.join(sorted(d.text for d in MATMUL_DTYPES))}; cast the operands to "
                                 f"one of them{mm.where()}")
    gemm = gemm_of(kernel, views, out)
    orientation = kernel_plan.partition_dim or choose_orientation(gemm)
    if orientation not in ("m", "n"):
        raise UnsupportedOpError(f"matmul %{mm.name}: partition_dim {orientation!r} is not 'm' or 'n'{mm.where()}")
    on_chip = {**kb.program.kept, **kb.program.transposed}
    kept = sum(on_chip[v.tensor].buffer.nbytes for v in (gemm.a, gemm.b) if v.tensor in on_chip)
    if kernel_plan.keep:
        kept += gemm.n * gemm.m // PARTITIONS * gemm.out.dtype.itemsize
    quantize = mm.attrs.get("quantize")
    side = "ab"[quantize["operand"]] if quantize is not None else None
    load_bytes = {side: gemm.kx(side).dtype.itemsize} if side else None
    plan = make_plan(gemm, orientation, dtype.itemsize, kb.hw, kernel_plan.row_tiles, kept, load_bytes)
    emitter = _Emitter(kb, kernel, gemm, plan, dtype, kernel_plan.keep)
    if side:
        emitter.quantize_on_load(side, quantize["scale"] if len(mm.inputs) == 2 else views[mm.inputs[2]])
    emitter.run()
    return emitter.kept


class _Emitter:
    """The instructions of one planned GEMM: loads, matmuls, evacuations (with the epilogue) and stores."""

    def __init__(self, kb: TileBuilder, kernel: ir.Kernel, gemm: Gemm, plan: Plan, dtype: DType, keep: bool):
        self.kb, self.gemm, self.plan, self.dtype = kb, gemm, plan, dtype
        self.mm, self.epilogue = kernel.nodes[0], kernel.nodes[1:]
        self.nb = nb = len(gemm.batch)
        self.k_tiles = math.ceil(gemm.k / PARTITIONS)
        self.kx = {side: gemm.kx(side) for side in ("a", "b")}                          # [*batch, K, X]
        self.split = {s: _split(v, nb, PARTITIONS) for s, v in self.kx.items()}         # [*batch, KT, 128, X]
        self.load_itemsize = {s: cost.dma_nbytes(1, v.dtype, dtype) for s, v in self.kx.items()}
        self.names = itertools.count()
        self.pdim = nb if plan.orientation == "m" else nb + 1    # the output dim on the partitions
        self.clocks = cost.QueueClocks(kb.hw)     # TensorE and the DMA queues after what is emitted so far
        # fp8 operands on a target with double-row matmuls: two whole k-tiles per matmul, twice the rate
        self.double_row = dtype.is_fp8 and kb.hw.fp8_double_row
        # the resident side's sub-tiles lie along the free axis of the output tiles (the moving side) or on
        # their partitions; a block's tile is [P, sub-tile, W] either way, and M is its axis m_axis
        self.along_v = plan.resident == ("b" if plan.orientation == "m" else "a")
        # N on the partitions and outermost in HBM (lower.py's feature-major storage): stores are whole rows
        self.rows_out = plan.orientation == "n" and gemm.out.strides[-1] > gemm.out.strides[-2]
        self.m_axis = {("m", True): 0, ("m", False): 1, ("n", True): 1, ("n", False): 2}[plan.orientation, self.along_v]
        # epilogue inputs the same for every streamed tile of a panel: constant along the streamed side's
        # output dim (M for a, N for b) and the batch dims
        t_dim = nb if plan.streamed == "a" else nb + 1
        self.panel_scope = {i for i, v in gemm.epilogue.items() if not any(v.strides[:nb]) and not v.strides[t_dim]}
        # epilogue inputs to load; a constant of one value is an immediate of the chain instead
        self.loads = {i: v for i, v in gemm.epilogue.items() if immediate(i) is None}
        self.operands: dict[tuple, list[Operand]] = {}
        self.kept = self.keep_on_chip() if keep else None
        self.quantized: str | None = None       # the side quantize_on_load set, and its scale
        self.scale: float | Tile | None = None

    def quantize_on_load(self, side: str, scale: float | HbmView) -> None:
        """Operand `side` (fp32 or bf16 in HBM) enters TensorE as fp8(x * scale): each chunk loads as it is and
        one tensor_scalar writes it in the compute dtype (the fp8 matmul of passes/graph/quantize.py). A
        run-time scale (a 0-d tensor) loads once, onto every partition, as the instruction's per-partition
        scalar."""
        self.quantized = side
        self.load_itemsize[side] = self.kx[side].dtype.itemsize
        if isinstance(scale, HbmView):
            column = self.kb.sbuf(self.name("scale"), scale.dtype, PARTITIONS, (1,))
            self.kb.dma(column, scale.expand((PARTITIONS, 1)).box_ap(0, ((0, PARTITIONS), (0, 1))))
            scale = column
        self.scale = scale

    def keep_on_chip(self) -> Tile | None:
        """The SBUF tile the result stays in for the next kernel, when every output tile lies within one
        128-row block of it; lower.py registers it in the program's `kept`, so the consumer reads it there.
        With N on the partitions (the next matmul's contraction operand) it is [128, N / 128, M], the
        feature-major result; with M on the partitions (a row-wise kernel's rows)
        [128, M / 128, N]. Either way row r of the stored [R, C] tensor is on partition r % 128, block r // 128."""
        gemm, plan = self.gemm, self.plan
        if math.prod(gemm.batch) != 1:
            return None
        if plan.orientation == "n":
            if plan.n_tile != PARTITIONS or not self.rows_out or gemm.n % PARTITIONS or \
                    any(n0 % PARTITIONS for n0, _ in self.n_ranges()):
                return None
            rows, cols = gemm.n, gemm.m
        else:
            if plan.m_tile != PARTITIONS or gemm.m % PARTITIONS or gemm.out.strides[-1] != 1 or \
                    gemm.out.strides[-2] != gemm.n or gemm.out.offset:
                return None
            rows, cols = gemm.m, gemm.n
        return self.kb.sbuf("kept", gemm.out.dtype, PARTITIONS, (rows // PARTITIONS, cols))

    def n_ranges(self) -> list[Cols]:
        """Where the output tiles' N columns start and how many: panels and sub-tiles, or plain tiles."""
        plan = self.plan
        if plan.resident != "b":
            return subtiles(0, self.gemm.n, plan.n_tile)
        return [c for x0, width in plan.panels(self.gemm.n, True) for c in subtiles(x0, width, plan.n_tile)]

    def kept_tile(self, m_cols: Cols, n_cols: Cols) -> Tile:
        """The part of the kept SBUF tile that holds the output box (m_cols, n_cols), as the output tile."""
        (r0, r_width), (c0, c_width) = (n_cols, m_cols) if self.plan.orientation == "n" else (m_cols, n_cols)
        return self.kept.narrow(0, r0 % PARTITIONS, r_width).select(1, r0 // PARTITIONS).narrow(1, c0, c_width)

    def name(self, what: str) -> str:
        return f"{what}{next(self.names)}"

    def dma_bytes(self, use: float, nbytes: int) -> int:
        """Bytes per DMA of a load of `nbytes` first needed at PE time `use`: on one queue, SLACK_SHARE of its
        slack (the time left once the queues have moved it and every DMA before it), within [DMA_MIN,
        DMA_MAX]; when TensorE waits for the DMAs anyway (no slack), DMA_MIN, for the throughput. The
        kernel's first wave of DMAs is smaller, so TensorE starts early."""
        slack = self.clocks.slack(use, nbytes)
        low = DMA_FIRST if self.clocks.dmas < DMA_QUEUES else DMA_MIN
        return int(min(DMA_MAX, max(low, SLACK_SHARE * slack * cost.dma_rate(self.kb.hw))))

    def dma(self, dst, src, size: int) -> None:
        """kb.dma_split in pieces of about `size` bytes, counted on the kernel's clocks."""
        start = len(self.kb.program.instrs)
        self.kb.dma_split(dst, src, size)
        self.clocks.add_dmas(dma_nbytes(dst, src), len(self.kb.program.instrs) - start)

    def matmul_seconds(self, partitions: int, width: int) -> float:
        """TensorE time of one matmul into an output tile [partitions, width]."""
        return cost.matmul_seconds(partitions, width, self.dtype is DType.FP32, self.kb.hw)

    def pe_seconds(self, partitions: int, width: int) -> float:
        """TensorE time per k-tile into an output tile [partitions, width]: half a matmul's with double-row
        matmuls, which take two k-tiles each."""
        return self.matmul_seconds(partitions, width) / (2 if self.double_row else 1)

    def run(self) -> None:
        if self.plan.resident:
            self.run_resident()
        else:
            self.run_streamed()

    def run_resident(self) -> None:
        """Panels of the resident side; per panel, every tile of the streamed side meets every block."""
        plan, r_side, t_side = self.plan, self.plan.resident, self.plan.streamed
        r_total, t_total = (self.gemm.n, self.gemm.m) if r_side == "b" else (self.gemm.m, self.gemm.n)
        t_tile = plan.tile(t_side)
        groups: dict[int, list[tuple[int, ...]]] = {}
        for index in batch_indices(self.gemm.batch):
            groups.setdefault(batch_offset(self.kx[r_side], index), []).append(index)
        jobs = [(group, x0, width) for g, group in enumerate(groups.values())
                for x0, width in plan.panels(r_total, g == 0)]
        self.steps = [(j, index, (t0, min(t_tile, t_total - t0))) for j, (group, _, _) in enumerate(jobs)
                      for index in group for t0 in range(0, t_total, t_tile)]
        self.subtiles_of = [subtiles(x0, width, plan.tile(r_side)) for _, x0, width in jobs]
        self.uses = self.step_uses()
        self.pe_total = self.uses[-1][-1][0] + self.uses[-1][-1][1] * self.k_tiles
        first: dict[int, int] = {}
        for i, (j, _, _) in enumerate(self.steps):
            first.setdefault(j, i)
        left = Counter(j for j, _, _ in self.steps)      # steps left per job, to spread the next panel's loads
        panels = {0: Panel(self, jobs[0], self.uses[0])}
        streamed = {0: self.streamed_region(0)}
        for i, (j, index, t_cols) in enumerate(self.steps):
            panel = panels[j]
            loads = [streamed[0], *self.epilogue_loads(0, 0)] if i == 0 else []
            if i == first[j]:                        # a new job: its successor starts loading
                panels.pop(j - 1, None)
                self.forget(-j)                      # the previous job's shared epilogue operands
                loads += panel.regions
                if j + 1 < len(jobs):
                    panels[j + 1] = Panel(self, jobs[j + 1], self.uses[first[j + 1]])
            if i + 1 < len(self.steps):
                streamed[i + 1] = self.streamed_region(i + 1)
                loads.append(streamed[i + 1])
            emit_by_use(loads)
            if j + 1 in panels:
                successor = panels[j + 1]
                successor.advance(successor.emitted + math.ceil((successor.nbytes - successor.emitted) / left[j]))
            left[j] -= 1
            for b, blk in enumerate(panel.blocks):
                ahead = (i, b + 1) if b + 1 < len(panel.blocks) else (i + 1, 0)
                if self.loads and ahead[0] < len(self.steps):    # the next block's epilogue operands load now
                    self.block_operands(*ahead)
                # the kernel's last block goes one sub-tile at a time: the tail after the last matmul is then the
                # evacuation and store of one sub-tile
                last = i + 1 == len(self.steps) and b + 1 == len(panel.blocks)
                for part in [[r] for r in blk] if last and self.plan.orientation == "m" else [blk]:
                    self.block(i, b, part, panel, streamed[i])
            streamed.pop(i)
            self.forget(i)

    def forget(self, scope: int) -> None:
        """Drop the epilogue operands of step `scope` (or of job -1 - scope when negative)."""
        for key in [k for k in self.operands if k[1] == scope]:
            self.operands.pop(key)

    def step_uses(self) -> list[list[tuple[float, float]]]:
        """Per step, per block: (PE time of the block's first matmul, PE time per k-tile of the block)."""
        uses, t = [], 0.0
        for j, _, (_, t_width) in self.steps:
            subtiles = self.subtiles_of[j]
            row = []
            for blk in blocks(len(subtiles)):
                per_kt = sum(self.pe_seconds(*self.tile_shape(t_width, subtiles[r][1])) for r in blk)
                row.append((t, per_kt))
                t += per_kt * self.k_tiles
            uses.append(row)
        return uses

    def tile_shape(self, t_width: int, r_width: int) -> tuple[int, int]:
        """[partitions, free] of the output tile of a streamed tile and a resident sub-tile of those widths."""
        return (t_width, r_width) if self.along_v else (r_width, t_width)

    def streamed_region(self, i: int) -> Region:
        _, index, t_cols = self.steps[i]
        return Region(self, self.plan.streamed, index, t_cols, self.uses[i][0])

    def epilogue_loads(self, i: int, b: int) -> list[Later]:
        """The epilogue operand loads of block b of step i for `emit_by_use`, due at its evacuation less their
        transfer time."""
        if not self.loads:
            return []
        (_, _, (_, t_width)), (t0, per_kt) = self.steps[i], self.uses[i][b]
        rate = cost.dma_rate(self.kb.hw, DMA_QUEUES)
        full = [v.dtype.itemsize for v in self.loads.values() if self.block_view(v).strides[self.nb + 2]]
        seconds = sum(full) * t_width * self.plan.tile(self.plan.resident) * BLOCK_TILES / rate
        return [Later(t0 + per_kt * self.k_tiles - seconds, lambda: self.block_operands(i, b))]

    def block(self, i: int, b: int, part: list[int], panel: Panel, streamed: Region) -> None:
        """Sub-tiles `part` of block b of step i against the streamed tile, k outermost, then evacuated and
        stored."""
        _, index, t_cols = self.steps[i]
        subtiles = [panel.subtiles[r] for r in part]
        tile = self.plan.tile(self.plan.resident)
        full = sum(1 for _, w in subtiles if w == tile)
        dsts, stores = [], []
        if self.kept is not None:   # evacuated straight into the kept tile, never stored
            dsts, full, subtiles = [self.kept_tile(*self.mn_cols(t_cols, cols)) for cols in subtiles], 0, []
        if full:
            box = self.block_box(index, t_cols, subtiles[0][0] // tile, full)
            out = self.kb.sbuf(self.name("out"), self.gemm.out.dtype, box[self.nb][1], (full, box[self.nb + 2][1]))
            dsts += [out.select(1, r) for r in range(full)]
            stores.append((out, self.block_view(self.gemm.out), self.nb, box, self.nb + self.m_axis, self.m_axis))
        for cols in subtiles[full:]:
            m_cols, n_cols = self.mn_cols(t_cols, cols)
            out = self.kb.sbuf(self.name("out"), self.gemm.out.dtype, *self.out_shape(m_cols, n_cols))
            dsts.append(out)
            stores.append(self.plain_store(out, index, m_cols, n_cols))
        t_part = (streamed, 0, t_cols[1])
        pairs = [(t_part, panel.operand(b, r)) if self.plan.resident == "b" else (panel.operand(b, r), t_part)
                 for r in part]
        first = panel.blocks[b][0]
        self.accumulate(pairs, dsts, lambda: [self.block_operands(i, b)[r - first] if self.loads else {} for r in part])
        for store in stores:
            self.store(*store, self.store_bytes(store[0]))

    def accumulate(self, pairs, dsts: list[Tile], operands: Callable[[], list[dict]]) -> None:
        """One accumulation group per output tile (its own PSUM bank), all of them k-tile by k-tile; then each
        evacuated through the epilogue into its `dsts` tile. `pairs` holds each tile's (a, b) operands as
        (region, column offset, width)."""
        psums = [self.kb.psum(self.name("acc"), dst.partitions, (dst.free_size,)) for dst in dsts]
        regions = {id(part[0]): part[0] for pair in pairs for part in pair}.values()
        sides = [(a, b) if self.plan.orientation == "m" else (b, a) for a, b in pairs]   # (stationary, moving)
        kt = 0
        while kt < self.k_tiles:
            for region in regions:
                region.fill(self.clocks.pe_seconds + LOOKAHEAD)
            doubles = [(s[0].pair(kt, *s[1:]), v[0].pair(kt, *v[1:])) for s, v in sides] if self.double_row else []
            double = bool(doubles) and all(None not in d for d in doubles)   # fp8: two k-tiles per matmul
            for (s, v), psum, pair in zip(sides, psums, doubles if double else sides):
                if double:
                    self.kb.emit("matmul", dst=psum, stationary=pair[0], moving=pair[1], accumulate=kt > 0,
                                 double_row=True)
                else:
                    self.kb.emit("matmul", dst=psum, stationary=s[0].at(kt, *s[1:]), moving=v[0].at(kt, *v[1:]),
                                 accumulate=kt > 0)
                self.clocks.add_pe(self.matmul_seconds(psum.partitions, psum.free_size))
            kt += 2 if double else 1
        for psum, dst, ops in zip(psums, dsts, operands()):
            if not self.epilogue:
                engines.write(self.kb, dst, psum)
            else:
                emit_chain(self.kb, self.epilogue, {self.mm: Operand(psum, False), **ops}, dst)

    def run_streamed(self) -> None:
        """The fallback for a K too large for a resident panel: both sides per output tile, their k chunks
        loaded LOOKAHEAD ahead of the matmuls. M is the inner loop, so consecutive stores write disjoint rows."""
        plan, gemm = self.plan, self.gemm
        tiles = [(index, (m0, min(plan.m_tile, gemm.m - m0)), (n0, min(plan.n_tile, gemm.n - n0)))
                 for index in batch_indices(gemm.batch) for n0 in range(0, gemm.n, plan.n_tile)
                 for m0 in range(0, gemm.m, plan.m_tile)]
        shapes = [self.out_shape(m_cols, n_cols) for _, m_cols, n_cols in tiles]
        per_kt = [self.pe_seconds(p, w) for p, (w,) in shapes]
        self.pe_total = self.k_tiles * sum(per_kt)
        for (index, m_cols, n_cols), seconds in zip(tiles, per_kt):
            out = self.kb.sbuf(self.name("out"), gemm.out.dtype, *self.out_shape(m_cols, n_cols)) \
                if self.kept is None else self.kept_tile(m_cols, n_cols)
            use = (self.clocks.pe_seconds, seconds)
            a, b = Region(self, "a", index, m_cols, use, False), Region(self, "b", index, n_cols, use, False)
            box = (*((i, 1) for i in index), m_cols, n_cols)
            self.accumulate([((a, 0, m_cols[1]), (b, 0, n_cols[1]))], [out], lambda: [
                {node: load_operand(self.kb, view, self.pdim, box, self.name(f"e{node.name}_"))
                 for node, view in self.loads.items()}])
            if self.kept is None:
                self.store(*self.plain_store(out, index, m_cols, n_cols), self.store_bytes(out))

    def mn_cols(self, t_cols: Cols, r_cols: Cols) -> tuple[Cols, Cols]:
        return (t_cols, r_cols) if self.plan.resident == "b" else (r_cols, t_cols)

    def out_shape(self, m_cols: Cols, n_cols: Cols) -> tuple[int, tuple[int]]:
        """(partitions, free shape) of the output tile of the box (m_cols, n_cols)."""
        p, w = (m_cols[1], n_cols[1]) if self.plan.orientation == "m" else (n_cols[1], m_cols[1])
        return p, (w,)

    def plain_store(self, tile: Tile, index, m_cols: Cols, n_cols: Cols):
        """store() arguments of one output tile written to the output as it is."""
        box = (*((i, 1) for i in index), m_cols, n_cols)
        return tile, self.gemm.out, self.pdim, box, self.nb, 0 if self.plan.orientation == "m" else 1

    def block_view(self, view: HbmView) -> HbmView:
        """An output-shaped view as [*batch, P, B, W], the axes of a block's tile: its partitions, its
        sub-tile (one per resident sub-tile, tile columns apart) and its free axis."""
        nb, tile = self.nb, self.plan.tile(self.plan.resident)
        sv = view if self.plan.orientation == "m" else view.permute((*range(nb), nb + 1, nb))
        if self.along_v:
            return _split(sv, nb + 1, tile)
        return _split(sv, nb, tile).permute((*range(nb), nb + 1, nb, nb + 2))

    def block_box(self, index, t_cols: Cols, q0: int, count: int) -> tuple[Cols, ...]:
        """The box of block_view covering `count` full sub-tiles from sub-tile q0 against streamed t_cols."""
        batch, tile = tuple((i, 1) for i in index), self.plan.tile(self.plan.resident)
        return (*batch, t_cols, (q0, count), (0, tile)) if self.along_v else (*batch, (0, tile), (q0, count), t_cols)

    def block_operands(self, i: int, b: int) -> list[dict[ir.Node, Operand]]:
        """The epilogue operands of block b of step i, one dict per sub-tile, loaded on the first call: one
        tile per input for the block's full sub-tiles (dims that do not change the input are loaded once),
        its own tile for a narrower last sub-tile. Inputs in panel_scope are shared by the job's steps."""
        j, index, t_cols = self.steps[i]
        (t0, per_kt), nb, tile = self.uses[i][b], self.nb, self.plan.tile(self.plan.resident)
        subtiles = self.subtiles_of[j][b * BLOCK_TILES:(b + 1) * BLOCK_TILES]
        full = sum(1 for _, w in subtiles if w == tile)
        result: list[dict[ir.Node, Operand]] = [{} for _ in subtiles]
        for node, view in self.loads.items():
            key = (node, i, b) if node not in self.panel_scope else (node, -1 - j, b, t_cols[1])
            if key not in self.operands:
                ops = []
                if full:
                    bview = self.block_view(view)
                    box = self.block_box(index, t_cols, subtiles[0][0] // tile, full)
                    once = [bview.strides[d] == 0 for d in range(nb + 3)]
                    box = tuple((s, 1) if d > nb and once[d] else (s, c) for d, (s, c) in enumerate(box))
                    ap = bview.box_ap(nb, box)
                    loaded = self.kb.sbuf(self.name(f"e{node.name}_"), view.dtype, ap.partitions,
                                          (box[nb + 1][1], box[nb + 2][1]))
                    self.dma(loaded, ap, self.dma_bytes(t0 + per_kt * self.k_tiles, dma_nbytes(loaded, ap)))
                    ops += [Operand(loaded.select(1, 0 if once[nb + 1] else r), once[nb + 2]) for r in range(full)]
                for cols in subtiles[full:]:
                    m_cols, n_cols = self.mn_cols(t_cols, cols)
                    ops.append(load_operand(self.kb, view, self.pdim, (*((x, 1) for x in index), m_cols, n_cols),
                                            self.name(f"e{node.name}_")))
                self.operands[key] = ops
            for r, op in enumerate(self.operands[key]):
                result[r][node] = op
        return result

    def store_bytes(self, tile: Tile) -> int:
        """Bytes per store DMA of `tile`, stored at the PE clock: STORE_BYTES, or at most
        SLACK_SHARE of the TensorE time left in the kernel on one queue (a store must not outlast the kernel
        by much), at least one wave over the queues."""
        total = tile.partitions * tile.free_size * tile.dtype.itemsize
        size = min(STORE_BYTES, SLACK_SHARE * (self.pe_total - self.clocks.pe_seconds) * cost.dma_rate(self.kb.hw))
        return int(max(size, TAIL_BYTES, total / DMA_QUEUES))

    def store(self, tile: Tile, view: HbmView, pdim: int, box, m_dim: int, m_axis: int, size: int) -> None:
        """DMA `tile` to the box of `view` in pieces of about `size` bytes, each whole rows of M (view dim
        `m_dim`, tile axis `m_axis`); with M on the partitions, pieces split further by partitions."""
        if self.rows_out:   # each sub-tile is whole rows of the output: split by partitions, disjoint pieces
            sub = len(box) - 2                    # a block's tile is [P, sub-tile, W]; a plain one [P, W]
            for r in range(box[sub][1]) if len(tile.dims) > 1 else [None]:
                part = box if r is None else (*box[:sub], (box[sub][0] + r, 1), *box[sub + 1:])
                self.dma(view.box_ap(pdim, part), tile if r is None else tile.select(1, r), size)
            return
        start, count = box[m_dim]
        step = max(1, size // (tile.partitions * tile.free_size * tile.dtype.itemsize // count))
        split = size if self.plan.orientation == "m" else 1 << 62
        for i in range(0, count, step):
            rows = min(step, count - i)
            part = (*box[:m_dim], (start + i, rows), *box[m_dim + 1:])
            self.dma(view.box_ap(pdim, part), tile.narrow(m_axis, i, rows), split)


def _split(view: HbmView, dim: int, inner: int) -> HbmView:
    """`view` with dim `dim` (size n) as (n // inner, inner); elements past the last whole group are left out."""
    shape = (*view.shape[:dim], view.shape[dim] // inner, inner, *view.shape[dim + 1:])
    strides = (*view.strides[:dim], view.strides[dim] * inner, view.strides[dim], *view.strides[dim + 1:])
    return HbmView(view.tensor, view.dtype, shape, strides, view.offset)
