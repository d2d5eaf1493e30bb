"""The tile pass on small graphs (what it stores where, what it registers from the plan) and the tile-level
verifier on hand-built tile programs that break one rule each."""
from dataclasses import replace

import numpy as np
import pytest

import harness
from trnc import ir
from trnc.errors import TrncError, VerifyError
from trnc.isa.ap import Engine
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc
from trnc.isa.program import TensorKind
from trnc.passes.tile.allocate import Allocate
from trnc.options import Options
from trnc.passes.pipeline import CompileState
from trnc.passes.graph.plan import PlanKernels
from trnc.passes.tile.lower import LowerToTiles
from trnc.passes.tile.tiles import Buffer, Tile, TileBuilder, TileProgram
from trnc.passes.tile.verify import check_tiles, verify_tiles

F32 = DType.FP32
HW = get_target("trn2")
RNG = np.random.default_rng(5)


def _two_matmuls(h: int, second_reads_as: str = "a"):
    """x [256, 64] @ w1 [64, h] -> mid, then mid @ w2 (or w2' @ mid): two kernels with N on the partitions."""
    x = harness.inp(0, (256, 64), F32)
    w1 = harness.const(RNG.standard_normal((64, h)), F32)
    mid = ir.Node("matmul", (x, w1), (256, h), F32, {})
    if second_reads_as == "a":
        w2 = harness.const(RNG.standard_normal((h, 32)), F32)
        out = ir.Node("matmul", (mid, w2), (256, 32), F32, {})
    else:
        w2 = harness.const(RNG.standard_normal((32, 256)), F32)
        out = ir.Node("matmul", (w2, mid), (32, h), F32, {})
    return [x], [ir.Kernel("matmul", [mid], partition_dim="n"), ir.Kernel("matmul", [out], partition_dim="n")]


def _tiled(inputs, kernels, plan=True) -> CompileState:
    nodes = [n for k in kernels for n in k.nodes]
    consts = sorted({i for n in nodes for i in n.inputs if i.op == "const"}, key=lambda n: n.name)
    graph = ir.Graph(inputs + consts + nodes, inputs, [kernels[-1].output], kernels=kernels)
    state = CompileState(graph, Options(), HW)
    if plan:
        PlanKernels().run(state)
    LowerToTiles().run(state)
    return state


def test_a_kept_result_is_registered_from_the_plan_and_has_no_hbm_traffic():
    state = _tiled(*_two_matmuls(256))
    first = state.graph.kernels[0]
    assert first.plan.keep and first.plan.feature_major
    (tensor, tile), = state.tiles.kept.items()
    decl = state.tiles.tensors[tensor]
    assert decl.shape == (256, 256) and tile.shape == (128, 2, 256)   # [N, M] feature-major, N on partitions
    assert check_tiles(state.tiles, state.graph) == []


def test_no_hand_over_when_the_plan_has_none():
    """N not a multiple of 128: no keep, but still stored feature-major ([N, M]) for the next matmul."""
    state = _tiled(*_two_matmuls(192))
    assert not state.graph.kernels[0].plan.keep and not state.tiles.kept
    assert [t.shape for t in state.tiles.tensors if t.name.endswith("_t")] == [(192, 256)]


def test_a_result_read_as_the_weight_is_stored_as_is():
    state = _tiled(*_two_matmuls(256, second_reads_as="b"))
    plan = state.graph.kernels[0].plan
    assert not plan.keep and plan.feature_major   # a matmul reads it, with N on the partitions
    assert not state.tiles.kept


def test_tile_refuses_kernels_without_a_plan():
    with pytest.raises(TrncError, match="run the plan pass before tile"):
        _tiled(*_two_matmuls(256), plan=False)


def test_the_verifier_finds_a_kept_tile_its_kernel_did_not_plan():
    state = _tiled(*_two_matmuls(256))
    first = state.graph.kernels[0]
    first.plan = replace(first.plan, keep=False)
    assert any("whose plan does not ask for it" in p for p in check_tiles(state.tiles, state.graph))


def test_the_verifier_passes_after_allocate_and_finds_a_buffer_beyond_sbuf():
    state = _tiled(*_two_matmuls(256))
    Allocate().run(state)
    verify_tiles(state.tiles, state.graph)
    state.tiles.buffers[0].offset = HW.sbuf_bytes_per_partition
    with pytest.raises(VerifyError, match="lies outside SBUF"):
        verify_tiles(state.tiles, state.graph)


def _program():
    """x -> SBUF -> exp -> out, one 128 x 64 tile; returns the program and its three tiles."""
    tp = TileProgram(HW)
    kb = TileBuilder(tp, "k0")
    x = kb.tensor("x", TensorKind.INPUT, F32, (128, 64))
    out = kb.tensor("out", TensorKind.OUTPUT, F32, (128, 64))
    a, b = kb.sbuf("a", F32, 128, (64,)), kb.sbuf("b", F32, 128, (64,))
    box = ((0, 128), (0, 64))
    kb.dma(a, x.box_ap(0, box))
    kb.emit("activation", (Engine.ACT,), dst=b, src=a, func=ActFunc.EXP)
    kb.dma(out.box_ap(0, box), b)
    return tp, kb, (x, out), (a, b)


def test_a_sound_hand_built_program_passes():
    tp, *_ = _program()
    assert check_tiles(tp) == []


def test_a_read_before_any_write_is_found():
    tp, kb, _, (a, b) = _program()
    c = kb.sbuf("c", F32, 128, (64,))
    kb.emit("tensor_copy", dst=b, src=c)
    assert [p for p in check_tiles(tp) if "src reads sbuf:k0.c@" in p and "before any instruction writes it" in p]


def test_tiles_outside_their_buffer_or_undeclared_are_found():
    tp, kb, _, (a, b) = _program()
    kb.emit("tensor_copy", dst=b, src=replace(a, offset=8))            # 8 bytes past the end of a's 256
    stray = Tile(Buffer("stray", a.buffer.mem, 256), F32, 128, ((1, 64),))
    kb.emit("tensor_copy", dst=stray, src=a)
    found = check_tiles(tp)
    assert any("touches bytes [8, 264) of" in p for p in found)
    assert any("which the program does not declare" in p for p in found)


def test_engines_that_cannot_reach_an_operand_and_shape_mismatches_are_found():
    tp, kb, _, (a, b) = _program()
    psum = kb.psum("p", 128, (64,))
    kb.emit("memset", dst=psum, value=0.0)
    kb.emit("tensor_copy", (Engine.POOL,), dst=b, src=psum)                  # GpSimdE cannot read PSUM
    kb.emit("tensor_copy", dst=b.narrow(1, 0, 32), src=a)                    # 32 columns from 64
    found = check_tiles(tp)
    assert any("out of reach" in p for p in found)
    assert any("src is 128 x 64, dst 128 x 32" in p for p in found)


def test_hbm_operands_beyond_their_tensor_or_in_another_dtype_are_found():
    tp, kb, (x, out), (a, b) = _program()
    whole = x.box_ap(0, ((0, 128), (0, 64)))
    kb.dma(a, replace(whole, offset=4))
    kb.dma(a, replace(whole, dtype=DType.INT32))
    found = check_tiles(tp)
    assert any("touches bytes [4, 32772) of x (32768 bytes)" in p for p in found)
    assert any("reads tensor x (fp32) as int32" in p for p in found)
