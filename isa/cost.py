"""Cost model: cycles of one instruction on its engine, from the formulas of neuroncore.md, and the same formulas
by size for the estimates the compiler makes before it has instructions.

Every estimate comes from here: the opcode table's cost functions (below, used by the scheduler, the layout
pass and the performance model), the formulas by size (matmul cycles, DMA time, bytes a DMA moves) that plan
a matmul kernel, the clocks a kernel keeps of its own emission to size its DMAs (QueueClocks), and the
roofline (Roofline) of a program's executed MACs (runtime/perf.py) and of a model's (passes/roofline.py).

Compute engines count cycles of their own clock (HwConfig.clock_hz); DMA counts nanoseconds.
N is the free size (elements per partition) of the instruction's main operand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from trnc.isa.config import (DMA_QUEUES, FP32_PE_SLOWDOWN, GPSIMD_START, MIN_II, MOVING_FMAX, PARTITIONS, PE_COLUMNS,
                             HwConfig)
from trnc.isa.dtypes import DType
from trnc.isa.enums import AluOp


# -- formulas by size ------------------------------------------------------------------------------------

def matmul_cycles(stationary: int, moving: int, fp32: bool = False) -> int:
    """TensorE cycles of one matmul of `stationary` (M) by `moving` (N) columns: max(min(64, M), N), x4 for fp32
    inputs (2.1, ISA-OLD)."""
    cycles = max(min(64, stationary), moving)
    return cycles * FP32_PE_SLOWDOWN if fp32 else cycles


def matmul_seconds(stationary: int, moving: int, fp32: bool, hw: HwConfig) -> float:
    """matmul_cycles at the preset's TensorE clock."""
    return matmul_cycles(stationary, moving, fp32) / hw.clock_hz["pe"]


def _widths(total: int, tile: int) -> list[int]:
    return [min(tile, total - x) for x in range(0, total, tile)]


def gemm_cycles(stationary: int, moving: int, contraction: int, fp32: bool = False) -> int:
    """TensorE cycles of a [K, S]^T @ [K, V] product in the largest matmuls the engine takes: K in tiles of
    PARTITIONS rows, S in tiles of PE_COLUMNS, V in tiles of MOVING_FMAX (one PSUM bank)."""
    per_k = sum(matmul_cycles(s, v, fp32)
                for s in _widths(stationary, PE_COLUMNS) for v in _widths(moving, MOVING_FMAX))
    return math.ceil(contraction / PARTITIONS) * per_k


def dma_nbytes(elements: int, *dtypes: DType) -> int:
    """Bytes a DMA of `elements` elements moves on its queue: in the widest of its dtypes (a DMA casts on the way)."""
    return elements * max(d.itemsize for d in dtypes)


def dma_ns(nbytes: int, hw: HwConfig, pieces: int = 1) -> float:
    """Nanoseconds of `pieces` DMAs moving `nbytes` in all on one queue: each its fixed cost, plus the bytes over
    the queue's bandwidth (2.5, DMABW/A3)."""
    return pieces * hw.dma_fixed_ns + nbytes / hw.dma_queue_bytes_per_ns


def dma_rate(hw: HwConfig, queues: int = 1) -> float:
    """Bytes per second that `queues` DMA queues move, past their fixed costs."""
    return queues * hw.dma_queue_bytes_per_ns * hw.clock_hz["dma"]


# -- the opcode table's cost functions --------------------------------------------------------------------

def _free(instr, name: str) -> int:
    return instr[name].free_size


def pe_matmul(instr, hw: HwConfig) -> int:
    """max(min(64, M), N), x4 for fp32 inputs (2.1, ISA-OLD). Double-row and MX run at bf16 speed."""
    st, mv = instr["stationary"], instr["moving"]
    return matmul_cycles(st.free_shape[-1], mv.free_shape[-1], st.dtype is DType.FP32)


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
    return math.ceil(dma_ns(dma_bytes(instr), hw))


def dma_gather(instr, hw: HwConfig) -> int:
    """As dma, counting the gathered rows (the dst bytes)."""
    return dma(instr, hw)


def dma_bytes(instr) -> int:
    """Bytes a DMA instruction moves: the gathered rows of a dma_gather, else its elements in the wider dtype."""
    dst = instr["dst"]
    if instr.opcode == "dma_gather":
        return dst.num_bytes
    return dma_nbytes(dst.num_elements, dst.dtype, instr["src"].dtype)


def cycles(instr, hw: HwConfig) -> int:
    """Cycles of `instr` on its engine's clock (ns for DMA), from the opcode table's cost function."""
    return instr.spec.cost(instr, hw)


def seconds(instr, hw: HwConfig) -> float:
    """Duration of `instr` in seconds at the preset's clock of its engine."""
    return cycles(instr, hw) / hw.clock_hz[instr.engine.text]


# -- estimates ---------------------------------------------------------------------------------------------

class QueueClocks:
    """The timeline a kernel estimates of itself while it emits, to size its DMAs by their slack (the scheduler
    places the instructions later): TensorE busy back to back with the matmuls emitted so far, and the DMA
    queues sharing the DMAs emitted so far evenly, none of them starting before TensorE has got to it."""

    def __init__(self, hw: HwConfig):
        self.hw = hw
        self.pe_seconds = 0.0     # when TensorE finishes the matmuls emitted so far, at full rate
        self.dma_seconds = 0.0    # when the queues would have moved every DMA emitted so far
        self.dmas = 0             # DMA instructions emitted so far

    def add_pe(self, seconds: float) -> None:
        """TensorE work of `seconds` (matmul_seconds), emitted now."""
        self.pe_seconds += seconds

    def add_dmas(self, nbytes: int, pieces: int) -> None:
        """`pieces` DMAs moving `nbytes` in all, emitted now."""
        share = dma_ns(nbytes, self.hw, pieces) / self.hw.clock_hz["dma"] / DMA_QUEUES
        self.dma_seconds = max(self.dma_seconds, self.pe_seconds) + share
        self.dmas += pieces

    def slack(self, use: float, nbytes: int) -> float:
        """Seconds from when the queues would have moved `nbytes` more, after every DMA so far, to TensorE time
        `use`; below zero TensorE waits for them."""
        return use - max(self.dma_seconds, self.pe_seconds) - nbytes / dma_rate(self.hw, DMA_QUEUES)


def peak_pe_cycles(macs: int, dtype: DType, hw: HwConfig, double_row: bool = False, mx: bool = False) -> float:
    """TensorE cycles of `macs` multiply-accumulates at the peak rate of `dtype` (HwConfig.macs_per_cycle)."""
    return macs / hw.macs_per_cycle(dtype, double_row, mx)


@dataclass(frozen=True)
class Roofline:
    """The time no program for the work can beat: TensorE at its peak rate for the MACs (`pe_cycles`, at the
    peak rate of each one's dtype), or HBM for the compulsory bytes (inputs, constants, outputs), whichever
    is longer."""

    pe_seconds: float
    hbm_seconds: float

    @classmethod
    def of(cls, pe_cycles: float, compulsory_bytes: int, hw: HwConfig) -> "Roofline":
        return cls(pe_cycles / hw.clock_hz["pe"], compulsory_bytes / hw.hbm_bytes_per_s)

    @property
    def seconds(self) -> float:
        return max(self.pe_seconds, self.hbm_seconds)

    def efficiency(self, modeled_seconds: float) -> float:
        """Roofline time over `modeled_seconds` (0 for a program that takes no time)."""
        return self.seconds / modeled_seconds if modeled_seconds else 0.0
