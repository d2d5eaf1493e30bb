"""The operand table of a program: every present AP operand of every instruction as one row of int64 columns.

Built once per Program (`operand_table(program)`, kept while the program lives) by one pass over the
instructions, and shared by the passes that read every operand: the verifier's place rules and race check
(isa/verify.py, isa/races.py) and the JIT loader's argument words (runtime/jit/executor.py). What they compute
per operand (byte ranges, footprints, places) is then numpy over all rows at once instead of Python per
operand, which was most of what loading a 100k-instruction program cost.

Rows follow the instructions in order and, within one, `Instruction.operands()` order. A program with an
ill-formed instruction or an operand that is not an AP of integer fields (which the verifier reports per
instruction) has no table: `build` raises TypeError.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trnc.isa.ap import MAX_FREE_DIMS, AP, Mem
from trnc.isa.decoding import no_gc

# The columns `build` unpacks from each distinct AP, then stride and count of each of MAX_FREE_DIMS free dims
# (absent dims: stride 0, count 1).
_AP_COLUMNS = ("mem", "dtype", "itemsize", "partitions", "start", "offset", "tensor", "pstride", "ndims")


@dataclass(frozen=True)
class OperandTable:
    """Columns over the operand rows; `first[i]:first[i + 1]` are instruction i's rows."""

    aps: list[AP]
    instr: np.ndarray
    slot: np.ndarray        # position among the instruction's present operands
    field: np.ndarray       # position among the instruction's fields
    write: np.ndarray       # bool
    mem: np.ndarray         # Mem value
    dtype: np.ndarray       # DType code
    itemsize: np.ndarray
    partitions: np.ndarray
    start: np.ndarray       # start partition (on chip)
    offset: np.ndarray      # bytes
    tensor: np.ndarray      # HBM tensor index, -1 on chip
    pstride: np.ndarray     # HBM partition stride in elements
    ndims: np.ndarray
    strides: np.ndarray     # [rows, MAX_FREE_DIMS] in elements
    counts: np.ndarray      # [rows, MAX_FREE_DIMS]
    first: np.ndarray       # [instructions + 1]

    def __len__(self) -> int:
        return len(self.aps)

    @cached_property
    def extent(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row, AP.free_extent: the lowest and highest element offset the free dims reach."""
        reach = self.strides * (self.counts - 1)
        return np.minimum(reach, 0).sum(axis=1), np.maximum(reach, 0).sum(axis=1)

    @cached_property
    def byte_range(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row, AP.byte_range: [lo, hi) within a partition (on chip) or the tensor (HBM)."""
        lo, hi = self.extent
        across = np.where(self.mem == Mem.HBM, self.pstride * (self.partitions - 1), 0)
        lo, hi = lo + np.minimum(across, 0), hi + np.maximum(across, 0)
        return self.offset + lo * self.itemsize, self.offset + (hi + 1) * self.itemsize

    @cached_property
    def form(self) -> np.ndarray:
        """Per row, an id shared by exactly the rows whose APs are equal but for their place (start partition,
        offset, tensor): mem, dtype, partitions, dims, and the partition stride of an HBM AP."""
        key = np.column_stack([self.mem, self.dtype, self.partitions, self.ndims, self.strides, self.counts,
                               np.where(self.mem == Mem.HBM, self.pstride, 0)])
        return row_ids(key)

    @cached_property
    def ap_id(self) -> np.ndarray:
        """Per row, an id shared by exactly the rows whose APs are equal (place included)."""
        return row_ids(np.column_stack([self.mem, self.dtype, self.partitions, self.start, self.offset, self.tensor,
                                        self.pstride, self.ndims, self.strides, self.counts]))


def row_ids(key: np.ndarray) -> np.ndarray:
    """Per row of `key`, an id shared by exactly the equal rows (np.unique(axis=0)'s inverse, faster)."""
    if not len(key):
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(key.T[::-1])
    ranked = key[order]
    ids = np.empty(len(key), dtype=np.int64)
    ids[order] = np.concatenate([[0], np.cumsum(np.any(ranked[1:] != ranked[:-1], axis=1))])
    return ids


_tables: dict[int, tuple[weakref.ref, OperandTable]] = {}   # by id(program), dropped when the program dies


def operand_table(program) -> OperandTable:
    """The table of `program`'s operands, built on first use and kept with the program (not in it: a Program
    is a value, hashed and pickled by its fields)."""
    key = id(program)
    entry = _tables.get(key)
    if entry is not None and entry[0]() is program:
        return entry[1]
    table = build(program.instructions)
    _tables[key] = (weakref.ref(program, lambda _, key=key: _tables.pop(key, None)), table)
    return table


def build(instructions) -> OperandTable:
    """The table of the operands of a sequence of instructions (one Python pass; each AP object is unpacked
    once)."""
    rows: list[int] = []   # per operand: instruction, slot, field, write, distinct AP
    aps: list[AP] = []
    first = [0]
    distinct: dict[int, int] = {}   # id(ap) -> its row in `unpacked`: the instructions keep every AP alive meanwhile
    unpacked: list[tuple] = []
    with no_gc(), _ill_formed_is_type_error():
        for i, ins in enumerate(instructions):
            for slot, (field, _, ap, write) in enumerate(ins.operand_fields()):
                at = distinct.get(id(ap))
                if at is None:
                    at = distinct[id(ap)] = len(unpacked)
                    unpacked.append(_fields(ap))
                rows += (i, slot, field, write, at)
                aps.append(ap)
            first.append(len(aps))
    width = len(_AP_COLUMNS) + 2 * MAX_FREE_DIMS
    flat = [v for fields in unpacked for v in fields]
    per_ap = np.array(flat) if flat else np.zeros(0, dtype=np.int64)
    if per_ap.dtype != np.int64:   # numpy finds the type: any float, None or huge int makes it another
        raise TypeError("an operand field is not an integer of int64 range")
    per_ap = per_ap.reshape(-1, width)
    index = np.array(rows, dtype=np.int64).reshape(-1, 5).T
    cols = per_ap[index[4]].T
    dims = len(_AP_COLUMNS)
    return OperandTable(aps, index[0], index[1], index[2], index[3].astype(bool),
                        **dict(zip(_AP_COLUMNS, cols)), strides=cols[dims::2].T.copy(),
                        counts=cols[dims + 1::2].T.copy(), first=np.array(first, dtype=np.int64))


@contextlib.contextmanager
def _ill_formed_is_type_error():
    """An instruction whose operands cannot be listed (an unknown opcode, a missing field) makes no table."""
    try:
        yield
    except (AttributeError, KeyError, ValueError, IndexError) as e:
        raise TypeError(f"an instruction is ill-formed: {e}") from None


_PAD = tuple((0, 1) * (MAX_FREE_DIMS - k) for k in range(MAX_FREE_DIMS + 1))


def _fields(ap) -> tuple:
    if not isinstance(ap, AP) or not isinstance(ap.mem, Mem) or len(ap.dims) > MAX_FREE_DIMS:
        raise TypeError(f"{ap!r} is not an access pattern of at most {MAX_FREE_DIMS} free dims")
    dtype = ap.dtype
    return (ap.mem, dtype.code, dtype.itemsize, ap.partitions, ap.start_partition, ap.offset, ap.tensor,
            ap.partition_stride, len(ap.dims), *sum(ap.dims, ()), *_PAD[len(ap.dims)])
