"""A matmul result kept in SBUF for the next kernel (plan.py keeps_features_on_chip, hands_rows_on_chip): no HBM traffic,
the same result."""
from __future__ import annotations

import numpy as np

import harness
from trnc import ir
from trnc.isa.ap import Engine, Mem
from trnc.isa.dtypes import DType

F32, BF16 = DType.FP32, DType.BF16
RNG = np.random.default_rng(11)


def _mlp(m: int, k: int, h: int, n: int, dtype: DType):
    x = harness.inp(0, (m, k), dtype)
    w1 = harness.const(RNG.standard_normal((k, h)) / np.sqrt(k), dtype)
    bias = harness.const(RNG.standard_normal(h), dtype)
    w2 = harness.const(RNG.standard_normal((h, n)) / np.sqrt(h), dtype)
    mm = ir.Node("matmul", (x, w1), (m, h), dtype, {})
    biased = ir.Node("binary", (mm, bias), (m, h), dtype, {"op": "add"})
    mid = ir.Node("unary", (biased,), (m, h), dtype, {"func": "relu"})
    out = ir.Node("matmul", (mid, w2), (m, n), dtype, {})
    kernels = [ir.Kernel("matmul", [mm, biased, mid], partition_dim="n"),
               ir.Kernel("matmul", [out], partition_dim="n")]
    return [x], kernels, (w1, bias, w2)


def _hbm_touches(state, name: str) -> int:
    """DMA operands on the program's HBM tensor `name` (0 when emit dropped it as an unused scratch tensor)."""
    index = [i for i, t in enumerate(state.program.tensors) if t.name == name]
    return sum(1 for ins in state.program.instructions if ins.engine is Engine.DMA
               for _, ap, _ in ins.operands() if ap.mem is Mem.HBM and ap.tensor in index)


def _unused_tensors(state) -> list[str]:
    used = {ap.tensor for ins in state.program.instructions for _, ap, _ in ins.operands() if ap.mem is Mem.HBM}
    return [t.name for i, t in enumerate(state.program.tensors) if i not in used]


def _reference(x, w1, bias, w2, dtype: DType) -> np.ndarray:
    """The two matmuls in float64 with the intermediate rounded to `dtype`, as the kernel stores it."""
    mid = np.maximum(x.astype(np.float64) @ w1.attrs["value"].astype(np.float64) + bias.attrs["value"], 0)
    mid = mid.astype(dtype.storage).astype(np.float64)
    return mid @ w2.attrs["value"].astype(np.float64)


def test_a_value_read_only_by_the_next_matmul_stays_in_sbuf():
    """The [h, m] intermediate (h a multiple of 128) is neither stored nor loaded; the result is the product."""
    m, k, h, n = 256, 128, 384, 96
    inputs, kernels, weights = _mlp(m, k, h, n, F32)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    (got,), state = harness.compile_and_run(inputs, kernels, [x])
    tensors = {t.name: i for i, t in enumerate(state.tiles.tensors)}
    mid = [i for name, i in tensors.items() if name.endswith("_t")]
    assert len(mid) == 1 and list(state.tiles.kept) == mid
    name = state.tiles.tensors[mid[0]].name
    assert _hbm_touches(state, name) == 0
    assert name not in [t.name for t in state.program.tensors]   # emit drops its unused HBM declaration
    assert _unused_tensors(state) == []
    assert harness.rel_err(got, _reference(x, *weights, F32)) <= 1e-5


def test_bf16_kept_value_matches_and_a_ragged_one_goes_through_hbm():
    """bf16 (the BERT case) keeps the value on chip with the same result; with h not a multiple of 128 the
    value goes to HBM as before (feature-major rows), and both programs compute the same product."""
    m, k, n = 256, 128, 128
    for h, kept in ((256, True), (192, False)):
        inputs, kernels, weights = _mlp(m, k, h, n, BF16)
        x = RNG.standard_normal((m, k)).astype(BF16.storage)
        (got,), state = harness.compile_and_run(inputs, kernels, [x])
        name = [t.name for t in state.tiles.tensors if t.name.endswith("_t")][0]
        assert bool(state.tiles.kept) == kept
        assert (_hbm_touches(state, name) == 0) == kept
        assert _unused_tensors(state) == []
        assert harness.rel_err(got.astype(np.float64), _reference(x, *weights, BF16)) <= 1e-2


def _linear_norm(m: int, k: int, n: int):
    """x @ w + bias + residual, then a layer norm: the out-projection and layer norm of a transformer."""
    x, res = harness.inp(0, (m, k), F32), harness.inp(1, (m, n), F32)
    w = harness.const(RNG.standard_normal((k, n)) / np.sqrt(k), F32)
    bias, lw, lb = (harness.const(RNG.standard_normal(n), F32) for _ in range(3))
    mm = ir.Node("matmul", (x, w), (m, n), F32, {})
    biased = ir.Node("binary", (mm, bias), (m, n), F32, {"op": "add"})
    summed = ir.Node("binary", (biased, res), (m, n), F32, {"op": "add"})
    ln = ir.Node("layer_norm", (summed, lw, lb), (m, n), F32, {"eps": 1e-5, "has_weight": True, "has_bias": True})
    kernels = [ir.Kernel("matmul", [mm, biased, summed], partition_dim="m"), ir.Kernel("layer_norm", [ln])]
    return [x, res], kernels, (w, bias, lw, lb)


def _norm_reference(x, res, w, bias, lw, lb) -> np.ndarray:
    h = x.astype(np.float64) @ w.attrs["value"] + bias.attrs["value"] + res
    norm = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    return norm * lw.attrs["value"] + lb.attrs["value"]


def test_rows_a_layer_norm_reads_stay_in_sbuf():
    """With tokens on the partitions, the matmul evacuates each 128-row tile into SBUF and the layer norm
    reads it there: the [m, n] sum is neither stored nor loaded. With m not a multiple of 128 it goes through
    HBM as before. Both agree with float64 within fp32 accumulation error."""
    for m, kept in ((256, True), (200, False)):
        inputs, kernels, params = _linear_norm(m, 96, 160)
        x, res = (RNG.standard_normal((m, c)).astype(np.float32) for c in (96, 160))
        (got,), state = harness.compile_and_run(inputs, kernels, [x, res])
        name = [t.name for t in state.tiles.tensors if t.name.startswith("t_")][0]
        assert bool(state.tiles.kept) == kept
        assert (_hbm_touches(state, name) == 0) == kept
        assert harness.rel_err(got, _norm_reference(x, res, *params)) <= 1e-5


def test_rows_a_softmax_reads_stay_in_sbuf():
    """The same hand-over to a softmax (scores of an unfused attention): kept, and the softmax of the product."""
    m, k, n = 256, 64, 200
    x = harness.inp(0, (m, k), F32)
    w = harness.const(RNG.standard_normal((k, n)) / np.sqrt(k), F32)
    mm = ir.Node("matmul", (x, w), (m, n), F32, {})
    sm = ir.Node("softmax", (mm,), (m, n), F32, {})
    kernels = [ir.Kernel("matmul", [mm], partition_dim="m"), ir.Kernel("softmax", [sm])]
    a = RNG.standard_normal((m, k)).astype(np.float32)
    (got,), state = harness.compile_and_run([x], kernels, [a])
    assert len(state.tiles.kept) == 1
    scores = a.astype(np.float64) @ w.attrs["value"]
    ref = np.exp(scores - scores.max(-1, keepdims=True))
    assert harness.rel_err(got, ref / ref.sum(-1, keepdims=True)) <= 1e-5


def test_plan_puts_tokens_on_the_partitions_when_rows_can_stay_on_chip():
    """The plan gives such a matmul "m" (tokens on the partitions) and keeps its rows when they fit in
    KEEP_BYTES per partition, whatever layout chose, and leaves layout's choice when they do not."""
    from trnc.passes.graph.plan import KEEP_BYTES, plan_kernels
    for m, n, fits in ((512, 768, True), (128 * 12, 768, False)):
        assert (m // 128 * n * 4 <= KEEP_BYTES) == fits
        inputs, kernels, _ = _linear_norm(m, 64, n)
        kernels[0].partition_dim = "n"
        nodes = [nd for k in kernels for nd in k.nodes]
        consts = [i for nd in nodes for i in nd.inputs if i.op == "const"]
        graph = ir.Graph(inputs + consts + nodes, inputs, [kernels[-1].output], kernels=kernels)
        stats = plan_kernels(graph)
        ir.verify(graph)
        assert stats["rows_on_chip"] == fits and kernels[0].plan.keep == fits
        assert kernels[0].plan.partition_dim == ("m" if fits else "n") and kernels[0].partition_dim == "n"


def _norm_linear(m: int, c: int, n: int, dtype: DType):
    """A layer norm read by the next matmul as its `a` operand (LN1 -> FFN1), the norm also a model output."""
    x = harness.inp(0, (m, c), F32)
    lw, lb = (harness.const(RNG.standard_normal(c), F32) for _ in range(2))
    w = harness.const(RNG.standard_normal((c, n)) / np.sqrt(c), dtype)
    ln = ir.Node("layer_norm", (x, lw, lb), (m, c), dtype, {"eps": 1e-5, "has_weight": True, "has_bias": True})
    mm = ir.Node("matmul", (ln, w), (m, n), F32, {})
    kernels = [ir.Kernel("layer_norm", [ln]), ir.Kernel("matmul", [mm], partition_dim="n", compute_dtype=dtype)]
    return [x], kernels, (lw, lb, w)


def test_a_layer_norm_leaves_the_next_matmul_its_transpose_in_sbuf():
    """The matmul reads its `a` operand from the layer norm's transposed SBUF copy (its HBM tensor is only
    written, for the other reader); both copies hold the same values: the matmul's result equals the
    product of the stored norm, in fp32 and bf16. With rows not a multiple of 128 there is no copy."""
    for m, dtype, kept in ((256, F32, True), (256, BF16, True), (200, F32, False)):
        inputs, kernels, (lw, lb, w) = _norm_linear(m, 256, 96, dtype)
        x = RNG.standard_normal((m, 256)).astype(np.float32)
        (norm, got), state = harness.compile_and_run(inputs, kernels, [x], outputs=[k.output for k in kernels])
        assert bool(state.tiles.transposed) == kept
        index = [t.name for t in state.program.tensors].index("out0")
        loads = sum(1 for ins in state.program.instructions for _, ap, write in ins.operands()
                    if not write and ap.mem is Mem.HBM and ap.tensor == index)
        assert (loads == 0) == kept                 # no DMA reads the norm back from HBM
        product = norm.astype(np.float64) @ w.attrs["value"].astype(np.float64)
        assert harness.rel_err(got, product) <= 1e-6   # fp32 accumulation of the same operands
        h = x.astype(np.float64)
        ref = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
        ref = ref * lw.attrs["value"] + lb.attrs["value"]
        assert harness.rel_err(norm, ref) <= (1e-5 if dtype is F32 else 2.0 ** -8)
