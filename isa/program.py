"""Programs: tensor declarations in HBM and per-engine instruction streams, in one list.

An Instruction is one row of the opcode table filled in: its engine (and DMA queue), its field
values, and its semaphore waits and signals. Instructions of one queue execute in list order;
instructions on different queues are ordered only through semaphores: `signals` increments each
named semaphore by one when the instruction completes, and `waits` holds (semaphore, value) pairs
that must all have count >= value before it starts.
"""
from __future__ import annotations

import enum
import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Iterator, TypeVar

from trnc.isa.ap import AP, Engine, queue_name
from trnc.isa.config import DEFAULT_TARGET
from trnc.isa.dtypes import DType
from trnc.isa.opcodes import Kind, OpSpec, opspec
from trnc.isa.rows import instruction_rows, with_sync_row


class TensorKind(enum.IntEnum):
    INPUT = 0
    OUTPUT = 1
    CONST = 2
    SCRATCH = 3
    SEED = 4       # int32 [1]: the seed of the `random` instructions, a new one per call (its caller draws it)

    @property
    def text(self) -> str:
        return self.name.lower()


# The kinds whose values the caller of a run supplies (the runtimes check that each is given).
BOUND_KINDS = frozenset({TensorKind.INPUT, TensorKind.CONST, TensorKind.SEED})


@dataclass(frozen=True)
class TensorDecl:
    name: str
    kind: TensorKind
    dtype: DType
    shape: tuple[int, ...]

    @property
    def num_elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def num_bytes(self) -> int:
        return self.num_elements * self.dtype.itemsize


@dataclass(frozen=True)
class Instruction:
    opcode: str
    engine: Engine
    args: tuple[tuple[str, Any], ...]   # (field name, value) in table order, every field present
    queue: int = 0                      # DMA queue number; 0 for compute engines
    waits: tuple[tuple[int, int], ...] = ()
    signals: tuple[int, ...] = ()
    # The fields the loaders read of every instruction, packed once as it is made (isa/rows.py; isa/row_table.py
    # joins them, touching each instruction once); a part is absent when a field is not of its type or place
    # (the verifier then reports it).
    rows: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.__dict__["rows"] = instruction_rows(self)   # frozen: set past __setattr__

    @classmethod
    def with_rows(cls, opcode: str, engine: Engine, args: tuple, queue: int, waits: tuple, signals: tuple,
                  rows: bytes) -> "Instruction":
        """An instruction whose rows its maker packed from values it checked (isa/decoding.py, by
        isa/rows.checked_rows), not packed again."""
        ins = object.__new__(cls)
        ins.__dict__.update(opcode=opcode, engine=engine, args=args, queue=queue, waits=waits, signals=signals,
                            rows=rows)
        return ins

    def __getstate__(self) -> dict:
        """Pickled without its rows (larger than the fields, and quicker to make again than to load)."""
        return {k: v for k, v in self.__dict__.items() if k != "rows"}

    def __setstate__(self, state: dict):
        self.__dict__.update(state)
        self.__dict__["rows"] = instruction_rows(self)

    @classmethod
    def make(cls, opcode: str, engine: Engine | None = None, *, queue: int = 0,
             waits=(), signals=(), **fields) -> "Instruction":
        """Build an instruction, filling defaults from the table; engine defaults to the opcode's first."""
        spec = opspec(opcode)
        unknown = set(fields) - {f.name for f in spec.fields}
        if unknown:
            raise ValueError(f"{opcode}: unknown field(s) {sorted(unknown)}; fields are "
                             f"{[f.name for f in spec.fields]}")
        args = []
        for f in spec.fields:
            if f.kind is Kind.AP:
                value = fields.get(f.name)
                if value is None and not f.optional:
                    raise ValueError(f"{opcode}: missing operand '{f.name}'")
            else:
                value = fields.get(f.name, f.default)
                if f.kind is Kind.I32X4:
                    value = tuple(int(v) for v in value)
            args.append((f.name, value))
        return cls(opcode, engine if engine is not None else spec.engines[0], tuple(args), queue,
                   tuple((int(s), int(v)) for s, v in waits), tuple(int(s) for s in signals))

    @property
    def spec(self) -> OpSpec:
        return opspec(self.opcode)

    def __getitem__(self, name: str) -> Any:
        for k, v in self.args:
            if k == name:
                return v
        raise KeyError(f"{self.opcode} has no field '{name}'")

    def __contains__(self, name: str) -> bool:
        return any(k == name for k, _ in self.args)

    @property
    def queue_name(self) -> str:
        return queue_name(self.engine, self.queue)

    def operands(self) -> Iterator[tuple[str, AP, bool]]:
        """(field name, AP, is_write) of every present AP operand (by position when the fields are in table order,
        as in every well-formed instruction; else by name)."""
        args = self.args
        for k, name, out in self.spec.ap_slots:
            ap = args[k][1] if k < len(args) and args[k][0] == name else self[name]
            if ap is not None:
                yield name, ap, out

    def replace(self, **changes) -> "Instruction":
        if changes.keys() <= {"waits", "signals"}:   # the scheduler's: the operand and field parts stay as they are
            ins = Instruction.with_rows(self.opcode, self.engine, self.args, self.queue,
                                        changes.get("waits", self.waits), changes.get("signals", self.signals),
                                        self.rows)
            ins.__dict__["rows"] = with_sync_row(self.rows, ins)
            return ins
        from dataclasses import replace
        return replace(self, **changes)


@dataclass(frozen=True)
class Program:
    tensors: tuple[TensorDecl, ...]
    instructions: tuple[Instruction, ...]
    target: str = DEFAULT_TARGET

    def tensor_index(self, name: str) -> int:
        for i, t in enumerate(self.tensors):
            if t.name == name:
                return i
        raise KeyError(name)

    @property
    def num_semaphores(self) -> int:
        used = [s for ins in self.instructions for s in ins.signals] + \
               [s for ins in self.instructions for s, _ in ins.waits]
        return max(used, default=-1) + 1

    def tensors_of(self, kind: TensorKind) -> list[TensorDecl]:
        return [t for t in self.tensors if t.kind is kind]


_Kept = TypeVar("_Kept")


def kept_with_program(build: Callable[[Program], _Kept]) -> Callable[[Program], _Kept]:
    """`build` made once per Program, on first use, and kept while the program lives: not in it, since a Program is
    a value, hashed and pickled by its fields (the operand, sync and field tables the load path shares). Built under
    a lock: the verifier's ordering thread and the JIT loader ask for the same tables at once."""
    kept: dict[int, tuple[weakref.ref, _Kept]] = {}   # by id(program), dropped when the program dies
    lock = threading.Lock()

    @functools.wraps(build)
    def get(program: Program) -> _Kept:
        key = id(program)
        with lock:
            entry = kept.get(key)
            if entry is not None and entry[0]() is program:
                return entry[1]
            value = build(program)
            kept[key] = (weakref.ref(program, lambda _, key=key: kept.pop(key, None)), value)
        return value
    return get
