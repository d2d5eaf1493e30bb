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
