"""The kept buffers of a JitProgram are cleared only where a run may read before writing (runtime/jit/clearing.py):
every run of one loaded program must still see zeros wherever a fresh reference machine would."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from aps import hbm, onchip
from strategies import valid_programs
from test_jit_program import assert_same_outputs, inputs_for, outcome
from trnc.isa import DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind
from trnc.runtime import reference
from trnc.runtime.jit import clearing
from trnc.runtime.jit.executor import load, on_chip_memories

pytestmark = pytest.mark.usefixtures("private_cache")

F32 = DType.FP32


def accumulating_program() -> Program:
    """A matmul that accumulates into PSUM nothing wrote (it reads zeros), and a tile read before the
    instruction that writes it; both results go out, so stale bytes from the run before would show."""
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, (4, 4)), TensorDecl("y", TensorKind.OUTPUT, F32, (4, 4)),
               TensorDecl("z", TensorKind.OUTPUT, F32, (4, 4)))
    x, late, y = onchip(F32, (4, 4)), onchip(F32, (4, 4), offset=256), onchip(F32, (4, 4), offset=512)
    acc = onchip(F32, (4, 4), mem=Mem.PSUM)
    return Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=x, src=hbm(0, F32, (4, 4)), signals=(0,)),
        Instruction.make("matmul", Engine.PE, dst=acc, stationary=x, moving=x, accumulate=True, waits=((0, 1),),
                         signals=(1,)),
        Instruction.make("tensor_copy", Engine.DVE, dst=y, src=acc, waits=((1, 1),), signals=(2,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=hbm(1, F32, (4, 4)), src=y, waits=((2, 1),),
                         signals=(3,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=hbm(2, F32, (4, 4)), src=late, signals=(3,)),
        Instruction.make("dma_copy", Engine.DMA, queue=2, dst=late, src=x, waits=((3, 2),))))


def test_reads_before_writes_are_planned_and_accumulated_dst_counts_as_read():
    program = accumulating_program()
    jp = load(program)
    sbuf, psum = on_chip_memories(jp.hw)
    plan = clearing.clear_plan(program, jp.table, jp.order, (sbuf.shape, psum.shape))
    assert sorted(plan) == [(0, 0, 4, 256, 272), (1, 0, 4, 0, 16)]   # the late tile; PSUM, read by accumulating
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    want = reference.run(program, {"x": x})
    for _ in range(3):
        got = jp.run({"x": x})
        assert np.array_equal(got["y"], want["y"]) and np.array_equal(got["z"], want["z"])
        assert np.array_equal(got["y"], x.T @ x) and (got["z"] == 0).all()


def test_a_run_after_a_nan_filled_one_clears_everything_again():
    program = accumulating_program()
    jp = load(program)
    x = np.ones((4, 4), dtype=np.float32)
    jp.run({"x": x})
    assert np.isnan(jp.run({"x": x}, fill_nan=True)["z"]).all()
    got = jp.run({"x": x})
    assert (got["z"] == 0).all() and (got["y"] == 4).all()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs(max_instructions=8))
def test_every_run_of_one_loaded_program_matches_a_fresh_reference(program):
    """Random programs read much memory nothing wrote; runs with new inputs, and after a NaN-filled run, of one
    JitProgram each agree with the reference from a zeroed machine."""
    jp = load(program)
    for seed, fill_nan in ((0, False), (1, False), (2, True), (0, False), (1, False)):
        inputs = inputs_for(program, seed)
        got = outcome(lambda p, i, **kw: jp.run(i, **kw), program, inputs, fill_nan=fill_nan)
        if not fill_nan:
            assert_same_outputs(got, outcome(reference.run, program, inputs), program)
