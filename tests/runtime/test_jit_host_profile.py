"""The host profile (runtime/jit/host_profile.py): every instruction timed once, faults as `run` reports them,
and later runs unchanged although the profiled run applies each step twice."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from aps import hbm, onchip
from strategies import valid_programs
from test_jit_program import assert_same_outputs, inputs_for, outcome
from trnc.errors import ExecutionError
from trnc.isa import DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind
from trnc.runtime.jit.executor import load

pytestmark = pytest.mark.usefixtures("private_cache")

F32, I32 = DType.FP32, DType.INT32


def accumulating_program() -> Program:
    """y = x^T x + x^T x, the second matmul accumulating into the first's PSUM tile, so that a step run twice
    adds twice."""
    shape = (32, 16)
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, shape), TensorDecl("y", TensorKind.OUTPUT, F32, (16, 16)))
    tile, acc, out = onchip(F32, shape), onchip(F32, (16, 16), mem=Mem.PSUM), onchip(F32, (16, 16), offset=1024)
    return Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=tile, src=hbm(0, F32, shape), signals=(0,)),
        Instruction.make("matmul", Engine.PE, dst=acc, stationary=tile, moving=tile, waits=((0, 1),)),
        Instruction.make("matmul", Engine.PE, dst=acc, stationary=tile, moving=tile, accumulate=True, signals=(1,)),
        Instruction.make("tensor_copy", Engine.ACT, dst=out, src=acc, waits=((1, 1),), signals=(2,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=hbm(1, F32, (16, 16)), src=out, waits=((2, 1),))))


def test_every_instruction_is_timed_once_and_the_table_sums_them():
    program = accumulating_program()
    jp = load(program)
    inputs = {"x": np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)}
    profile = jp.host_profile(inputs)
    n = len(program.instructions)
    assert profile.opcodes == tuple(str(ins.opcode) for ins in program.instructions)
    assert profile.seconds.shape == profile.again.shape == (n,)
    assert (profile.seconds >= 0).all() and (profile.again >= 0).all() and profile.total > 0
    rows = profile.by_opcode()
    assert {name: count for name, count, _, _ in rows} == collections.Counter(profile.opcodes)
    assert sum(seconds for _, _, seconds, _ in rows) == pytest.approx(profile.total)
    assert [seconds for _, _, seconds, _ in rows] == sorted((seconds for _, _, seconds, _ in rows), reverse=True)
    lines = profile.table().splitlines()
    assert lines[-1].split()[:2] == ["total", str(n)]
    assert {line.split()[0] for line in lines[1:-1]} == set(profile.opcodes)


def scratch_first_program() -> Program:
    """y = the scratch tensor s as the run finds it (zeros), then s = x: a run that saw the last run's s would
    return x."""
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, (2, 3)), TensorDecl("y", TensorKind.OUTPUT, F32, (2, 3)),
               TensorDecl("s", TensorKind.SCRATCH, F32, (2, 3)))
    tile = onchip(F32, (2, 3), offset=512)
    return Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=tile, src=hbm(2, F32, (2, 3)), signals=(0,)),
        Instruction.make("dma_copy", Engine.DMA, dst=hbm(1, F32, (2, 3)), src=tile, waits=((0, 1),), signals=(1,)),
        Instruction.make("dma_copy", Engine.DMA, dst=hbm(2, F32, (2, 3)), src=hbm(0, F32, (2, 3)),
                         waits=((1, 1),))))


@pytest.mark.parametrize("make", [accumulating_program, scratch_first_program])
def test_a_run_after_a_profile_gives_the_outputs_of_one_before(make):
    """The profiled run leaves other values in the kept buffers (each step applied twice); the next run must
    not see them."""
    program = make()
    jp = load(program)
    x = np.random.default_rng(1).standard_normal(program.tensors[0].shape).astype(np.float32)
    before = jp.run({"x": x})["y"]
    jp.host_profile({"x": x})
    assert np.array_equal(jp.run({"x": x})["y"], before)
    want = 2 * x.T.astype(np.float64) @ x if make is accumulating_program else np.zeros_like(x)
    assert np.allclose(before, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs(max_instructions=6))
def test_random_programs_run_the_same_after_a_profile(program):
    inputs = inputs_for(program, 0)
    jp = load(program)
    before = outcome(lambda p, x: jp.run(x), program, inputs)
    profiled = outcome(lambda p, x: jp.host_profile(x), program, inputs)
    if isinstance(before, str):   # a faulting program: the profile reports the run's fault
        assert profiled == before
    assert_same_outputs(outcome(lambda p, x: jp.run(x), program, inputs), before, program)


def test_a_fault_is_raised_as_the_run_raises_it():
    tensors = (TensorDecl("table", TensorKind.INPUT, F32, (6, 4)), TensorDecl("idx", TensorKind.INPUT, I32, (3, 1)))
    index_ap = onchip(I32, (3, 1), offset=256)
    program = Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=index_ap, src=hbm(1, I32, (3, 1)), signals=(0,)),
        Instruction.make("dma_gather", Engine.DMA, queue=1, dst=onchip(F32, (3, 4)), table=hbm(0, F32, (6, 4)),
                         index=index_ap, waits=((0, 1),))))
    inputs = {"table": np.zeros((6, 4), np.float32), "idx": np.array([[2], [6], [-1]], np.int32)}
    jp = load(program)
    with pytest.raises(ExecutionError) as want:
        jp.run(inputs)
    with pytest.raises(ExecutionError) as got:
        jp.host_profile(inputs)
    assert str(got.value) == str(want.value) and "instruction 1" in str(got.value)
