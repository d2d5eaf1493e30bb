"""Big instructions as independent pieces for the parallel driver, with the same result bits as the whole.

Queues alone leave a core idle when one queue holds most of the work (TensorE's matmuls in a transformer).
So the parallel driver runs a big instruction as pieces on several workers at once (runtime/jit/parallel.py
waits for all of them before the queue moves on). A piece is the instruction restricted to part of its
outputs, and each output element is computed from the same inputs in the same order whatever the other
elements do, so the pieces together write exactly the whole's bits:

- matmul (not double_row), by output columns: a piece is a matmul of moving's and dst's columns [n0, n1),
  cut along moving's outer free dim (a convolution's window rows: moving [K, rows, row]).
  Each dst[m, n] accumulates over the same k in the same order (the spec's loop is per (m, n)).
- tensor_tensor, tensor_scalar, activation and tensor_copy (round to nearest even), by partitions: a piece
  is the instruction on partitions [p0, p1) of every operand, per-partition ones included. Their
  semantics are per element, or per partition for activation's accum. Stochastic rounding is left whole,
  as its random stream depends on the partition index (rand(seed, p, e)).

Pieces are internal to a run, never verified or encoded: the partition alignment rules of compute engines
do not apply to them, as the kernels do not depend on the start partition.
"""
from __future__ import annotations

from dataclasses import replace

from trnc.isa.ap import AP, Mem
from trnc.isa.enums import Rounding
from trnc.isa.program import Instruction

MIN_MATMUL_MACS = 1 << 19      # K * M * N below which a matmul is not worth a second worker
MIN_ELEMENTS = 1 << 14         # elements of an elementwise instruction below which it stays whole
COLUMN_QUANTUM = 16            # pieces of a one-row matmul start at multiples of the kernel's column block
ROW_SPLIT = frozenset({"tensor_tensor", "tensor_scalar", "activation", "tensor_copy"})


def pieces(ins: Instruction, count: int) -> tuple[Instruction, ...]:
    """`ins` as at most `count` pieces that together compute it bit for bit; (ins,) when it stays whole."""
    if count > 1 and ins.opcode == "matmul" and not ins["double_row"]:
        return _by_columns(ins, count)
    if count > 1 and ins.opcode in ROW_SPLIT and not (ins.opcode == "tensor_copy" and ins["rounding"] == Rounding.SR):
        return _by_partitions(ins, count)
    return (ins,)


def _ranges(total: int, count: int, quantum: int) -> list[tuple[int, int]]:
    size = -(-total // count)
    size = -(-size // quantum) * quantum
    return [(lo, min(lo + size, total)) for lo in range(0, total, size)]


def _outer(ap: AP, lo: int, hi: int) -> AP:
    """The AP restricted to indices [lo, hi) of its outer free dim."""
    (stride, _), *inner = ap.dims
    return replace(ap, dims=((stride, hi - lo), *inner), offset=ap.offset + stride * lo * ap.dtype.itemsize)


def _by_columns(ins: Instruction, count: int) -> tuple[Instruction, ...]:
    st, mv, dst = ins["stationary"], ins["moving"], ins["dst"]
    if not mv.dims or len(dst.dims) != 1 or st.partitions * st.free_size * mv.free_size < MIN_MATMUL_MACS:
        return (ins,)
    row = mv.free_size // mv.dims[0][1]   # columns per index of moving's outer dim (1: moving is one row)
    spans = _ranges(mv.dims[0][1], count, COLUMN_QUANTUM if row == 1 else 1)
    return tuple(_with(ins, moving=_outer(mv, lo, hi), dst=_outer(dst, lo * row, hi * row)) for lo, hi in spans) \
        if len(spans) > 1 else (ins,)


def _rows(ap: AP, lo: int, hi: int) -> AP:
    return replace(ap, start_partition=ap.start_partition + lo, partitions=hi - lo)


def _by_partitions(ins: Instruction, count: int) -> tuple[Instruction, ...]:
    operands = list(ins.operands())
    partitions = operands[0][1].partitions
    if partitions * operands[0][1].free_size < MIN_ELEMENTS or any(ap.mem is Mem.HBM for _, ap, _ in operands):
        return (ins,)
    spans = _ranges(partitions, count, 1)
    return tuple(_with(ins, **{name: _rows(ap, lo, hi) for name, ap, _ in operands}) for lo, hi in spans) \
        if len(spans) > 1 else (ins,)


def _with(ins: Instruction, **operands: AP) -> Instruction:
    return ins.replace(args=tuple((k, operands.get(k, v)) for k, v in ins.args))
