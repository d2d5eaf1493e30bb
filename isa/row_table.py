"""The row table of a program: the rows every instruction carries (Instruction.rows, isa/rows.py) joined in one
pass over the instructions.

Touching a hundred thousand Python objects costs more than anything done with their words after, so the load
path does it once: the operand, sync and field tables (isa/operand_table.py, isa/sync_table.py,
isa/field_table.py) are each read out of this one join. Built once per Program and kept while it lives.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from trnc.isa import native
from trnc.isa.program import kept_with_program
from trnc.isa.rows import HEAD_WORDS


@dataclass(frozen=True)
class RowTable:
    """Per instruction i and part (operand, sync, field): the part's words are words[at[part][i]:][:length[part][i]],
    and length -1 when the part is absent (a field not of its type)."""

    words: np.ndarray
    at: tuple[np.ndarray, np.ndarray, np.ndarray]
    length: tuple[np.ndarray, np.ndarray, np.ndarray]

    def part(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(at, length) of part k (0 operand, 1 sync, 2 field) of every instruction; TypeError when one lacks it."""
        at, length = self.at[k], self.length[k]
        if len(length) and length.min() < 0:
            raise TypeError(f"an instruction has no {('operand', 'sync', 'field')[k]} row: a field is not of its type")
        return at, length


def join(instructions) -> RowTable:
    """The row table of a sequence of instructions."""
    try:
        words = np.frombuffer(b"".join(map(attrgetter("rows"), instructions)), dtype=np.int64)
    except (AttributeError, TypeError) as e:   # not an Instruction
        raise TypeError(f"an instruction is ill-formed: {e}") from None
    head = native.row_starts(words, len(instructions))
    lengths = words[head[:, None] + np.arange(HEAD_WORDS)].T   # [3, n]
    ats = [head + HEAD_WORDS]
    for k in range(1, HEAD_WORDS):
        ats.append(ats[-1] + np.maximum(lengths[k - 1], 0))
    return RowTable(words, tuple(ats), tuple(lengths))


@kept_with_program
def row_table(program) -> RowTable:
    """The program's row table, built on first use and kept with the program."""
    return join(program.instructions)
