"""The matmul kernel (passes/tile/kernels/matmul.py, matmul_plan.py) against torch, through tile/allocate/schedule/emit
and both runtimes (the harness requires the reference and the JIT to agree bit for bit).

Tolerances, from how the machine computes (isa/SPEC.md, matmul): every output element is one fp32
accumulation over k = 0..K-1 in order, starting from +0.0; products of bf16 operands are exact in fp32, fp32
products round once. The classic bound for such a sum (Higham, 3.1) is
    |got - exact| <= gamma_n * (|A| @ |B|),   gamma_n = n u / (1 - n u),   u = 2^-24,
with n = K for bf16 operands (exact products) and n = K + 1 for fp32 (one more rounding per product); `exact`
is computed in float64 from the operands as the machine sees them (bf16-rounded when the compute dtype is
bf16). A result stored in bf16 adds one rounding, 2^-8 |exact| (and the bound's own rounding, hence the
(1 + 2^-8) factor). Epilogues add their fp32 operations' roundings (a few u of the result).
fp32 operands also meet the issue's bound against torch: max|diff| / max|ref| <= 1e-5. torch sums in another
order (blocked, vectorized), so results differ by rounding, within gamma_K * max(|A| @ |B|) / max|ref|: about
1e-5 for K = 600 of random normal data, less for the sizes here.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import torch

import harness
from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.config import DMA_QUEUES, get_target
from trnc.isa.dtypes import DType
from trnc.isa.races import footprint, footprints_overlap
from trnc.passes.tile.kernels import matmul, matmul_plan
from trnc.passes.tile.kernels.matmul_plan import Gemm, Plan, choose_orientation, make_plan
from trnc.passes.tile.tiles import HbmView, contiguous_strides

F32, BF16, I32 = DType.FP32, DType.BF16, DType.INT32
RNG = np.random.default_rng(11)
U = 2.0 ** -24


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def node(kind, inputs, shape, dtype=F32, **attrs) -> ir.Node:
    return ir.Node(kind, tuple(inputs), shape, dtype, attrs)


def matmul_node(a: ir.Node, b: ir.Node, dtype=F32) -> ir.Node:
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return node("matmul", [a, b], (*batch, a.shape[-2], b.shape[-1]), dtype)


def run(inputs, arrays, nodes, compute=None, partition_dim=None, pre=()):
    """Compile `pre` (movement kernels) and one matmul kernel of `nodes`; the output and the state."""
    kernels = [ir.Kernel("movement", [m]) for m in pre]
    kernels.append(ir.Kernel("matmul", list(nodes), compute_dtype=compute, partition_dim=partition_dim))
    outs, state = harness.compile_and_run(inputs, kernels, arrays)
    return outs[0], state


def as_seen(x: np.ndarray, compute: DType | None) -> np.ndarray:
    """The operand as TensorE reads it, in float64: rounded to bf16 when the compute dtype is bf16."""
    if compute is BF16:
        x = x.astype(ml_dtypes.bfloat16)
    return np.asarray(x, np.float64)


def check(got, a, b, compute, out_dtype=F32, extra=0.0):
    """got against the float64 product of the operands as the machine reads them, within the fp32
    accumulation bound (plus one bf16 rounding when the output is bf16, plus `extra` * |exact|);
    fp32 operands also against torch's fp32 matmul."""
    a64, b64 = as_seen(a, compute), as_seen(b, compute)
    n = a.shape[-1] + (0 if compute is BF16 else 1)
    exact = np.matmul(a64, b64)
    bound = n * U / (1 - n * U) * np.matmul(np.abs(a64), np.abs(b64)) + extra * np.abs(exact)
    if out_dtype is BF16:
        bound = (bound + 2.0 ** -8 * np.abs(exact)) * (1 + 2.0 ** -8)
    got64 = np.asarray(got, np.float64)
    assert got64.shape == exact.shape
    assert np.all(np.abs(got64 - exact) <= bound), float(np.max(np.abs(got64 - exact) - bound))
    if compute in (None, F32) and out_dtype is F32 and not extra:
        ref = torch.matmul(torch.from_numpy(np.asarray(a, np.float32)), torch.from_numpy(np.asarray(b, np.float32)))
        assert np.abs(got64 - ref.numpy()).max() <= 1e-5 * np.abs(ref.numpy()).max()


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 1, 7), (130, 200, 70), (64, 300, 600), (257, 129, 515)])
@pytest.mark.parametrize("partition_dim", ["m", "n"])
def test_fp32_shapes(m, k, n, partition_dim):
    a_np, b_np = randn(m, k), randn(k, n)
    a, b = harness.inp(0, (m, k), F32), harness.inp(1, (k, n), F32)
    out, _ = run([a, b], [a_np, b_np], [matmul_node(a, b)], partition_dim=partition_dim)
    check(out, a_np, b_np, None)


@pytest.mark.parametrize("partition_dim", ["m", "n"])
def test_bf16_compute_converts_fp32_inputs_on_load(partition_dim):
    a_np, b_np = randn(200, 384), randn(384, 300)
    a, b = harness.inp(0, a_np.shape, F32), harness.inp(1, b_np.shape, F32)
    out, state = run([a, b], [a_np, b_np], [matmul_node(a, b)], compute=BF16, partition_dim=partition_dim)
    check(out, a_np, b_np, BF16)
    mm = [i for i in state.program.instructions if i.opcode == "matmul"]
    assert mm and all(i["stationary"].dtype is BF16 and i["moving"].dtype is BF16 for i in mm)


def test_bf16_inputs_and_bf16_output():
    a_np, b_np = randn(96, 260, dtype=ml_dtypes.bfloat16), randn(260, 136, dtype=ml_dtypes.bfloat16)
    a, b = harness.inp(0, a_np.shape, BF16), harness.inp(1, b_np.shape, BF16)
    out, _ = run([a, b], [a_np, b_np], [matmul_node(a, b, BF16)], compute=BF16)
    assert out.dtype == ml_dtypes.bfloat16
    check(out, a_np, b_np, BF16, BF16)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 40, 24), (24, 50)), ((2, 1, 20, 33), (1, 3, 33, 17)),
                                             ((3, 70, 20), (3, 20, 140)), ((45, 16), (4, 16, 30))])
@pytest.mark.parametrize("partition_dim", ["m", "n"])
def test_batch_broadcast(a_shape, b_shape, partition_dim):
    a_np, b_np = randn(*a_shape), randn(*b_shape)
    a, b = harness.inp(0, a_shape, F32), harness.inp(1, b_shape, F32)
    out, _ = run([a, b], [a_np, b_np], [matmul_node(a, b)], partition_dim=partition_dim)
    check(out, a_np, b_np, None)


def test_batch_folds_into_m_when_b_is_shared():
    """[2, 3, 40, K] @ [K, N]: the 240 rows of a go by as full 128-row tiles, not 40-row tiles per batch."""
    a_np, b_np = randn(2, 3, 40, 64), randn(64, 96)
    a, b = harness.inp(0, a_np.shape, F32), harness.inp(1, b_np.shape, F32)
    out, state = run([a, b], [a_np, b_np], [matmul_node(a, b)], partition_dim="m")
    check(out, a_np, b_np, None)
    widths = sorted({i["stationary"].free_size for i in state.program.instructions if i.opcode == "matmul"})
    assert widths == [112, 128]


def test_transposed_and_sliced_views():
    """q @ k^T with k read through a permute (strides only) and a sliced, strided a."""
    q_np, k_np = randn(2, 90, 48), randn(2, 70, 48)
    q, k = harness.inp(0, q_np.shape, F32), harness.inp(1, k_np.shape, F32)
    kt = node("permute", [k], (2, 48, 70), dims=(0, 2, 1))
    qs = node("slice", [q], (2, 28, 48), dim=1, start=5, stop=89, step=3)
    out, _ = run([q, k], [q_np, k_np], [matmul_node(qs, kt)], pre=[kt, qs])
    check(out, q_np[:, 5:89:3], k_np.transpose(0, 2, 1), None)


@pytest.mark.parametrize("partition_dim", ["m", "n"])
def test_epilogue_scale_bias_relu_cast(partition_dim):
    """relu(x @ w * 0.5 + bias) stored as bf16: the bias is per column (per partition in "n")."""
    x_np, w_np, bias_np = randn(150, 200), randn(200, 260), randn(260)
    x, w, bias = (harness.inp(i, v.shape, F32) for i, v in enumerate((x_np, w_np, bias_np)))
    mm = matmul_node(x, w)
    scaled = node("scalar", [mm], mm.shape, op="mul", value=0.5)
    biased = node("binary", [scaled, bias], mm.shape, op="add")
    relu = node("unary", [biased], mm.shape, func="relu")
    cast = node("cast", [relu], mm.shape, BF16)
    out, state = run([x, w, bias], [x_np, w_np, bias_np], [mm, scaled, biased, relu, cast],
                     partition_dim=partition_dim)
    ref = np.maximum(np.matmul(x_np.astype(np.float64), w_np) * 0.5 + bias_np, 0)
    n = 200 + 1
    bound = n * U / (1 - n * U) * 0.5 * np.matmul(np.abs(x_np).astype(np.float64), np.abs(w_np))
    bound = (bound + 2 * U * np.abs(ref) + 2.0 ** -8 * np.abs(ref)) * (1 + 2.0 ** -8) + 4 * U * np.abs(bias_np)
    assert out.dtype == ml_dtypes.bfloat16
    assert np.all(np.abs(out.astype(np.float64) - ref) <= bound)
    bias_index = state.program.tensor_index("in2")
    loads = [i["dst"] for i in state.program.instructions if i.opcode == "dma_copy" and i["src"].tensor == bias_index]
    if partition_dim == "n":    # N on the partitions: the bias is per partition, each element loaded once
        assert sum(d.num_elements for d in loads) == 260


@pytest.mark.parametrize("partition_dim", ["m", "n"])
def test_epilogue_residual_add_and_immediate(partition_dim):
    """x @ w + residual - 1.0 over a batch: the residual is a full tile per output tile; the constant an immediate."""
    x_np, w_np, r_np = randn(2, 70, 96), randn(96, 600), randn(2, 70, 600)
    x, w, r = (harness.inp(i, v.shape, F32) for i, v in enumerate((x_np, w_np, r_np)))
    one = harness.const(np.ones((1,), np.float32), F32)
    mm = matmul_node(x, w)
    res = node("binary", [mm, r], mm.shape, op="add")
    out_node = node("binary", [res, one], mm.shape, op="sub")
    out, state = run([x, w, r], [x_np, w_np, r_np], [mm, res, out_node], partition_dim=partition_dim)
    exact = np.matmul(x_np.astype(np.float64), w_np) + r_np - 1.0
    n = 96 + 1
    bound = n * U / (1 - n * U) * np.matmul(np.abs(x_np).astype(np.float64), np.abs(w_np))
    bound = bound + 4 * U * (np.abs(exact) + np.abs(r_np) + 1)
    assert np.all(np.abs(out - exact) <= bound)
    consts = {i for i, t in enumerate(state.program.tensors) if t.name.startswith("c_")}
    assert not any(i.opcode == "dma_copy" and i["src"].tensor in consts for i in state.program.instructions)


def gemm_of_shapes(a_shape, b_shape, dtype=BF16) -> Gemm:
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    out = (*batch, a_shape[-2], b_shape[-1])

    def view(t, shape, full):
        return HbmView(t, dtype, shape, contiguous_strides(shape)).expand(full)
    return Gemm(view(0, a_shape, batch + a_shape[-2:]), view(1, b_shape, batch + b_shape[-2:]), view(2, out, out), {})


def features(plan: Plan, gemm: Gemm) -> dict:
    total = gemm.n if plan.resident == "b" else gemm.m
    return dict(resident=plan.resident, panels=len(plan.panels(total, True)) if plan.resident else 0,
                ramp=plan.ramp)


@pytest.mark.parametrize("a_shape,b_shape,dtype_bytes,budget,expect", [
    # the benchmark GEMM: b in 4 panels of 1024 (two live: 2 x 64 KiB per partition) after a one-tile ramp
    ((4096, 4096), (4096, 4096), 2, None, dict(resident="b", panels=5, ramp=True)),
    # fp32 takes twice the bytes per column: panels of 512; a panel (8 MiB, 23 us of DMA) loads faster than
    # TensorE needs it (32 fp32 matmuls of 853 ns per sub-tile and tile of a), so no ramp
    ((4096, 4096), (4096, 4096), 4, None, dict(resident="b", panels=8, ramp=False)),
    # BERT's FFN up-projection: all of a (768 KiB) stays resident and b goes by once
    ((512, 768), (768, 3072), 2, None, dict(resident="a", panels=1, ramp=False)),
    # a contraction too long for two one-tile panels beside the stream: both operands streamed
    ((256, 65536), (65536, 256), 2, None, dict(resident="", panels=0, ramp=False)),
    # small SBUF budgets (bytes per partition) force multi-panel blockings on small shapes
    ((400, 128), (128, 600), 2, 1200, dict(resident="b", panels=5, ramp=False)),
    ((500, 256), (256, 700), 2, 3000, dict(resident="a", panels=4, ramp=False)),
])
def test_plan_choices(monkeypatch, a_shape, b_shape, dtype_bytes, budget, expect):
    hw = get_target("trn2")
    if budget is not None:
        monkeypatch.setattr(matmul_plan, "SBUF_RESERVE", hw.sbuf_bytes_per_partition - budget)
    gemm = gemm_of_shapes(a_shape, b_shape)
    plan = make_plan(gemm, "m", dtype_bytes, hw)
    assert features(plan, gemm) == expect
    if plan.resident:      # what is live at once fits: two panels (or one) beside STREAM_DEPTH streamed tiles
        ranges = plan.panels(gemm.n if plan.resident == "b" else gemm.m, True)
        live = max([w for _, w in ranges] + [a[1] + b[1] for a, b in zip(ranges, ranges[1:])])
        k_tiles = -(-gemm.k // 128)
        assert (live + 2 * plan.tile(plan.streamed)) * k_tiles * dtype_bytes <= \
            hw.sbuf_bytes_per_partition - matmul_plan.SBUF_RESERVE


def test_orientation_puts_the_wider_side_on_partitions():
    assert choose_orientation(gemm_of_shapes((512, 256), (256, 512))) == "m"          # a tie: m
    assert choose_orientation(gemm_of_shapes((16, 256), (256, 1024))) == "n"          # 16 rows would idle the PE
    assert choose_orientation(gemm_of_shapes((1024, 256), (256, 16))) == "m"


# Explicit plans on small shapes (K = 200: one full and one partial k-tile), so every emission path runs
# whatever the planner would choose for them.
PLANS = [
    ((300, 200), (200, 700), Plan("m", 128, 128, "b", 256, True)),     # b panels after a ramp, narrow last
    ((300, 200), (200, 700), Plan("n", 256, 128, "b", 256, True)),
    ((300, 200), (200, 700), Plan("m", 128, 256, "a", 256, True)),     # a panels
    ((300, 200), (200, 700), Plan("n", 128, 128, "a", 128, False)),
    ((300, 200), (200, 700), Plan("m", 128, 512, "", 0)),              # streamed
    ((300, 200), (200, 700), Plan("n", 512, 128, "", 0)),
    ((3, 100, 200), (3, 200, 300), Plan("m", 128, 128, "b", 128, True)),   # a panel per batch group
    ((2, 1, 100, 200), (1, 3, 200, 300), Plan("n", 128, 128, "a", 128, False)),
]


@pytest.mark.parametrize("a_shape,b_shape,plan", PLANS)
def test_emission_paths(monkeypatch, a_shape, b_shape, plan):
    """Every plan with an epilogue of a per-column bias and a full residual: the operands of each block
    (shared by a panel's steps or per step, full or narrower sub-tiles) meet the right output elements."""
    monkeypatch.setattr(matmul, "make_plan", lambda *args: plan)
    a_np, b_np = randn(*a_shape), randn(*b_shape)
    a, b = harness.inp(0, a_shape, F32), harness.inp(1, b_shape, F32)
    mm = matmul_node(a, b)
    bias_np, r_np = randn(mm.shape[-1]), randn(*mm.shape)
    bias, r = harness.inp(2, bias_np.shape, F32), harness.inp(3, r_np.shape, F32)
    biased = node("binary", [mm, bias], mm.shape, op="add")
    res = node("binary", [biased, r], mm.shape, op="add")
    out, _ = run([a, b, bias, r], [a_np, b_np, bias_np, r_np], [mm, biased, res], compute=BF16,
                 partition_dim=plan.orientation)
    a64, b64 = as_seen(a_np, BF16), as_seen(b_np, BF16)
    exact = np.matmul(a64, b64)
    n = a_shape[-1]     # the accumulation bound (as in check) plus a rounding for each of the two adds
    bound = n * U / (1 - n * U) * np.matmul(np.abs(a64), np.abs(b64)) + 4 * U * (np.abs(exact) + np.abs(bias_np) +
                                                                                 np.abs(r_np))
    assert np.all(np.abs(out - (exact + bias_np + r_np)) <= bound)


def store_ranges(state) -> list[tuple[int, int]]:
    out_index = state.program.tensor_index(state.tiles.outputs[0])
    return sorted(i["dst"].byte_range() for i in state.program.instructions
                  if i.opcode == "dma_copy" and i["dst"].tensor == out_index)


@pytest.mark.parametrize("plan", [Plan("m", 128, 128, "b", 768, False), Plan("n", 128, 128, "b", 768, False),
                                  Plan("m", 128, 128, "a", 384, False), Plan("n", 128, 128, "a", 384, False)])
def test_stores_in_pieces_of_whole_rows(monkeypatch, plan):
    """Each block's output tile is stored in pieces of whole rows of M (small ones here, so there are many):
    every element lands where it belongs, and no two stores write the same byte. With M on the partitions
    the pieces of different blocks write disjoint rows or columns (the scheduler runs them side by side)."""
    monkeypatch.setattr(matmul, "STORE_BYTES", 4096)
    monkeypatch.setattr(matmul, "TAIL_BYTES", 2048)
    monkeypatch.setattr(matmul, "make_plan", lambda *args: plan)
    a_np, b_np = randn(300, 200), randn(200, 768)
    a, b = harness.inp(0, a_np.shape, F32), harness.inp(1, b_np.shape, F32)
    out, state = run([a, b], [a_np, b_np], [matmul_node(a, b)], compute=BF16, partition_dim=plan.orientation)
    check(out, a_np, b_np, BF16)
    out_index = state.program.tensor_index(state.tiles.outputs[0])
    stores = [i["dst"] for i in state.program.instructions if i.opcode == "dma_copy" and i["dst"].tensor == out_index]
    assert sum(d.num_bytes for d in stores) == out.nbytes
    assert len(stores) > -(-300 // 128) * 768 // 128       # more pieces than output tiles
    if plan.orientation == "m":
        boxes = [footprint(d) for d in stores]
        assert not any(footprints_overlap(x, y) for x, y in itertools.combinations(boxes, 2))


def transformer_program(orientation: str):
    """BERT-base's FFN up-projection with its bias, [512, 768] @ [768, 3072] in bf16, compiled (not run)."""
    x, w, bias = harness.inp(0, (512, 768), BF16), harness.inp(1, (768, 3072), BF16), harness.inp(2, (3072,), BF16)
    mm = matmul_node(x, w, BF16)
    biased = node("binary", [mm, bias], mm.shape, BF16, op="add")
    return harness.compile_kernels([x, w, bias], [ir.Kernel("matmul", [mm, biased], compute_dtype=BF16,
                                                            partition_dim=orientation)])


@pytest.mark.parametrize("orientation", ["m", "n"])
def test_load_dmas_carry_several_k_tiles(orientation):
    """On a transformer-sized GEMM the loads coalesce k-tiles: the kernel's first wave of DMAs (one per queue)
    is small, so TensorE starts early; after it nearly all bytes move in DMAs of DMA_MIN or more, none above
    DMA_MAX, and each operand byte is loaded once (x 768 KiB, w 4.5 MiB)."""
    state = transformer_program(orientation)
    ins = state.program.instructions
    x_index, w_index = state.program.tensor_index("in0"), state.program.tensor_index("in1")
    loads = [i["dst"].num_bytes for i in ins if i.opcode == "dma_copy" and i["src"].tensor in (x_index, w_index)]
    assert sum(loads) == (512 * 768 + 768 * 3072) * 2
    assert max(loads[:DMA_QUEUES]) <= matmul.DMA_FIRST and max(loads) <= matmul.DMA_MAX
    later = loads[DMA_QUEUES:]
    assert sum(b for b in later if b >= matmul.DMA_MIN) >= 0.9 * sum(later)
    assert len(loads) <= 2 * DMA_QUEUES + sum(later) // matmul.DMA_MIN


def test_blocks_accumulate_k_outermost():
    """Sub-tiles go by in blocks of BLOCK_TILES PSUM banks filled k-tile by k-tile: each block's first
    matmuls start BLOCK_TILES groups, the next ones add the second k-tile to the same groups."""
    state = transformer_program("n")
    mms = [i for i in state.program.instructions if i.opcode == "matmul"]
    block = matmul_plan.BLOCK_TILES
    first = [(i["dst"].offset, i["accumulate"]) for i in mms[:2 * block]]
    assert [acc for _, acc in first] == [False] * block + [True] * block
    assert len({off for off, _ in first[:block]}) == block and [o for o, _ in first[block:]] == \
        [o for o, _ in first[:block]]


def test_candidates_put_a_per_feature_bias_on_the_partitions():
    """The layout pass keeps the first of equal estimates: with equal TensorE cycles, the orientation that
    makes the bias a per-partition operand comes first; otherwise the one with fewer cycles."""
    x, w, bias = harness.inp(0, (512, 256), F32), harness.inp(1, (256, 512), F32), harness.inp(2, (512,), F32)
    mm = matmul_node(x, w)
    biased = node("binary", [mm, bias], mm.shape, op="add")
    assert matmul.candidates(ir.Kernel("matmul", [mm, biased])) == ["n", "m"]
    assert matmul.candidates(ir.Kernel("matmul", [mm])) == ["m", "n"]
    narrow = harness.inp(0, (16, 256), F32)
    assert matmul.candidates(ir.Kernel("matmul", [matmul_node(narrow, w)]))[0] == "n"


def test_long_contraction_streams_within_sbuf():
    """K = 65536 leaves no room for a resident panel: both operands stream in k chunks loaded a little ahead
    of their matmuls, so the kernel fits in SBUF (allocate raises when it does not)."""
    a, b = harness.inp(0, (128, 65536), BF16), harness.inp(1, (65536, 128), BF16)
    state = harness.compile_kernels([a, b], [ir.Kernel("matmul", [matmul_node(a, b, BF16)], compute_dtype=BF16)])
    assert sum(1 for i in state.program.instructions if i.opcode == "matmul") == 65536 // 128


def test_rejects_integer_operands_and_unknown_layouts():
    a, b = harness.inp(0, (4, 8), I32), harness.inp(1, (8, 4), I32)
    with pytest.raises(UnsupportedOpError, match="int32"):
        harness.compile_kernels([a, b], [ir.Kernel("matmul", [matmul_node(a, b, I32)])])
    a, b = harness.inp(0, (4, 8), F32), harness.inp(1, (8, 4), F32)
    with pytest.raises(UnsupportedOpError, match="partition_dim"):
        harness.compile_kernels([a, b], [ir.Kernel("matmul", [matmul_node(a, b)], partition_dim="k")])
    assert matmul.candidates(ir.Kernel("matmul", [matmul_node(a, b)])) == ["m", "n"]
