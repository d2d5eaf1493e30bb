"""The field table of a program: every instruction's field row (isa/rows.py: its opcode, engine, queue and every
field but the APs, as int64 words) joined once.

Read by the verifier (an id per distinct row for its forms; the engines for its place rules) and by the JIT
loader (each opcode's static and dynamic words), which before each joined the rows again. Built once per
Program and kept while the program lives, as the operand and sync tables are.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter

import numpy as np

from trnc.isa.program import kept_with_program


@dataclass(frozen=True)
class FieldTable:
    """`words[at[i]:at[i] + lengths[i]]` is instruction i's field row."""

    rows: tuple[bytes, ...]
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

    @cached_property
    def ids(self) -> np.ndarray:
        """Per instruction, an id shared by exactly the instructions whose rows are equal (not dense)."""
        first: dict[bytes, int] = {}
        return np.fromiter(map(first.setdefault, self.rows, itertools.count()), dtype=np.int64, count=len(self.rows))


def build(instructions) -> FieldTable:
    """The field table of a sequence of instructions; TypeError when one has no field row (a field not of its
    type)."""
    rows = tuple(map(attrgetter("field_row"), instructions))
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)) // 8   # None: TypeError
    return FieldTable(rows, np.frombuffer(b"".join(rows), dtype=np.int64), np.cumsum(lengths) - lengths, lengths)


@kept_with_program
def field_table(program) -> FieldTable:
    """The program's field table, built on first use and kept with the program."""
    return build(program.instructions)
