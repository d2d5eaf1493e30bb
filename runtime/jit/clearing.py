"""Which bytes of its kept buffers a JitProgram must clear before a run: those the run may read before it
writes them.

A run starts from zeroed SBUF, PSUM and scratch tensors. A JitProgram keeps these buffers from one run to
the next (runtime/jit/executor.py), and clearing all of them took 10 ms of GPT-2's 100 ms run (46 MB). But
the addresses of a program are static, so after a full clear only bytes the program writes ever become
nonzero, and a run only needs zeros in the bytes it reads before writing them. This module finds a
superset of those bytes once, from the operand table in the execution order (any execution the parallel
driver runs orders every conflicting pair as that order does, so "before" is the same in all of them):

- an instruction reads its read operands, and its dst too when it accumulates (matmul, matmul_mx), before
  it writes; every write stores every element of its access pattern (runtime/reference.py `write`);
- a write marks its bytes as written when they are one run per partition (on chip) or one run (HBM);
  other writes mark nothing, which only makes later reads look unwritten;
- a read none of whose bytes' bounding box lies wholly in marked bytes puts that box in the plan.

The plan is a list of rectangles (buffer, partitions, bytes) to clear: the buffers are SBUF, PSUM, then the
scratch tensors in declaration order.
"""
from __future__ import annotations

import numpy as np

from trnc.isa.ap import Mem
from trnc.isa.operand_table import OperandTable
from trnc.isa.program import Program, TensorKind
from trnc.runtime.jit.kernels import canonical

Rectangle = tuple[int, int, int, int, int]   # buffer, first partition, end partition, first byte, end byte


def clear_plan(program: Program, table: OperandTable, order, on_chip: tuple[tuple[int, int], ...]) -> list[Rectangle]:
    """The rectangles to clear before a run (after a full clear once); `on_chip`: the shapes of the SBUF and
    PSUM buffers, [partitions, bytes]."""
    scratch = {t: 2 + k for k, t in enumerate(i for i, d in enumerate(program.tensors)
                                              if d.kind is TensorKind.SCRATCH)}
    places = {Mem.SBUF: 0, Mem.PSUM: 1}
    written = [np.zeros(shape, dtype=bool) for shape in on_chip] + \
              [np.zeros(program.tensors[t].num_bytes, dtype=bool) for t in scratch]
    unread: set[Rectangle] = set()
    lo, hi = table.byte_range
    for index in order:
        ins = program.instructions[index]
        accumulates = bool(ins.args and dict(ins.args).get("accumulate"))
        span = range(table.first[index], table.first[index + 1])
        for read_pass in (True, False):
            for row in span:
                write = bool(table.write[row])
                if read_pass and write and not (accumulates and ins.args[table.field[row]][0] == "dst"):
                    continue
                if not read_pass and not write:
                    continue
                mem = Mem(int(table.mem[row]))
                if mem is Mem.HBM:
                    buffer = scratch.get(int(table.tensor[row]))
                    if buffer is None:
                        continue   # inputs, constants and outputs are bound afresh for every run
                    rect = (buffer, 0, 1, int(lo[row]), int(hi[row]))
                    box = (slice(rect[3], rect[4]),)
                else:
                    buffer, start = places[mem], int(table.start[row])
                    rect = (buffer, start, start + int(table.partitions[row]), int(lo[row]), int(hi[row]))
                    box = (slice(rect[1], rect[2]), slice(rect[3], rect[4]))
                if read_pass:
                    if rect not in unread and not written[buffer][box].all():
                        unread.add(rect)
                elif _one_run(table, row):
                    written[buffer][box] = True
    return _bounded(sorted(unread), [w.shape for w in written])


def _bounded(rects: list[Rectangle], shapes: list[tuple[int, ...]]) -> list[Rectangle]:
    """The rectangles, but one whole buffer in place of those of a buffer whose areas add up to its size."""
    area = [0] * len(shapes)
    for buffer, first, end, lo, hi in rects:
        area[buffer] += (end - first) * (hi - lo)
    whole = {b for b, a in enumerate(area) if a >= np.prod(shapes[b])}
    return [r for r in rects if r[0] not in whole] + \
        [(b, 0, shapes[b][0] if len(shapes[b]) == 2 else 1, 0, shapes[b][-1]) for b in sorted(whole)]


def _one_run(table: OperandTable, row: int) -> bool:
    """The access pattern's bytes are one run per partition (on chip), or one run over all (HBM)."""
    ap = table.ap(row)
    dims = canonical(ap.dims)
    if ap.mem is Mem.HBM:
        dims = canonical(((ap.partition_stride, ap.partitions), *ap.dims))
    return not dims or (len(dims) == 1 and dims[0][0] == 1)
