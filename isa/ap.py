"""Operands: memories, engines and access patterns.

An access pattern (AP) names a memory region element by element: the memory (SBUF, PSUM, or one
HBM tensor), the partitions it covers, a byte offset, a dtype and up to four [stride, count] free
dimensions (strides in elements). Its logical shape is (partitions, *counts); elements are visited
in row-major order of that shape, and every instruction's semantics are written in that order.
"""
from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from trnc.isa.config import DMA_QUEUES
from trnc.isa.dtypes import DType

MAX_FREE_DIMS = 4
MAX_COUNT = 65535        # free-dim counts are 16-bit (neuroncore.md 3, "Free-dim AP": size uint16)
STRIDE_LIMIT = 2**31     # |stride| and |partition_stride| in elements stay below this (int32)
MAX_AP_ELEMENTS = 2**32  # elements one operand may span (partitions x free counts): bounds any instruction's work

# AP.row: the AP's fields as int64 words, the columns of the operand table (isa/operand_table.py): ROW_FIELDS,
# then a (stride, count) pair per free dim, padded with (0, 1) to MAX_FREE_DIMS.
ROW_FIELDS = ("mem", "dtype", "ndims", "partitions", "start", "offset", "tensor", "pstride")
ROW_WORDS = len(ROW_FIELDS) + 2 * MAX_FREE_DIMS
_ROWS = tuple(struct.Struct(f"<{len(ROW_FIELDS) + 2 * n}q") for n in range(MAX_FREE_DIMS + 1))   # by ndims
_ROW_PADS = tuple(struct.pack("<2q", 0, 1) * (MAX_FREE_DIMS - n) for n in range(MAX_FREE_DIMS + 1))


class Mem(enum.IntEnum):
    SBUF = 1
    PSUM = 2
    HBM = 3

    @property
    def text(self) -> str:
        return self.name.lower()


class Engine(enum.IntEnum):
    """Instruction queues: four compute engines and the DMA queues (neuroncore.md 1.3, 2.5)."""

    PE = 0    # TensorE
    ACT = 1   # ScalarE
    DVE = 2   # VectorE
    POOL = 3  # GpSimdE
    DMA = 4   # one of DMA_QUEUES queues, chosen by Instruction.queue

    @property
    def text(self) -> str:
        return self.name.lower()


def queue_name(engine: Engine, queue: int = 0) -> str:
    """An instruction queue's name in assembly, traces and messages: the engine's, or dma0..dma15."""
    return f"{engine.text}{queue}" if engine is Engine.DMA else engine.text


def queue_index(engine: Engine, queue: int = 0) -> int:
    """The queue's position in QUEUES: the compute engines in Engine order, then the DMA queues."""
    return int(Engine.DMA) + queue if engine is Engine.DMA else int(engine)


QUEUES = (*(queue_name(e) for e in Engine if e is not Engine.DMA),
          *(queue_name(Engine.DMA, q) for q in range(DMA_QUEUES)))


@dataclass(frozen=True)
class AP:
    """An access pattern.

    On-chip (SBUF/PSUM): partitions start_partition .. start_partition+partitions-1, and in each
    partition the bytes offset + itemsize*sum(i_j*stride_j).
    HBM: tensor `tensor` (index into Program.tensors); element (p, i...) lies at byte
    offset + itemsize*(p*partition_stride + sum(i_j*stride_j)) of that tensor.
    """

    mem: Mem
    dtype: DType
    partitions: int
    dims: tuple[tuple[int, int], ...]   # (stride, count) per free dim, outermost first
    offset: int = 0                     # bytes
    start_partition: int = 0            # on-chip only
    tensor: int = -1                    # HBM only
    partition_stride: int = 0           # HBM only, in elements
    # The fields packed once, as the AP is made, so that a table of a program's operands is one join of these
    # (isa/operand_table.py); None when a field is not of its type (the verifier then reports it).
    row: bytes | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "row", _pack(self))

    def __getstate__(self) -> dict:
        """Pickled without its row (which is larger than the fields and quicker to make again than to load)."""
        return {k: v for k, v in self.__dict__.items() if k != "row"}

    def __setstate__(self, state: dict):
        self.__dict__.update(state)
        object.__setattr__(self, "row", _pack(self))

    @property
    def free_shape(self) -> tuple[int, ...]:
        return tuple(c for _, c in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.partitions, *self.free_shape)

    @property
    def free_size(self) -> int:
        return math.prod(c for _, c in self.dims)

    @property
    def num_elements(self) -> int:
        return self.partitions * self.free_size

    @property
    def num_bytes(self) -> int:
        return self.num_elements * self.dtype.itemsize

    def free_offsets(self) -> np.ndarray:
        """Element offsets (not bytes) of the free dims, flattened in row-major order, int64."""
        off = np.zeros((), dtype=np.int64)
        for stride, count in self.dims:
            off = off[..., None] + np.arange(count, dtype=np.int64) * stride
        return off.reshape(-1)

    def free_extent(self) -> tuple[int, int]:
        """(lowest, highest) element offset reached by the free dims, relative to `offset`."""
        lo = hi = 0
        for stride, count in self.dims:
            reach = stride * (count - 1)
            if reach < 0:
                lo += reach
            else:
                hi += reach
        return lo, hi

    def byte_range(self) -> tuple[int, int]:
        """Half-open byte range [lo, hi) touched within one partition (on-chip) or the tensor (HBM)."""
        lo, hi = self.free_extent()
        if self.mem is Mem.HBM:
            plo, phi = sorted((0, self.partition_stride * (self.partitions - 1)))
            lo, hi = lo + plo, hi + phi
        isz = self.dtype.itemsize
        return self.offset + lo * isz, self.offset + (hi + 1) * isz

    def partition_range(self) -> tuple[int, int]:
        return self.start_partition, self.start_partition + self.partitions


def _pack(ap: AP) -> bytes | None:
    """AP.row (mem and dtype by their codes); None unless mem and dtype are a Mem and a DType, the dims at most
    MAX_FREE_DIMS pairs (unpacked by count, which checks each is a pair) and every other field a 64-bit integer."""
    dims = ap.dims
    try:
        ndims = len(dims)
        if ndims > MAX_FREE_DIMS or type(ap.mem) is not Mem or type(ap.dtype) is not DType:
            return None
        if ndims == 1:
            (s0, c0), = dims
            flat = (s0, c0)
        elif ndims == 2:
            (s0, c0), (s1, c1) = dims
            flat = (s0, c0, s1, c1)
        elif ndims == 3:
            (s0, c0), (s1, c1), (s2, c2) = dims
            flat = (s0, c0, s1, c1, s2, c2)
        elif ndims == 4:
            (s0, c0), (s1, c1), (s2, c2), (s3, c3) = dims
            flat = (s0, c0, s1, c1, s2, c2, s3, c3)
        else:
            flat = ()
        return _ROWS[ndims].pack(ap.mem, ap.dtype.code, ndims, ap.partitions, ap.start_partition, ap.offset,
                                 ap.tensor, ap.partition_stride, *flat) + _ROW_PADS[ndims]
    except (TypeError, ValueError, struct.error):
        return None
