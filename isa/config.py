"""Machine presets trn1, trn2 (default) and trn3: the numbers every other module derives from.

Each number cites its key in ../shared/reference/neuroncore.md (section, then the AWS source key).
A config is frozen data; `HwConfig.name` goes into artifact names and cache keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trnc.isa.dtypes import DType

PARTITIONS = 128          # 1.1, A2-A4: SBUF/PSUM partitions = PE rows
PE_COLUMNS = 128          # 2.1, A2: stationary free size limit (M)
MOVING_FMAX = 512         # 2.1, A2: moving free size limit (N) = one PSUM bank of fp32
PSUM_BANKS = 8            # 1.1, A2-A4
PSUM_BANK_BYTES = 2048    # 1.1, A2-A4: 8 banks x 2 KiB per partition
FP32_PE_SLOWDOWN = 4      # 1.2, 2.1: TensorE takes fp32 operands at a quarter of its bf16 rate
MIN_II = 64               # 4.5, ISA-OLD: Vector/Scalar/GpSimd minimum initiation interval, engine cycles
GPSIMD_START = 150        # 4.5, ISA-OLD: GpSimd start overhead, cycles
SEMAPHORES = 256          # trnc's fixed set of semaphores per core [INF]; waits/signals name 0..255
DMA_QUEUES = 16           # 2.5, DMA: 16 DMA engines (queues) per NeuronCore


@dataclass(frozen=True)
class HwConfig:
    name: str
    generation: str                   # NeuronCore version
    sbuf_bytes_per_partition: int     # usable bytes per partition (3, KLR total_available_sbuf_size)
    clock_hz: dict = field(hash=False)  # per engine: pe, act, dve, pool; dma counts in ns (a 1 GHz clock)
    dma_queue_bytes_per_ns: float     # 2.5, DMA/DMABW per-engine bandwidth
    dma_fixed_ns: float               # 2.5, fixed cost of one DMA instruction
    hbm_bytes_per_s: float            # 1.1, per NeuronCore (chip bandwidth / cores)
    hbm_bytes: int                    # 1.1, per NeuronCore (chip HBM / cores)
    fp8_double_row: bool              # 2.1, A3: fp8 matmul with K up to 256 at bf16 speed
    mx: bool                          # 2.1, A4: matmul_mx and quantize_mx
    partitions: int = PARTITIONS
    psum_banks: int = PSUM_BANKS
    psum_bank_bytes: int = PSUM_BANK_BYTES

    @property
    def psum_bytes_per_partition(self) -> int:
        return self.psum_banks * self.psum_bank_bytes

    def macs_per_cycle(self, dtype: DType, double_row: bool = False, mx: bool = False) -> int:
        """Peak TensorE MACs per PE cycle (1.2: 128x128 PEs; fp32 at 1/4; fp8 double-row x2; MX x4)."""
        base = PARTITIONS * PE_COLUMNS
        if mx:
            return base * 4
        if dtype is DType.FP32:
            return base // FP32_PE_SLOWDOWN
        if double_row and dtype.is_fp8:
            return base * 2
        return base

    def peak_flops(self, dtype: DType, double_row: bool = False, mx: bool = False) -> float:
        return 2.0 * self.macs_per_cycle(dtype, double_row, mx) * self.clock_hz["pe"]


TARGETS = {
    "trn1": HwConfig(
        name="trn1", generation="NeuronCore-v2",
        sbuf_bytes_per_partition=180_224,                               # 3, KLR (192 KiB physical, A2)
        clock_hz={"pe": 2.8e9, "act": 1.4e9, "dve": 1.12e9, "pool": 1.4e9, "dma": 1e9},  # 1.3, A2
        dma_queue_bytes_per_ns=17.0,                                    # 2.5, DMABW (272 GB/s per NC)
        dma_fixed_ns=1300.0,                                            # 2.5, DMABW semaphore-to-start
        hbm_bytes_per_s=820e9 / 2,                                      # 1.1, A2: 820 GB/s, 2 NCs
        hbm_bytes=32 * 2**30 // 2,                                      # 1.1, A2: 32 GiB, 2 NCs
        fp8_double_row=False, mx=False),
    "trn2": HwConfig(
        name="trn2", generation="NeuronCore-v3",
        sbuf_bytes_per_partition=212_984,                               # 3, KLR (224 KiB physical, A3)
        clock_hz={"pe": 2.4e9, "act": 1.2e9, "dve": 0.96e9, "pool": 1.2e9, "dma": 1e9},  # 1.3, A3
        dma_queue_bytes_per_ns=23.0,                                    # 2.5, DMABW (368 GB/s per NC)
        dma_fixed_ns=600.0,                                             # 2.5, A3 HW-DGE instruction
        hbm_bytes_per_s=3e12 / 8,                                       # 1.1, A3: 3 TB/s, 8 NCs
        hbm_bytes=96 * 2**30 // 8,                                      # 1.1, A3: 96 GiB, 8 NCs
        fp8_double_row=True, mx=False),
    "trn3": HwConfig(
        name="trn3", generation="NeuronCore-v4",
        sbuf_bytes_per_partition=245_752,                               # 3, KLR (256 KiB physical, A4)
        clock_hz={"pe": 2.4e9, "act": 1.2e9, "dve": 1.2e9, "pool": 1.2e9, "dma": 1e9},   # 1.3, A4
        dma_queue_bytes_per_ns=33.0,                                    # 2.5, DMABW (528 GB/s per NC)
        dma_fixed_ns=600.0,                                             # 2.5, A3 (no v4 figure; [INF] same)
        hbm_bytes_per_s=4.7e12 / 8,                                     # 1.1, A4: 4.7 TB/s, 8 NCs
        hbm_bytes=144 * 2**30 // 8,                                     # 1.1, A4: 144 GiB, 8 NCs
        fp8_double_row=True, mx=True),
}
DEFAULT_TARGET = "trn2"


def get_target(name: str) -> HwConfig:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target '{name}'; expected one of {', '.join(TARGETS)}") from None
