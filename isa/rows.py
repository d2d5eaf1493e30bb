"""The rows an instruction carries: its operands, its sync fields and its other fields packed as int64 words.

An Instruction packs them once, when it is made (Instruction.rows), from its APs' own rows (AP.row). The
passes that read every instruction of a program then join the rows of all of them in one pass over the
instructions (isa/row_table.py) and read the columns with numpy: the operand table (isa/operand_table.py),
the sync table (isa/sync_table.py) and the field table (isa/field_table.py), which serve the verifier and
the JIT loader. A part is absent when a field is not of its type or place; the verifier then finds the
problem by its per-instruction rules.

Instruction.rows is a head of three words, each part's length in words (-1: absent), then the parts present:
- operand part: per present AP operand in field order, its position among the fields, 1 if written, then
  AP.row.
- sync part: engine, queue, wait count, signal count, each wait's semaphore and value, each signal.
- field part: the opcode's position in TABLE, engine, queue, then each field but the APs (an F32 as its
  double's bits, an I32X4 as four words, the others as one).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

from trnc.isa.ap import AP, Engine
from trnc.isa.opcodes import TABLE, Kind

OPERAND_PREFIX_WORDS = 2
HEAD_WORDS = 3        # of Instruction.rows: the lengths of its operand, sync and field parts
_HEAD = struct.Struct("<3q")
_FIELD_ROW_HEAD = 3   # words before the fields: opcode, engine, queue
_SYNC_ROWS = {n: struct.Struct(f"<{n}q") for n in range(4, 64)}   # by length in words
_INT = {int}


@dataclass(frozen=True)
class _OpcodeRows:
    """How the instructions of one opcode pack their operand and field rows."""

    code: int                             # position in TABLE
    names: tuple[str, ...]                # every field's name, in table order
    aps: tuple[tuple[int, bytes], ...]    # per AP field: its position, and its rows' prefix (position, written)
    plain: tuple[int, ...]                # positions of the fields but the APs
    words: dict[str, tuple[int, int]]     # per field but the APs: (first word, words) in the field row
    wide: tuple[bool, ...] | None         # per field but the APs: one of four words (I32X4); None if none is
    fields: struct.Struct


def _opcode_rows(code: int) -> _OpcodeRows:
    op = TABLE[code]
    plain = tuple(k for k, f in enumerate(op.fields) if f.kind is not Kind.AP)
    words, at = {}, _FIELD_ROW_HEAD
    for k in plain:
        words[op.fields[k].name] = (at, 4 if op.fields[k].kind is Kind.I32X4 else 1)
        at += words[op.fields[k].name][1]
    formats = "".join({Kind.F32: "d", Kind.I32X4: "4q"}.get(op.fields[k].kind, "q") for k in plain)
    wide = tuple(op.fields[k].kind is Kind.I32X4 for k in plain)
    return _OpcodeRows(code, tuple(f.name for f in op.fields),
                       tuple((k, struct.pack("<2q", k, f.out)) for k, f in enumerate(op.fields) if f.kind is Kind.AP),
                       plain, words, wide if any(wide) else None, struct.Struct(f"<{_FIELD_ROW_HEAD}q{formats}"))


_OPCODES = {op.name: _opcode_rows(code) for code, op in enumerate(TABLE)}


def field_words(opcode: str, name: str) -> tuple[int, int]:
    """Where field `name` (not an AP) of `opcode` lies in the field part: (first word, words)."""
    return _OPCODES[opcode].words[name]


def instruction_rows(ins) -> bytes:
    """Instruction.rows of an Instruction. The operand and field parts need the opcode known and the fields named
    as in the table."""
    try:
        rows = _OPCODES.get(ins.opcode)
        args = ins.args
        if rows is None or tuple(map(itemgetter(0), args)) != rows.names:
            return _joined(None, sync_row(ins), None)
    except TypeError:   # an unhashable opcode, args not pairs
        return _joined(None, sync_row(ins), None)
    return _joined(_operand_rows(args, rows), sync_row(ins), _field_row(ins.engine, ins.queue, args, rows))


def checked_rows(opcode: str, engine: Engine, queue: int, args, sync_words: tuple[int, ...], waits: int,
                 signals: int) -> bytes:
    """instruction_rows of an instruction whose every field its maker has checked (isa/decoding.py): the sync
    part straight from its words (its waits' semaphores and values, then its signals), the others without the
    check of the field names."""
    rows = _OPCODES[opcode]
    return _joined(_operand_rows(args, rows), _sync_packer(4 + len(sync_words)).pack(engine, queue, waits, signals,
                                                                                     *sync_words),
                   _field_row(engine, queue, args, rows))


def parts(rows: bytes) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(operand part, sync part, field part) of an Instruction.rows, None where absent."""
    found, at = [], 8 * HEAD_WORDS
    for words in _HEAD.unpack_from(rows):
        found.append(rows[at:at + 8 * words] if words >= 0 else None)
        at += 8 * max(words, 0)
    return found[0], found[1], found[2]


def with_sync_row(rows: bytes, ins) -> bytes:
    """`rows` with the sync part of `ins` instead of its own (an instruction whose waits or signals changed)."""
    operand, _, field = parts(rows)
    return _joined(operand, sync_row(ins), field)


def _joined(operand: bytes | None, sync: bytes | None, field: bytes | None) -> bytes:
    if operand is not None and sync is not None and field is not None:   # the usual case, quickest
        return b"".join((_HEAD.pack(len(operand) >> 3, len(sync) >> 3, len(field) >> 3), operand, sync, field))
    present = [p for p in (operand, sync, field) if p is not None]
    return b"".join([_HEAD.pack(*(len(p) >> 3 if p is not None else -1 for p in (operand, sync, field))), *present])


def _operand_rows(args, rows: _OpcodeRows) -> bytes | None:
    """None unless each AP field holds an AP with a row, or nothing."""
    found = []
    for k, prefix in rows.aps:
        ap = args[k][1]
        if ap is not None:
            if type(ap) is not AP or ap.row is None:
                return None
            found += (prefix, ap.row)
    return b"".join(found)


def sync_row(ins) -> bytes | None:
    """None unless the engine is an Engine, the waits pairs and every number a 64-bit integer (a bool is not)."""
    engine, queue, waits, signals = ins.engine, ins.queue, ins.waits, ins.signals
    try:
        if type(engine) is not Engine:
            return None
        if len(waits) == 1:   # the most common shape, checked a pair by unpacking
            (semaphore, value), = waits
            values = (queue, semaphore, value, *signals)
        elif not waits:
            values = (queue, *signals)
        elif set(map(len, waits)) <= {2}:
            values = (queue, *chain.from_iterable(waits), *signals)
        else:
            return None
        if not _INT.issuperset(map(type, values)) and bool in set(map(type, values)):
            return None
        return _sync_packer(3 + len(values)).pack(engine, queue, len(waits), len(signals), *values[1:])
    except (TypeError, ValueError, struct.error):
        return None


def _field_row(engine, queue, args, rows: _OpcodeRows) -> bytes | None:
    """None unless the engine is an Engine, the queue an int (a bool is not) and every value of its kind's Python
    type."""
    try:
        if type(engine) is not Engine or type(queue) is not int:
            return None
        values = [args[k][1] for k in rows.plain]
        if rows.wide is not None:   # an I32X4 must be a tuple, and no other field is one
            if any(wide != (type(v) is tuple) for v, wide in zip(values, rows.wide)):
                return None
            values = list(chain.from_iterable(v if wide else (v,) for v, wide in zip(values, rows.wide)))
        return rows.fields.pack(rows.code, engine, queue, *values)
    except (TypeError, ValueError, struct.error):
        return None


def _sync_packer(words: int) -> struct.Struct:
    return _SYNC_ROWS.get(words) or struct.Struct(f"<{words}q")
