"""The parallel driver (runtime/jit/parallel.py): at every thread count the bits of the serial run and of the
reference; faults stop every thread and are reported once, as the serial run reports them; a program whose
semaphores leave a race or a deadlock is refused before anything runs."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, given, settings

from aps import hbm, onchip
from golden import GOLDENS
from strategies import valid_programs
from test_jit_program import assert_same_outputs, inputs_for, outcome
from trnc import flags
from trnc.errors import ExecutionError, VerifyError
from trnc.isa import AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind, verify
from trnc.runtime import reference
from trnc.runtime.jit import executor, parallel, split
from trnc.runtime.jit.executor import load
from trnc.runtime.reference import execution_order

pytestmark = pytest.mark.usefixtures("private_cache")

F32, I32 = DType.FP32, DType.INT32
THREADS = (2, 3, 5)   # 3 and 5: more workers than this machine's cores, so workers are preempted mid-unit


def run_at(threads: int, program: Program, inputs, **kw):
    with flags.override(TRNC_THREADS=threads):
        return outcome(executor.run, program, inputs, **kw)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs(max_instructions=10))
def test_random_programs_give_the_references_bits_at_every_thread_count(program):
    inputs = inputs_for(program, 0)
    want = outcome(reference.run, program, inputs)
    for threads in THREADS:
        assert_same_outputs(run_at(threads, program, inputs), want, program)


def _bits(outputs):
    return [t.view(torch.int32 if t.element_size() == 4 else torch.int16).clone() if t.is_floating_point() else t
            for t in pytree.tree_leaves(outputs)]


@pytest.mark.parametrize("name", ["mlp", "tiny_bert", "tiny_gpt2", "tiny_llama_bf16"])
def test_compiled_models_give_the_serial_bits_at_every_thread_count(name):
    """Compiled programs have real concurrency (PE, ACT, DVE, Pool and several DMA queues at once); each run
    at 3 threads is another interleaving."""
    golden = {g.name: g for g in GOLDENS}[name]
    torch.manual_seed(0)
    model, inputs = golden.build()
    compiled = golden.compile()
    with flags.override(TRNC_THREADS=1):
        want = _bits(compiled(*inputs))
    for threads in (*THREADS, 3, 3):
        with flags.override(TRNC_THREADS=threads):
            got = _bits(compiled(*inputs))
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), threads


SLOTS, WIDTH = 8, 16


def _slot(k: int) -> AP:
    return onchip(F32, (32, WIDTH), offset=4 * WIDTH * k)


def _hbm_slot(tensor: int, k: int) -> AP:
    return AP(Mem.HBM, F32, 32, ((1, WIDTH),), offset=4 * WIDTH * k, tensor=tensor, partition_stride=WIDTH * SLOTS)


def dataflow_program(seed: int, n: int = 80) -> Program:
    """Values flowing between queues: each instruction reads one or two of eight SBUF slots and writes one, on a
    random queue; it waits for every earlier access on another queue that conflicts with its own (one counting
    semaphore per queue), so the program is race free and list order is legal, but most pairs are unordered.
    Any interleaving that broke a wait would change the outputs, since every slot's value depends on the order."""
    rng = random.Random(seed)
    queues = [(Engine.DVE, 0), (Engine.POOL, 0), (Engine.ACT, 0), (Engine.DMA, 0), (Engine.DMA, 1), (Engine.DMA, 2)]
    signalled = [0] * len(queues)
    last_write: list[tuple[int, int] | None] = [None] * SLOTS   # (queue, its signal count after) of a slot's writer
    reads: list[dict[int, int]] = [{} for _ in range(SLOTS)]    # readers since: queue -> signal count after
    instrs = []

    def emit(q: int, make, dst: int, srcs: tuple[int, ...]) -> None:
        need: dict[int, int] = {}
        for slot in (dst, *srcs):
            if last_write[slot] is not None:
                need[last_write[slot][0]] = max(need.get(last_write[slot][0], 0), last_write[slot][1])
        for rq, count in reads[dst].items():
            need[rq] = max(need.get(rq, 0), count)
        signalled[q] += 1
        waits = tuple((o, c) for o, c in sorted(need.items()) if o != q)
        instrs.append(make().replace(waits=waits, signals=(q,)))
        for slot in srcs:
            reads[slot][q] = signalled[q]
        last_write[dst], reads[dst] = (q, signalled[q]), {}

    for k in range(SLOTS):
        emit(3 + k % 3, lambda k=k: Instruction.make("dma_copy", Engine.DMA, queue=k % 3, dst=_slot(k),
                                                     src=_hbm_slot(0, k)), k, ())
    for _ in range(n):
        q = rng.randrange(len(queues))
        engine, queue = queues[q]
        dst, a, b = rng.randrange(SLOTS), rng.randrange(SLOTS), rng.randrange(SLOTS)
        if engine is Engine.DMA:
            a = a if a != dst else (a + 1) % SLOTS
            emit(q, lambda: Instruction.make("dma_copy", engine, queue=queue, dst=_slot(dst), src=_slot(a)), dst, (a,))
        elif engine is Engine.ACT or rng.random() < 0.4:
            scale = rng.choice((0.5, -1.25, 2.0))
            emit(q, lambda: Instruction.make("tensor_scalar", engine, dst=_slot(dst), src=_slot(a), op0=AluOp.MUL,
                                             scalar0=scale, op1=AluOp.ADD, scalar1=1.0), dst, (a,))
        else:
            op = rng.choice((AluOp.ADD, AluOp.SUB, AluOp.MAX))
            emit(q, lambda: Instruction.make("tensor_tensor", engine, dst=_slot(dst), in0=_slot(a), in1=_slot(b),
                                             op=op), dst, (a, b))
    for k in range(SLOTS):
        emit(3 + k % 3, lambda k=k: Instruction.make("dma_copy", Engine.DMA, queue=k % 3, dst=_hbm_slot(1, k),
                                                     src=_slot(k)), k, (k,))
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, (32, WIDTH * SLOTS)),
               TensorDecl("y", TensorKind.OUTPUT, F32, (32, WIDTH * SLOTS)))
    return Program(tensors, tuple(instrs))


@pytest.mark.parametrize("seed", range(6))
def test_values_flowing_between_queues_give_the_references_bits_at_every_thread_count(seed):
    program = dataflow_program(seed)
    assert execution_order(program) != sorted(execution_order(program))   # the queues really interleave
    inputs = {"x": np.random.default_rng(seed).standard_normal((32, WIDTH * SLOTS)).astype(np.float32)}
    want = reference.run(program, inputs)
    for threads in (*THREADS, *[3] * 8):
        assert_same_outputs(run_at(threads, program, inputs), want, program)


def _fan_in(length: int) -> Program:
    """Three compute queues each scale a block of rows of their own while two DMA queues load them; DVE waits for
    all three (a semaphore each) and sums them."""
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, (128, length)), TensorDecl("y", TensorKind.OUTPUT, F32,
                                                                                 (32, length)))
    ins = []
    for k, engine in enumerate((Engine.ACT, Engine.DVE, Engine.POOL, Engine.DVE)):
        done = {Engine.ACT: 4, Engine.DVE: 5, Engine.POOL: 6}[engine]
        rows = onchip(F32, (32, length), offset=4 * length * k)
        src = AP(Mem.HBM, F32, 32, ((1, length),), offset=4 * 32 * length * k, tensor=0, partition_stride=length)
        ins.append(Instruction.make("dma_copy", Engine.DMA, queue=k % 2, dst=rows, src=src, signals=(k,)))
        ins.append(Instruction.make("tensor_scalar", engine, dst=rows, src=rows, waits=((k, 1),), op0=AluOp.MUL,
                                    scalar0=float(k + 1), op1=AluOp.ADD, scalar1=0.5, signals=(done,)))
    total = onchip(F32, (32, length), offset=4 * length * 4)
    ins.append(Instruction.make("tensor_copy", Engine.DVE, dst=total, src=onchip(F32, (32, length)),
                                waits=((4, 1), (6, 1))))
    for k in range(1, 4):
        part = onchip(F32, (32, length), offset=4 * length * k)
        ins.append(Instruction.make("tensor_tensor", Engine.DVE, dst=total, in0=total, in1=part, op=AluOp.ADD,
                                    signals=(7,) if k == 3 else ()))
    ins.append(Instruction.make("dma_copy", Engine.DMA, queue=2, dst=hbm(1, F32, (32, length)), src=total,
                                waits=((7, 1),)))
    return Program(tensors, tuple(ins))


def _take_order_is_topological(schedule: parallel.Schedule) -> bool:
    """Every (queue, count) a unit waits for is reached by units taken before it."""
    finished = {}   # queue -> instructions finished by the units taken so far, by position
    for u in schedule.take.tolist():
        first, count = schedule.units[u, 4:6]
        if any(finished.get(int(q), 0) < c for q, c in schedule.deps[first:first + count].tolist()):
            return False
        q, pos = (int(v) for v in schedule.units[u, 2:4])
        finished[q] = max(finished.get(q, 0), pos + 1)
    return True


@pytest.mark.parametrize("seed", range(3))
def test_the_take_order_is_a_topological_list_schedule_not_the_serial_order(seed):
    program = dataflow_program(seed)
    order = execution_order(program)
    driven = load(program)._driver_table(2)
    schedule = parallel.Schedule(program, order, driven.pieces, workers=2)
    assert sorted(schedule.take.tolist()) == list(range(len(schedule.units)))
    assert _take_order_is_topological(schedule)
    assert schedule.take.tolist() != list(range(len(schedule.units)))   # it reorders: the point of it


def test_a_wait_on_three_queues_orders_its_instruction_after_all_three():
    program = _fan_in(512)
    inputs = {"x": np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)}
    want = reference.run(program, inputs)
    for threads in (*THREADS, *[4] * 10):
        assert_same_outputs(run_at(threads, program, inputs), want, program)


def test_the_schedule_waits_on_the_last_of_the_signals_a_wait_counts():
    program = _fan_in(8)
    order = execution_order(program)
    schedule = parallel.Schedule(program, order, [(1,)] * len(order))
    waiter = order.index(8)                     # the tensor_copy waiting for ACT's and Pool's semaphores
    first, count = schedule.units[waiter, 4:6]
    needs = {(int(q), int(c)) for q, c in schedule.deps[first:first + count]}
    queues = {name: q for q, name in enumerate(reference.QUEUE_ORDER)}
    # its own queue (DVE) had run its two tensor_scalars; ACT and Pool one each
    assert needs == {(queues["dve"], 2), (queues["act"], 1), (queues["pool"], 1)}


def _gather_fault() -> tuple[Program, dict]:
    """Two queues stream copies while a third gathers with an index out of range half way through."""
    tensors = (TensorDecl("table", TensorKind.INPUT, F32, (6, 4)), TensorDecl("idx", TensorKind.INPUT, I32, (3, 1)),
               TensorDecl("y", TensorKind.OUTPUT, F32, (64, 64)))
    index_ap = onchip(I32, (3, 1), offset=256)
    ins = [Instruction.make("dma_copy", Engine.DMA, dst=index_ap, src=hbm(1, I32, (3, 1)), signals=(0,))]
    for k in range(40):
        ins.append(Instruction.make("memset", Engine.DVE if k % 2 else Engine.POOL,
                                    dst=onchip(F32, (64, 64), offset=1024 + 256 * (k % 2)), value=float(k)))
    ins.append(Instruction.make("dma_gather", Engine.DMA, queue=1, dst=onchip(F32, (3, 4)), table=hbm(0, F32, (6, 4)),
                                index=index_ap, waits=((0, 1),), signals=(1,)))
    ins.append(Instruction.make("dma_copy", Engine.DMA, queue=2, dst=hbm(2, F32, (64, 64)),
                                src=onchip(F32, (64, 64), offset=4096), waits=((1, 1),)))
    inputs = {"table": np.zeros((6, 4), np.float32), "idx": np.array([[2], [6], [-1]], np.int32)}
    return Program(tensors, tuple(ins)), inputs


def test_a_fault_in_one_queue_stops_every_thread_and_is_reported_once_as_the_serial_run_reports_it():
    program, inputs = _gather_fault()
    with pytest.raises(ExecutionError) as want:
        reference.run(program, inputs)
    for threads in (1, *THREADS):
        with flags.override(TRNC_THREADS=threads), pytest.raises(ExecutionError) as got:
            load(program).run(inputs)
        assert str(got.value) == str(want.value)
        assert str(got.value).count("gather index") == 1 and "instruction 41" in str(got.value)


@pytest.mark.parametrize("ahead", [False, True])
def test_a_race_between_queues_is_refused_before_anything_runs(ahead, monkeypatch):
    """The DVE write and the Pool read of one tile without a semaphore between them: the verifier's race check; also
    when the race is found on a thread of its own while the program is laid out (its instructions all pass)."""
    if ahead:
        monkeypatch.setattr(verify, "AHEAD_INSTRUCTIONS", 0)
    tile = onchip(F32, (32, 16))
    program = Program((), (Instruction.make("memset", Engine.DVE, dst=tile, value=1.0),
                           Instruction.make("tensor_copy", Engine.POOL, dst=onchip(F32, (32, 16), offset=64),
                                            src=tile)))
    with flags.override(TRNC_THREADS=4), pytest.raises(VerifyError, match="race"):
        load(program)


def test_a_wait_that_is_never_met_is_an_error_naming_the_queue_and_the_semaphore():
    program = Program((), (Instruction.make("memset", Engine.DVE, dst=onchip(F32, (32, 16)), value=1.0,
                                            waits=((0, 1),)),
                           Instruction.make("memset", Engine.POOL, dst=onchip(F32, (32, 16), offset=64), value=1.0,
                                            waits=((1, 1),), signals=(0,))))
    with flags.override(TRNC_THREADS=4), pytest.raises((VerifyError, ExecutionError)) as e:
        load(program).run({})
    assert "sem 1" in str(e.value) or "semaphore 1" in str(e.value)
    assert "pool" in str(e.value).lower()
    with flags.override(TRNC_THREADS=4), pytest.raises(ExecutionError, match=r"deadlock.*pool.*sem 1"):
        load(program, verified=True).run({})


def _big_matmul_and_activation() -> Program:
    """A [128, 128] x [128, 512] matmul accumulated twice into PSUM, then a gelu of it with a per-partition bias
    and an accumulated row sum, all on one queue each: only splitting gives the second worker work."""
    tensors = (TensorDecl("a", TensorKind.INPUT, F32, (128, 128)), TensorDecl("b", TensorKind.INPUT, F32, (128, 512)),
               TensorDecl("y", TensorKind.OUTPUT, F32, (128, 512)), TensorDecl("s", TensorKind.OUTPUT, F32, (128, 1)))
    a, b = onchip(F32, (128, 128)), onchip(F32, (128, 512), offset=512)
    psum, y, rows = onchip(F32, (128, 512), mem=Mem.PSUM), onchip(F32, (128, 512), offset=4096), \
        onchip(F32, (128, 1), offset=8192)
    ins = (Instruction.make("dma_copy", Engine.DMA, dst=a, src=hbm(0, F32, (128, 128)), signals=(0,)),
           Instruction.make("dma_copy", Engine.DMA, queue=1, dst=b, src=hbm(1, F32, (128, 512)), signals=(1,)),
           Instruction.make("matmul", Engine.PE, dst=psum, stationary=a, moving=b, waits=((0, 1), (1, 1))),
           Instruction.make("matmul", Engine.PE, dst=psum, stationary=a, moving=b, accumulate=True, signals=(2,)),
           Instruction.make("activation", Engine.ACT, dst=y, src=psum, func=ActFunc.GELU, scale=0.5,
                            bias_ap=onchip(F32, (128, 1), offset=8200), accum=rows, waits=((2, 1),), signals=(3,)),
           Instruction.make("dma_copy", Engine.DMA, queue=2, dst=hbm(2, F32, (128, 512)), src=y, waits=((3, 1),)),
           Instruction.make("dma_copy", Engine.DMA, queue=3, dst=hbm(3, F32, (128, 1)), src=rows, waits=((3, 1),)))
    return Program(tensors, ins)


def test_big_instructions_run_as_pieces_with_the_bits_of_the_whole():
    program = _big_matmul_and_activation()
    rng = np.random.default_rng(0)
    inputs = {"a": rng.standard_normal((128, 128)).astype(np.float32),
              "b": rng.standard_normal((128, 512)).astype(np.float32)}
    want = reference.run(program, inputs)
    loaded = load(program)
    for threads in (*THREADS, 3, 3):
        with flags.override(TRNC_THREADS=threads):
            assert_same_outputs(loaded.run(inputs), want, program)
        table, schedule = loaded._parallel[threads]
        assert schedule.split and len(table.pieces[2]) == threads   # the first matmul, one piece per worker


def test_a_convolutions_matmul_splits_along_its_window_rows_with_the_bits_of_the_whole():
    """moving [K, 14 rows of 14] read from a padded [16, 16] image (stride 16 between rows): pieces of whole rows."""
    tensors = (TensorDecl("w", TensorKind.INPUT, F32, (128, 128)), TensorDecl("x", TensorKind.INPUT, F32, (128, 256)),
               TensorDecl("y", TensorKind.OUTPUT, F32, (128, 196)))
    w, x = onchip(F32, (128, 128)), onchip(F32, (128, 256), offset=512)
    window = AP(Mem.SBUF, F32, 128, ((16, 14), (1, 14)), offset=512 + 4 * 17)
    psum, y = onchip(F32, (128, 196), mem=Mem.PSUM), onchip(F32, (128, 196), offset=2048)
    program = Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=w, src=hbm(0, F32, (128, 128)), signals=(0,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=x, src=hbm(1, F32, (128, 256)), signals=(1,)),
        Instruction.make("matmul", Engine.PE, dst=psum, stationary=w, moving=window, waits=((0, 1), (1, 1)),
                         signals=(2,)),
        Instruction.make("tensor_copy", Engine.DVE, dst=y, src=psum, waits=((2, 1),), signals=(3,)),
        Instruction.make("dma_copy", Engine.DMA, queue=2, dst=hbm(2, F32, (128, 196)), src=y, waits=((3, 1),))))
    parts = split.pieces(program.instructions[2], 3)
    assert [p["moving"].dims for p in parts] == [((16, 5), (1, 14)), ((16, 5), (1, 14)), ((16, 4), (1, 14))]
    assert [(p["dst"].offset, p["dst"].free_size) for p in parts] == [(0, 70), (280, 70), (560, 56)]
    rng = np.random.default_rng(1)
    inputs = {"w": rng.standard_normal((128, 128)).astype(np.float32),
              "x": rng.standard_normal((128, 256)).astype(np.float32)}
    want = reference.run(program, inputs)
    for threads in (*THREADS, 3):
        assert_same_outputs(run_at(threads, program, inputs), want, program)


def test_more_workers_than_pieces_run_each_piece_once():
    """Matmuls of 48 columns split into 3 pieces of 16 for 4 or 5 workers: worker w claims piece w mod 3 first,
    so two workers prefer the same piece and one must take another. The second matmul accumulates into the
    first's PSUM, so a piece run twice, or not at all, changes the output bits."""
    tensors = (TensorDecl("a", TensorKind.INPUT, F32, (128, 128)), TensorDecl("b", TensorKind.INPUT, F32, (128, 48)),
               TensorDecl("y", TensorKind.OUTPUT, F32, (128, 48)))
    a, b = onchip(F32, (128, 128)), onchip(F32, (128, 48), offset=512)
    psum, y = onchip(F32, (128, 48), mem=Mem.PSUM), onchip(F32, (128, 48), offset=1024)
    program = Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=a, src=hbm(0, F32, (128, 128)), signals=(0,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=b, src=hbm(1, F32, (128, 48)), signals=(1,)),
        Instruction.make("matmul", Engine.PE, dst=psum, stationary=a, moving=b, waits=((0, 1), (1, 1))),
        Instruction.make("matmul", Engine.PE, dst=psum, stationary=a, moving=b, accumulate=True, signals=(2,)),
        Instruction.make("tensor_copy", Engine.DVE, dst=y, src=psum, waits=((2, 1),), signals=(3,)),
        Instruction.make("dma_copy", Engine.DMA, queue=2, dst=hbm(2, F32, (128, 48)), src=y, waits=((3, 1),))))
    rng = np.random.default_rng(2)
    inputs = {"a": rng.standard_normal((128, 128)).astype(np.float32),
              "b": rng.standard_normal((128, 48)).astype(np.float32)}
    want = reference.run(program, inputs)
    loaded = load(program)
    for threads in (4, 5, 4, 5, 4, 5):
        with flags.override(TRNC_THREADS=threads):
            assert_same_outputs(loaded.run(inputs), want, program)
        table, _ = loaded._parallel[threads]
        assert len(table.pieces[2]) == len(table.pieces[3]) == 3


@pytest.mark.parametrize("opcode", ["matmul", "activation"])
def test_pieces_cover_the_whole_instruction_once(opcode):
    ins = next(i for i in _big_matmul_and_activation().instructions if i.opcode == opcode)
    parts = split.pieces(ins, 3)
    assert len(parts) == 3
    if opcode == "matmul":
        assert [p["dst"].free_size for p in parts] == [176, 176, 160]
        assert sum(p["moving"].free_size for p in parts) == 512
        assert all(p["stationary"] == ins["stationary"] for p in parts)
    else:
        assert [(p["dst"].start_partition, p["dst"].partitions) for p in parts] == [(0, 43), (43, 43), (86, 42)]
        assert all(p["accum"].partitions == p["dst"].partitions for p in parts)
