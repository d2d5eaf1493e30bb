"""Cost model: each formula against a cycle count worked out by hand from neuroncore.md."""
import math

import pytest

from trnc.isa import AP, DType, Engine, Instruction, Mem, get_target
from trnc.isa import cost
from trnc.isa.enums import ActFunc, AluOp

TRN2 = get_target("trn2")


def sb(p, n, dtype=DType.BF16, offset=0):
    return AP(Mem.SBUF, dtype, p, ((1, n),), offset=offset)


def ps(p, n):
    return AP(Mem.PSUM, DType.FP32, p, ((1, n),))


@pytest.mark.parametrize("dtype,m,n,expected", [
    (DType.BF16, 128, 512, 512),   # max(min(64,128),512)
    (DType.BF16, 128, 16, 64),     # short moving: MM_INIT_LATENCY-bound
    (DType.BF16, 32, 16, 32),      # max(min(64,32),16)
    (DType.FP32, 128, 512, 2048),  # x4 for fp32
    (DType.FP8_E4M3, 128, 512, 512),
])
def test_matmul_cycles(dtype, m, n, expected):
    ins = Instruction.make("matmul", dst=ps(m, n), stationary=sb(128, m, dtype), moving=sb(128, n, dtype))
    assert cost.cycles(ins, TRN2) == expected


def test_matmul_double_row_runs_at_bf16_speed():
    st = AP(Mem.SBUF, DType.FP8_E4M3, 128, ((128, 2), (1, 128)))
    mv = AP(Mem.SBUF, DType.FP8_E4M3, 128, ((512, 2), (1, 512)), offset=4096)
    ins = Instruction.make("matmul", dst=ps(128, 512), stationary=st, moving=mv, double_row=True)
    assert cost.cycles(ins, TRN2) == 512


@pytest.mark.parametrize("dtype,p,f,expected", [(DType.BF16, 128, 128, 128), (DType.BF16, 16, 100, 64),
                                                (DType.FP32, 128, 128, 256)])
def test_transpose_cycles(dtype, p, f, expected):
    ins = Instruction.make("transpose", dst=AP(Mem.PSUM, dtype, f, ((1, p),)), src=sb(p, f, dtype))
    assert cost.cycles(ins, TRN2) == expected


@pytest.mark.parametrize("n,accum,expected", [(32, False, 64), (1000, False, 1000), (1000, True, 1064)])
def test_activation_cycles(n, accum, expected):
    acc = AP(Mem.SBUF, DType.FP32, 128, ((1, 1),), offset=8192) if accum else None
    ins = Instruction.make("activation", dst=sb(128, n), src=sb(128, n), func=ActFunc.EXP, accum=acc)
    assert cost.cycles(ins, TRN2) == expected


def test_vector_and_gpsimd_cycles():
    f32 = DType.FP32
    tt = Instruction.make("tensor_tensor", dst=sb(128, 100, f32), in0=sb(128, 100, f32), in1=sb(128, 100, f32))
    assert cost.cycles(tt, TRN2) == 200                       # max(64, 2N)
    ts = Instruction.make("tensor_scalar", Engine.POOL, dst=sb(128, 100), src=sb(128, 100))
    assert cost.cycles(ts, TRN2) == 150 + 100                 # GPSIMD_START + N on GpSimdE
    assert cost.cycles(ts.replace(engine=Engine.DVE), TRN2) == 100
    iota = Instruction.make("iota", dst=sb(128, 10, DType.INT32))
    assert cost.cycles(iota, TRN2) == 160
    red = Instruction.make("partition_reduce", dst=sb(1, 10, DType.FP32), src=sb(128, 10, DType.FP32))
    assert cost.cycles(red, TRN2) == 150 + 10 * 8             # 8 cores of 16 partitions


def test_dma_nanoseconds_and_seconds():
    hbm = AP(Mem.HBM, DType.BF16, 128, ((1, 512),), tensor=0, partition_stride=512)
    ins = Instruction.make("dma_copy", dst=sb(128, 512), src=hbm)
    expected_ns = math.ceil(600 + 128 * 512 * 2 / 23)
    assert cost.cycles(ins, TRN2) == expected_ns
    assert cost.seconds(ins, TRN2) == pytest.approx(expected_ns * 1e-9)
    assert cost.cycles(ins, get_target("trn1")) == math.ceil(1300 + 128 * 512 * 2 / 17)


def test_seconds_use_the_engine_clock():
    ins = Instruction.make("matmul", dst=ps(128, 512), stationary=sb(128, 128), moving=sb(128, 512))
    assert cost.seconds(ins, TRN2) == pytest.approx(512 / 2.4e9)
    act = Instruction.make("activation", dst=sb(128, 1200), src=sb(128, 1200))
    assert cost.seconds(act, TRN2) == pytest.approx(1200 / 1.2e9)


def test_peak_rates_match_the_reference_sheet():
    # neuroncore.md 1.2: NC-v3 79 TFLOPS bf16, 20 fp32, 158 fp8; NC-v4 315 MX; NC-v2 92 bf16.
    assert TRN2.peak_flops(DType.BF16) / 1e12 == pytest.approx(79, rel=0.01)
    assert TRN2.peak_flops(DType.FP32) / 1e12 == pytest.approx(20, rel=0.02)
    assert TRN2.peak_flops(DType.FP8_E4M3, double_row=True) / 1e12 == pytest.approx(158, rel=0.01)
    assert get_target("trn3").peak_flops(DType.FP8_E4M3, mx=True) / 1e12 == pytest.approx(315, rel=0.01)
    assert get_target("trn1").peak_flops(DType.BF16) / 1e12 == pytest.approx(92, rel=0.01)


def test_every_opcode_has_a_cost_that_runs():
    from trnc.isa.opcodes import TABLE
    for op in TABLE:
        assert callable(op.cost) and op.cost.__doc__, op.name


def test_tensor_tensor_one_pass_cases():
    """max(MIN_II, N) on VectorE with one input in PSUM (an evacuation adding a tile), or all operands bf16 in
    SBUF with add/subtract/multiply and contiguous rows; 2N otherwise, and always 2N on GpSimdE."""
    f32, bf16 = DType.FP32, DType.BF16
    evac = Instruction.make("tensor_tensor", dst=sb(128, 512, f32), in0=ps(128, 512), in1=sb(128, 512, f32),
                            op=AluOp.ADD)
    assert cost.cycles(evac, TRN2) == 512
    assert cost.cycles(evac.replace(engine=Engine.POOL), TRN2) == 1024
    fast = Instruction.make("tensor_tensor", dst=sb(128, 300), in0=sb(128, 300), in1=sb(128, 300), op=AluOp.MUL)
    assert cost.cycles(fast, TRN2) == 300
    assert cost.cycles(fast.replace(args=tuple((k, AluOp.DIV if k == "op" else v) for k, v in fast.args)),
                       TRN2) == 600                         # not add, subtract or multiply
    strided = AP(Mem.SBUF, bf16, 128, ((2, 300),))
    assert cost.cycles(Instruction.make("tensor_tensor", dst=sb(128, 300), in0=strided, in1=sb(128, 300),
                                        op=AluOp.ADD), TRN2) == 600
    mixed = Instruction.make("tensor_tensor", dst=sb(128, 300, f32), in0=sb(128, 300), in1=sb(128, 300),
                             op=AluOp.ADD)
    assert cost.cycles(mixed, TRN2) == 600                  # an fp32 operand


# -- the formulas by size, which the compiler's estimates use --------------------------------------------

@pytest.mark.parametrize("m,n,fp32,expected", [(128, 512, False, 512), (128, 16, False, 64), (32, 16, False, 32),
                                               (128, 512, True, 2048), (8, 8, True, 32)])
def test_matmul_cycles_by_size_are_the_instruction_cost(m, n, fp32, expected):
    dtype = DType.FP32 if fp32 else DType.BF16
    ins = Instruction.make("matmul", dst=ps(m, n), stationary=sb(128, m, dtype), moving=sb(128, n, dtype))
    assert cost.matmul_cycles(m, n, fp32) == cost.cycles(ins, TRN2) == expected
    assert cost.matmul_seconds(m, n, fp32, TRN2) == cost.seconds(ins, TRN2)


def test_a_full_matmul_runs_at_the_reference_peak():
    # neuroncore.md 2.1: back-to-back 128x128 stationary by 128x512 moving is the best case; 1.2: 79 TFLOPS bf16
    # and 20 fp32 on NC-v3 (2.4 GHz), the fp32 rate a quarter of bf16's.
    flops = 2 * 128 * 128 * 512
    assert flops / cost.matmul_seconds(128, 512, False, TRN2) / 1e12 == pytest.approx(79, rel=0.01)
    assert flops / cost.matmul_seconds(128, 512, True, TRN2) / 1e12 == pytest.approx(20, rel=0.02)
    for dtype, fp32 in ((DType.BF16, False), (DType.FP32, True)):    # the peak rate and the cost model agree
        assert cost.peak_pe_cycles(128 * 128 * 512, dtype, TRN2) == cost.matmul_cycles(128, 512, fp32)


def test_gemm_cycles_tile_the_contraction_and_both_sides():
    # K = 130: two k-tiles; S = 200: 128 + 72 columns; V = 600: 512 + 88 columns.
    assert cost.gemm_cycles(200, 600, 130) == 2 * (512 + 88 + 512 + 88)
    assert cost.gemm_cycles(200, 600, 130, fp32=True) == 4 * cost.gemm_cycles(200, 600, 130)
    assert cost.gemm_cycles(128, 16, 16) == 64                     # a short moving side: the 64-cycle floor
    # 4096^3 bf16 in full-rate matmuls is the roofline of tests/golden/gemm_4096_bf16.json
    assert cost.gemm_cycles(4096, 4096, 4096) / TRN2.clock_hz["pe"] == 0.0017476266666666667


def test_dma_bytes_count_the_wider_dtype():
    assert cost.dma_nbytes(100, DType.BF16, DType.FP32) == 400
    assert cost.dma_nbytes(100, DType.FP8_E4M3) == 100
    cast = Instruction.make("dma_copy", dst=sb(128, 64, DType.BF16),
                            src=AP(Mem.HBM, DType.FP32, 128, ((1, 64),), tensor=0, partition_stride=64))
    assert cost.dma_bytes(cast) == 128 * 64 * 4
    assert cost.cycles(cast, TRN2) == math.ceil(cost.dma_ns(128 * 64 * 4, TRN2))


def test_dma_time_and_rates_match_the_reference_sheet():
    # neuroncore.md 2.5: 17 / 23 / 33 B/ns per queue = 272 / 368 / 528 GB/s per NeuronCore over 16 queues;
    # a fixed 600 ns per DMA instruction on NC-v3 (1300 ns semaphore-to-start on trn1).
    for name, per_core in (("trn1", 272e9), ("trn2", 368e9), ("trn3", 528e9)):
        assert cost.dma_rate(get_target(name), 16) == pytest.approx(per_core)
    assert cost.dma_ns(0, TRN2) == 600 and cost.dma_ns(0, get_target("trn1"), pieces=2) == 2600
    # one queue moved 32 KiB in 1416 ns on NC-v3: the bandwidth part of the model, within 1 %
    assert cost.dma_ns(32768, TRN2) - cost.dma_ns(0, TRN2) == pytest.approx(1416, rel=0.01)
    assert cost.dma_ns(23_000, TRN2, pieces=4) == 4 * 600 + 1000


def test_queue_clocks_by_hand():
    clocks = cost.QueueClocks(TRN2)
    clocks.add_dmas(23_000, 2)       # 2 x 600 ns + 1000 ns, shared by the 16 queues
    assert clocks.dma_seconds == pytest.approx(2200e-9 / 16, rel=1e-12)
    clocks.add_pe(1e-6)
    clocks.add_dmas(0, 1)            # queued once TensorE got there: 1 us, plus 600 ns / 16
    assert clocks.dma_seconds == pytest.approx(1e-6 + 600e-9 / 16, rel=1e-12)
    assert clocks.dmas == 3 and clocks.pe_seconds == 1e-6
    # 368 kB more take the 16 queues 1 us; needed at 5 us, they leave 5 - 1.0375 - 1 us
    assert clocks.slack(5e-6, 368_000) == pytest.approx(2.9625e-6, rel=1e-12)
    assert clocks.slack(1.5e-6, 368_000) < 0     # TensorE would wait


def test_roofline():
    # tests/runtime/test_perf.py's gemm example: 1024 cycles of MACs at peak, 589824 compulsory bytes at 3 TB/s / 8
    r = cost.Roofline.of(1024.0, 589824, TRN2)
    assert (r.pe_seconds, r.hbm_seconds) == (1024 / 2.4e9, 589824 / 375e9)
    assert r.seconds == r.hbm_seconds
    assert r.efficiency(2 * r.seconds) == 0.5 and r.efficiency(0.0) == 0.0
    # neuroncore.md 1.2 [INF] ridge: 79 TFLOPS over 3 TB/s / 8 is about 210 FLOP per byte
    macs = 105 * 10**6
    ridge = cost.Roofline.of(cost.peak_pe_cycles(macs, DType.BF16, TRN2), 10**6, TRN2)
    assert ridge.pe_seconds == pytest.approx(ridge.hbm_seconds, rel=0.01)


@pytest.mark.parametrize("dtype,double_row,mx,cycles", [(DType.BF16, False, False, 512), (DType.FP32, False, False, 2048),
                                                        (DType.FP8_E4M3, True, False, 256), (DType.FP8_E4M3, False, True, 128)])
def test_peak_pe_cycles_per_dtype(dtype, double_row, mx, cycles):
    assert cost.peak_pe_cycles(128 * 128 * 512, dtype, get_target("trn3"), double_row, mx) == cycles
