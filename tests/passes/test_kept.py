"""A matmul result kept in SBUF for the next matmul (tile.py keep_on_chip): no HBM traffic, the same result."""
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
