"""The verifier: one small program per rule that breaks exactly that rule, and valid programs that pass."""
from dataclasses import replace

import pytest

from trnc import flags
from trnc.errors import VerifyError
from trnc.isa import TABLE, AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, ReduceOp, Rounding
from trnc.isa import TensorDecl, TensorKind, get_target
from trnc.isa import verify as verify_module
from trnc.isa.verify import check, verify

F32, BF16, FP8, E8M0, I32 = DType.FP32, DType.BF16, DType.FP8_E4M3, DType.E8M0, DType.INT32
make = Instruction.make

TENSORS = (
    TensorDecl("x", TensorKind.INPUT, F32, (128, 64)),
    TensorDecl("table", TensorKind.CONST, F32, (100, 16)),
    TensorDecl("out", TensorKind.OUTPUT, F32, (64, 64)),
)


def sb(p, dims=((1, 64),), off=0, start=0, dt=F32):
    return AP(Mem.SBUF, dt, p, tuple(dims), off, start)


def ps(p, dims=((1, 64),), off=0, start=0, dt=F32):
    return AP(Mem.PSUM, dt, p, tuple(dims), off, start)


def hbm(tensor, p, dims, pstride, off=0, dt=F32):
    return AP(Mem.HBM, dt, p, tuple(dims), off, tensor=tensor, partition_stride=pstride)


def chain(instrs, target="trn3", tensors=TENSORS):
    """A program running `instrs` one after another: each signals its queue's semaphore and waits for the
    previous instruction when that one is on another queue."""
    sems, counts, out = {}, {}, []
    for k, ins in enumerate(instrs):
        waits = ()
        if k and instrs[k - 1].queue_name != ins.queue_name:
            q = instrs[k - 1].queue_name
            waits = ((sems[q], counts[q]),)
        s = sems.setdefault(ins.queue_name, len(sems))
        counts[ins.queue_name] = counts.get(ins.queue_name, 0) + 1
        out.append(ins.replace(waits=waits + ins.waits, signals=(s,)))
    return Program(tensors, tuple(out), target)


def every_opcode():
    """Every opcode in a valid form on trn3, in an order where each reads what an earlier one wrote."""
    x = sb(128)                                          # fp32 [128, 64] at byte 0
    return [
        make("dma_copy", Engine.DMA, queue=0, dst=x, src=hbm(0, 128, [(1, 64)], 64)),
        make("iota", dst=sb(32, [(1, 1)], off=5000, dt=I32), base=0, partition_step=3),
        make("random", dst=sb(16, [(1, 8)], off=5200), seed=sb(1, [(1, 1)], off=5000, dt=I32), stream=3,
          partition_step=8, steps=(1, 0, 0, 0)),
        make("dma_gather", Engine.DMA, queue=1, dst=sb(32, [(1, 16)], off=4096), table=hbm(1, 100, [(1, 16)], 16),
          index=sb(32, [(1, 1)], off=5000, dt=I32)),
        make("tensor_copy", Engine.DVE, dst=sb(128, off=1024, dt=BF16), src=x),
        make("matmul", dst=ps(64), stationary=sb(128, off=1024, dt=BF16), moving=sb(128, off=1024, dt=BF16)),
        make("tensor_copy", Engine.ACT, dst=sb(128, off=2048, dt=FP8), src=x, rounding=Rounding.SR, seed=7),
        make("matmul", dst=ps(32, [(1, 32)], off=2048), stationary=sb(128, [(32, 2), (1, 32)], off=2048, dt=FP8),
          moving=sb(128, [(32, 2), (1, 32)], off=2048, dt=FP8), double_row=True),
        make("quantize_mx", dst=sb(128, off=3072, dt=FP8), scale=sb(4, off=3200, dt=E8M0), src=x),
        make("matmul_mx", dst=ps(64, off=4096), stationary=sb(128, off=3072, dt=FP8),
          stationary_scale=sb(4, off=3200, dt=E8M0), moving=sb(128, off=3072, dt=FP8),
          moving_scale=sb(4, off=3200, dt=E8M0), accumulate=False),
        make("transpose", dst=ps(64, [(1, 128)], off=6144), src=x),
        make("memset", Engine.POOL, dst=sb(64, [(1, 2)], off=9000), value=0.5),
        make("activation", dst=sb(64, off=8192), src=ps(64), func=ActFunc.GELU, scale_ap=sb(64, [(1, 1)], off=9000),
          bias_ap=sb(64, [(1, 1)], off=9004), accum=sb(64, [(1, 1)], off=9008)),
        make("tensor_tensor", Engine.DVE, dst=sb(64, off=10000), in0=ps(64), in1=sb(64, off=8192), op=AluOp.ADD),
        make("tensor_scalar", Engine.ACT, dst=sb(64, off=11000), src=sb(64, off=10000), op0=AluOp.MUL, scalar0=2.0,
          op1=AluOp.ADD, scalar1=1.0),
        make("tensor_scalar", Engine.POOL, dst=sb(64, off=11000), src=sb(64, off=11000), op0=AluOp.MAX,
          scalar0_ap=sb(64, [(1, 1)], off=9000), op1=AluOp.POW, scalar1=2.0, reverse1=True),
        make("tensor_reduce", dst=sb(64, [(1, 4)], off=12000), src=sb(64, [(16, 4), (1, 16)], off=10000),
          op=ReduceOp.MAX, axes=0b10),
        make("select", dst=sb(64, off=12100), pred=sb(64, off=11000), on_true=sb(64, off=10000),
          on_false=ps(64, [(2, 32), (1, 2)])),
        make("affine_select", dst=sb(64, off=13000), src=sb(64, off=10000), cmp=AluOp.GE, fill=-1e9,
          partition_step=1, steps=(-1, 0, 0, 0)),
        make("partition_reduce", dst=sb(1, off=14000), src=sb(64, off=10000), op=ReduceOp.SUM),
        make("partition_broadcast", dst=sb(64, off=15000), src=sb(1, off=14000)),
        make("tensor_copy", Engine.DVE, dst=sb(4, off=16000), src=sb(4, off=3200, dt=E8M0)),
        make("dma_copy", Engine.DMA, queue=2, dst=hbm(2, 64, [(1, 64)], 64), src=sb(64, off=13000)),
    ]


def test_every_opcode_passes_on_trn3():
    instrs = every_opcode()
    assert {ins.opcode for ins in instrs} == {spec.name for spec in TABLE}
    program = chain(instrs)
    assert check(program) == []
    verify(program)


def tiled_gemm(drop_wait_of=None):
    """C[128, 1024] = A[256, 128].T @ B[256, 1024] in bf16 on trn2: K in 2 tiles, N in 2 PSUM banks, B tiles
    double-buffered on dma1, the results evacuated by ACT and stored by dma2. Semaphores: s0 A loaded (dma0),
    s1 B tile loaded (dma1), s2 matmul done (pe), s3 bank evacuated (act)."""
    tensors = (TensorDecl("a", TensorKind.INPUT, BF16, (256, 128)),
               TensorDecl("b", TensorKind.INPUT, BF16, (256, 1024)),
               TensorDecl("c", TensorKind.OUTPUT, F32, (128, 1024)))
    a = [sb(128, [(1, 128)], off=kt * 256, dt=BF16) for kt in range(2)]
    b = [sb(128, [(1, 512)], off=1024 + buf * 1024, dt=BF16) for buf in range(2)]
    ins = [make("dma_copy", Engine.DMA, queue=0, dst=a[kt], src=hbm(0, 128, [(1, 128)], 128, off=kt * 128 * 256,
                                                                   dt=BF16), signals=[0]) for kt in range(2)]
    step = 0
    for nt in range(2):
        for kt in range(2):
            src = hbm(1, 128, [(1, 512)], 1024, off=(kt * 128 * 1024 + nt * 512) * 2, dt=BF16)
            waits = [(2, step - 1)] if step >= 2 else []      # the matmul that read this buffer is done
            ins.append(make("dma_copy", Engine.DMA, queue=1, dst=b[step % 2], src=src, waits=waits, signals=[1]))
            ins.append(make("matmul", dst=ps(128, [(1, 512)], off=nt * 2048), stationary=a[kt], moving=b[step % 2],
                         accumulate=kt > 0, waits=[(0, kt + 1), (1, step + 1)], signals=[2]))
            step += 1
        out = sb(128, [(1, 512)], off=8192 + nt * 2048)
        ins.append(make("activation", dst=out, src=ps(128, [(1, 512)], off=nt * 2048), func=ActFunc.COPY,
                     waits=[(2, step)], signals=[3]))
        ins.append(make("dma_copy", Engine.DMA, queue=2, dst=hbm(2, 128, [(1, 512)], 1024, off=nt * 2048), src=out,
                     waits=[(3, nt + 1)]))
    if drop_wait_of is not None:
        ins[drop_wait_of] = ins[drop_wait_of].replace(waits=())
    return Program(tensors, tuple(ins), "trn2")


def test_tiled_gemm_passes():
    verify(tiled_gemm())


def test_tiled_gemm_without_the_buffer_release_wait_races():
    program = tiled_gemm()
    k = next(i for i, ins in enumerate(program.instructions) if ins.opcode == "dma_copy" and ins.queue == 1
             and ins.waits)                                 # the third B load overwrites buffer 0
    found = check(tiled_gemm(drop_wait_of=k))
    assert {v.rule for v in found} == {"race"}
    assert any(v.index == k and "moving of instruction 3" in v.message for v in found)


# -- one broken rule per case ------------------------------------------------------------------------

FILLER = [make("memset", Engine.POOL, dst=sb(32, [(1, 4)], off=170000), value=0.0)] * 2


def broken(ins, target="trn3", tensors=TENSORS):
    """The instruction after two unrelated valid ones, so that it has index 2."""
    return chain([*FILLER, ins], target, tensors)


def with_fields(ins, **fields):
    return ins.replace(args=tuple((k, fields.get(k, v)) for k, v in ins.args))


def op(name, k=0):
    return [ins for ins in every_opcode() if ins.opcode == name][k]


def expect(program, rule, index, *words):
    found = check(program)
    assert found and {v.rule for v in found} == {rule}, [(v.rule, v.message) for v in found]
    with pytest.raises(VerifyError) as err:
        verify(program)
    text = str(err.value)
    assert f"instruction {index}: {rule}:" in text
    for w in words:
        assert w in text, (w, text)
    assert err.value.violations == found


def test_unknown_opcode():
    expect(broken(Instruction("frobnicate", Engine.DVE, ())), "opcode", 2, "frobnicate", "tensor_tensor")


@pytest.mark.parametrize("ins,words", [
    (with_fields(op("tensor_tensor"), op="add"), ["op", "AluOp"]),
    (with_fields(op("memset"), dst=None), ["dst", "access pattern"]),
    (with_fields(op("iota"), steps=(1, 2)), ["steps", "4 x i32"]),
    (with_fields(op("tensor_reduce"), axes=-1), ["axes", "u32"]),
    (op("memset").replace(args=op("memset").args[::-1]), ["fields are"]),
])
def test_fields(ins, words):
    expect(broken(ins), "fields", 2, *words)


@pytest.mark.parametrize("name,fields,words", [
    ("tensor_tensor", {"op": (AluOp.ADD,)}, ["op", "AluOp"]),   # one word once packed, but not an AluOp
    ("iota", {"steps": [0, 0, 0, 0]}, ["steps", "4 x i32"]),      # four words once packed, but not a tuple
    ("iota", {"base": 1.0}, ["base", "i32"]),
])
def test_an_ill_typed_field_is_refused_after_a_valid_instruction_of_its_opcode(name, fields, words):
    """The field rows that stand for an instruction's form must not merge it with a valid one."""
    expect(chain([op(name), with_fields(op(name), **fields)]), "fields", 1, *words)


def test_engine():
    expect(broken(op("tensor_tensor").replace(engine=Engine.ACT)), "engine", 2, "tensor_tensor runs on dve, pool",
           "not act")


@pytest.mark.parametrize("ins,words", [
    (op("dma_copy").replace(queue=16), ["DMA queue 16", "[0, 16)"]),
    (op("tensor_tensor").replace(queue=1), ["queue 1 on dve", "number 0"]),
])
def test_queue(ins, words):
    expect(broken(ins), "queue", 2, *words)


@pytest.mark.parametrize("ins,words", [
    (with_fields(op("memset"), dst=sb(0, [(1, 2)], off=9000)), ["partition count 0"]),
    (with_fields(op("memset"), dst=sb(64, [(1, 1)] * 5, off=9000)), ["5 free dims", "at most 4"]),
    (with_fields(op("memset"), dst=sb(64, [(1, 0)], off=9000)), ["count 0", "[1, 65535]"]),
    (with_fields(op("tensor_copy"), src=sb(128, [(0, 65536)], dt=F32), dst=sb(128, [(1, 65536)], off=1024,
                                                                               dt=FP8)), ["count 65536"]),
    (with_fields(op("partition_broadcast"), src=sb(1, [(2**31, 1), (1, 64)], off=14000)), ["stride 2147483648"]),
    (with_fields(op("memset"), dst=sb(64, [(1, 2)], off=9002)), ["offset 9002", "multiple of 4"]),
    (with_fields(op("memset"), dst=sb(64, [(1, 2)], off=-4)), ["offset -4"]),
    (with_fields(op("memset"), dst=replace(sb(64, [(1, 2)], off=9000), tensor=0)), ["on-chip AP", "tensor (0)"]),
    (with_fields(op("memset"), dst=sb(16, [(1, 2)], start=128 - 8)), ["partitions [120, 136)", "[0, 128)"]),
    (with_fields(op("dma_copy"), src=hbm(5, 128, [(1, 64)], 64)), ["tensor 5 does not exist", "declares 3"]),
    (with_fields(op("dma_copy"), src=hbm(0, 128, [(1, 128)], 64, dt=BF16), dst=sb(128, [(1, 128)], dt=BF16)),
     ["bf16 differs from tensor 'x' (fp32)"]),
    (with_fields(op("memset"), dst=sb(64, [(0, 2)], off=9000)), ["stride 0", "read operands"]),
    (with_fields(op("dma_copy", 1), dst=hbm(2, 64, [(1, 64)], 0)), ["partition stride 0"]),
    (with_fields(op("tensor_reduce"), src=sb(128, [(0, 65535)] * 4)), ["spans", "at most 2^32"]),  # hangs if run
])
def test_ap_form(ins, words):
    expect(broken(ins), "ap-form", 2, *words)


@pytest.mark.parametrize("ins,target,words", [
    (with_fields(op("memset"), dst=sb(64, [(1, 2)], off=212984 - 4)), "trn2", ["[212980, 212988)", "212984 bytes"]),
    (with_fields(op("memset"), dst=sb(64, [(1, 2)], off=212984 - 4)), "trn3", None),  # trn3 partitions are larger
    (with_fields(op("tensor_tensor"), in0=ps(64, off=16384 - 128)), "trn3", ["in0", "[16256, 16512)", "psum"]),
    (with_fields(op("dma_copy", 1), dst=hbm(2, 64, [(1, 64)], 64, off=4)), "trn3", ["[4, 16388)", "tensor 'out'"]),
    (with_fields(op("memset"), dst=sb(64, [(-1, 2)], off=0)), "trn3", ["[-4, 4)"]),
])
def test_ap_bounds(ins, target, words):
    if words is None:
        assert check(broken(ins, target)) == []
    else:
        expect(broken(ins, target), "ap-bounds", 2, *words)


@pytest.mark.parametrize("ins,words", [
    (with_fields(op("memset"), dst=sb(64, [(1, 2)], start=32)), ["partition 32 with 64", "{0, 64}"]),
    (with_fields(op("memset"), dst=sb(100, [(1, 2)], start=28)), ["partition 28 with 100", "{0}"]),
    (with_fields(op("memset"), dst=sb(16, [(1, 2)], start=16)), ["partition 16 with 16", "{0, 32, 64, 96}"]),
    (with_fields(op("transpose"), dst=ps(64, [(1, 16)], start=32), src=sb(16, start=32)),
     ["dst starts at partition 32"]),
])
def test_partition_align(ins, words):
    expect(broken(ins), "partition-align", 2, *words)


def test_dma_needs_no_partition_alignment():
    dma = with_fields(op("dma_copy"), dst=sb(16, start=16), src=hbm(0, 16, [(1, 64)], 64))
    assert check(broken(dma)) == []


@pytest.mark.parametrize("ins,words", [
    (with_fields(op("tensor_tensor").replace(engine=Engine.POOL)), ["in0 is in psum", "on pool", "from sbuf"]),
    (with_fields(op("matmul"), moving=ps(128, dt=BF16, off=8192)), ["moving is in psum"]),
    (with_fields(op("dma_copy"), dst=ps(128)), ["dst is in psum", "dma_copy on dma"]),
    (with_fields(op("tensor_copy"), src=hbm(0, 128, [(1, 64)], 64)), ["src is in hbm", "psum, sbuf"]),
    (with_fields(op("quantize_mx"), scale=ps(4, dt=E8M0)), ["scale is in psum"]),
    (with_fields(op("dma_gather"), table=sb(100, [(1, 16)], off=6000)), ["table is in sbuf", "from hbm"]),
    (with_fields(op("transpose"), dst=sb(64, [(1, 128)], off=6144)), ["dst is in sbuf", "from psum"]),
])
def test_memory(ins, words):
    expect(broken(ins), "memory", 2, *words)


def test_psum_bank():
    ins = with_fields(op("matmul"), dst=ps(64, off=2048 - 128))
    expect(broken(ins), "psum-bank", 2, "[1920, 2176)", "banks 0 to 1", "2048-byte bank")
    assert check(broken(with_fields(op("matmul"), dst=ps(64, off=2048 - 256)))) == []


MM = op("matmul")
MX = op("matmul_mx")


@pytest.mark.parametrize("ins,words", [
    (with_fields(op("tensor_tensor"), in1=sb(64, [(1, 63)], off=8192)), ["in1 [64, 63]", "equal partitions"]),
    (with_fields(op("tensor_tensor"), in1=sb(32, [(1, 128)], off=8192)), ["in1 [32, 128]"]),
    (with_fields(op("activation"), bias_ap=sb(64, [(1, 2)], off=9000)), ["bias_ap is [64, 2]", "[64, 1]"]),
    (with_fields(op("dma_copy"), src=hbm(0, 64, [(1, 128)], 128)), ["src [64, 128]"]),
    (with_fields(MM, moving=sb(64, off=1024, dt=BF16)), ["moving partitions is 64", "K = 128"]),
    (with_fields(MM, stationary=sb(128, [(1, 130)], off=1024, dt=BF16), dst=ps(128)),
     ["free size M is 130", "at most 128"]),
    (with_fields(MM, moving=sb(128, [(1, 520)], off=1024, dt=BF16), dst=ps(64, [(1, 512)])),
     ["free size N is 520", "at most 512"]),
    (with_fields(MM, dst=ps(64, [(1, 32)])), ["dst is [64, 32]", "[64, 64]"]),
    (with_fields(op("matmul", 1), stationary=sb(128, [(1, 64)], off=2048, dt=FP8)), ["first free dim to count 2"]),
    (with_fields(MX, stationary=sb(80, off=3072, dt=FP8), moving=sb(80, off=3072, dt=FP8),
                 stationary_scale=sb(2, off=3200, dt=E8M0), moving_scale=sb(2, off=3200, dt=E8M0)),
     ["partitions K is 80", "multiple of 32"]),
    (with_fields(MX, stationary=sb(128, [(8, 8), (1, 8)], off=3072, dt=FP8),
                 stationary_scale=sb(4, [(8, 8), (1, 8)], off=3200, dt=E8M0), dst=ps(8)),
     ["row-group count R is 8", "at most 4"]),
    (with_fields(MX, moving_scale=sb(4, [(1, 32)], off=3200, dt=E8M0)), ["moving_scale is [4, 32]", "[4, 64]"]),
    (with_fields(op("transpose"), src=sb(128, [(1, 130)]), dst=ps(128, [(1, 128)], off=6144)),
     ["src free size is 130"]),
    (with_fields(op("transpose"), dst=ps(64, [(1, 64)], off=6144)), ["dst is [64, 64]", "[64, 128]"]),
    (with_fields(op("tensor_reduce"), axes=0), ["axes 0b0", "bits 0..1"]),
    (with_fields(op("tensor_reduce"), axes=0b100), ["axes 0b100"]),
    (with_fields(op("tensor_reduce"), axes=0b01), ["dst is [64, 4]", "[64, 16]"]),
    (with_fields(op("partition_reduce"), dst=sb(2, off=14000)), ["[1, 64]"]),
    (with_fields(op("partition_broadcast"), src=sb(2, off=14000)), ["src partitions is 2"]),
    (with_fields(op("dma_gather"), index=sb(32, [(1, 2)], off=5000, dt=I32)), ["index is [32, 2]", "[32, 1]"]),
    (with_fields(op("dma_gather"), dst=sb(32, [(1, 8)], off=4096)), ["dst free size 8", "row size 16"]),
    (with_fields(op("quantize_mx"), src=sb(48), dst=sb(48, off=3072, dt=FP8), scale=sb(1, off=3200, dt=E8M0)),
     ["src partitions is 48", "multiple of 32"]),
    (with_fields(op("quantize_mx"), scale=sb(4, [(1, 32)], off=3200, dt=E8M0)), ["scale is [4, 32]", "[4, 64]"]),
    (with_fields(op("iota"), steps=(1, 1, 0, 0)), ["steps [1, 1, 0, 0]", "beyond the 1"]),
    (with_fields(op("random"), seed=sb(2, [(1, 1)], off=5000, dt=I32)), ["seed is [2, 1]", "[1, 1]"]),
    (with_fields(op("random"), steps=(1, 1, 0, 0)), ["steps [1, 1, 0, 0]", "beyond the 1"]),
])
def test_shape(ins, words):
    expect(broken(ins), "shape", 2, *words)


@pytest.mark.parametrize("ins,words", [
    (with_fields(MM, stationary=sb(128, off=1024, dt=DType.INT8), moving=sb(128, off=1024, dt=DType.INT8)),
     ["stationary is int8", "matmul input"]),
    (with_fields(MM, stationary=sb(128)), ["stationary is fp32, moving bf16", "both inputs or neither"]),
    (with_fields(MM, dst=ps(64, dt=BF16)), ["dst is bf16", "fp32"]),
    (with_fields(op("matmul", 1), moving=sb(128, [(32, 2), (1, 32)], off=1024, dt=BF16)), ["double_row takes fp8"]),
    (with_fields(MX, moving=sb(128, off=1024, dt=BF16)), ["moving is bf16", "MX element type"]),
    (with_fields(MX, moving_scale=sb(4, off=3072, dt=FP8)), ["moving_scale is fp8_e4m3", "e8m0"]),
    (with_fields(op("quantize_mx"), src=sb(128, off=2048, dt=FP8)), ["src is fp8_e4m3", "bf16, fp16, fp32"]),
    (with_fields(op("tensor_tensor"), in1=sb(64, off=3200, dt=E8M0)), ["in1 is e8m0", "MX scale"]),
    (with_fields(op("dma_copy"), dst=sb(128, dt=E8M0)), ["dst is e8m0"]),
    (with_fields(op("tensor_copy", 2), dst=sb(4, off=3300, dt=E8M0), src=sb(4, off=16000)), ["dst is e8m0"]),
    (with_fields(op("transpose"), src=sb(128, off=1024, dt=BF16), dst=ps(64, [(1, 128)], off=6144, dt=DType.FP16)),
     ["dst is fp16 and src bf16"]),
    (with_fields(op("transpose"), src=sb(128, off=1024, dt=DType.INT8), dst=ps(64, [(1, 128)], off=6144)),
     ["dst is fp32 and src int8"]),
    (with_fields(op("dma_gather"), dst=sb(32, [(1, 16)], off=4096, dt=I32)), ["dst is int32 and the table fp32"]),
    (with_fields(op("dma_gather"), index=sb(32, [(1, 1)], off=5000)), ["index is fp32", "gather index"]),
    (with_fields(op("activation"), accum=sb(64, [(1, 1)], off=9008, dt=BF16)), ["accum is bf16"]),
    (with_fields(op("tensor_copy", 1), dst=sb(128, off=2048, dt=DType.INT8)), ["rounding=sr needs a float dst"]),
    (with_fields(op("random"), dst=sb(16, [(1, 8)], off=5200, dt=BF16)), ["dst is bf16", "random draw"]),
    (with_fields(op("random"), seed=sb(1, [(1, 1)], off=5000)), ["seed is fp32", "the seed"]),
])
def test_dtype(ins, words):
    expect(broken(ins), "dtype", 2, *words)


def test_e8m0_copies_are_allowed():
    tensors = (*TENSORS, TensorDecl("s", TensorKind.INPUT, E8M0, (4, 64)))
    load = with_fields(op("dma_copy"), dst=sb(4, off=3300, dt=E8M0), src=hbm(3, 4, [(1, 64)], 64, dt=E8M0))
    copy = with_fields(op("tensor_copy", 2), dst=sb(4, off=3400, dt=E8M0), src=sb(4, off=3300, dt=E8M0))
    assert check(chain([load, copy], tensors=tensors)) == []


@pytest.mark.parametrize("ins,target,words", [
    (MX, "trn2", ["matmul_mx needs a target with mx (trn3)", "trn2 has none"]),
    (op("quantize_mx"), "trn2", ["quantize_mx needs"]),
    (op("matmul", 1), "trn1", ["double_row needs a target with fp8_double_row (trn2, trn3)"]),
])
def test_target(ins, target, words):
    expect(broken(ins, target), "target", 2, *words)


@pytest.mark.parametrize("ins,words", [
    (with_fields(op("affine_select"), cmp=AluOp.ADD), ["cmp is add", "eq, ge, gt, le, lt, ne"]),
    (with_fields(op("tensor_scalar"), op1=AluOp.SUB), ["op1 is sub", "on act supports add, bypass, mul"]),
])
def test_op(ins, words):
    expect(broken(ins), "op", 2, *words)


def test_tensor_scalar_ops_are_free_off_act():
    ins = with_fields(op("tensor_scalar"), op1=AluOp.SUB).replace(engine=Engine.DVE)
    assert check(broken(ins)) == []


# -- semaphores and deadlocks --------------------------------------------------------------------------

def memset(q, off, **kw):
    return make("memset", q, dst=sb(32, [(1, 4)], off=off), value=1.0, **kw)


def program(*instrs):
    return Program(TENSORS, instrs, "trn3")


@pytest.mark.parametrize("instrs,index,words", [
    ((memset(Engine.DVE, 0, signals=[256]),), 0, ["semaphore 256", "0..255"]),
    ((memset(Engine.DVE, 0, signals=[3]), memset(Engine.POOL, 16, signals=[3])), 1,
     ["semaphore 3 from pool", "instruction 0 signals it from dve", "one queue only"]),
    ((memset(Engine.DVE, 0, signals=[3]), memset(Engine.POOL, 16, waits=[(3, 0)])), 1, ["semaphore 3 >= 0"]),
])
def test_semaphore(instrs, index, words):
    expect(program(*instrs), "semaphore", index, *words)


def test_deadlock_wait_beyond_signals():
    p = program(memset(Engine.DVE, 0, signals=[3]), memset(Engine.POOL, 16, waits=[(3, 2)]))
    expect(p, "deadlock", 1, "semaphore 3 >= 2", "1 instruction(s) signal it", "wait forever")


def test_deadlock_cycle():
    p = program(memset(Engine.DVE, 0, waits=[(1, 1)]), memset(Engine.DVE, 16, signals=[0]),
                memset(Engine.POOL, 32, waits=[(0, 1)], signals=[1]))
    expect(p, "deadlock", 0, "0 (dve) -> 1 (dve) -> 2 (pool) -> 0 (dve)", "none can start")


def test_deadlock_waiting_on_own_signal():
    expect(program(memset(Engine.DVE, 0, waits=[(0, 1)], signals=[0])), "deadlock", 0, "0 (dve) -> 0 (dve)")


@pytest.mark.parametrize("change,rule,words", [
    ({"waits": ((1,),)}, "semaphore", ["waits ((1,),) are not (semaphore, value) pairs of 64-bit integers"]),
    ({"waits": ((1, 2, 3), (4,))}, "semaphore", ["waits ((1, 2, 3), (4,))"]),
    ({"waits": ((2**70, 1),)}, "semaphore", [f"waits (({2**70}, 1),)"]),
    ({"signals": (-2**64,)}, "semaphore", [f"signals ({-2**64},)"]),
    ({"waits": ((1.5, 2),)}, "semaphore", ["waits ((1.5, 2),)"]),
    ({"signals": ("a",)}, "semaphore", ["signals ('a',) are not semaphore numbers"]),
    ({"signals": (True,)}, "semaphore", ["signals (True,)"]),
    ({"queue": "0"}, "queue", ["queue '0' is not a 64-bit integer"]),
])
def test_ill_typed_sync_fields_are_reported_not_raised(change, rule, words):
    """Also on an instruction of a form that already passed (the form key leaves waits and signals out)."""
    p = program(memset(Engine.DVE, 0), memset(Engine.DVE, 16).replace(**change))
    expect(p, rule, 1, *words)


def test_race_reports_both_instructions_and_memory():
    p = program(memset(Engine.DVE, 0), memset(Engine.POOL, 8))       # bytes [0, 16) and [8, 24) of partitions 0-31
    expect(p, "race", 1, "dst on pool writes sbuf partitions [0, 32) bytes [8, 16) (8 in common)",
           "dst of instruction 0 on dve writes", "\n    0: dve", "\n    1: pool")


def test_out_of_order_program_list_is_ordered_by_semaphores():
    """Program order between queues means nothing: a waiter listed before its signaller is fine."""
    p = program(memset(Engine.POOL, 8, waits=[(0, 1)]), memset(Engine.DVE, 0, signals=[0]))
    assert check(p) == []


def test_unknown_target():
    with pytest.raises(VerifyError, match="unknown target 'trn9'"):
        verify(Program(TENSORS, (), "trn9"))


def test_several_violations_are_all_reported():
    p = chain([*FILLER, with_fields(op("memset"), dst=sb(64, [(1, 2)], start=32)), op("dma_copy").replace(queue=99)])
    found = check(p)
    assert [(v.index, v.rule) for v in found] == [(2, "partition-align"), (3, "queue")]
    with pytest.raises(VerifyError, match="2 violations"):
        verify(p)


def test_hw_argument_overrides_the_program_target():
    program = broken(op("quantize_mx"), "trn3")
    assert check(program) == []
    assert {v.rule for v in check(program, get_target("trn2"))} == {"target"}


def test_partial_overlap_of_a_written_operand_is_rejected_but_in_place_is_allowed():
    from trnc.isa.verify import check as check_rules
    a = AP(Mem.SBUF, DType.FP32, 128, ((1, 64),))
    shifted = AP(Mem.SBUF, DType.FP32, 128, ((1, 64),), offset=16)
    in_place = Program((), (Instruction.make("tensor_tensor", dst=a, in0=a, in1=a, op=AluOp.ADD),))
    assert check_rules(in_place) == []
    partial = Program((), (Instruction.make("tensor_tensor", dst=shifted, in0=a, in1=a, op=AluOp.ADD),))
    found = check_rules(partial)
    assert [v.rule for v in found] == ["overlap", "overlap"]
    assert "dst partially overlaps in0" in found[0].message and "dst partially overlaps in1" in found[1].message
    reduce_in_place = Program((), (Instruction.make("tensor_reduce", dst=AP(Mem.SBUF, DType.FP32, 128, ((1, 1),)),
                                                    src=a, axes=1),))
    assert [v.rule for v in check_rules(reduce_in_place)] == ["overlap"]


def test_instructions_of_a_form_already_passed_are_judged_as_if_checked_whole(monkeypatch):
    """check() runs only the place rules on an instruction whose form (everything but its APs' places) passed
    every rule before; each place fault must still be found, with the words of the whole check."""
    memset = op("memset")
    a, shifted = sb(64, off=20000), sb(64, off=20016)
    variants = [   # (rule, instruction): each follows a valid one of its form
        ("ap-form", with_fields(memset, dst=sb(64, [(1, 2)], off=9002))),
        ("ap-form", with_fields(memset, dst=replace(sb(64, [(1, 2)], off=9000), tensor=0))),
        ("ap-form", with_fields(memset, dst=sb(64, [(1, 2)], start=96))),
        ("ap-bounds", with_fields(memset, dst=sb(64, [(-1, 2)], off=0))),
        ("ap-bounds", with_fields(memset, dst=sb(64, [(1, 2)], off=450000))),
        ("partition-align", with_fields(memset, dst=sb(64, [(1, 2)], start=32))),
        ("ap-form", with_fields(op("dma_copy"), src=hbm(5, 128, [(1, 64)], 64))),
        ("psum-bank", with_fields(op("matmul"), dst=ps(64, off=2048 - 128))),
        ("overlap", make("tensor_tensor", Engine.DVE, dst=shifted, in0=a, in1=a, op=AluOp.ADD)),
    ]
    valid = [with_fields(memset, dst=sb(64, [(1, 2)], off=9000)), op("dma_copy"), op("matmul"),
             make("tensor_tensor", Engine.DVE, dst=a, in0=a, in1=a, op=AluOp.ADD)]
    program = chain([*valid, *(ins for _, ins in variants)])
    fast = check(program)
    assert [v.rule for v in fast] == [rule for rule, _ in variants for _ in range(1 if rule != "overlap" else 2)]

    def no_form(ins):
        raise TypeError("every instruction checked whole")
    monkeypatch.setattr("trnc.isa.verify._form_key", no_form)
    assert check(program) == fast


@pytest.mark.parametrize("threads", [1, 3])
def test_what_runs_meanwhile_runs_only_once_every_instruction_passed_and_the_verdict_comes_first(threads, monkeypatch):
    """The JIT lays a program out while the verifier's ordering checks run: only on programs whose instructions all
    passed, with its result returned once the whole program passes and its error raised only then."""
    monkeypatch.setattr(verify_module, "AHEAD_INSTRUCTIONS", 0)   # the ordering on a thread of its own too
    calls = []

    def lay_out():
        calls.append(1)
        return "laid out"

    def failing():
        calls.append(1)
        raise ValueError("cannot lay it out")
    valid, racing = tiled_gemm(), program(memset(Engine.DVE, 0), memset(Engine.POOL, 8))
    out_of_bounds = program(memset(Engine.DVE, 0), memset(Engine.DVE, 10**6))
    with flags.override(TRNC_THREADS=threads):
        assert verify(valid, meanwhile=lay_out) == "laid out" and len(calls) == 1
        with pytest.raises(VerifyError, match="race"):   # its instructions pass; the ordering checks fail it
            verify(racing, meanwhile=failing)
        assert len(calls) == 2
        with pytest.raises(VerifyError, match="ap-bounds"):
            verify(out_of_bounds, meanwhile=lay_out)
        assert len(calls) == 2
        with pytest.raises(ValueError, match="cannot lay it out"):
            verify(valid, meanwhile=failing)
        assert verify(valid) is None
