"""The JIT executor on whole programs: execution order, binding, outputs, faults, refusals and kernel counts."""
from __future__ import annotations

import os
import random
import re

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from aps import hbm, onchip
from strategies import valid_programs
from test_jit_ops import random_values
from trnc.errors import ExecutionError, TrncError, VerifyError
from trnc.isa import AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind
from trnc.isa.config import TARGETS
from trnc.isa.program import BOUND_KINDS
from trnc.isa.asm import format_instruction
from trnc.runtime import reference
from trnc.runtime.convert import bits_equal_or_both_nan
from trnc.runtime.jit import executor
from trnc.runtime.jit.cache import KernelCache
from trnc.runtime.jit.codegen import Codegen
from trnc.runtime.jit.executor import JitProgram, Kernels, load
from trnc.runtime.reference import execution_order
from trnc.runtime.jit.kernels import CACHE_LINE, LOWERINGS, KernelSig, build_kernel, layout_of, partition_pitch

pytestmark = pytest.mark.usefixtures("private_cache")

F32, BF16, I32 = DType.FP32, DType.BF16, DType.INT32


def inputs_for(program: Program, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: random_values(rng, t.dtype, t.num_elements).reshape(t.shape)
            for t in program.tensors if t.kind in BOUND_KINDS}


def outcome(run, program, inputs, **kw):
    """The outputs of a run, or the ExecutionError message it raised."""
    try:
        return run(program, inputs, **kw)
    except ExecutionError as e:
        return str(e)


def assert_same_outputs(got, want, program: Program) -> None:
    """Two runs' outcomes agree: the same error message, or every output bit for bit (a NaN matching any NaN)."""
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    assert set(got) == set(want)
    for t in program.tensors:
        if t.name in want:
            same = bits_equal_or_both_nan(got[t.name], want[t.name], t.dtype)
            assert same.all(), f"output {t.name} differs at {np.argwhere(~same)[0]}\n" + \
                "\n".join(format_instruction(i, program) for i in program.instructions)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs(max_instructions=6))
def test_whole_programs_match_the_reference(program):
    inputs = inputs_for(program, 0)
    assert_same_outputs(outcome(executor.run, program, inputs), outcome(reference.run, program, inputs), program)


def random_schedule(seed: int, n: int = 60) -> Program:
    """Instructions on random queues, each signalling its queue's semaphore and waiting on counts other queues
    reach earlier in list order (so list order is legal and there is no deadlock)."""
    rng = random.Random(seed)
    queues = [(Engine.DVE, 0), (Engine.POOL, 0), (Engine.ACT, 0), (Engine.DMA, 0), (Engine.DMA, 3)]
    signalled = [0] * len(queues)
    instrs = []
    for _ in range(n):
        q = rng.randrange(len(queues))
        engine, queue = queues[q]
        waits = tuple((o, rng.randint(1, signalled[o])) for o in range(len(queues))
                      if o != q and signalled[o] and rng.random() < 0.4)
        dst = onchip(F32, (1, 1), offset=4 * len(instrs))
        if engine is Engine.DMA:
            ins = Instruction.make("dma_copy", engine, queue=queue, dst=dst, src=onchip(F32, (1, 1), offset=100_000))
        elif engine is Engine.ACT:
            ins = Instruction.make("tensor_copy", engine, dst=dst, src=onchip(F32, (1, 1), offset=100_000))
        else:
            ins = Instruction.make("memset", engine, dst=dst, value=1.0)
        instrs.append(ins.replace(waits=waits, signals=(q,)))
        signalled[q] += 1
    return Program((), tuple(instrs))


def priority_order(program: Program) -> list[int]:
    """The rule written plainly: each time, start the head of the first queue in QUEUE_ORDER whose waits are met."""
    queues = {name: [i for i, ins in enumerate(program.instructions) if ins.queue_name == name]
              for name in reference.QUEUE_ORDER}
    counts = [0] * program.num_semaphores
    order = []
    while any(queues.values()):
        q = next(q for q in queues.values()
                 if q and all(counts[s] >= v for s, v in program.instructions[q[0]].waits))
        index = q.pop(0)
        order.append(index)
        for s in program.instructions[index].signals:
            counts[s] += 1
    return order


@pytest.mark.parametrize("seed", range(5))
def test_execution_order_follows_the_queue_priority_rule(seed):
    program = random_schedule(seed)
    want = priority_order(program)
    assert execution_order(program) == want
    assert want != sorted(want)   # the schedules really interleave queues


def copy_program(dtype=F32, shape=(4, 8), write_input=False) -> Program:
    """x (input) -> SBUF -> y (output); with write_input, SBUF is also copied back into x."""
    tensors = (TensorDecl("x", TensorKind.INPUT, dtype, shape), TensorDecl("y", TensorKind.OUTPUT, dtype, shape))
    ins = [Instruction.make("dma_copy", Engine.DMA, dst=onchip(dtype, shape), src=hbm(0, dtype, shape), signals=(0,)),
           Instruction.make("dma_copy", Engine.DMA, queue=1, dst=hbm(1, dtype, shape), src=onchip(dtype, shape),
                            waits=((0, 1),), signals=(1,))]
    if write_input:
        ins.append(Instruction.make("dma_copy", Engine.DMA, queue=2, dst=hbm(0, dtype, shape),
                                    src=onchip(dtype, shape), waits=((1, 1),)))
    return Program(tensors, tuple(ins))


def test_inputs_are_used_in_place_when_the_layout_allows():
    jp = load(copy_program())
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert jp._bind(0, x) is x
    assert np.array_equal(jp.run({"x": x})["y"], x)
    strided = np.arange(64, dtype=np.float32).reshape(4, 16)[:, ::2]
    assert not np.shares_memory(jp._bind(0, strided), strided)
    assert np.array_equal(jp.run({"x": strided})["y"], strided)


def test_torch_inputs_bind_without_copy_including_bf16():
    jp = load(copy_program(BF16))
    x = torch.randn(4, 8).to(torch.bfloat16)
    bound = jp._bind(0, x)
    assert bound.ctypes.data == x.data_ptr()
    got = jp.run({"x": x})["y"]
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(got.view(np.uint16), x.view(torch.int16).numpy().view(np.uint16))


def test_an_input_the_program_writes_is_copied_so_the_callers_array_is_unchanged():
    program = copy_program(write_input=True)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    before = x.copy()
    got = load(program).run({"x": x})
    assert np.array_equal(x, before)
    assert np.array_equal(got["y"], reference.run(program, {"x": x})["y"])


@pytest.mark.parametrize("bad, given", [(np.zeros((4, 9), np.float32), "(4, 9)"),
                                        (np.zeros((4, 8), np.float64), "float64"),
                                        (torch.zeros(4, 8, dtype=torch.float16), "torch.float16")])
def test_wrong_input_shape_or_dtype_names_the_input_and_both_layouts(bad, given):
    with pytest.raises(TrncError) as err:
        load(copy_program()).run({"x": bad})
    message = str(err.value)
    assert "'x'" in message and "(4, 8)" in message and "fp32" in message and given in message


def test_missing_and_unknown_inputs_are_named():
    with pytest.raises(TrncError, match=r"missing \['x'\], unknown \['z'\]"):
        load(copy_program()).run({"z": np.zeros((4, 8), np.float32)})


def test_an_unverified_program_is_refused():
    bad = Program((), (Instruction.make("memset", Engine.DVE, dst=onchip(F32, (4, 8), offset=10**9), value=0.0),))
    with pytest.raises(VerifyError, match="ap-bounds"):
        load(bad)


def test_gather_index_out_of_range_raises_the_references_error():
    tensors = (TensorDecl("table", TensorKind.INPUT, F32, (6, 4)), TensorDecl("idx", TensorKind.INPUT, I32, (3, 1)))
    index_ap = onchip(I32, (3, 1), offset=256)
    ins = (Instruction.make("dma_copy", Engine.DMA, dst=index_ap, src=hbm(1, I32, (3, 1)), signals=(0,)),
           Instruction.make("dma_gather", Engine.DMA, queue=1, dst=onchip(F32, (3, 4)), table=hbm(0, F32, (6, 4)),
                            index=index_ap, waits=((0, 1),)))
    program = Program(tensors, ins)
    inputs = {"table": np.zeros((6, 4), np.float32), "idx": np.array([[2], [6], [-1]], np.int32)}
    with pytest.raises(ExecutionError) as want:
        reference.run(program, inputs)
    with pytest.raises(ExecutionError) as got:
        load(program).run(inputs)
    assert str(got.value) == str(want.value)
    assert "instruction 1" in str(got.value) and "gather index 6 at partition 1" in str(got.value)


def test_fill_nan_shows_a_read_of_unwritten_memory():
    tensors = (TensorDecl("y", TensorKind.OUTPUT, F32, (2, 3)),)
    program = Program(tensors, (Instruction.make("dma_copy", Engine.DMA, dst=hbm(0, F32, (2, 3)),
                                                 src=onchip(F32, (2, 3), offset=512)),))
    jp = load(program)
    assert np.isnan(jp.run({}, fill_nan=True)["y"]).all()
    assert (jp.run({})["y"] == 0).all()               # the memories a JitProgram keeps are cleared each run
    assert np.isnan(jp.run({}, fill_nan=True)["y"]).all()


def test_kept_scratch_tensors_start_every_run_zeroed():
    """Each run reads a scratch tensor before writing it; the next run must read zeros again, not the last
    run's values."""
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, (2, 3)), TensorDecl("y", TensorKind.OUTPUT, F32, (2, 3)),
               TensorDecl("s", TensorKind.SCRATCH, F32, (2, 3)))
    tile = onchip(F32, (2, 3), offset=512)
    program = Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=tile, src=hbm(2, F32, (2, 3)), signals=(0,)),
        Instruction.make("dma_copy", Engine.DMA, dst=hbm(1, F32, (2, 3)), src=tile, waits=((0, 1),), signals=(1,)),
        Instruction.make("dma_copy", Engine.DMA, dst=hbm(2, F32, (2, 3)), src=hbm(0, F32, (2, 3)),
                         waits=((1, 1),))))
    jp = load(program)
    x = {"x": np.full((2, 3), 7.0, np.float32)}
    first, second = jp.run(x)["y"], jp.run(x)["y"]
    assert (first == 0).all() and (second == 0).all()
    assert first is not second                        # outputs are the caller's: fresh arrays each run


def test_an_opcode_without_lowering_is_refused_at_load(monkeypatch):
    monkeypatch.delitem(LOWERINGS, "memset")
    program = Program((), (Instruction.make("memset", Engine.DVE, dst=onchip(F32, (4, 8)), value=1.0),))
    with pytest.raises(TrncError, match="JIT: opcode memset is not lowered yet; use runtime.reference"):
        load(program)


def test_execute_rejects_memories_of_the_wrong_layout():
    jp = load(copy_program())
    sbuf = np.zeros((128, jp.hw.sbuf_bytes_per_partition), np.uint8)
    psum = np.zeros((128, jp.hw.psum_bytes_per_partition), np.uint8)
    with pytest.raises(TrncError, match="sbuf must be"):
        jp.execute(sbuf[:, :100], psum, [np.zeros(128, np.uint8)] * 2)
    with pytest.raises(TrncError, match="HBM tensor 'y'"):
        jp.execute(sbuf, psum, [np.zeros(128, np.uint8), np.zeros(127, np.uint8)])


def test_partition_rows_are_an_odd_number_of_cache_lines_apart_on_every_target():
    for hw in TARGETS.values():
        for mem, size in ((Mem.SBUF, hw.sbuf_bytes_per_partition), (Mem.PSUM, hw.psum_bytes_per_partition)):
            pitch = partition_pitch(hw, mem)
            assert size <= pitch < size + 2 * CACHE_LINE and pitch % CACHE_LINE == 0 and pitch // CACHE_LINE % 2


def test_on_chip_memories_run_in_place_and_plain_arrays_on_a_padded_copy_written_back():
    """Both layouts of SBUF and PSUM give the reference's bytes: on_chip_memories' views (rows partition_pitch
    apart) are used in place, dense arrays run on a padded copy that is written back into them."""
    rng = np.random.default_rng(13)
    mm = Instruction.make("matmul", Engine.PE, dst=onchip(F32, (128, 64), mem=Mem.PSUM),
                          stationary=onchip(F32, (128, 128)), moving=onchip(F32, (128, 64), offset=512),
                          accumulate=True)
    add = Instruction.make("tensor_tensor", Engine.DVE, dst=onchip(F32, (128, 32), offset=4096),
                           in0=onchip(F32, (128, 32), offset=512), in1=onchip(F32, (128, 32), offset=1024),
                           op=AluOp.ADD)
    program = Program((), (mm, add))
    ref = reference.Machine(program)
    for ap in (mm["dst"], mm["stationary"], mm["moving"]):
        ref.write(ap, rng.uniform(-1, 1, ap.shape).astype(np.float32))
    dense_sbuf, dense_psum = ref.sbuf.copy(), ref.psum.copy()
    padded_sbuf, padded_psum = executor.on_chip_memories(ref.hw)
    padded_sbuf[...], padded_psum[...] = ref.sbuf, ref.psum
    for ins in program.instructions:
        ref.execute(ins)
    jp = load(program)
    jp.execute(dense_sbuf, dense_psum, [])
    jp.execute(padded_sbuf, padded_psum, [])
    assert padded_sbuf.strides == (partition_pitch(ref.hw, Mem.SBUF), 1)
    for sbuf, psum in ((dense_sbuf, dense_psum), (padded_sbuf, padded_psum)):
        assert np.array_equal(sbuf, ref.sbuf) and np.array_equal(psum, ref.psum)


def test_ten_thousand_instructions_compile_only_their_distinct_kernels():
    shapes = [(8, 4), (16, 16), (128, 2)]
    instrs = []
    for i in range(10_000):
        p, f = shapes[i % 3]
        off = 64 * (i % 50)
        instrs.append(Instruction.make("tensor_tensor", Engine.DVE, dst=onchip(F32, (p, f), offset=off),
                                       in0=onchip(F32, (p, f), offset=off), in1=onchip(F32, (p, f), offset=8192),
                                       op=AluOp.ADD if i % 2 else AluOp.MUL))
        if i % 1000 == 0:
            instrs.append(Instruction.make("memset", Engine.DVE, dst=onchip(F32, (p, f), offset=8192), value=0.5))
    program = Program((), tuple(instrs))
    codegen = Codegen()
    table = Kernels(codegen, KernelCache(codegen))
    jp = JitProgram(program, verified=True, table=table)
    assert jp.distinct_kernels == 3 * 2 + 3   # tensor_tensor: 3 shapes x 2 ops; memset: 3 shapes
    assert table.count == 9 and table.cache.stats.misses + table.cache.stats.disk_hits == 9 + 1   # and the driver
    assert len(jp._serial.table) == len(instrs)


def test_an_in_place_read_that_repeats_an_element_is_staged_and_its_copy_kernel_counted():
    """dst and in0 one AP whose two free dims overlap (element i + j): in0 is read from a copy made before the
    kernel writes, as the reference reads every input before writing; the copy is a kernel of its own."""
    overlapping = AP(Mem.SBUF, F32, 32, ((1, 4), (1, 4)))
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, (32, 16)), TensorDecl("y", TensorKind.OUTPUT, F32, (32, 8)))
    program = Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=onchip(F32, (32, 16), offset=256), src=hbm(0, F32, (32, 16)),
                         signals=(0,)),
        Instruction.make("dma_copy", Engine.DMA, dst=onchip(F32, (32, 8)),
                         src=AP(Mem.HBM, F32, 32, ((1, 8),), tensor=0, partition_stride=16), signals=(0,)),
        Instruction.make("tensor_tensor", Engine.DVE, dst=overlapping, in0=overlapping,
                         in1=AP(Mem.SBUF, F32, 32, ((4, 4), (1, 4)), offset=256), op=AluOp.ADD, waits=((0, 2),),
                         signals=(1,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=hbm(1, F32, (32, 8)), src=onchip(F32, (32, 8)),
                         waits=((1, 1),))))
    jp = load(program)
    assert jp.stage_bytes > 0
    assert jp.distinct_kernels == len(set(jp._serial.table[:, 0].tolist())) == 5   # 3 dma_copy shapes, copy, add
    inputs = inputs_for(program, 3)
    assert_same_outputs(jp.run(inputs), reference.run(program, inputs), program)


def _memory_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts the memory maps of Linux's /proc")
def test_the_code_of_a_dropped_program_is_unmapped():
    """The fuzzer: one process-wide MCJIT engine kept every loaded kernel mapped, about 3 memory maps each, and after
    ~4000 programs the process aborted past vm.max_map_count ('LLVM ERROR: Unable to allocate section memory').
    Each program has its engine now, whose maps go with it."""
    def program(f: int) -> Program:   # two distinct kernels per f, each bigger than a page of code
        exp = Instruction.make("activation", Engine.ACT, dst=onchip(F32, (3, f)), src=onchip(F32, (3, f), offset=4096),
                               func=ActFunc.EXP)
        mm = Instruction.make("matmul", Engine.PE, dst=onchip(F32, (f, 8), mem=Mem.PSUM),
                              stationary=onchip(F32, (4, f), offset=8192), moving=onchip(F32, (4, 8), offset=16384))
        return Program((), (exp, mm))
    load(program(1)).run({})
    before = _memory_maps()
    for f in range(2, 62):
        load(program(f)).run({})
    assert _memory_maps() < before + 30   # the old single engine: +243


def test_an_fp32_matmul_rounds_each_multiply_add_once():
    """acc = fma(a, a, fp32(-1 * 1)) with a = 1 + 2^-12: the exact product 1 + 2^-11 + 2^-24 goes into the sum
    unrounded, so the result is 2^-11 + 2^-24 (rounding the product first, a tie to even, would give 2^-11).
    On a host with FMA the kernel does it in the vector FMA instruction."""
    a = np.float32(1 + 2 ** -12)
    st, mv = onchip(F32, (2, 1)), onchip(F32, (2, 1), offset=64)
    dst = onchip(F32, (1, 1), mem=Mem.PSUM)
    tensors = (TensorDecl("s", TensorKind.INPUT, F32, (2, 1)), TensorDecl("v", TensorKind.INPUT, F32, (2, 1)),
               TensorDecl("y", TensorKind.OUTPUT, F32, (1, 1)))
    program = Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=st, src=hbm(0, F32, (2, 1)), signals=(0,)),
        Instruction.make("dma_copy", Engine.DMA, dst=mv, src=hbm(1, F32, (2, 1)), signals=(0,)),
        Instruction.make("matmul", Engine.PE, dst=dst, stationary=st, moving=mv, waits=((0, 2),), signals=(1,)),
        Instruction.make("tensor_copy", Engine.DVE, dst=onchip(F32, (1, 1), offset=128), src=dst, waits=((1, 1),),
                         signals=(2,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=hbm(2, F32, (1, 1)), src=onchip(F32, (1, 1), offset=128),
                         waits=((2, 1),))))
    inputs = {"s": np.array([[-1.0], [a]], np.float32), "v": np.array([[1.0], [a]], np.float32)}
    got = load(program).run(inputs)["y"][0, 0]
    assert got == np.float32(2 ** -11 + 2 ** -24) == reference.run(program, inputs)["y"][0, 0]
    jp = load(program)
    matmul = next(ins for ins in program.instructions if ins.opcode == "matmul")
    sig = KernelSig("matmul", tuple((name, layout_of(matmul[name], jp.hw)) for name in ("dst", "stationary", "moving")),
                    (("accumulate", False), ("double_row", False)))   # this one, not any loaded in the process
    if "+fma" in Codegen().features.split(","):
        assert re.search(r"vfn?madd", Codegen().assembly(build_kernel(sig)))
