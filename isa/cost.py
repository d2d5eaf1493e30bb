"""Cost model: cycles of one instruction on its engine, from the formulas of neuroncore.md.

Compute engines count cycles of their own clock (HwConfig.clock_hz); DMA counts nanoseconds.
N is the free size (elements per partition) of the instruction's main operand.
"""
from __future__ import annotations

import math

from trnc.isa.config import GPSIMD_START, MIN_II, HwConfig
from trnc.isa.dtypes import DType
from trnc.isa.enums import AluOp


def _free(instr, name: str) -> int:
    return instr[name].free_size


def pe_matmul(instr, hw: HwConfig) -> int:
    """max(min(64, M), N), x4 for fp32 inputs (2.1, ISA-OLD). Double-row and MX run at bf16 speed."""
    st, mv = instr["stationary"], instr["moving"]
    m, n = st.free_shape[-1], mv.free_shape[-1]
    cycles = max(min(64, m), n)
    return cycles * 4 if st.dtype is DType.FP32 else cycles


def pe_transpose(instr, hw: HwConfig) -> int:
    """max(P, min(64, F)) (2.1, ISA-OLD); 4-byte data at twice that (A3: fp32 transpose is 2x a fp32 matmul)."""
    src = instr["src"]
    cycles = max(src.partitions, min(64, src.free_size))
    return cycles * 2 if src.dtype.itemsize == 4 else cycles


def one_input(instr, hw: HwConfig) -> int:
    """max(MIN_II, N) for one input tensor (2.2, A2; 4.4 tensor_scalar/tensor_copy/activation)."""
    return max(MIN_II, _free(instr, "dst"))


def activation(instr, hw: HwConfig) -> int:
    """max(MIN_II, N), plus MIN_II to read the accumulators back when reducing (4.4 activation_reduce)."""
    extra = MIN_II if instr["accum"] is not None else 0
    return max(MIN_II, _free(instr, "src")) + extra


def two_inputs(instr, hw: HwConfig) -> int:
    """max(MIN_II, 2N) for two input tensors (2.2, A2; 4.4 tensor_tensor, tensor_copy_predicated)."""
    return max(MIN_II, 2 * _free(instr, "dst"))


def tensor_tensor(instr, hw: HwConfig) -> int:
    """On VectorE, max(MIN_II, N) when one input is in PSUM and the other in SBUF (a PSUM evacuation that
    adds a bias or residual tile), or when every operand is bf16 in SBUF with add, subtract or multiply
    and a contiguous innermost dim; else max(MIN_II, 2N) (4.4 tensor_tensor, ISA-OLD)."""
    ins = (instr["in0"], instr["in1"])
    if instr.engine.name == "DVE":
        mems = sorted(ap.mem.name for ap in ins)
        if mems == ["PSUM", "SBUF"]:
            return one_input(instr, hw)
        operands = (instr["dst"], *ins)
        if instr["op"] in (AluOp.ADD, AluOp.SUB, AluOp.MUL) and all(
                ap.mem.name == "SBUF" and ap.dtype is DType.BF16 and ap.dims[-1][0] == 1 for ap in operands):
            return one_input(instr, hw)
    return two_inputs(instr, hw)


def reduce(instr, hw: HwConfig) -> int:
    """max(MIN_II, N) with N the input free size (4.4 tensor_reduce)."""
    return max(MIN_II, _free(instr, "src"))


def quantize_mx(instr, hw: HwConfig) -> int:
    """4 elements per partition per cycle (2.2, A4 quantize_mx)."""
    return max(MIN_II, math.ceil(_free(instr, "src") / 4))


def gpsimd(instr, hw: HwConfig) -> int:
    """GPSIMD_START + N (2.4, ISA-OLD iota/affine_select); used for every GpSimd instruction [INF]."""
    return GPSIMD_START + _free(instr, "dst")


def partition_reduce(instr, hw: HwConfig) -> int:
    """GPSIMD_START + N per 16-partition core group [INF: 8 cores x 16 partitions each, 2.4 A2]."""
    return GPSIMD_START + _free(instr, "src") * math.ceil(instr["src"].partitions / 16)


def any_engine(instr, hw: HwConfig) -> int:
    """Instructions that VectorE, ScalarE or GpSimdE can run: that engine's rule."""
    return gpsimd(instr, hw) if instr.engine.name == "POOL" else one_input(instr, hw)


def dma(instr, hw: HwConfig) -> int:
    """Fixed cost plus bytes over one queue's bandwidth, in ns (2.5, DMABW/A3)."""
    nbytes = max(instr["dst"].num_bytes, instr["src"].num_bytes)
    return math.ceil(hw.dma_fixed_ns + nbytes / hw.dma_queue_bytes_per_ns)


def dma_gather(instr, hw: HwConfig) -> int:
    """As dma, counting the gathered rows (the dst bytes)."""
    return math.ceil(hw.dma_fixed_ns + instr["dst"].num_bytes / hw.dma_queue_bytes_per_ns)


def cycles(instr, hw: HwConfig) -> int:
    """Cycles of `instr` on its engine's clock (ns for DMA), from the opcode table's cost function."""
    return instr.spec.cost(instr, hw)


def seconds(instr, hw: HwConfig) -> float:
    """Duration of `instr` in seconds at the preset's clock of its engine."""
    return cycles(instr, hw) / hw.clock_hz[instr.engine.text]
