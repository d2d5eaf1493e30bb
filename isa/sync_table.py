"""The sync table of a program: each instruction's queue and its semaphore waits and signals as int64 columns.

What the ordering rules read (isa/races.py's happens-before order) and what decides the runtimes' execution
order (runtime/reference.py), read out of the rows the instructions carry (isa/row_table.py) and kept with
the program while it lives, as isa/operand_table.py keeps the operands. Waits and signals are flattened in
program order (and each instruction's own order), with row starts per instruction.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trnc.isa import native
from trnc.isa.ap import Engine, queue_name
from trnc.isa.program import Program, kept_with_program
from trnc.isa.row_table import RowTable, row_table


@dataclass(frozen=True)
class SyncTable:
    """`wait_*[wait_first[i]:wait_first[i + 1]]` are instruction i's waits, likewise its signals."""

    queue: np.ndarray          # queue id per instruction: names[queue[i]] is its queue's name
    names: tuple[str, ...]     # queue names in order of first use
    wait_first: np.ndarray
    wait_semaphore: np.ndarray
    wait_value: np.ndarray
    signal_first: np.ndarray
    signal_semaphore: np.ndarray

    @cached_property
    def wait_instr(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.queue)), np.diff(self.wait_first))

    @cached_property
    def signal_instr(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.queue)), np.diff(self.signal_first))

    @cached_property
    def by_queue(self) -> tuple[np.ndarray, np.ndarray]:
        """(instructions grouped by queue id, each queue's in program order; where each queue id's group starts,
        one more for the end): queue q's instructions are members[start[q]:start[q + 1]], none empty."""
        members = np.argsort(self.queue, kind="stable")
        return members, np.searchsorted(self.queue[members], np.arange(len(self.names) + 1))


@kept_with_program
def sync_table(program: Program) -> SyncTable:
    """The program's sync table, built on first use; TypeError when a wait, signal, engine or queue is not an
    integer (a wait not a pair)."""
    return _build(row_table(program))


def _build(rows: RowTable) -> SyncTable:
    """From the sync rows of the row table: engine, queue, wait count, signal count, the waits' (semaphore, value)
    words and the signals'."""
    at, length = rows.part(1)
    words = rows.words
    engine, queue, wait_counts, signal_counts = (words[at + k] for k in range(4))
    if np.any(4 + 2 * wait_counts + signal_counts != length):
        raise TypeError("a sync row is not whole")
    waits = words[_spans(at + 4, 2 * wait_counts)]
    pair = native.row_ids(np.column_stack([engine, queue]))   # numbered in order of first use
    first = native.first_appearances(pair)
    # queue names (a compute engine's ignores the queue field) numbered in order of first use
    pair_names = [queue_name(Engine(e), q) for e, q in zip(engine[first].tolist(), queue[first].tolist())]
    names = tuple(dict.fromkeys(pair_names))
    pair_queue = np.array([names.index(name) for name in pair_names], dtype=np.int64)
    return SyncTable(pair_queue[pair], names, _first(wait_counts), waits[0::2], waits[1::2],
                     _first(signal_counts), words[_spans(at + 4 + 2 * wait_counts, signal_counts)])


def _spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices start, start + 1, ..., start + count - 1 of each span, in order."""
    return np.repeat(starts - _first(counts)[:-1], counts) + np.arange(int(counts.sum()))


def _first(counts: np.ndarray) -> np.ndarray:
    first = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    return first
