"""The tile-level program: what the tile pass produces and allocate, schedule and emit consume.

Kernels (passes/tile/kernels/) describe their work as TileInstrs: an opcode, the engines that may run
it, and fields whose on-chip operands are Tiles of symbolic Buffers rather than addresses. HBM
operands are already final APs over `TileProgram.tensors`. Allocate gives each Buffer its address,
schedule picks an engine or DMA queue per instruction and derives the semaphores, emit builds the
isa.Program. A value between kernels lives in HBM as an HbmView (a strided view of a tensor), so
views (permute, expand, slice) cost nothing and are folded into the DMAs of their consumers; a
matmul result that the next kernel reads may instead stay in SBUF (`TileProgram.kept`), its HBM
tensor then never written or read (emit drops its declaration), a layer norm may leave the
next matmul a transposed copy of its result in SBUF beside the HBM one (`TileProgram.transposed`), and a
window kernel's image may stay in SBUF for the window kernels that read it (`TileProgram.resident`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from trnc.isa.ap import AP, MAX_COUNT, MAX_FREE_DIMS, Engine, Mem
from trnc.isa.config import PARTITIONS, PSUM_BANK_BYTES, HwConfig
from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding
from trnc.isa.opcodes import opspec
from trnc.isa.program import Instruction, TensorDecl, TensorKind


@dataclass(eq=False)
class Buffer:
    """An on-chip allocation of `nbytes` per partition on every partition; allocate sets `offset`."""

    name: str
    mem: Mem
    nbytes: int
    offset: int | None = None

    def __repr__(self) -> str:
        where = "?" if self.offset is None else str(self.offset)
        return f"{self.mem.name.lower()}:{self.name}@{where}+{self.nbytes}"


@dataclass(frozen=True)
class Tile:
    """A view of a Buffer: partitions [start_partition, +partitions), free dims (stride, count) in elements
    starting `offset` bytes into the buffer. Axis 0 is the partition axis, axes 1.. the free dims."""

    buffer: Buffer
    dtype: DType
    partitions: int
    dims: tuple[tuple[int, int], ...]
    offset: int = 0
    start_partition: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.partitions, *(c for _, c in self.dims))

    @property
    def free_size(self) -> int:
        return math.prod(c for _, c in self.dims)

    def ap(self) -> AP:
        if self.buffer.offset is None:
            raise ValueError(f"{self.buffer} has no address yet: run allocate first")
        return AP(self.buffer.mem, self.dtype, self.partitions, self.dims, self.buffer.offset + self.offset,
                  self.start_partition)

    def narrow(self, axis: int, start: int, count: int) -> "Tile":
        """Elements [start, start+count) of `axis` (0: partitions)."""
        size = self.shape[axis]
        if not (0 <= start and count >= 1 and start + count <= size):
            raise ValueError(f"narrow({axis}, {start}, {count}) outside a tile of shape {self.shape}")
        if axis == 0:
            return replace(self, partitions=count, start_partition=self.start_partition + start)
        dims = list(self.dims)
        stride, _ = dims[axis - 1]
        dims[axis - 1] = (stride, count)
        return replace(self, dims=tuple(dims), offset=self.offset + start * stride * self.dtype.itemsize)

    def select(self, axis: int, index: int) -> "Tile":
        """Free axis `axis` (>= 1) fixed at `index`, and dropped; a tile keeps at least one free dim."""
        t = self.narrow(axis, index, 1)
        dims = t.dims[:axis - 1] + t.dims[axis:]
        return replace(t, dims=dims or ((1, 1),))

    def reshape(self, *free_shape: int) -> "Tile":
        """The same elements with new free dims; the free dims must be contiguous (row-major)."""
        if math.prod(free_shape) != self.free_size:
            raise ValueError(f"reshape of {self.free_size} free elements to {free_shape}")
        expect = 1
        for stride, count in reversed(self.dims):
            if count != 1 and stride != expect:
                raise ValueError(f"reshape of a non-contiguous tile {self.dims}")
            expect *= count
        return replace(self, dims=_contiguous(free_shape))

    def bitcast(self, dtype: DType) -> "Tile":
        """The same bytes seen as `dtype` (same itemsize)."""
        if dtype.itemsize != self.dtype.itemsize:
            raise ValueError(f"bitcast {self.dtype.text} -> {dtype.text} changes the item size")
        return replace(self, dtype=dtype)


def _contiguous(shape) -> tuple[tuple[int, int], ...]:
    dims, stride = [], 1
    for count in reversed(shape):
        dims.append((stride, int(count)))
        stride *= int(count)
    return tuple(reversed(dims)) or ((1, 1),)


def contiguous_strides(shape) -> tuple[int, ...]:
    return tuple(s for s, _ in _contiguous(shape)) if shape else ()


@dataclass(frozen=True)
class HbmView:
    """A strided view of HBM tensor `tensor`: element (i...) is at element offset + sum(i_k * strides_k)."""

    tensor: int
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def is_contiguous(self) -> bool:
        expect = 1
        for size, stride in reversed(list(zip(self.shape, self.strides))):
            if size != 1 and stride != expect:
                return False
            expect *= size
        return True

    def permute(self, dims) -> "HbmView":
        return replace(self, shape=tuple(self.shape[d] for d in dims), strides=tuple(self.strides[d] for d in dims))

    def expand(self, shape) -> "HbmView":
        lead = len(shape) - len(self.shape)
        old = [(1, 0)] * lead + list(zip(self.shape, self.strides))
        strides = tuple(0 if (o_size == 1 and size != 1) else o_stride
                        for (o_size, o_stride), size in zip(old, shape))
        return replace(self, shape=tuple(shape), strides=strides)

    def narrow(self, dim: int, start: int, stop: int, step: int = 1) -> "HbmView":
        count = max(0, -(-(stop - start) // step))
        shape, strides = list(self.shape), list(self.strides)
        offset = self.offset + start * strides[dim]
        shape[dim], strides[dim] = count, strides[dim] * step
        return replace(self, shape=tuple(shape), strides=tuple(strides), offset=offset)

    def reshape(self, shape) -> "HbmView | None":
        """A view with `shape` over the same elements when the strides allow it, else None.

        torch's view rule: old dims split into chunks that are contiguous among themselves, and
        each chunk must map onto whole new dims.
        """
        shape = tuple(int(s) for s in shape)
        if self.is_contiguous or not self.shape:
            return replace(self, shape=shape, strides=contiguous_strides(shape))
        new_strides = [0] * len(shape)
        view_d = len(shape) - 1
        base = self.strides[-1]
        old_numel = view_numel = 1
        for d in reversed(range(len(self.shape))):
            old_numel *= self.shape[d]
            chunk_ends = d == 0 or (self.shape[d - 1] != 1 and self.strides[d - 1] != old_numel * base)
            if not chunk_ends:
                continue
            while view_d >= 0 and (view_numel < old_numel or shape[view_d] == 1):
                new_strides[view_d] = view_numel * base
                view_numel *= shape[view_d]
                view_d -= 1
            if view_numel != old_numel:
                return None
            if d > 0:
                base, old_numel, view_numel = self.strides[d - 1], 1, 1
        if view_d != -1:
            return None
        return replace(self, shape=shape, strides=tuple(new_strides))

    def box_ap(self, pdim: int | None, box: tuple[tuple[int, int], ...]) -> AP:
        """The AP of the sub-box `box` ((start, count) per dim) with dim `pdim` on the partitions.

        The free dims are the other dims in order, size-1 dims dropped and contiguous neighbours
        merged; more than four left is a ValueError (the kernel must split the box).
        """
        offset = self.offset + sum(start * st for (start, _), st in zip(box, self.strides))
        parts, pstride = (box[pdim][1], self.strides[pdim]) if pdim is not None else (1, 0)
        free = [(st, count) for d, ((_, count), st) in enumerate(zip(box, self.strides)) if d != pdim and count != 1]
        dims: list[tuple[int, int]] = []
        for stride, count in free:
            if dims and dims[-1][0] == stride * count and dims[-1][1] * count <= MAX_COUNT:
                prev_stride, prev_count = dims[-1]
                dims[-1] = (stride, prev_count * count)
            else:
                dims.append((stride, count))
        if len(dims) > MAX_FREE_DIMS:
            raise ValueError(f"box {box} of view {self.shape} needs {len(dims)} free dims; at most {MAX_FREE_DIMS}")
        return AP(Mem.HBM, self.dtype, parts, tuple(dims) or ((1, 1),), offset * self.dtype.itemsize,
                  tensor=self.tensor, partition_stride=pstride if parts > 1 else 0)


@dataclass
class TileInstr:
    """One instruction before scheduling: on-chip operands are Tiles, `engines` the allowed engines."""

    opcode: str
    engines: tuple[Engine, ...]
    fields: dict[str, Any]
    kernel: str = ""

    def text(self) -> str:
        def show(v):
            if isinstance(v, Tile):
                return f"{v.buffer.name}[{v.start_partition}:+{v.partitions}]+{v.offset}:{v.dtype.text}{list(v.dims)}"
            if isinstance(v, AP):
                return f"hbm{v.tensor}+{v.offset}:{v.dtype.text}[{v.partition_stride};{v.partitions}]{list(v.dims)}"
            return getattr(v, "text", v)
        engines = "|".join(e.text for e in self.engines)
        args = " ".join(f"{k}={show(v)}" for k, v in self.fields.items() if v is not None)
        return f"{self.opcode}.{engines} {args}"


    def instruction(self, engine: Engine | None = None, queue: int = 0) -> Instruction:
        """The isa Instruction once buffers have addresses (engine defaults to the first allowed)."""
        fields = {k: (v.ap() if isinstance(v, Tile) else v) for k, v in self.fields.items()}
        return Instruction.make(self.opcode, engine or self.engines[0], queue=queue, **fields)


@dataclass
class TileProgram:
    """Everything the tile pass produced: HBM tensors and constants, buffers, instructions, and the signature."""

    hw: HwConfig
    tensors: list[TensorDecl] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    buffers: list[Buffer] = field(default_factory=list)
    instrs: list[TileInstr] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)    # INPUT tensor names in call order
    outputs: list[str] = field(default_factory=list)   # OUTPUT tensor names in result order
    # HBM tensors [R, C] whose value lives in SBUF instead: tensor index -> a [128, R / 128, C] tile (row r on
    # partition r % 128, in block r // 128); see plan.py keeps_features_on_chip and hands_rows_on_chip
    kept: dict[int, Tile] = field(default_factory=dict)
    # HBM tensors [R, C] whose transpose SBUF also holds: tensor index -> a [128, C / 128, R] tile (column c on
    # partition c % 128, in block c // 128); see plan.py hands_transpose_on_chip
    transposed: dict[int, Tile] = field(default_factory=dict)
    # HBM tensors [N, C, H, W] (images of window kernels) whose value lives in SBUF instead: tensor index -> a
    # [min(C, 128), C / 128, N, H, W] tile (channel c on partition c % 128, in block c // 128); see plan.py
    # keeps_image_on_chip and kernels/window.py
    resident: dict[int, Tile] = field(default_factory=dict)
    # how engines round what they write in a narrow float (Options.rounding) and the seed stochastic rounding
    # starts from; each instruction that rounds stochastically takes the next seed (next_seed)
    rounding: Rounding = Rounding.RNE
    seed: int = 0
    seeds_taken: int = 0
    random_seed: HbmView | None = None   # the SEED tensor of the `random` instructions, declared on first use

    def next_seed(self) -> int:
        """A distinct u32 seed for the next stochastically rounding instruction, from `seed` and a counter."""
        self.seeds_taken += 1
        return (self.seed * 0x9E3779B1 + self.seeds_taken * 0x85EBCA77) & 0xFFFFFFFF

    def on_chip(self, kx: HbmView) -> Tile | None:
        """The SBUF tile [128, K / 128, X] that holds the view `kx` ([*batch, K, X]: a matmul operand, a row-wise
        kernel's rows) when the plan keeps its tensor on chip: row k on partition k % 128, in block k // 128.
        Either the kept [K, X] tensor, read row by row (the view must be the whole tensor so), or the
        transposed copy of an [X, K] tensor, read as its transpose (else the view reads the HBM copy).
        None: in HBM only."""
        k, x = kx.shape[-2:]
        if kx.tensor in self.kept:
            kept = self.kept[kx.tensor]
            if kx.offset or kx.strides[-2:] != (x, 1) or (k, x) != (kept.shape[1] * PARTITIONS, kept.shape[2]):
                raise ValueError(f"operand view {kx} does not read the kept tile {kept.buffer} row by row")
            return kept
        copy = self.transposed.get(kx.tensor)
        if copy is None or kx.offset or kx.strides[-2:] != (1, k) or \
                (k, x) != (copy.shape[1] * PARTITIONS, copy.shape[2]):
            return None
        return copy

    def text(self) -> str:
        lines = [f"tensor {i} {t.name}: {t.kind.text} {t.dtype.text}{list(t.shape)}"
                 for i, t in enumerate(self.tensors)]
        lines += [f"buffer {b!r}" for b in self.buffers]
        lines += [f"{i:6d} [{ins.kernel}] {ins.text()}" for i, ins in enumerate(self.instrs)]
        return "\n".join(lines)


class TileBuilder:
    """What a kernel uses to declare tensors and buffers and to emit instructions into a TileProgram."""

    def __init__(self, program: TileProgram, kernel: str = ""):
        self.program = program
        self.kernel = kernel
        self._names = {t.name for t in program.tensors}

    @property
    def hw(self) -> HwConfig:
        return self.program.hw

    def tensor(self, name: str, kind: TensorKind, dtype: DType, shape, value: np.ndarray | None = None) -> HbmView:
        """Declare an HBM tensor (contiguous) and return its view; CONST tensors carry their value. A name
        taken before (two graph nodes of one name: the copies of a shared weight) gets a numbered suffix."""
        shape = tuple(int(s) for s in shape)
        base, k = name, 1
        while name in self._names:
            k += 1
            name = f"{base}.{k}"
        self._names.add(name)
        index = len(self.program.tensors)
        self.program.tensors.append(TensorDecl(name, kind, dtype, shape))
        if kind is TensorKind.CONST:
            self.program.constants[name] = value
        return HbmView(index, dtype, shape, contiguous_strides(shape))

    def seed_tensor(self) -> HbmView:
        """The program's SEED tensor (int32 [1], a new value each run), declared by the first kernel that draws."""
        if self.program.random_seed is None:
            self.program.random_seed = self.tensor("seed", TensorKind.SEED, DType.INT32, (1,))
        return self.program.random_seed

    def sbuf(self, name: str, dtype: DType, partitions: int, free_shape) -> Tile:
        return self._tile(Mem.SBUF, name, dtype, partitions, tuple(free_shape))

    def psum(self, name: str, partitions: int, free_shape, dtype: DType = DType.FP32) -> Tile:
        tile = self._tile(Mem.PSUM, name, dtype, partitions, tuple(free_shape))
        if tile.buffer.nbytes > PSUM_BANK_BYTES and tile.buffer.nbytes % PSUM_BANK_BYTES:
            raise ValueError(f"psum tile {name} of {tile.buffer.nbytes} bytes per partition: use whole banks")
        return tile

    def _tile(self, mem, name, dtype, partitions, free_shape) -> Tile:
        if not 1 <= partitions <= PARTITIONS:
            raise ValueError(f"tile {name}: {partitions} partitions; 1..{PARTITIONS}")
        nbytes = math.prod(free_shape) * dtype.itemsize
        buf = Buffer(f"{self.kernel}.{name}" if self.kernel else name, mem, nbytes)
        self.program.buffers.append(buf)
        return Tile(buf, dtype, partitions, _contiguous(free_shape))

    def emit(self, opcode: str, engines: tuple[Engine, ...] | None = None, **fields) -> TileInstr:
        """Append an instruction; `engines` defaults to every engine the opcode table allows."""
        ins = TileInstr(opcode, tuple(engines or opspec(opcode).engines), fields, self.kernel)
        self.program.instrs.append(ins)
        return ins

    def dma(self, dst, src) -> TileInstr:
        return self.emit("dma_copy", (Engine.DMA,), dst=dst, src=src)

    def dma_split(self, dst, src, max_bytes: int = 1 << 16) -> None:
        """One DMA per group of partitions, each moving at most about `max_bytes`, so a large transfer
        spreads over the DMA queues (each queue moves ~23 B/ns after a ~600 ns fixed cost on trn2)."""
        parts = dst.partitions
        row_bytes = max(_row_bytes(dst), _row_bytes(src))
        step = max(1, min(parts, max_bytes // max(1, row_bytes)))
        for p0 in range(0, parts, step):
            n = min(step, parts - p0)
            self.dma(_narrow_partitions(dst, p0, n), _narrow_partitions(src, p0, n))


def _row_bytes(x) -> int:
    return (x.free_size if isinstance(x, Tile) else math.prod(c for _, c in x.dims)) * x.dtype.itemsize


def _narrow_partitions(x, p0: int, n: int):
    """Partitions [p0, p0+n) of a Tile or an AP (on-chip or HBM)."""
    if isinstance(x, Tile):
        return x.narrow(0, p0, n)
    if x.mem is Mem.HBM:
        return replace(x, partitions=n, offset=x.offset + p0 * x.partition_stride * x.dtype.itemsize,
                       partition_stride=x.partition_stride if n > 1 else 0)
    return replace(x, partitions=n, start_partition=x.start_partition + p0)
