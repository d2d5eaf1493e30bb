"""allocate: SBUF and PSUM addresses for every Buffer of the tile program, by liveness.

A buffer lives from the first to the last instruction that touches it. Addresses are handed out
next-fit from a cursor that moves round a ring, so the space a buffer frees is reused late: the next
user of an address then rarely waits for the last one (the WAR semaphores schedule derives), which is
what lets DMA prefetch run ahead of compute. SBUF's ring is RING_SLACK times the most bytes ever live
at once (all of SBUF if that is less): going round all 192 KiB of each partition, a program touches
every byte of SBUF, which the host run pays for in its caches. A buffer that fits nowhere in the ring
goes wherever it fits. PSUM's ring is all of PSUM (2 MiB on the host; a smaller ring cost ResNet-50
bf16 3% of modeled time). PSUM is handed out in
whole 2 KiB banks, so each accumulation group owns its bank(s). Values between kernels already
live in HBM (the tile pass puts them there), so a kernel whose working set exceeds SBUF is a
tiling error, reported with the buffers that were live.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from trnc.errors import TrncError
from trnc.isa.ap import Mem
from trnc.isa.config import PSUM_BANK_BYTES, PSUM_BANKS
from trnc.passes.tile.tiles import Buffer, Tile, TileProgram

SBUF_ALIGN = 64   # bytes; keeps every dtype's offsets aligned
# SBUF ring / peak live bytes. Measured against the whole of SBUF (one thread; modeled figures otherwise equal):
# GPT-2 fp32 host run 96.6 -> 86.3 ms, BERT-base bf16 265 -> 237 ms, Llama layer bf16 67.7 -> 62.5 ms, with
# modeled time +0.6% (Llama bf16) and +0.16% (BERT bf16). At 2.0 the host gains 5% more but Llama bf16's
# modeled time rises 4.4%; at 3.0 little changes on either side.
RING_SLACK = 2.5


def lifetimes(program: TileProgram) -> dict[Buffer, tuple[int, int]]:
    """(first, last) instruction index of every buffer that an instruction touches."""
    life: dict[Buffer, tuple[int, int]] = {}
    for i, ins in enumerate(program.instrs):
        for v in ins.fields.values():
            if isinstance(v, Tile):
                first, _ = life.get(v.buffer, (i, i))
                life[v.buffer] = (first, i)
    return life


class _NextFit:
    """Free intervals of [0, capacity) and a cursor that goes round [0, ring); place() takes the first gap at
    or after the cursor."""

    def __init__(self, capacity: int, ring: int):
        self.capacity = capacity
        self.ring = ring
        self.free = [(0, capacity)]
        self.cursor = 0

    def place(self, size: int) -> int | None:
        if self.cursor + size > self.ring:
            self.cursor = 0
        gaps = sorted(self.free)
        ordered = [g for g in gaps if g[1] > self.cursor] + [g for g in gaps if g[1] <= self.cursor]
        for lo, hi in ordered:
            start = max(lo, self.cursor) if lo < self.cursor < hi else lo
            if hi - start < size:
                start = lo
            if hi - start >= size:
                self._take(lo, hi, start, size)
                self.cursor = (start + size) % self.capacity
                return start
        return None

    def _take(self, lo, hi, start, size):
        self.free.remove((lo, hi))
        if start > lo:
            self.free.append((lo, start))
        if start + size < hi:
            self.free.append((start + size, hi))

    def release(self, start: int, size: int):
        self.free.append((start, start + size))
        self.free.sort()
        merged = [self.free[0]]
        for lo, hi in self.free[1:]:
            if lo == merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        self.free = merged


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _peak_live(life: dict[Buffer, tuple[int, int]], mem: Mem, align: int) -> int:
    """The most bytes per partition of `mem` live at once (a buffer is live from its first to its last use;
    at one index, ends come before starts)."""
    events = sorted(e for buf, (first, last) in life.items() if buf.mem is mem
                    for e in ((first, 1, _align(buf.nbytes, align)), (last + 1, 0, -_align(buf.nbytes, align))))
    live = peak = 0
    for _, _, size in events:
        live += size
        peak = max(peak, live)
    return peak


def place(program: TileProgram) -> dict[str, int]:
    """Set every buffer's offset; return peak bytes per partition of SBUF and PSUM."""
    life = lifetimes(program)
    hw = program.hw
    align = {Mem.SBUF: SBUF_ALIGN, Mem.PSUM: PSUM_BANK_BYTES}
    peak = {mem: _peak_live(life, mem, align[mem]) for mem in (Mem.SBUF, Mem.PSUM)}
    sbuf, psum = hw.sbuf_bytes_per_partition, PSUM_BANKS * PSUM_BANK_BYTES
    arenas = {Mem.SBUF: _NextFit(sbuf, min(sbuf, _align(int(RING_SLACK * peak[Mem.SBUF]), SBUF_ALIGN))),
              Mem.PSUM: _NextFit(psum, psum)}
    used = {Mem.SBUF: 0, Mem.PSUM: 0}
    ending: list[tuple[int, int, Buffer]] = []   # heap of (last use, tie-break, buffer)
    for n, buf in enumerate(sorted(life, key=lambda b: life[b][0])):
        first, last = life[buf]
        while ending and ending[0][0] < first:
            _, _, old = heapq.heappop(ending)
            size = _align(old.nbytes, align[old.mem])
            arenas[old.mem].release(old.offset, size)
            used[old.mem] -= size
        size = _align(buf.nbytes, align[buf.mem])
        offset = arenas[buf.mem].place(size)
        if offset is None:
            live = sorted((b for _, _, b in ending if b.mem is buf.mem), key=lambda b: -b.nbytes)[:6]
            memory = "SBUF" if buf.mem is Mem.SBUF else "PSUM"
            raise TrncError(f"{memory} is full: buffer {buf.name} needs {size} bytes per partition with "
                            f"{used[buf.mem]} of {arenas[buf.mem].capacity} in use by "
                            f"{', '.join(f'{b.name} ({b.nbytes} B)' for b in live)}; the tiling of kernel "
                            f"{buf.name.split('.')[0]} is too large for {hw.name}")
        buf.offset = offset
        used[buf.mem] += size
        heapq.heappush(ending, (last, n, buf))
    for buf in program.buffers:
        if buf.offset is None:
            buf.offset = 0   # never touched by an instruction
    return {"sbuf_peak_bytes": peak[Mem.SBUF] * 128, "psum_peak_bytes": peak[Mem.PSUM] * 128,
            "buffers": len(life)}


@dataclass(frozen=True)
class Allocate:
    """SBUF/PSUM addresses by liveness, next-fit round a ring so freed space is reused late."""

    name: str = "allocate"

    def run(self, state) -> dict:
        return place(state.tiles)
