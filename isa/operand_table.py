"""The operand table of a program: every present AP operand of every instruction as one row of int64 columns.

Built once per Program (`operand_table(program)`, kept while the program lives) out of the operand rows its
instructions carry (isa/rows.py, packed as each is made from its APs' AP.row; joined by isa/row_table.py), and
shared by the passes that read every operand: the verifier's place rules and race check (isa/verify.py,
isa/races.py) and the JIT loader's argument words (runtime/jit/executor.py). What they compute per operand (byte ranges,
footprints, places) is then numpy over all rows at once instead of Python per operand, which was most of what
loading a 100k-instruction program cost.

Rows follow the instructions in order and, within one, `Instruction.operands()` order. A program with an
ill-formed instruction or an operand that is not an AP of integer fields (which the verifier reports per
instruction) has no table: TypeError.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from trnc.isa import native
from trnc.isa.native import first_appearances, row_ids
from trnc.isa.ap import ROW_FIELDS, ROW_WORDS, AP, Mem
from trnc.isa.dtypes import DType
from trnc.isa.program import kept_with_program
from trnc.isa.row_table import RowTable, join, row_table
from trnc.isa.rows import OPERAND_PREFIX_WORDS

_WORDS = OPERAND_PREFIX_WORDS + ROW_WORDS   # of an operand row
_ITEMSIZE = np.zeros(max(d.code for d in DType) + 1, dtype=np.int64)   # by DType code
_ITEMSIZE[[d.code for d in DType]] = [d.itemsize for d in DType]


@dataclass(frozen=True)
class OperandTable:
    """Columns over the operand rows; `first[i]:first[i + 1]` are instruction i's rows."""

    instructions: Sequence   # the instructions, for their operands' APs (OperandTable.ap)
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
        return len(self.instr)

    def ap(self, row: int) -> AP:
        """The AP of a row."""
        return self.instructions[self.instr[row]].args[self.field[row]][1]

    @property
    def aps(self) -> list[AP]:
        """The AP of every row."""
        return [self.ap(row) for row in range(len(self))]

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
        offset, tensor): mem, dtype, partitions, dims and partition stride."""
        key = np.column_stack([self.mem, self.dtype, self.partitions, self.ndims, self.strides, self.counts,
                               self.pstride])
        return row_ids(key)

    @cached_property
    def ap_id(self) -> np.ndarray:
        """Per row, an id shared by exactly the rows whose APs are equal (place included)."""
        return row_ids(np.column_stack([self.form, self.start, self.offset, self.tensor]))

    @cached_property
    def instruction_forms(self) -> np.ndarray:
        """Per instruction, an id shared by exactly the instructions whose operands agree in field, form and which
        earlier operand of the instruction each is identical to (place included): with the opcode and its other
        fields, what the verifier's rules but the place rules read, and what decides a JIT kernel."""
        count, rows = len(self.first) - 1, len(self)
        if not rows:
            return np.zeros(count, dtype=np.int64)
        same = row_ids(np.column_stack([self.instr, self.ap_id]))   # equal operands of one instruction
        repeats = self.slot[first_appearances(same)[same]]   # the slot of the first operand equal to each
        width = int(self.slot.max()) + 1
        code = (self.form * (int(self.field.max()) + 1) + self.field) * width + repeats
        per_instruction = np.full((count, width), -1, dtype=np.int64)
        per_instruction[self.instr, self.slot] = code
        return row_ids(per_instruction)


@kept_with_program
def operand_table(program) -> OperandTable:
    """The table of `program`'s operands, built on first use and kept with the program; TypeError when an
    instruction has no operand row."""
    return from_rows(program.instructions, row_table(program))


def build(instructions) -> OperandTable:
    """The table of the operands of a sequence of instructions (isa/row_table.py joins their rows)."""
    instructions = instructions if isinstance(instructions, (list, tuple)) else list(instructions)
    return from_rows(instructions, join(instructions))


def from_rows(instructions, rows: RowTable) -> OperandTable:
    """The operand table out of the instructions' row table: each operand row's words gathered straight into
    columns; TypeError when an instruction has no operand row."""
    at, length = rows.part(0)
    counts = length // _WORDS
    if np.any(counts * _WORDS != length):
        raise TypeError("an operand row is not whole")
    first = np.zeros(len(instructions) + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    row_at = np.repeat(at - _WORDS * first[:-1], counts) + _WORDS * np.arange(int(first[-1]))
    words = native.gather_columns(rows.words, row_at, _WORDS)   # [_WORDS, rows]
    instr = np.repeat(np.arange(len(instructions)), counts)
    columns = dict(zip(ROW_FIELDS, words[OPERAND_PREFIX_WORDS:]))
    pairs = words[OPERAND_PREFIX_WORDS + len(ROW_FIELDS):].T
    return OperandTable(instructions, instr, np.arange(len(instr)) - first[instr], words[0], words[1].astype(bool),
                        **columns, itemsize=_ITEMSIZE[columns["dtype"]], strides=pairs[:, 0::2],
                        counts=pairs[:, 1::2], first=first)
