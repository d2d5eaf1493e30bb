"""The plan of a matmul kernel: its operands as [batch..., K, X] views, the orientation, and the blocking.

Part of the tile stage (passes/tile/kernels/matmul.py emits the instructions this plan describes). The
machine computes psum[s, v] (+)= stationary[k, s]^T @ moving[k, v] with the contraction K on the
partitions of both inputs, so both operands are read as [K, X] boxes: a as a^T ([K, M]) and b as is
([K, N]). Orientation "m" makes a^T the stationary side S (M on the PSUM partitions) and b the
moving side V; "n" swaps them (N on the partitions, the output stored transposed).

Blocking (why): a full-rate instruction (K = 128, S width 128, V width >= 64) needs 32 KiB of S
and 32-128 KiB of V, while the 16 DMA queues move about 80 KiB in the 213 ns it takes, so each
byte loaded must feed several instructions. One operand, the resident side, is kept in SBUF in
panels of `panel` columns over the whole of K; the other goes by in tiles ([K, t columns], the
streamed side), each meeting every column of the panel, so the resident side is read once and the
streamed side once per panel. With more than one panel (or one per batch group), two are live at
a time, so the next one loads while the current one computes. make_plan scores each choice of
resident side and moving width by its modeled time; on ties b is resident (a^T then goes by down
M, and consecutive stores cover disjoint rows of the output, see matmul.py). When K is so large
that even two one-tile panels do not fit, the plan falls back to streaming both operands in k
chunks per output tile (correct for any K, DMA bound).

SBUF: the panels and the stream share what SBUF_RESERVE (output tiles, epilogue temporaries) and the
epilogue inputs (_epilogue_bytes) leave, less a margin (SBUF_SHARE): allocate packs buffers of
several sizes by liveness, and the gaps between them are not all usable.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from trnc import ir
from trnc.isa import cost
from trnc.isa.config import DMA_QUEUES, MOVING_FMAX, PARTITIONS, PE_COLUMNS, HwConfig
from trnc.passes.tile.tiles import HbmView

STREAM_DEPTH = 4             # streamed tiles in SBUF at once: one computing, the rest loading ahead
MOVING_WIDTHS = (512, 256, 128)  # moving tile widths to try, widest (fewest instructions) first
DMA_SHARE = 0.5              # a plan is good when its loads need at most this share of the TensorE time
SBUF_RESERVE = 32 * 1024     # bytes per partition kept for output and epilogue tiles
SBUF_SHARE = 0.95            # of the rest, the share operands may plan on: allocation leaves gaps
BLOCK_TILES = 4              # output tiles accumulated together (k outermost): half the 8 PSUM banks


@dataclass(frozen=True)
class Gemm:
    """out[*batch, M, N] = a[*batch, M, K] @ b[*batch, K, N] with every view expanded to the full batch.

    `epilogue` holds the epilogue's external inputs as views expanded to out.shape, so a box of the
    output is also a box of each of them.
    """

    a: HbmView
    b: HbmView
    out: HbmView
    epilogue: dict[ir.Node, HbmView]

    @property
    def batch(self) -> tuple[int, ...]:
        return self.out.shape[:-2]

    @property
    def m(self) -> int:
        return self.out.shape[-2]

    @property
    def n(self) -> int:
        return self.out.shape[-1]

    @property
    def k(self) -> int:
        return self.a.shape[-1]

    def kx(self, side: str) -> HbmView:
        """Operand `side` ("a" or "b") as [*batch, K, X]: a^T or b."""
        if side == "b":
            return self.b
        nb = len(self.batch)
        return self.a.permute((*range(nb), nb + 1, nb))


TINY_MATRIX = 8   # M, K and N at most this: a matmul instruction would use at most 8 of the PE's 128 x 128 cells


def on_vector_engines(batch: int, m: int, k: int, n: int) -> bool:
    """Whether a matmul of `batch` tiny matrices is better computed on the vector engines, as a sum of K outer
    products (legalize builds it so). This kernel lowers each batch index on its own: a few DMAs of ~600 ns
    fixed cost and a matmul of at least 64 cycles each, five instructions per index (128 x 513 products of
    [1, 1] matrices compiled to 328k instructions). The vector form is one elementwise kernel of 2K - 1 ops
    that puts the batch on the partitions, 128 indices per instruction."""
    return batch >= PARTITIONS and max(m, k, n) <= TINY_MATRIX


def gemm_of(kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView) -> Gemm:
    """The kernel's GEMM with batch dims expanded, folded into M when b is the same for every batch
    (a linear layer over [batch, tokens, features]) and every view allows it: one [B*M, K] operand
    feeds full 128-row tiles where per-batch tiles would be short."""
    mm = kernel.nodes[0]
    a_node, b_node = mm.inputs[:2]     # a third input is the scale of a quantized operand (matmul.py)
    batch, (m, n), k = mm.shape[:-2], mm.shape[-2:], a_node.shape[-1]
    a = views[a_node].expand((*batch, m, k))
    b = views[b_node].expand((*batch, k, n))
    inside = set(kernel.nodes)
    ext = {i: views[i].expand(mm.shape) for node in kernel.nodes[1:] for i in node.inputs if i not in inside}
    gemm = Gemm(a, b, out, ext)
    if len(batch) == 0 or any(s != 0 for s in b.strides[:-2]):
        return gemm
    rows = math.prod(batch) * m
    a2 = a.reshape((rows, k))
    out2 = out.reshape((rows, n))
    ext2 = {i: v.reshape((rows, n)) for i, v in ext.items()}
    if a2 is None or out2 is None or any(v is None for v in ext2.values()):
        return gemm
    b2 = replace(b, shape=b.shape[-2:], strides=b.strides[-2:])
    return Gemm(a2, b2, out2, ext2)


def pe_cycles(gemm: Gemm, orientation: str, fp32: bool = False) -> int:
    """TensorE cycles of the plain tiling in `orientation` (isa/cost.py gemm_cycles)."""
    return shape_cycles(gemm.batch, gemm.m, gemm.n, gemm.k, orientation, fp32)


def shape_cycles(batch: tuple[int, ...], m: int, n: int, k: int, orientation: str, fp32: bool = False) -> int:
    """pe_cycles of a GEMM given by its sizes."""
    xs, xv = (m, n) if orientation == "m" else (n, m)
    return math.prod(batch) * cost.gemm_cycles(xs, xv, k, fp32)


def choose_orientation(gemm: Gemm) -> str:
    """The orientation with fewer TensorE cycles; "m" on a tie (its output store is contiguous)."""
    return min(("m", "n"), key=lambda o: pe_cycles(gemm, o))


@dataclass(frozen=True)
class Plan:
    """How to tile one GEMM. m_tile/n_tile: M and N columns per matmul (the stationary or moving
    width by the orientation); resident: "a" or "b", the side kept in panels of `panel` columns
    ("" for the streamed fallback); ramp: the first panel is one tile wide, so TensorE starts after
    a small load instead of a whole panel."""

    orientation: str
    m_tile: int
    n_tile: int
    resident: str
    panel: int
    ramp: bool = False
    row_tiles: bool = False

    @property
    def streamed(self) -> str:
        """The side that goes by in tiles (the other side of the resident one)."""
        return "a" if self.resident == "b" else "b"

    def tile(self, side: str) -> int:
        return self.m_tile if side == "a" else self.n_tile

    def panels(self, total: int, first: bool) -> list[tuple[int, int]]:
        """(start, width) of the panels over the resident side's `total` columns; `first`: the first batch group."""
        tile = self.tile(self.resident)
        ranges = [(0, tile)] if self.ramp and first and total > tile else []
        x = sum(w for _, w in ranges)
        while x < total:
            ranges.append((x, min(self.panel, total - x)))
            x += ranges[-1][1]
        return ranges


def make_plan(gemm: Gemm, orientation: str, dtype_bytes: int, hw: HwConfig, row_tiles: bool = False,
              kept_bytes: int = 0, load_bytes: dict[str, int] | None = None) -> Plan:
    """The blocking for `orientation` (see the module docstring).

    load_bytes: bytes per element a side's loads move when that differs from dtype_bytes (an operand the
    kernel quantizes as it loads it reads its own dtype), so the wider side is the one read once.

    kept_bytes: bytes per partition of a value kept in SBUF (lower.py keep_on_chip) that the kernel writes
    or reads, live across the kernel; the operands plan on what it leaves.

    row_tiles: a neighbour of the kernel is a row-wise kernel (a layer norm) that works in tiles of 128
    rows of M; with M moving ("n"), the plan then streams M in 128-row tiles (still full rate: K = 128,
    M = 128, 128 moving columns), and with M on the partitions ("m") it keeps b resident (a streams by
    in 128-row tiles); either way there is no ramp, so each step completes (or needs) one row tile and
    the row-wise kernel's tiles run beside the matmul's other steps instead of before or after all of
    them.

    Candidates: each side resident, moving tiles of 512, 256 or 128 columns (all full rate: a
    matmul costs max(min(64, M), N) cycles for K*M*N MACs; narrower ones leave SBUF for wider
    panels), the deepest stream that leaves room for a panel beside the epilogue's inputs. Each is
    scored by its modeled time,
    max(TensorE time, DMA time / DMA_SHARE); ties go to wider moving tiles (fewer instructions),
    then to b resident (stores of consecutive tiles in disjoint rows).
    """
    xs, xv = (gemm.m, gemm.n) if orientation == "m" else (gemm.n, gemm.m)
    k_tiles = math.ceil(gemm.k / PARTITIONS)
    column = k_tiles * dtype_bytes                      # bytes per partition of one [K, 1] column
    budget = int((hw.sbuf_bytes_per_partition - SBUF_RESERVE - kept_bytes) * SBUF_SHARE)
    fp32 = dtype_bytes == 4
    pe_seconds = pe_cycles(gemm, orientation, fp32) / hw.clock_hz["pe"]
    rate = cost.dma_rate(hw, DMA_QUEUES)
    batches = batch_indices(gemm.batch)
    best = None
    for resident in ("b",) if row_tiles and orientation == "m" else ("b", "a"):
        view, r_total, t_total = (gemm.b, gemm.n, gemm.m) if resident == "b" else (gemm.kx("a"), gemm.m, gemm.n)
        offsets = [batch_offset(view, i) for i in batches]
        copies, first_group = len(set(offsets)), offsets.count(offsets[0])
        for moving in (PARTITIONS,) if row_tiles and orientation == "n" else MOVING_WIDTHS:
            s_tile, v_tile = min(PE_COLUMNS, xs), min(moving, xv)
            m_tile, n_tile = (s_tile, v_tile) if orientation == "m" else (v_tile, s_tile)
            r_tile, t_tile = (n_tile, m_tile) if resident == "b" else (m_tile, n_tile)
            per_column, per_element = _epilogue_bytes(gemm, orientation, resident)
            columns = (budget - per_element * BLOCK_TILES * v_tile) // (column + per_column)
            panel = _panel(columns, r_total, r_tile, t_tile, copies)
            if panel is None:
                continue
            panels = math.ceil(r_total / panel)
            matmul = cost.matmul_seconds(s_tile, v_tile, fp32, hw)
            ramp = not row_tiles and panel > r_tile and \
                panel * gemm.k * dtype_bytes / rate > math.ceil(panel / r_tile) * k_tiles * matmul
            streamed = "a" if resident == "b" else "b"
            r_bytes, t_bytes = ((load_bytes or {}).get(side, dtype_bytes) for side in (resident, streamed))
            t_reads = (len(batches) * panels + (first_group if ramp else 0)) * t_total
            reads = copies * r_total * r_bytes + t_reads * t_bytes
            seconds = max(pe_seconds, reads * gemm.k / rate / DMA_SHARE)
            key = (seconds, -moving, resident != "b")
            if best is None or key < best[0]:
                best = (key, Plan(orientation, m_tile, n_tile, resident, panel, ramp, row_tiles))
    if best is None:
        s_tile, v_tile = min(PE_COLUMNS, xs), min(MOVING_FMAX, xv)
        return Plan(orientation, *((s_tile, v_tile) if orientation == "m" else (v_tile, s_tile)), "", 0)
    return best[1]


def _epilogue_bytes(gemm: Gemm, orientation: str, resident: str) -> tuple[int, int]:
    """SBUF bytes per partition the epilogue inputs take beyond SBUF_RESERVE: (per resident column, per element
    of a block's free axis). An input constant along the output dim off the partitions is a per-partition
    column (a few bytes); the others are full tiles, one per block of output tiles: two live (the current
    block's and the next one's, loaded ahead), or, for an input constant along the streamed side, one per
    block of the whole panel, kept while the panel is (an element per partition per resident column)."""
    nb = len(gemm.batch)
    off, streamed = (nb + 1 if orientation == "m" else nb), (nb if resident == "b" else nb + 1)
    per_column = per_element = 0
    for view in gemm.epilogue.values():
        if not view.strides[off]:
            continue
        if not any(view.strides[:nb]) and not view.strides[streamed]:
            per_column += view.dtype.itemsize
        else:
            per_element += 2 * view.dtype.itemsize
    return per_column, per_element


def _panel(columns: int, r_total: int, r_tile: int, t_tile: int, copies: int) -> int | None:
    """Resident columns per panel when `columns` [K, 1] columns fit in SBUF: all of them in one panel
    when they fit beside the stream, else two panels must fit (the next loads while one computes);
    None when not even two one-tile panels do. The panels are evened out (whole tiles)."""
    for depth in range(STREAM_DEPTH, 1, -1):
        fits = columns - depth * t_tile
        if copies == 1 and r_total <= fits:
            return r_total
        panel = fits // 2 // r_tile * r_tile
        if panel >= r_tile:
            panels = math.ceil(r_total / panel)
            return min(r_total, math.ceil(math.ceil(r_total / panels) / r_tile) * r_tile)
    return None


def batch_indices(batch: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every index of the batch dims in row-major order ([()] without batch dims)."""
    return list(itertools.product(*(range(b) for b in batch)))


def batch_offset(view: HbmView, index: tuple[int, ...]) -> int:
    """Element offset of batch `index` in `view`: equal offsets mean the same operand (broadcast)."""
    return sum(i * s for i, s in zip(index, view.strides))


def dma_nbytes(dst, src) -> int:
    """Bytes a DMA between `dst` and `src` (tiles or access patterns) moves (isa/cost.py dma_nbytes)."""
    return cost.dma_nbytes(dst.partitions * math.prod(c for _, c in dst.dims), dst.dtype, src.dtype)
