"""Fused attention of the tile stage: softmax(scale * q k^T + mask) v per batch index and 128-query tile.

One "attention" node: q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv], an optional additive float
mask broadcastable to [..., Sq, Sk]; attrs scale, causal (top-left aligned, as torch: query i sees
keys j <= i) and has_mask. The matmul operands are in kernel.compute_dtype (None: q's dtype); the
scores, softmax statistics and the output accumulate in fp32.

Per batch index (every leading index), loaded once: K^T [D on partitions, Sk] (the k view with its
D dim on the partitions), V as key tiles [128 keys, Sk/128, Dv] and Q^T [D, Sq]. Per query tile of
up to 128 rows, the scores S = Q^T-tile (stationary) x K^T chunks of <= 512 keys (moving; one PSUM
bank each) land in PSUM as [128 q, Sk] and DVE takes the row max. Then one of two plans:

- standard: P = exp(scale*S - scale*max) on ScalarE with the row sum accumulated, P in the compute
  dtype in SBUF; P^T by TensorE transposes of 128 x 128 blocks, copied PSUM -> SBUF (by ACT and DVE;
  by DVE alone when ACT also stages masked scores); O = sum over key tiles of P^T-block (stationary)
  x V-tile (moving) in one PSUM bank; O / sum on its way to SBUF.
- transposed (no additive mask, D a multiple of 32 below 128): the PE computes S^T directly with
  the max folded into the contraction: K^T gets a row of ones at partition D, Q^T the row -max
  (TensorE transposes the [128, 1] column), so S^T-block = K^T-tile (stationary) x Q^T-tile
  (moving) = S^T - max, and ScalarE's exp of it is P^T, already keys-on-partitions for the PV
  matmul. V gets a column of ones, so the PV matmul also yields the row sums. This trades the
  [128, Sk] PSUM -> SBUF copy of P^T per query tile (the busiest vector work) for a second,
  equally cheap pass of the PE over the keys: [1, 12, 512, 64] in bf16 models at 33.4 us on trn2
  against 42.1 us for the standard plan (PE roofline of the useful MACs: 10.2 us).

The stages are emitted software-pipelined (the scores of tile t, the later stages of earlier tiles,
the loads LOAD_LEAD tiles ahead) because each engine runs its queue in order: TensorE computes the
next scores while the vector engines finish the softmax of the previous ones. The stage delays and
the engines of the small per-row steps (-max, 1/sum, row copies) were chosen on the performance
model: a choice by earliest finish alone piles them onto VectorE, which the row max keeps busy, and
a step queued on an in-order engine behind another tile's long step holds back every engine that
waits for it.

Masks. causal (scale > 0): a query tile skips the keys past its last row; the diagonal block of S
gets CAUSAL_FILL added in PSUM by one more matmul (identity x constant block, bf16, exact), so the
max ignores it and exp gives exactly 0 (the transposed plan also zeroes the diagonal blocks of P^T
with GpSimdE's affine_select). Additive masks (and causal with scale <= 0): ScalarE copies scale*S
to SBUF, the mask tile is added, causal entries are set to -inf (affine_select), and the standard
plan runs on that tile, the softmax input as torch forms it (scale*S + mask).

Stochastic rounding (Options.rounding): the operands converted on load (engines.load), P and the output are
computed in fp32 and rounded by engines.write; -max in the transposed plan rounds to nearest, a shift that the
row sums, from the same matmul, undo.

Limits: D <= 128 (the PE contraction), Dv <= 511 (Dv + 1 fp32 in one PSUM bank), Sk <= MAX_KEYS in the
transposed plan and MAX_KEYS_STANDARD in the standard one (a [128, Sk] fp32 score tile takes Sk/512 of
PSUM's 8 banks, and the standard plan keeps two in flight); legalize lowers an attention beyond
them as two matmuls and a softmax (`beyond_limits`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.ap import Engine
from trnc.isa.config import MOVING_FMAX, PARTITIONS, PSUM_BANK_BYTES
from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc, AluOp, ReduceOp
from trnc.passes.tile.kernels import engines
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

FP32, BF16 = DType.FP32, DType.BF16
P = PARTITIONS
MAX_KEYS = 2048              # the transposed plan: S^T tiles of 128 keys, so only the [128, Sk] max row is wide
MAX_KEYS_STANDARD = 1024     # the standard plan: two [128, Sk] fp32 score tiles in flight, plus P^T and O banks
COMPUTE_DTYPES = (DType.FP32, DType.BF16, DType.FP16)
PSUM_READERS = (Engine.ACT, Engine.DVE)   # GpSimdE cannot reach PSUM
DVE_POOL = (Engine.DVE, Engine.POOL)      # sub/div are not ScalarE tensor_scalar ops
CAUSAL_FILL = -2.0 ** 127    # added to masked scores: exact in bf16 and fp32, and exp(scale * it) == 0
LOAD_LEAD = 4                # query tiles between a tile's loads and its scores
MASK_CACHE_BYTES = 1 << 16   # per partition: mask tiles kept for reuse across batch indices (heads)
DMA_CHUNK = 1 << 15          # bytes per DMA of the loads, so one load spreads over several queues


@dataclass(frozen=True)
class _Geometry:
    batch: tuple[int, ...]
    sq: int
    sk: int
    d: int
    dv: int
    cd: DType            # matmul operand dtype
    out: DType
    scale: float
    causal: bool
    staged: bool         # softmax on an SBUF copy of scale*S (masks), not on PSUM

    @property
    def transposed(self) -> bool:
        return transposed_plan(self.d, self.dv, self.staged)

    def keys_of(self, q0: int, qn: int) -> int:
        """Keys a query tile [q0, q0+qn) attends to: all, or under causal those up to its last row."""
        return min(self.sk, q0 + qn) if self.causal else self.sk


@dataclass
class _Head:
    qt: Tile     # [D (+1), Sq]
    kt: Tile     # [D (+1), Sk]
    v: Tile      # [128 keys, key tiles, Dv (+1)]


@dataclass
class _Item:
    """One query tile of one batch index, and the tiles its stages hand on."""

    index: tuple[int, ...]
    q0: int
    qn: int
    keys: int
    mask: Tile | None = None
    src: Tile | None = None      # standard: the scores the softmax reads, with the scale still to apply
    scale: float = 1.0
    bias: Tile | None = None     # standard: the row max (min when scale < 0)
    stat: Tile | None = None     # standard: row sum; transposed: -max in the compute dtype
    p: Tile | None = None        # standard: P [q, keys]; transposed: P^T [keys, tiles, q]
    pt: Tile | None = None       # standard: P^T in SBUF

    @property
    def key_tiles(self) -> int:
        return -(-self.keys // P)

    def key_rows(self, j: int) -> int:
        return min(P, self.keys - j * P)


def transposed_plan(d: int, dv: int, staged: bool) -> bool:
    """The S^T plan: needs no mask tile (not `staged`), a spare PE row (D < 128) that a compute engine may write
    as one partition (the partition start rule: D a multiple of 32), and a spare PSUM column."""
    return not staged and d % 32 == 0 and d < P and dv < MOVING_FMAX


def beyond_limits(d: int, dv: int, sk: int, staged: bool) -> str | None:
    """Why the fused kernel cannot take head dim d, value dim dv and sk keys (with a staged softmax: an additive
    mask, or causal with scale <= 0), or None when it can (legalize lowers such an attention unfused, as two
    matmuls and a softmax). The standard plan's score tiles fill PSUM at fewer keys than the transposed plan's
    (at 1536 keys and more it failed in allocate, 'PSUM is full': Llama's D = 128 at 2048 tokens; fuzz seed
    515001705)."""
    if d > P:
        return f"head dim D={d}: the fused kernel contracts over D on the {P} PE rows, so D <= {P}"
    if dv >= MOVING_FMAX:
        return (f"value dim Dv={dv}: the output tile [128, Dv + 1] fp32 must fit one PSUM bank, so "
                f"Dv <= {MOVING_FMAX - 1}")
    most = MAX_KEYS if transposed_plan(d, dv, staged) else MAX_KEYS_STANDARD
    if not 1 <= sk <= most:
        return f"Sk={sk} keys: the fused kernel keeps [128, Sk] fp32 score tiles in PSUM, so 1 <= Sk <= {most} here"
    return None


def _geometry(kernel: ir.Kernel) -> _Geometry:
    node = kernel.output
    q, k, v = node.inputs[:3]
    *batch, sq, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    cd = kernel.compute_dtype or q.dtype
    where = node.where()
    if cd not in COMPUTE_DTYPES:
        raise UnsupportedOpError(f"attention with compute dtype {cd.text}{where}: the fused kernel computes in "
                                 f"{', '.join(t.text for t in COMPUTE_DTYPES)}")
    scale = node.attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal, has_mask = bool(node.attrs.get("causal")), bool(node.attrs.get("has_mask"))
    staged = has_mask or (causal and scale <= 0)
    problem = beyond_limits(d, dv, sk, staged)
    if problem:
        raise UnsupportedOpError(f"attention{where}: {problem}")
    return _Geometry(tuple(batch), sq, sk, d, dv, cd, node.dtype, scale, causal, staged)


class _AttentionLowering:
    def __init__(self, kb: TileBuilder, kernel: ir.Kernel, views: dict, out: HbmView):
        self.kb = kb
        self.g = g = _geometry(kernel)
        node = kernel.output
        self.q = views[node.inputs[0]].expand(g.batch + (g.sq, g.d))
        self.k = views[node.inputs[1]].expand(g.batch + (g.sk, g.d))
        self.v = views[node.inputs[2]].expand(g.batch + (g.sk, g.dv))
        self.mask, self.reuse_masks = None, False
        if node.attrs.get("has_mask"):
            mask = node.inputs[3]
            if not mask.dtype.is_float:
                raise UnsupportedOpError(f"attention mask %{mask.name} of dtype {mask.dtype.text}{node.where()}: the "
                                         "kernel adds the mask to the scores; make it an additive float mask "
                                         "(0 / -inf) first")
            self.mask = views[mask].expand(g.batch + (g.sq, g.sk))
            # a mask broadcast over some batch dims (heads) repeats its tiles: keep them when they fit
            self.reuse_masks = -(-g.sq // P) * g.sk * mask.dtype.itemsize <= MASK_CACHE_BYTES
        self.out = out
        self.extra = 1 if g.transposed else 0   # the row of ones / -max, the column of ones
        # the standard plan's per-row steps (-max, 1/sum): on GpSimdE, idle otherwise; on ScalarE, next to the
        # exp and the evacuation that read them, when GpSimdE adds the masks (an in-order GpSimdE queue would
        # hold ScalarE back behind each mask tile)
        self.small = (Engine.ACT,) if g.staged else (Engine.POOL,)
        self.heads: dict[tuple, _Head] = {}
        self.masks: dict[tuple, Tile] = {}
        self.consts: dict[str, Tile] = {}

    # -- loads and constants -----------------------------------------------------------------------
    def _box(self, index, rows: tuple[int, int], cols: tuple[int, int]):
        return tuple((i, 1) for i in index) + (rows, cols)

    def head(self, index) -> _Head:
        if index in self.heads:
            return self.heads[index]
        g, kb, nb, extra = self.g, self.kb, len(self.g.batch), self.extra

        def load(dst: Tile, src) -> None:    # converted to the compute dtype as the program rounds
            engines.load(kb, dst, src, lambda d, a: kb.dma_split(d, a, DMA_CHUNK))
        qt = kb.sbuf("qT", g.cd, g.d + extra, (g.sq,))
        load(qt.narrow(0, 0, g.d), self.q.box_ap(nb + 1, self._box(index, (0, g.sq), (0, g.d))))
        kt = kb.sbuf("kT", g.cd, g.d + extra, (g.sk,))
        load(kt.narrow(0, 0, g.d), self.k.box_ap(nb + 1, self._box(index, (0, g.sk), (0, g.d))))
        v = kb.sbuf("v", g.cd, min(P, g.sk), (-(-g.sk // P), g.dv + extra))
        full, rest = divmod(g.sk, P)
        if full:   # key tiles: the Sk axis split as [full, 128]
            base = self.v.offset + sum(i * s for i, s in zip(index, self.v.strides))
            s_key, s_col = self.v.strides[-2:]
            tiles = HbmView(self.v.tensor, self.v.dtype, (full, P, g.dv), (P * s_key, s_key, s_col), base)
            load(v.narrow(1, 0, full).narrow(2, 0, g.dv), tiles.box_ap(1, ((0, full), (0, P), (0, g.dv))))
        if rest:
            load(v.narrow(1, full, 1).narrow(0, 0, rest).narrow(2, 0, g.dv),
                 self.v.box_ap(nb, self._box(index, (full * P, rest), (0, g.dv))))
        if extra:
            kb.emit("memset", (Engine.POOL,), dst=kt.narrow(0, g.d, 1), value=1.0)
            kb.emit("memset", (Engine.POOL,), dst=v.narrow(2, g.dv, 1), value=1.0)
        self.heads[index] = _Head(qt, kt, v)
        return self.heads[index]

    def load(self, item: _Item) -> None:
        self.head(item.index)
        if self.mask is None:
            return
        src = self.mask.box_ap(len(self.g.batch), self._box(item.index, (item.q0, item.qn), (0, item.keys)))
        key = (src.offset, src.partition_stride, src.dims, item.qn)
        if key not in self.masks:
            tile = self.kb.sbuf("mask", src.dtype, item.qn, (item.keys,))
            self.kb.dma_split(tile, src, 2 * DMA_CHUNK)
            if not self.reuse_masks:
                item.mask = tile
                return
            self.masks[key] = tile
        item.mask = self.masks[key]

    def const(self, name: str) -> Tile:
        """128 x 128 bf16 constants built once: the identity, and the causal block (CAUSAL_FILL above the diagonal)."""
        if name not in self.consts:
            t = self.kb.sbuf(name, BF16, P, (P,))
            diag = name == "identity"
            self.kb.emit("memset", DVE_POOL, dst=t, value=1.0 if diag else 0.0)
            # keep where (partition - column) == 0 (identity) or >= 0 (on or below the diagonal)
            self.kb.emit("affine_select", dst=t, src=t, cmp=AluOp.EQ if diag else AluOp.GE,
                         fill=0.0 if diag else CAUSAL_FILL, partition_step=1, steps=(-1, 0, 0, 0))
            self.consts[name] = t
        return self.consts[name]

    # -- scores and their row max (both plans) -----------------------------------------------------
    def scores(self, item: _Item) -> tuple[Tile, float, Tile]:
        """S (PSUM, or its staged SBUF form), the scale still to apply, and the row extreme to subtract."""
        g, kb = self.g, self.kb
        h = self.head(item.index)
        qn, keys = item.qn, item.keys
        s = kb.psum("s", qn, (-(-keys // MOVING_FMAX) * MOVING_FMAX,))
        stationary = h.qt.narrow(0, 0, g.d).narrow(1, item.q0, qn)
        for c0 in range(0, keys, MOVING_FMAX):
            cn = min(MOVING_FMAX, keys - c0)
            kb.emit("matmul", dst=s.narrow(1, c0, cn), stationary=stationary,
                    moving=h.kt.narrow(0, 0, g.d).narrow(1, c0, cn))
        s = s.narrow(1, 0, keys)
        src, scale = s, g.scale
        if g.staged:
            src, scale = self._staged(item, s), 1.0
        elif g.causal and item.q0 < keys:
            self._causal_in_psum(item, s)
        extreme = kb.sbuf("max", FP32, qn, (1,))
        kb.emit("tensor_reduce", dst=extreme, src=src, op=ReduceOp.MAX if scale >= 0 else ReduceOp.MIN, axes=1)
        return src, scale, extreme

    def _causal_in_psum(self, item: _Item, s: Tile) -> None:
        """S[i, q0 + c] += CAUSAL_FILL for c > i: identity (stationary) x causal block (moving), per PSUM bank."""
        qn, width = item.qn, item.keys - item.q0
        ident = self.const("identity").narrow(0, 0, qn).narrow(1, 0, qn)
        block = self.const("causal").narrow(0, 0, qn)
        c = 0
        while c < width:
            col = item.q0 + c
            n = min(width - c, MOVING_FMAX - col % MOVING_FMAX)
            self.kb.emit("matmul", dst=s.narrow(1, col, n), stationary=ident, moving=block.narrow(1, c, n),
                         accumulate=True)
            c += n

    def _staged(self, item: _Item, s: Tile) -> Tile:
        """t = scale*S + mask in SBUF fp32, with causal entries -inf: the softmax input exactly as torch forms it."""
        kb, qn, keys = self.kb, item.qn, item.keys
        t = kb.sbuf("scores", FP32, qn, (keys,))
        kb.emit("activation", dst=t, src=s, func=ActFunc.COPY, scale=self.g.scale)
        if item.mask is not None:
            kb.emit("tensor_tensor", dst=t, in0=t, in1=item.mask, op=AluOp.ADD)
        if self.g.causal and item.q0 < keys:
            diag = t.narrow(1, item.q0, keys - item.q0)
            kb.emit("affine_select", dst=diag, src=diag, cmp=AluOp.GE, fill=float("-inf"), partition_step=1,
                    steps=(-1, 0, 0, 0))
        return t

    # -- the standard plan: exp, transposes of P, P V ----------------------------------------------
    def row_stats(self, item: _Item) -> None:
        item.src, item.scale, item.bias = self.scores(item)

    def softmax(self, item: _Item) -> None:
        """P = exp(scale*S - scale*max) with the row sums: a stage behind the scores, so that ScalarE and
        GpSimdE take an earlier tile's steps while VectorE reduces the next tile."""
        kb, qn = self.kb, item.qn
        bias = kb.sbuf("nmax", FP32, qn, (1,))
        kb.emit("tensor_scalar", self.small, dst=bias, src=item.bias, op0=AluOp.MUL, scalar0=-item.scale)
        item.p = kb.sbuf("p", self.g.cd, qn, (item.keys,))
        item.stat = kb.sbuf("sum", FP32, qn, (1,))
        p = self._wide(item.p)
        kb.emit("activation", dst=p, src=item.src, func=ActFunc.EXP, scale=item.scale, bias_ap=bias,
                accum=item.stat)
        self._round(item.p, p)

    def transpose_p(self, item: _Item) -> None:
        g, kb, qn = self.g, self.kb, item.qn
        tiles = item.key_tiles
        per_bank = PSUM_BANK_BYTES // (P * g.cd.itemsize)
        item.pt = kb.sbuf("pT", g.cd, min(P, item.keys), (tiles, qn))
        for j0 in range(0, tiles, per_bank):
            group = range(j0, min(tiles, j0 + per_bank))
            ps = kb.psum("pT", min(P, item.keys), (len(group), qn), dtype=g.cd)
            for j in group:
                kn = item.key_rows(j)
                kb.emit("transpose", dst=ps.narrow(0, 0, kn).select(1, j - j0), src=item.p.narrow(1, j * P, kn))
            # whole blocks copied half by ScalarE, half by VectorE: both are busy with the softmax, and
            # a choice by earliest finish would give VectorE all of them (all, when ScalarE also stages S)
            whole = sum(1 for j in group if item.key_rows(j) == P)
            half = 0 if g.staged else -(-whole // 2)
            for engine, a, n in ((Engine.ACT, 0, half), (Engine.DVE, half, whole - half)):
                if n:
                    kb.emit("tensor_copy", (engine,), dst=item.pt.narrow(1, j0 + a, n), src=ps.narrow(1, a, n))
            if whole < len(group):
                kn = item.key_rows(group[-1])
                kb.emit("tensor_copy", PSUM_READERS, dst=item.pt.narrow(1, group[-1], 1).narrow(0, 0, kn),
                        src=ps.narrow(1, whole, 1).narrow(0, 0, kn))

    def output(self, item: _Item) -> None:
        kb, qn, g = self.kb, item.qn, self.g
        o = self._pv(item, item.pt, g.dv)
        inv = kb.sbuf("inv", FP32, qn, (1,))
        if self.small == (Engine.ACT,):
            kb.emit("activation", dst=inv, src=item.stat, func=ActFunc.RECIPROCAL)
        else:
            kb.emit("tensor_scalar", self.small, dst=inv, src=item.stat, op0=AluOp.DIV, scalar0=1.0, reverse0=True)
        y = kb.sbuf("y", g.out, qn, (g.dv,))
        wide = self._wide(y)
        kb.emit("tensor_scalar", (Engine.ACT,), dst=wide, src=o, op0=AluOp.MUL, scalar0_ap=inv)
        self._round(y, wide)
        self._store(item, y)

    def _wide(self, tile: Tile) -> Tile:
        """Where to compute the values of `tile`: itself, or an fp32 tile when they round stochastically."""
        return self.kb.sbuf(f"{tile.buffer.name.rsplit('.', 1)[-1]}_fp32", FP32, tile.partitions, tile.shape[1:]) \
            if engines.stochastic(self.kb, tile.dtype) else tile

    def _round(self, tile: Tile, wide: Tile) -> None:
        """`tile` = `wide` rounded stochastically (engines.write), when _wide gave another tile."""
        if wide is not tile:
            engines.write(self.kb, tile, wide)

    def _pv(self, item: _Item, pt: Tile, columns: int) -> Tile:
        """O [q, columns] = sum over key tiles of P^T-block (stationary) x V-tile (moving), in one PSUM bank."""
        h = self.head(item.index)
        o = self.kb.psum("o", item.qn, (columns,))
        for j in range(item.key_tiles):
            kn = item.key_rows(j)
            self.kb.emit("matmul", dst=o, stationary=pt.narrow(0, 0, kn).select(1, j),
                         moving=h.v.narrow(0, 0, kn).select(1, j).narrow(1, 0, columns), accumulate=j > 0)
        return o

    def _store(self, item: _Item, y: Tile) -> None:
        g = self.g
        box = self._box(item.index, (item.q0, item.qn), (0, g.dv))
        self.kb.dma_split(self.out.box_ap(len(g.batch), box), y, DMA_CHUNK)

    # -- the transposed plan: -max as a row, S^T - max on the PE, exp, P V with the sums -----------
    def max_row(self, item: _Item) -> None:
        _, _, mx = self.scores(item)
        # -max rounds to nearest even even under stochastic rounding: a shift the row sums (same matmul) undo
        item.stat = self.kb.sbuf("nmax", self.g.cd, item.qn, (1,))
        # GpSimdE when it is idle; under causal it masks the diagonal blocks of P^T, in the order of the
        # tiles some stages behind, and -max waiting there would hold back the next transposes
        engine = Engine.DVE if self.g.causal else Engine.POOL
        self.kb.emit("tensor_scalar", (engine,), dst=item.stat, src=mx, op0=AluOp.MUL, scalar0=-1.0)

    def place_row(self, item: _Item) -> None:
        """-max of the tile's rows into row D of Q^T (its columns q0..), through a PE transpose."""
        g, kb = self.g, self.kb
        row = kb.psum("row", 1, (item.qn,), dtype=g.cd)
        kb.emit("transpose", dst=row, src=item.stat)
        qt = self.head(item.index).qt
        kb.emit("tensor_copy", (Engine.ACT,), dst=qt.narrow(0, g.d, 1).narrow(1, item.q0, item.qn), src=row)

    def exp_transposed(self, item: _Item) -> None:
        """P^T blocks = exp(scale * (K^T-tile x Q^T-tile)) over D + 1 rows: the last row subtracts the max."""
        g, kb, qn, tiles = self.g, self.kb, item.qn, item.key_tiles
        h = self.head(item.index)
        per_bank = MOVING_FMAX // qn
        st = kb.psum("sT", min(P, item.keys), (-(-tiles // per_bank), MOVING_FMAX))
        item.p = kb.sbuf("pT", g.cd, min(P, item.keys), (tiles, qn))
        p = self._wide(item.p)
        moving = h.qt.narrow(1, item.q0, qn)

        def block(j: int) -> Tile:
            return st.narrow(0, 0, item.key_rows(j)).select(1, j // per_bank).narrow(1, j % per_bank * qn, qn)

        for j in range(tiles):
            kb.emit("matmul", dst=block(j), stationary=h.kt.narrow(1, j * P, item.key_rows(j)), moving=moving)
        for j0 in range(0, tiles, per_bank):
            group = list(range(j0, min(tiles, j0 + per_bank)))
            whole = [j for j in group if item.key_rows(j) == P]
            if whole:
                kb.emit("activation", dst=p.narrow(1, j0, len(whole)),
                        src=st.select(1, j0 // per_bank).narrow(1, 0, len(whole) * qn), func=ActFunc.EXP,
                        scale=g.scale)
            if len(whole) < len(group):
                j = group[-1]
                kb.emit("activation", dst=p.narrow(0, 0, item.key_rows(j)).select(1, j), src=block(j),
                        func=ActFunc.EXP, scale=g.scale)
        self._round(item.p, p)
        for j in range(tiles):
            kn = item.key_rows(j)
            if g.causal and j * P + kn - 1 > item.q0:   # keep P^T[k, q] where q0 + q - (j*128 + k) >= 0
                blk = item.p.narrow(0, 0, kn).select(1, j)
                kb.emit("affine_select", dst=blk, src=blk, cmp=AluOp.GE, fill=0.0, base=item.q0 - j * P,
                        partition_step=-1, steps=(1, 0, 0, 0))

    def output_transposed(self, item: _Item) -> None:
        g, kb = self.g, self.kb
        o = self._pv(item, item.p, g.dv + 1)
        y = kb.sbuf("y", g.out, item.qn, (g.dv,))
        wide = self._wide(y)
        kb.emit("tensor_scalar", (Engine.DVE,), dst=wide, src=o.narrow(1, 0, g.dv), op0=AluOp.DIV,
                scalar0_ap=o.narrow(1, g.dv, 1))
        self._round(y, wide)
        self._store(item, y)

    # -- the software pipeline ---------------------------------------------------------------------
    def run(self) -> None:
        g = self.g
        items = []
        for index in itertools.product(*(range(b) for b in g.batch)):
            for q0 in range(0, g.sq, P):
                qn = min(P, g.sq - q0)
                items.append(_Item(index, q0, qn, g.keys_of(q0, qn)))
        # (delay in query tiles, stage): each stage runs some tiles behind the previous one so that its
        # inputs from the other engines are ready when its queue reaches it (delays tuned on the model)
        if g.transposed:
            plan = ((0, self.max_row), (2, self.place_row), (3, self.exp_transposed), (5, self.output_transposed))
        else:
            plan = ((0, self.row_stats), (2, self.softmax), (3, self.transpose_p), (5, self.output))
        stages = [(LOAD_LEAD + delay, stage) for delay, stage in plan] + [(0, self.load)]
        for step in range(len(items) + LOAD_LEAD + max(delay for delay, _ in plan)):
            for delay, stage in stages:
                t = step - delay
                if 0 <= t < len(items):
                    stage(items[t])


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> None:
    """Lower one attention node (see the module docstring for the plans)."""
    if math.prod(kernel.output.shape) == 0:
        return
    _AttentionLowering(kb, kernel, views, out).run()
