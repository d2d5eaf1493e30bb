"""The field table of a program: every instruction's field row (isa/rows.py: its opcode, engine, queue and every
field but the APs, as int64 words), read out of its row table (isa/row_table.py).

Read by the verifier (an id per distinct row for its forms; the engines for its place rules) and by the JIT
loader (each opcode's static and dynamic words). Built once per Program and kept while the program lives, as
the operand and sync tables are.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trnc.isa.native import row_ids
from trnc.isa.program import kept_with_program
from trnc.isa.row_table import RowTable, join, row_table


QUEUE_WORD = 2   # of a field row: opcode, engine, queue, then the fields


@dataclass(frozen=True)
class FieldTable:
    """`words[at[i]:at[i] + lengths[i]]` is instruction i's field row."""

    words: np.ndarray
    at: np.ndarray
    lengths: np.ndarray

    @property
    def opcode(self) -> np.ndarray:
        """Per instruction, its opcode's position in TABLE."""
        return self.words[self.at]

    @property
    def engine(self) -> np.ndarray:
        return self.words[self.at + 1]

    def fields(self, members: np.ndarray) -> np.ndarray:
        """[len(members), words] of the rows of `members`, instructions of one opcode (so of one row length)."""
        return self.words[self.at[members][:, None] + np.arange(int(self.lengths[members[0]]))]

    @property
    def queue(self) -> np.ndarray:
        return self.words[self.at + QUEUE_WORD]

    @cached_property
    def ids(self) -> np.ndarray:
        """Per instruction, an id shared by exactly the instructions whose rows are equal but for the queue (the
        verifier's forms: its queue rule is checked on every instruction apart): over each row's length and its
        words, padded with zeros to the longest, the queue's word zero."""
        width = int(self.lengths.max(initial=0))
        reach = np.arange(width)
        inside = (reach < self.lengths[:, None]) & (reach != QUEUE_WORD)
        words = np.where(inside, self.words[np.where(inside, self.at[:, None] + reach, 0)], 0)
        return row_ids(np.column_stack([self.lengths, words]))


def build(instructions) -> FieldTable:
    """The field table of a sequence of instructions; TypeError when one has no field row (a field not of its
    type)."""
    return from_rows(join(instructions))


def from_rows(rows: RowTable) -> FieldTable:
    at, length = rows.part(2)
    return FieldTable(rows.words, at, length)


@kept_with_program
def field_table(program) -> FieldTable:
    """The program's field table, built on first use and kept with the program."""
    return from_rows(row_table(program))
