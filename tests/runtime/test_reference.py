"""The reference interpreter's machine: addressing, binding, ordering, faults, and a hand-built GEMM program.

Per-opcode semantics are in test_reference_ops.py. Expected values here come from independent
computations: byte addresses by explicit loops over the spec's addressing formula, numpy slicing,
and a sequential fp32 sum or a float64 torch matmul.
"""
import itertools

import ml_dtypes
import numpy as np
import pytest
import torch

from trnc.errors import ExecutionError, TrncError
from trnc.isa import AP, TABLE, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind
from trnc.isa.config import get_target
from trnc.runtime.reference import Machine, run
from aps import hbm, onchip
from trnc.runtime.reference_ops import SEMANTICS

IN, OUT = TensorKind.INPUT, TensorKind.OUTPUT


def element_addresses(ap):
    """(partition or None, byte address) of every element in (p, e) order, straight from the spec's formula."""
    isz = ap.dtype.itemsize
    for p in range(ap.partitions):
        for idx in itertools.product(*(range(c) for _, c in ap.dims)):
            linear = sum(i * s for i, (s, _) in zip(idx, ap.dims))
            if ap.mem is Mem.HBM:
                yield None, ap.offset + isz * (p * ap.partition_stride + linear)
            else:
                yield ap.start_partition + p, ap.offset + isz * linear


def test_every_opcode_of_the_table_has_semantics():
    assert set(SEMANTICS) == {op.name for op in TABLE}


# On-chip access patterns: (mem, dtype, partitions, dims, byte offset, start partition).
ONCHIP_CASES = [
    (Mem.SBUF, DType.FP32, 3, ((1, 5),), 0, 0),
    (Mem.SBUF, DType.BF16, 4, ((-1, 6),), 40, 2),                      # negative stride
    (Mem.SBUF, DType.FP8_E4M3, 2, ((7, 3), (-2, 4), (1, 2)), 30, 125),  # three dims, last partitions
    (Mem.SBUF, DType.INT32, 2, ((0, 3), (2, 4)), 8, 5),                # zero stride: the same bytes thrice
    (Mem.SBUF, DType.UINT8, 2, ((1, 3), (1, 3)), 0, 0),                # overlapping elements
    (Mem.PSUM, DType.FP32, 5, ((16, 2), (1, 3), (4, 2), (-8, 2)), 2112, 1),  # four dims, second bank
    (Mem.SBUF, DType.FP16, 1, (), 6, 9),                               # no free dims
]


def _random_machine(rng):
    m = Machine(Program((), ()))
    for mem in (m.sbuf, m.psum):
        mem[:, :4096] = rng.integers(0, 256, size=(mem.shape[0], 4096), dtype=np.uint8)
    return m


@pytest.mark.parametrize("mem, dtype, partitions, dims, offset, start", ONCHIP_CASES)
def test_read_gathers_the_bytes_of_each_element(mem, dtype, partitions, dims, offset, start):
    m = _random_machine(np.random.default_rng(1))
    ap = AP(mem, dtype, partitions, dims, offset=offset, start_partition=start)
    memory = m.sbuf if mem is Mem.SBUF else m.psum
    expected = b"".join(memory[p, a:a + dtype.itemsize].tobytes() for p, a in element_addresses(ap))
    got = m.read(ap)
    assert got.dtype == dtype.storage and got.shape == ap.shape
    assert got.tobytes() == expected


@pytest.mark.parametrize("mem, dtype, partitions, dims, offset, start", ONCHIP_CASES)
def test_write_stores_elements_in_order_and_nothing_else(mem, dtype, partitions, dims, offset, start):
    rng = np.random.default_rng(2)
    m = _random_machine(rng)
    ap = AP(mem, dtype, partitions, dims, offset=offset, start_partition=start)
    memory = m.sbuf if mem is Mem.SBUF else m.psum
    expected = memory.copy()
    data = rng.integers(0, 256, size=ap.num_bytes, dtype=np.uint8)
    isz = dtype.itemsize
    for e, (p, a) in enumerate(element_addresses(ap)):  # one element after the other: the last writer stays
        expected[p, a:a + isz] = data[e * isz:(e + 1) * isz]
    m.write(ap, data.view(dtype.storage).reshape(ap.shape))
    assert np.array_equal(memory, expected)


def test_hbm_addressing_uses_the_partition_stride_negative_too():
    rng = np.random.default_rng(3)
    program = Program((TensorDecl("t", IN, DType.UINT8, (200,)),), ())
    m = Machine(program)
    m.bind("t", rng.integers(0, 256, size=200, dtype=np.uint8))
    ap = AP(Mem.HBM, DType.FP16, 3, ((3, 4), (-1, 2)), offset=122, tensor=0, partition_stride=-20)
    raw = m.hbm[0].copy()
    assert m.read(ap).tobytes() == b"".join(raw[a:a + 2].tobytes() for _, a in element_addresses(ap))
    values = rng.standard_normal(ap.shape).astype(np.float16)
    m.write(ap, values)
    for (_, a), v in zip(element_addresses(ap), values.reshape(-1)):
        raw[a:a + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    assert np.array_equal(m.hbm[0], raw)


@pytest.mark.parametrize("ap", [
    AP(Mem.SBUF, DType.FP32, 2, ((-1, 4),)),                                  # below byte 0
    AP(Mem.SBUF, DType.FP32, 2, ((1, 4),), start_partition=127),              # past partition 127
    AP(Mem.PSUM, DType.FP32, 1, ((1, 4),), offset=16384 - 8),                 # past the end of PSUM
    AP(Mem.HBM, DType.FP32, 1, ((1, 4),), tensor=3, partition_stride=4),     # no such tensor
], ids=["negative-byte", "partition", "psum-end", "tensor"])
def test_accesses_outside_memory_are_errors(ap):
    m = Machine(Program((), ()))
    with pytest.raises(ExecutionError):
        m.read(ap)
    with pytest.raises(ExecutionError):
        m.write(ap, np.zeros(ap.shape, dtype=np.float32))


def test_memory_sizes_follow_the_target():
    ap = AP(Mem.SBUF, DType.FP32, 1, ((1, 1),), offset=200_000)   # inside trn2's SBUF, beyond trn1's
    Machine(Program((), ())).read(ap)
    with pytest.raises(ExecutionError):
        Machine(Program((), ()), hw=get_target("trn1")).read(ap)


def test_write_needs_values_of_the_storage_dtype_and_shape():
    m = Machine(Program((), ()))
    ap = onchip(DType.BF16, (2, 3))
    with pytest.raises(TrncError, match="float32.*bf16"):
        m.write(ap, np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(TrncError, match="shape"):
        m.write(ap, np.zeros((3, 2), dtype=ml_dtypes.bfloat16))


# -- run: binding ----------------------------------------------------------------------------------

def copy_program(dtype, shape):
    """y = x through SBUF: dma0 loads, dma1 stores after semaphore 0."""
    sb = onchip(dtype, shape)
    return Program((TensorDecl("x", IN, dtype, shape), TensorDecl("y", OUT, dtype, shape)), (
        Instruction.make("dma_copy", queue=0, dst=sb, src=hbm(0, dtype, shape), signals=(0,)),
        Instruction.make("dma_copy", queue=1, dst=hbm(1, dtype, shape), src=sb, waits=((0, 1),)),
    ))


def test_run_returns_the_outputs_by_name():
    x = np.random.default_rng(4).standard_normal((4, 3)).astype(np.float32)
    out = run(copy_program(DType.FP32, (4, 3)), {"x": x})
    assert list(out) == ["y"] and out["y"].dtype == np.float32 and out["y"].shape == (4, 3)
    assert np.array_equal(out["y"].view(np.uint32), x.view(np.uint32))


@pytest.mark.parametrize("torch_dtype, dtype, bits", [
    (torch.bfloat16, DType.BF16, torch.int16), (torch.float8_e4m3fn, DType.FP8_E4M3, torch.uint8),
    (torch.float16, DType.FP16, torch.int16), (torch.int32, DType.INT32, torch.int32)])
def test_torch_inputs_are_taken_bit_for_bit(torch_dtype, dtype, bits):
    raw = torch.randint(-2**15, 2**15, (5, 7), generator=torch.Generator().manual_seed(5)).to(bits)
    value = raw.view(torch_dtype)  # every bit pattern, NaN payloads included
    out = run(copy_program(dtype, (5, 7)), {"x": value})["y"]
    assert out.dtype == dtype.storage
    assert np.array_equal(out.view(raw.numpy().dtype), raw.numpy())


@pytest.mark.parametrize("value, pattern", [
    (np.zeros((3, 4), dtype=ml_dtypes.bfloat16), r"'x'.*\(4, 3\).*bf16.*\(3, 4\)"),
    (np.zeros((4, 3), dtype=np.float32), r"'x'.*bf16.*float32"),
    (torch.zeros((4, 3), dtype=torch.float64), r"'x'.*bf16.*torch.float64"),
])
def test_wrong_input_shape_or_dtype_is_an_error_naming_both(value, pattern):
    with pytest.raises(TrncError, match=pattern):
        run(copy_program(DType.BF16, (4, 3)), {"x": value})


def test_missing_and_unknown_inputs_are_errors():
    with pytest.raises(TrncError, match=r"missing \['x'\]"):
        run(copy_program(DType.FP32, (2, 2)), {})
    with pytest.raises(TrncError, match=r"unknown \['z'\]"):
        run(copy_program(DType.FP32, (2, 2)), {"x": np.zeros((2, 2), np.float32), "z": np.zeros(1)})


def test_fill_nan_shows_reads_of_unwritten_memory():
    shape = (4, 8)
    program = Program((TensorDecl("y", OUT, DType.FP32, shape),), (
        Instruction.make("dma_copy", dst=hbm(0, DType.FP32, shape), src=onchip(DType.FP32, shape, offset=64)),))
    assert np.isnan(run(program, {}, fill_nan=True)["y"]).all()
    assert np.array_equal(run(program, {})["y"], np.zeros(shape, np.float32))


# -- run: ordering --------------------------------------------------------------------------------

def test_queues_run_in_fixed_order_as_their_semaphores_allow():
    shape = (2, 4)
    f32 = DType.FP32
    a, b, c = (onchip(f32, shape, offset=o) for o in (0, 64, 128))
    program = Program((TensorDecl("x", IN, f32, shape), TensorDecl("w", IN, f32, shape),
                       TensorDecl("y", OUT, f32, shape)), (
        Instruction.make("dma_copy", queue=0, dst=a, src=hbm(0, f32, shape), signals=(0,)),
        Instruction.make("dma_copy", queue=1, dst=b, src=hbm(1, f32, shape), signals=(1,)),
        Instruction.make("activation", dst=a, src=a, func=ActFunc.SQUARE, waits=((0, 1),), signals=(2,)),
        Instruction.make("tensor_tensor", dst=c, in0=a, in1=b, op=AluOp.SUB, waits=((1, 1), (2, 1)), signals=(3,)),
        Instruction.make("dma_copy", queue=2, dst=hbm(2, f32, shape), src=c, waits=((3, 1),)),
    ))
    order = []
    x = np.arange(8, dtype=np.float32).reshape(shape)
    w = np.full(shape, 0.5, np.float32)
    out = run(program, {"x": x, "w": w}, on_instruction=lambda i, ins: order.append((i, ins.opcode)))
    # pe, act, dve, pool, dma0, ...: only dma0's head may start; then act's; dve still waits for dma1.
    assert [i for i, _ in order] == [0, 2, 1, 3, 4]
    assert order[1] == (2, "activation")
    assert np.array_equal(out["y"], x * x - w)


def test_unsatisfiable_waits_are_a_deadlock_naming_the_blocked_instructions():
    sb = onchip(DType.FP32, (2, 2))
    psum = onchip(DType.FP32, (2, 2), mem=Mem.PSUM)
    program = Program((), (
        Instruction.make("transpose", dst=psum, src=sb, waits=((1, 1),), signals=(0,)),
        Instruction.make("activation", Engine.ACT, dst=sb, src=psum, waits=((0, 1),), signals=(1,)),
    ))
    # verified=True: the runtime must stop by itself even on a program nobody checked
    with pytest.raises(ExecutionError, match=r"deadlock.*instruction 0 \(transpose on pe\).*sem 1 >= 1.*"
                                             r"instruction 1 \(activation on act\).*sem 0 >= 1"):
        run(program, {}, verified=True)


def test_a_deadlock_after_some_instructions_counts_the_signals_they_gave():
    sb = onchip(DType.FP32, (2, 2))
    program = Program((), (
        Instruction.make("memset", Engine.DVE, dst=sb, value=1.0, signals=(2,)),
        Instruction.make("memset", Engine.POOL, dst=sb, value=2.0, waits=((2, 2),)),
        Instruction.make("memset", Engine.DVE, dst=sb, value=3.0, waits=((3, 1),)),
    ))
    with pytest.raises(ExecutionError, match=r"instruction 2 \(memset on dve\) waits for sem 3 >= 1 \(count 0\); "
                                             r"instruction 1 \(memset on pool\) waits for sem 2 >= 2 \(count 1\)"):
        run(program, {}, verified=True)


@pytest.mark.parametrize("change,words", [
    ({"queue": 16}, "is on queue 'dma16'; queues are pe, act"),
    ({"signals": (-1,)}, "semaphore number is negative"),
])
def test_an_unverified_program_off_the_machine_is_refused_by_name(change, words):
    ins = Instruction.make("dma_copy", Engine.DMA, dst=onchip(DType.FP32, (2, 2)), src=onchip(DType.FP32, (2, 2), offset=64))
    with pytest.raises(TrncError, match=words):
        run(Program((), (ins.replace(**change),)), {}, verified=True)


# -- run: faults ----------------------------------------------------------------------------------

def gather_program(rows, cols, parts):
    dt = DType.FP16
    idx_sb = onchip(DType.INT32, (parts, 1))
    dst = onchip(dt, (parts, cols), offset=64)
    return Program((TensorDecl("table", IN, dt, (rows, cols)), TensorDecl("idx", IN, DType.INT32, (parts, 1)),
                    TensorDecl("y", OUT, dt, (parts, cols))), (
        Instruction.make("dma_copy", queue=0, dst=idx_sb, src=hbm(1, DType.INT32, (parts, 1)), signals=(0,)),
        Instruction.make("dma_gather", queue=1, dst=dst, table=hbm(0, dt, (rows, cols)), index=idx_sb,
                         waits=((0, 1),), signals=(1,)),
        Instruction.make("dma_copy", queue=2, dst=hbm(2, dt, (parts, cols)), src=dst, waits=((1, 1),)),
    ))


def test_gather_takes_table_rows_by_index():
    table = np.random.default_rng(6).standard_normal((10, 4)).astype(np.float16)
    idx = np.array([[3], [0], [9], [3], [7], [1]], dtype=np.int32)
    out = run(gather_program(10, 4, 6), {"table": table, "idx": idx})["y"]
    assert np.array_equal(out.view(np.uint16), table[idx[:, 0]].view(np.uint16))


@pytest.mark.parametrize("bad", [10, -1, 2**31 - 1])
def test_gather_index_outside_the_table_is_an_execution_error(bad):
    idx = np.array([[1], [2], [bad], [0]], dtype=np.int32)
    with pytest.raises(ExecutionError, match=rf"instruction 1 \(dma_gather on dma1\).*index {bad}\b.*\[0, 10\)"):
        run(gather_program(10, 4, 4), {"table": np.zeros((10, 4), np.float16), "idx": idx})


def test_dma_with_partition_stride_and_negative_strides_reverses_rows_and_columns():
    f32 = DType.FP32
    x = np.random.default_rng(7).standard_normal((8, 6)).astype(np.float32)
    # rows 7, 5, 3, 1 and columns 5..0 of x: partition stride -12 elements, free stride -1
    src = AP(Mem.HBM, f32, 4, ((-1, 6),), offset=(7 * 6 + 5) * 4, tensor=0, partition_stride=-12)
    sb = onchip(f32, (4, 6))
    program = Program((TensorDecl("x", IN, f32, (8, 6)), TensorDecl("y", OUT, f32, (4, 6))), (
        Instruction.make("dma_copy", queue=0, dst=sb, src=src, signals=(0,)),
        Instruction.make("dma_copy", queue=1, dst=hbm(1, f32, (4, 6)), src=sb, waits=((0, 1),)),
    ))
    assert np.array_equal(run(program, {"x": x})["y"], x[7::-2, ::-1])


# -- a GEMM program assembled by hand ----------------------------------------------------------------

def gemm_program(m_size, k_size, n_size, tile=128):
    """C[M, N] = A[M, K] @ B[K, N] in bf16 with fp32 PSUM accumulation over K tiles.

    dma0 loads A^T tiles (partition = k: partition stride 1, free stride K), dma1 loads B tiles,
    TensorE accumulates tile after tile into one PSUM bank, VectorE copies PSUM to SBUF, dma2 stores.
    """
    bf16, f32 = DType.BF16, DType.FP32
    tiles = k_size // tile
    psum = onchip(f32, (m_size, n_size), mem=Mem.PSUM)
    out_sb = onchip(f32, (m_size, n_size), offset=tiles * (m_size + n_size) * 2)
    instrs = []
    for t in range(tiles):
        st = onchip(bf16, (tile, m_size), offset=t * m_size * 2)
        mv = onchip(bf16, (tile, n_size), offset=tiles * m_size * 2 + t * n_size * 2)
        a_t = AP(Mem.HBM, bf16, tile, ((k_size, m_size),), offset=t * tile * 2, tensor=0, partition_stride=1)
        b_t = AP(Mem.HBM, bf16, tile, ((1, n_size),), offset=t * tile * n_size * 2, tensor=1,
                 partition_stride=n_size)
        instrs += [Instruction.make("dma_copy", queue=0, dst=st, src=a_t, signals=(0,)),
                   Instruction.make("dma_copy", queue=1, dst=mv, src=b_t, signals=(1,))]
        instrs.append(Instruction.make("matmul", dst=psum, stationary=st, moving=mv, accumulate=t > 0,
                                       waits=((0, t + 1), (1, t + 1)), signals=(2,) if t == tiles - 1 else ()))
    instrs += [Instruction.make("tensor_copy", dst=out_sb, src=psum, waits=((2, 1),), signals=(3,)),
               Instruction.make("dma_copy", queue=2, dst=hbm(2, f32, (m_size, n_size)), src=out_sb,
                                waits=((3, 1),))]
    return Program((TensorDecl("a", IN, bf16, (m_size, k_size)), TensorDecl("b", IN, bf16, (k_size, n_size)),
                    TensorDecl("c", OUT, f32, (m_size, n_size))), tuple(instrs))


def test_bf16_gemm_program_matches_torch_within_the_fp32_accumulation_bound():
    m_size, k_size, n_size = 128, 512, 128
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(m_size, k_size, generator=gen).to(torch.bfloat16)
    b = torch.randn(k_size, n_size, generator=gen).to(torch.bfloat16)
    c = run(gemm_program(m_size, k_size, n_size), {"a": a, "b": b})["c"]

    a64, b64 = a.double(), b.double()
    exact = (a64 @ b64).numpy()
    gamma = k_size * 2.0**-24 / (1 - k_size * 2.0**-24)   # Higham's bound for K sequential fp32 additions
    bound = gamma * (a64.abs() @ b64.abs()).numpy()
    assert (np.abs(c - exact) <= bound).all()
    # and bit for bit the sequential fp32 sum in k order (bf16 products are exact in fp32)
    acc = np.zeros((m_size, n_size), np.float32)
    an, bn = a64.numpy(), b64.numpy()
    for k in range(k_size):
        acc = acc + np.multiply.outer(an[:, k], bn[k]).astype(np.float32)
    assert np.array_equal(c.view(np.uint32), acc.view(np.uint32))
