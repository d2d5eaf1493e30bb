"""The prefetch pass (passes/tile/prefetch.py): convolutions' weight loads move back past earlier kernels, the
program computes the same bits, other kernels' loads stay, and an order allocate cannot fit is undone."""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

import harness
from test_kernel_conv import _chain, ints
from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.plan import PlanKernels
from trnc.passes.tile import prefetch
from trnc.passes.tile.lower import LowerToTiles

F32 = DType.FP32
RNG = np.random.default_rng(5)


def _layers():
    return [((8, 3, 3, 16), dict(padding=(1, 1, 1, 1)), None), ((16, 1, 1, 16), {}, None),
            ((16, 3, 3, 16), dict(padding=(1, 1, 1, 1)), None), ((16, 1, 1, 8), {}, None)]


def _tiles(inputs, kernels):
    state = harness.compile_kernels(inputs, kernels)      # the whole pipeline once, for the graph and plans
    fresh = dataclasses.replace(state, tiles=None, instructions=None, program=None)
    for p in (PlanKernels(), LowerToTiles()):
        p.run(fresh)
    return fresh


def test_weight_loads_move_back_and_the_results_stay_exact():
    x_arr = ints(1, 8, 6, 6, low=-1, high=2)
    inputs, kernels, refs = _chain(x_arr, _layers())
    state = _tiles(inputs, kernels)
    before = [(ins.kernel, ins.opcode) for ins in state.tiles.instrs]
    stats = prefetch.prefetch(state.tiles, [k.kind for k in state.graph.kernels])
    after = [(ins.kernel, ins.opcode) for ins in state.tiles.instrs]
    assert stats["loads_moved"] > 0 and Counter(before) == Counter(after) and before != after
    moved = [i for i, (k, op) in enumerate(after) if k == "k3" and op == "dma_copy"]
    assert moved[0] < after.index(("k2", "matmul"))      # the last conv's weights load before k2 computes
    (got,), _ = harness.compile_and_run(inputs, kernels, [x_arr])
    np.testing.assert_array_equal(got, refs[-1])


def test_kernels_whose_kind_does_not_ask_keep_their_order():
    a = harness.inp(0, (64, 64), F32)
    w1, w2 = (harness.const(RNG.standard_normal((64, 64)).astype(np.float32), F32) for _ in range(2))
    m1 = ir.Node("matmul", (a, w1), (64, 64), F32)
    m2 = ir.Node("matmul", (m1, w2), (64, 64), F32)
    state = _tiles([a], [ir.Kernel("matmul", [m1], compute_dtype=F32), ir.Kernel("matmul", [m2], compute_dtype=F32)])
    before = list(state.tiles.instrs)
    assert prefetch.prefetch(state.tiles, ["matmul", "matmul"])["loads_moved"] == 0
    assert state.tiles.instrs == before


def test_an_order_allocate_cannot_fit_is_undone(monkeypatch):
    x_arr = ints(1, 8, 6, 6, low=-1, high=2)
    inputs, kernels, _ = _chain(x_arr, _layers())
    state = _tiles(inputs, kernels)
    peak = max(prefetch._kernel_peaks(state.tiles, [list(range(len(state.tiles.instrs)))]))
    # an SBUF just large enough for the kernels as they are, and a share that lets every load move anyway
    state.tiles.hw = dataclasses.replace(state.tiles.hw, sbuf_bytes_per_partition=peak + 64)
    monkeypatch.setattr(prefetch, "PREFETCH_SHARE", 100.0)
    before = list(state.tiles.instrs)
    stats = prefetch.prefetch(state.tiles, [k.kind for k in state.graph.kernels])
    assert stats == {"kernels_prefetched": 0, "loads_moved": 0, "undone_sbuf_full": 1}
    assert state.tiles.instrs == before
