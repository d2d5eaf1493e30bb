"""prefetch: the weight loads of kernels whose kind asks for it move ahead of the kernels before them.

The tile pass emits each kernel's instructions in turn, its weight loads first, and allocate gives a buffer an
address free from its first use on; so a weight buffer usually reuses memory the kernel before just freed, and
its load waits for that kernel to finish with it. A CNN at batch 1 moves mostly weights (ResNet-50: 51 of its
59 MB of DMA in bf16) but computes its early layers on the vector engines, so its DMA queues idled there and
then loaded the later layers' weights while the engines waited.

Moved to after an earlier kernel's last instruction, a weight buffer lives from there and gets memory nothing
else uses then: its load can run as soon as a DMA queue is free, and the instructions before it in program
order keep their claim on the queues. A kernel's loads move back past as many kernels as leave SBUF room: at
every kernel passed, its own peak (the bytes per partition its live buffers take at once) plus the weights in
flight there (moved past it and not yet used) stays within PREFETCH_SHARE of SBUF and the weights in flight within
PREFETCH_BYTES. That estimate ignores how allocate's free space fragments, so the pass tries the allocation and
keeps the old order if it does not fit.

What moves: a kernel's DMAs from CONST tensors into SBUF buffers that only such DMAs write (its weights), when
the kernel's kind asks for it (KernelKind.prefetch). They read constants and write buffers of their own, so no
order they had with the instructions they pass matters; allocate then sees the longer lifetimes, and schedule
derives the semaphores from the new order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from trnc.errors import TrncError
from trnc.isa.ap import AP, Mem
from trnc.isa.opcodes import opspec
from trnc.isa.program import TensorKind
from trnc.passes.graph.kernel_kinds import KINDS
from trnc.passes.tile.allocate import lifetimes, place
from trnc.passes.tile.tiles import Tile, TileInstr, TileProgram

PREFETCH_SHARE = 0.6   # of SBUF per partition that a kernel's live buffers and the weights in flight may take
PREFETCH_BYTES = 128 * 1024   # bytes per partition of weights in flight at a kernel at most


def _weight_loads(tp: TileProgram, instrs: list[tuple[int, TileInstr]]) -> list[int]:
    """Positions of the kernel's DMAs from CONST tensors into buffers that nothing else writes."""
    written = {v.buffer for _, ins in instrs if not _loads_constant(tp, ins) for name, v in ins.fields.items()
               if isinstance(v, Tile) and opspec(ins.opcode).field(name).out}
    return [i for i, ins in instrs if _loads_constant(tp, ins) and ins.fields["dst"].buffer not in written]


def _loads_constant(tp: TileProgram, ins: TileInstr) -> bool:
    src, dst = ins.fields.get("src"), ins.fields.get("dst")
    return (ins.opcode == "dma_copy" and isinstance(src, AP) and src.mem is Mem.HBM and isinstance(dst, Tile)
            and dst.buffer.mem is Mem.SBUF and tp.tensors[src.tensor].kind is TensorKind.CONST)


def prefetch(tp: TileProgram, kinds: list[str]) -> dict:
    """Reorder tp.instrs in place; `kinds` are the kernels' kinds by index (TileInstr.kernel 'k<index>')."""
    by_kernel: dict[int, list[tuple[int, TileInstr]]] = {}
    for i, ins in enumerate(tp.instrs):
        match = re.fullmatch(r"k(\d+)", ins.kernel)
        if match:
            by_kernel.setdefault(int(match.group(1)), []).append((i, ins))
    order = sorted(by_kernel)
    peak = _kernel_peaks(tp, [[i for i, _ in by_kernel[k]] for k in order])
    limit = PREFETCH_SHARE * tp.hw.sbuf_bytes_per_partition
    flight = [0] * len(order)
    moved: dict[int, list[int]] = {}     # an instruction -> the loads placed after it
    taken: set[int] = set()
    for at, k in enumerate(order):
        if not KINDS[kinds[k]].prefetch:
            continue
        loads = _weight_loads(tp, by_kernel[k])
        size = sum({tp.instrs[i].fields["dst"].buffer: tp.instrs[i].fields["dst"].buffer.nbytes
                    for i in loads}.values())
        target = at - 1     # the loads go after kernel `target`'s last instruction
        while target > 0 and peak[target] + size <= limit and flight[target] + size <= PREFETCH_BYTES:
            target -= 1
        if not loads or target + 1 >= at:
            continue
        for passed in range(target + 1, at):
            peak[passed] += size
            flight[passed] += size
        moved.setdefault(by_kernel[order[target]][-1][0], []).extend(loads)
        taken.update(loads)
    result = []
    for i, ins in enumerate(tp.instrs):
        if i not in taken:
            result.append(ins)
        result.extend(tp.instrs[j] for j in moved.get(i, ()))
    original, tp.instrs = tp.instrs, result
    try:
        place(tp)   # a trial allocation: the estimate above ignores fragmentation
    except TrncError:
        tp.instrs = original
        return {"kernels_prefetched": 0, "loads_moved": 0, "undone_sbuf_full": 1}
    return {"kernels_prefetched": sum(1 for loads in moved.values() if loads), "loads_moved": len(taken)}


def _kernel_peaks(tp: TileProgram, spans: list[list[int]]) -> list[int]:
    """Per kernel (its instruction positions), the most bytes per partition its live SBUF buffers take at once."""
    change = [0] * (len(tp.instrs) + 1)
    for buf, (first, last) in lifetimes(tp).items():
        if buf.mem is Mem.SBUF:
            change[first] += buf.nbytes
            change[last + 1] -= buf.nbytes
    live, total = [], 0
    for delta in change[:-1]:
        total += delta
        live.append(total)
    return [max(live[i] for i in span) for span in spans]


@dataclass(frozen=True)
class Prefetch:
    """The weight loads of the kernels whose kind asks for it, ahead of the kernels before them."""

    name: str = "prefetch"

    def run(self, state) -> dict:
        return prefetch(state.tiles, [k.kind for k in state.graph.kernels])
