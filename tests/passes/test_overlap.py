"""How kernels overlap: the schedule's gap filling, feature-major storage between matmuls, row-tiled matmul plans."""
from __future__ import annotations

import numpy as np

import harness
from trnc import ir
from trnc.isa.ap import Engine, Mem
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.isa.program import TensorKind
from trnc.passes.tile.allocate import Allocate
from trnc.passes.tile.emit import Emit
from trnc.passes.tile.kernels.matmul_plan import Gemm, make_plan
from trnc.options import Options
from trnc.passes.pipeline import CompileState
from trnc.passes.tile.schedule import Schedule
from trnc.passes.tile.tiles import HbmView, TileBuilder, TileProgram, contiguous_strides
from trnc.runtime import perf

F32 = DType.FP32
RNG = np.random.default_rng(5)


def _view(shape, tensor=0) -> HbmView:
    return HbmView(tensor, DType.BF16, shape, contiguous_strides(shape))


def test_a_ready_instruction_fills_the_gap_before_a_waiting_one():
    """GpSimdE's first instruction waits for a 256 KiB load (~11 us); an independent memset after it in
    program order runs in that gap, ahead of it in GpSimdE's queue, and the program still verifies."""
    hw = get_target("trn2")
    tp = TileProgram(hw)
    kb = TileBuilder(tp, "k")
    src = kb.tensor("src", TensorKind.INPUT, F32, (128, 512))
    kb.tensor("dst", TensorKind.OUTPUT, F32, (128, 512))
    tp.inputs.append("src")
    tp.outputs.append("dst")
    big = kb.sbuf("big", F32, 128, (512,))
    other = kb.sbuf("other", F32, 128, (2048,))
    kb.dma(big, src.box_ap(0, ((0, 128), (0, 512))))
    waiting = kb.emit("memset", (Engine.POOL,), dst=big, value=1.0)
    ready = kb.emit("memset", (Engine.POOL,), dst=other, value=2.0)
    out = HbmView(1, F32, (128, 512), (512, 1))
    kb.dma(out.box_ap(0, ((0, 128), (0, 512))), big)
    state = CompileState(ir.Graph([], [], []), Options(), hw)
    state.tiles = tp
    for p in (Allocate(), Schedule(), Emit()):
        p.run(state)
    pool = [i for i in state.program.instructions if i.engine is Engine.POOL]
    assert [i["value"] for i in pool] == [ready.fields["value"], waiting.fields["value"]]
    report = perf.simulate(state.program, hw, verified=True)
    load = next(i for i in state.program.instructions if i.engine is Engine.DMA and i["dst"].mem is Mem.SBUF)
    memset = state.program.instructions.index(pool[0])
    assert report.timeline.start[memset] < report.timeline.end[state.program.instructions.index(load)]


def _mlp(m: int, k: int, h: int, n: int):
    x = harness.inp(0, (m, k), F32)
    w1 = harness.const(RNG.standard_normal((k, h)) / np.sqrt(k), F32)
    w2 = harness.const(RNG.standard_normal((h, n)) / np.sqrt(h), F32)
    mid = ir.Node("matmul", (x, w1), (m, h), F32, {})
    out = ir.Node("matmul", (mid, w2), (m, n), F32, {})
    kernels = [ir.Kernel("matmul", [mid], partition_dim="n"), ir.Kernel("matmul", [out], partition_dim="n")]
    return [x], kernels, (w1, w2)


def test_matmul_to_matmul_values_are_stored_feature_major():
    """Between two matmuls with N on the partitions the intermediate is an [N, M] tensor, written and read as
    whole rows (partition stride M); the model output keeps its own layout; the result is the product."""
    m, k, h, n = 256, 64, 192, 96
    inputs, kernels, (w1, w2) = _mlp(m, k, h, n)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    (got,), state = harness.compile_and_run(inputs, kernels, [x])
    tensors = {t.name: (i, t) for i, t in enumerate(state.tiles.tensors)}
    mid = [(i, t) for name, (i, t) in tensors.items() if name.endswith("_t")]
    assert len(mid) == 1 and mid[0][1].shape == (h, m)
    assert tensors["out0"][1].shape == (m, n)
    index = mid[0][0]
    touching = [ap for ins in state.program.instructions if ins.engine is Engine.DMA
                for _, ap, _ in ins.operands() if ap.mem is Mem.HBM and ap.tensor == index]
    assert touching and all(ap.partition_stride == m for ap in touching)
    ref = (x.astype(np.float64) @ w1.attrs["value"]) @ w2.attrs["value"]
    assert harness.rel_err(got, ref) <= 1e-5


def test_row_tiled_plans_stream_128_rows_without_a_ramp():
    """Next to a row-wise kernel a matmul with M moving streams M in 128-row tiles (each step one row tile),
    where on its own it takes the widest moving tile."""
    hw = get_target("trn2")
    gemm = Gemm(_view((512, 3072)), _view((3072, 768), 1), _view((512, 768), 2), {})
    alone = make_plan(gemm, "n", 2, hw)
    near_rows = make_plan(gemm, "n", 2, hw, True)
    assert alone.m_tile == 512 and not alone.row_tiles
    assert near_rows.m_tile == 128 and near_rows.row_tiles and not near_rows.ramp
    assert near_rows.resident == "b" and near_rows.panel == 768
