"""Loading and running a verified Program on the JIT: kernels, argument blocks, the driver table, and binding.

`load` does every piece of Python work once: it verifies the program (unless told it is verified), computes
the reference's execution order (runtime/reference.py's rule: each time, the head of the first queue in
QUEUE_ORDER whose waits are met), turns each instruction into a kernel signature and an argument block
(instructions of one shape share the kernel; operand places come from the program's operand table,
isa/operand_table.py, which the verifier has usually built already), compiles or fetches each distinct
kernel through runtime/jit/cache.py, and lays out the driver table. `JitProgram.run` then binds the memories
and makes one native call to the driver, which runs every instruction in that order; with TRNC_THREADS above 1
it runs the parallel driver instead (runtime/jit/parallel.py: the queues on that many threads, big
instructions as pieces from runtime/jit/split.py, the table of each piece count laid out on first use), which
gives the same bits.

Memories: SBUF and PSUM are uint8 host buffers [128, bytes per partition] (0xFF bytes with fill_nan,
which is NaN in every float dtype, so a read of unwritten memory shows), scratch tensors zeroed arrays,
outputs fresh zeroed arrays, and input and constant tensors are used in place, without a copy, when they
are C-contiguous, aligned numpy arrays (or CPU torch tensors) of the exact storage dtype that the
program never writes; otherwise they are copied. Outputs are returned as the arrays the kernels wrote.

In place with a repeated element: when a written operand is identical to a read operand (the verifier
allows that) and its access pattern reaches some element twice, a kernel visiting elements in order
would read values it already overwrote, while the instruction reads everything first. Such a read
operand is copied to a staging buffer by a copy kernel just before the instruction, which then reads
the copy.

A JitProgram keeps its SBUF, PSUM and scratch buffers from one run to the next and clears them before each
(on chip, only the bytes of each partition its instructions reach): fresh buffers cost a page fault per
page touched, about 40 ms of GPT-2's 100 ms run. The price is memory held while the program lives: its
scratch tensors and the reached part of SBUF and PSUM. A run that finds them in use by another thread's run
takes fresh ones.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np

from trnc.errors import ExecutionError, TrncError
from trnc.isa.ap import AP, Mem
from trnc.isa.config import HwConfig, get_target
from trnc.isa.field_table import FieldTable, field_table, build as build_field_table
from trnc.isa.opcodes import TABLE
from trnc.isa.native import first_appearances, row_ids
from trnc.isa.operand_table import OperandTable, build, operand_table
from trnc.isa.program import BOUND_KINDS, Instruction, Program, TensorKind
from trnc.isa.rows import field_words
from trnc.isa.races import byte_addresses
from trnc.isa.verify import verify
from trnc import flags
from trnc.runtime.jit import kernels_move, kernels_pe, kernels_reduce, kernels_vector  # noqa: F401  (lowerings)
from trnc.runtime.jit import clearing, host_profile, parallel, split
from trnc.runtime.jit.cache import KernelCache
from trnc.runtime.jit.codegen import Codegen, codegen
from trnc.runtime.jit.library import Library
from trnc.runtime.jit.kernels import (
    DRIVER_SYMBOL, FAULT_GATHER_INDEX, LOWERINGS, FieldColumns, KernelSig, Layout, build_kernel, driver_ir, layout_of,
    on_chip_bytes, partition_pitch, static_value,
)
from trnc.runtime.reference import execution_order, input_array

SBUF_MEM, PSUM_MEM, HBM_MEM0 = 0, 1, 2   # memory numbers in the mems array; HBM tensor t is HBM_MEM0 + t
STAGE_ALIGN = 64


class Kernels:
    """The kernels of a process: signature -> object code, through a KernelCache (each JitProgram loads the ones
    it needs into its own runtime/jit/library.py Library)."""

    def __init__(self, cg: Codegen | None = None, cache: KernelCache | None = None):
        self.codegen = cg if cg is not None else codegen()
        self.cache = cache if cache is not None else KernelCache(self.codegen)
        self._objects: dict[KernelSig, bytes] = {}
        self._driver: bytes | None = None
        self._worker: bytes | None = None

    def object_code(self, sig: KernelSig) -> bytes:
        obj = self._objects.get(sig)
        if obj is None:
            obj = self._objects[sig] = self.cache.object_code(f"kernel {sig.text}", partial(build_kernel, sig))
        return obj

    def driver(self) -> bytes:
        """The object code of the driver loop (compiled or fetched once per process)."""
        if self._driver is None:
            self._driver = self.cache.object_code("driver", driver_ir)
        return self._driver

    def worker(self) -> bytes:
        """The object code of the parallel driver's worker loop (runtime/jit/parallel.py)."""
        if self._worker is None:
            parallel.declare_runtime_symbols()
            self._worker = self.cache.object_code("parallel driver", partial(parallel.worker_ir, self.codegen.triple))
        return self._worker

    @property
    def signatures(self) -> list[KernelSig]:
        """The kernels resolved so far."""
        return list(self._objects)

    @property
    def count(self) -> int:
        return len(self._objects)


_kernels: Kernels | None = None


def kernels() -> Kernels:
    """The process's kernel table, created on first use."""
    global _kernels
    if _kernels is None:
        _kernels = Kernels()
    return _kernels


@dataclass(frozen=True)
class _Shape:
    """What instructions of one shape share: the kernel, its address, and per staged read operand (slot among
    the operands, byte offset in the staging buffer, copy kernel, its address)."""

    sig: KernelSig
    address: int
    staging: tuple[tuple[int, int, KernelSig, int], ...]


@dataclass(frozen=True)
class _DriverTable:
    """The (kernel address, argument block address) rows the drivers walk, the blocks they point into, the
    instruction index of each row, and (of a table of pieces) the step count of each piece of each instruction in
    execution order."""

    table: np.ndarray
    blocks: np.ndarray
    owners: np.ndarray
    pieces: list[tuple[int, ...]]


class _Layout:
    """The driver steps of a sequence of units (instructions or pieces of them), from their operand table and
    their field table (isa/field_table.py).

    Kernel and staging depend only on a unit's shape (the table's instruction_forms: per operand its field, form and
    which earlier operand it repeats; and the opcode's static fields), which many units share. Per opcode, numpy
    groups the units by shape and computes their dynamic words (the lowering's FieldColumns); Python makes the
    kernel of each shape once; the argument blocks (each operand's memory and place, a column of the table, then
    the dynamic words) and the steps are laid out with numpy for all units at once.
    """

    def __init__(self, jit: "JitProgram", units, table: OperandTable, field_rows: FieldTable):
        code, shape_id = field_rows.opcode, table.instruction_forms
        self.shapes: list[_Shape] = []
        self.kind = np.zeros(len(units), dtype=np.int64)
        self.dynamic_count = np.zeros(len(units), dtype=np.int64)
        dynamic: list[tuple[np.ndarray, np.ndarray]] = []   # per opcode: its units, their words [units, count]
        for opcode_code in np.flatnonzero(np.bincount(code)).tolist():
            members = np.flatnonzero(code == opcode_code)
            opcode = TABLE[opcode_code].name
            lowering = LOWERINGS.get(opcode)
            if lowering is None:
                raise TrncError(f"JIT: opcode {opcode} is not lowered yet; use runtime.reference")
            fields = field_rows.fields(members)
            statics = [fields[:, first:first + count] for first, count in
                       (field_words(opcode, name) for name in lowering.statics)]
            shape = row_ids(np.column_stack([shape_id[members], *statics]))
            for unit in members[first_appearances(shape)].tolist():
                self.shapes.append(jit._shape(units[unit], lowering, list(units[unit].operands())))
            self.kind[members] = len(self.shapes) - int(shape.max()) - 1 + shape
            columns = lowering.dynamics(FieldColumns(opcode, fields, partial(_operand_dtypes, table, members)))
            if columns:
                self.dynamic_count[members] = len(columns)
                dynamic.append((members, np.column_stack(columns)))
        self.dynamic_words = np.zeros(int(self.dynamic_count.sum()), dtype=np.int64)
        first = _starts(self.dynamic_count)
        for members, values in dynamic:
            self.dynamic_words[(first[members][:, None] + np.arange(values.shape[1])).reshape(-1)] = values.reshape(-1)
        hw, mem = jit.hw, table.mem
        partition_bytes = np.where(mem == Mem.SBUF, partition_pitch(hw, Mem.SBUF), partition_pitch(hw, Mem.PSUM))
        self.number = np.where(mem == Mem.HBM, HBM_MEM0 + table.tensor, np.where(mem == Mem.SBUF, SBUF_MEM, PSUM_MEM))
        self.place = np.where(mem == Mem.HBM, table.offset, table.start * partition_bytes + table.offset)
        self.first = table.first
        self.stage_mem = jit.stage_mem

    def steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(kernel address, argument block offset in words) of each step, the blocks (int64 words), and the steps
        of each unit: a staging copy per staged read of its shape, then its kernel."""
        operands = np.diff(self.first)
        dynamics = self.dynamic_count
        lengths = 2 * operands + dynamics
        at = _starts(lengths)   # each unit's block
        blocks = np.empty(int(lengths.sum()), dtype=np.int64)
        rows = np.arange(len(self.number))
        where = np.repeat(at - 2 * self.first[:-1], operands) + 2 * rows
        blocks[where], blocks[where + 1] = self.number, self.place
        blocks[np.repeat(at + 2 * operands - _starts(dynamics), dynamics) + np.arange(dynamics.sum())] = \
            self.dynamic_words
        staged = np.array([len(shape.staging) for shape in self.shapes], dtype=np.int64)[self.kind]
        counts = staged + 1
        first_step = _starts(counts)
        address = np.empty(int(counts.sum()), dtype=np.uint64)
        block_at = np.empty(len(address), dtype=np.int64)
        main = first_step + staged
        address[main] = np.array([shape.address for shape in self.shapes], dtype=np.uint64)[self.kind]
        block_at[main] = at
        copies: list[int] = []
        for unit in np.flatnonzero(staged).tolist():   # rare: an in-place read of a repeated element
            for k, (slot, stage_at, _, copy_address) in enumerate(self.shapes[self.kind[unit]].staging):
                row, word = int(self.first[unit]) + slot, int(at[unit]) + 2 * slot
                step = int(first_step[unit]) + k
                address[step], block_at[step] = copy_address, len(blocks) + len(copies)
                copies += (self.stage_mem, stage_at, int(self.number[row]), int(self.place[row]))
                blocks[word:word + 2] = self.stage_mem, stage_at
        blocks = np.concatenate([blocks, np.array(copies or [0], dtype=np.int64)])   # never empty: the driver's base
        return address.view(np.int64), block_at, blocks, counts


def _operand_dtypes(table: OperandTable, members: np.ndarray, name: str) -> np.ndarray:
    """The DType codes of operand `name` of the units `members` (all of one opcode, the operand present in each)."""
    slots = table.instructions[members[0]].spec.ap_slots
    position = next(k for k, field_name, _ in slots if field_name == name)
    rows = np.flatnonzero(table.field == position)
    row_of = np.full(len(table.first) - 1, -1, dtype=np.int64)
    row_of[table.instr[rows]] = rows
    return table.dtype[row_of[members]]


def _field_rows(make, of) -> FieldTable:
    try:
        return make(of)
    except TypeError:
        raise TrncError("JIT: an instruction's fields are ill-formed (verify the program)") from None


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of `lengths` starts."""
    return np.cumsum(lengths) - lengths


class JitProgram:
    """A program loaded for the JIT: its kernels compiled and its driver table laid out; `run` executes it."""

    def __init__(self, program: Program, hw: HwConfig | None = None, verified: bool = False,
                 table: Kernels | None = None):
        self.program = program
        self.hw = hw if hw is not None else get_target(program.target)
        self.kernels = table if table is not None else kernels()
        self.library = Library(self.kernels.codegen)   # the program's native code lives as long as it does
        self._kept: tuple[np.ndarray, ...] | None = None     # SBUF, PSUM and scratch buffers between runs
        self._kept_zero = False   # they hold zeros wherever the program never writes
        self._plan: list | None = None   # what to clear of them before a run (runtime/jit/clearing.py)
        self._kept_lock = threading.Lock()
        self._parallel: dict[int, tuple[_DriverTable, parallel.Schedule]] = {}   # by piece count, on first use
        self._worker_call = None   # the ctypes function of the worker, on the first parallel run
        if verified:
            self._lay_out()
        else:   # laid out while the verifier's ordering checks run; nothing runs before its verdict
            verify(program, self.hw, meanwhile=self._lay_out)

    # -- load time ----------------------------------------------------------------------------------

    def _lay_out(self) -> None:
        """The execution order, the operand table, the kernels and the serial driver table."""
        program = self.program
        self.order = execution_order(program)
        self.stage_bytes = 0
        try:
            self.table = operand_table(program)
        except TypeError as e:
            raise TrncError(f"JIT: the program cannot be loaded: {e}") from None
        self._written, self._reached = _written_and_reached(self.table)
        self._serial = self._driver_table(1)
        self.distinct_kernels = len(self.library)   # the serial table's kernels, each loaded once (not yet the driver)
        self._driver = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                        ctypes.c_void_p)(self.library.address(DRIVER_SYMBOL, self.kernels.driver()))

    def _shape(self, ins: Instruction, lowering, operands) -> _Shape:
        """The kernel of an instruction's shape, and the staging copies of its staged reads."""
        layouts = [layout_of(ap, self.hw) for _, ap, _ in operands]
        staged = _staged_reads(operands)
        staging, stage_at = [], 0
        for slot in staged:
            contiguous = _contiguous(layouts[slot])
            copy = KernelSig("dma_copy", (("dst", contiguous), ("src", layouts[slot])), ())
            staging.append((slot, stage_at, copy, self._address(copy)))
            layouts[slot] = contiguous
            stage_at += -(-contiguous.partitions * contiguous.pstride // STAGE_ALIGN) * STAGE_ALIGN
        self.stage_bytes = max(self.stage_bytes, stage_at)
        statics = tuple((f, static_value(ins[f])) for f in lowering.statics)
        names = [name for name, _, _ in operands]
        sig = KernelSig(ins.opcode, tuple(zip(names, layouts)), statics, _same_groups(operands, staged))
        return _Shape(sig, self._address(sig), tuple(staging))

    def _address(self, sig: KernelSig) -> int:
        return self.library.address(sig.symbol, self.kernels.object_code(sig))

    @property
    def stage_mem(self) -> int:
        return HBM_MEM0 + len(self.program.tensors)

    def _driver_table(self, parts: int) -> "_DriverTable":
        """The driver table of the execution order, each instruction as up to `parts` pieces (runtime/jit/split.py;
        1: whole). All argument blocks lie in one int64 array."""
        instructions = self.program.instructions
        if parts == 1:   # the program's own instructions and tables, their steps then taken in execution order
            units, table, sequence = instructions, self.table, np.array(self.order, dtype=np.int64)
            field_rows = _field_rows(field_table, self.program)
            owners, pieces = self.order, []
        else:
            units, owners, pieces = [], [], []
            for index in self.order:
                found = split.pieces(instructions[index], parts)
                units.extend(found)
                owners.extend([index] * len(found))
                pieces.append(len(found))
            table, sequence = build(units), np.arange(len(units))
            field_rows = _field_rows(build_field_table, units)
        address, block_at, blocks, counts = _Layout(self, units, table, field_rows).steps()
        first = _starts(counts)[sequence]   # each unit's first step, the units in execution order
        counts = counts[sequence]
        steps = np.repeat(first - _starts(counts), counts) + np.arange(int(counts.sum()))
        driver = np.empty((len(steps), 2), dtype=np.int64)
        driver[:, 0] = address[steps]
        driver[:, 1] = blocks.ctypes.data + 8 * block_at[steps]
        if parts > 1:   # the parallel driver's schedule reads them
            per_unit = iter(counts.tolist())
            pieces = [tuple(next(per_unit) for _ in range(n)) for n in pieces]
        return _DriverTable(driver, blocks, np.repeat(np.asarray(owners, dtype=np.int64), counts), pieces)

    # -- run time -----------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, object], fill_nan: bool = False) -> dict[str, np.ndarray]:
        """Execute on `inputs` (numpy arrays or torch tensors by name); return the output tensors."""
        with self._memories(inputs, fill_nan) as (mems, outputs):
            self._call(mems)
        return outputs

    def host_profile(self, inputs: Mapping[str, object]) -> host_profile.HostProfile:
        """One serial run with every step timed as the run reaches it and again at once (runtime/jit/
        host_profile.py); its outputs are dropped."""
        with self._memories(inputs, False) as (mems, _):
            stages, (bases,), (status,) = self._native_args(mems, 1)
            first, again, code = host_profile.timed_steps(self._driver, self._serial.table, bases, status)
        if code:
            raise self._fault(self._serial.owners, code, status)
        n, owners = len(self.program.instructions), self._serial.owners
        opcodes = tuple(str(ins.opcode) for ins in self.program.instructions)
        return host_profile.HostProfile(opcodes, np.bincount(owners, first, minlength=n),
                                        np.bincount(owners, again, minlength=n))

    @contextlib.contextmanager
    def _memories(self, inputs: Mapping[str, object], fill_nan: bool):
        """(the memories of a run, its output arrays by name), from the inputs, the kept or new buffers."""
        program = self.program
        bound = {t.name for t in program.tensors if t.kind in BOUND_KINDS}
        missing, unknown = sorted(bound - set(inputs)), sorted(set(inputs) - bound)
        if missing or unknown:
            raise TrncError(f"inputs do not match the program: missing {missing}, unknown {unknown}; "
                            f"expected exactly {sorted(bound)}")
        keep = self._kept_lock.acquire(blocking=False)
        try:
            sbuf, psum, *kept = self._cleared(0xFF if fill_nan else 0, keep)
            scratch = iter(kept)
            mems = [sbuf, psum]
            outputs: dict[str, np.ndarray] = {}
            for index, decl in enumerate(program.tensors):
                if decl.name in bound:
                    mems.append(self._bind(index, inputs[decl.name]))
                elif decl.kind is TensorKind.OUTPUT:
                    mems.append(outputs.setdefault(decl.name, np.zeros(decl.shape, dtype=decl.dtype.storage)))
                else:
                    mems.append(next(scratch))
            yield mems, outputs
        finally:
            if keep:
                self._kept_lock.release()

    def _cleared(self, fill: int, keep: bool) -> tuple[np.ndarray, ...]:
        """SBUF and PSUM filled with `fill` and zeroed scratch tensors: the kept ones (with `keep`), else new ones.
        On chip only the bytes of each partition a run reaches are written, so the pages past them are never
        touched (not resident) in a new buffer. Kept buffers that hold zeros but where the program writes
        (after a run with fill 0) are cleared only where runtime/jit/clearing.py plans it."""
        hw = self.hw
        new = not (keep and self._kept is not None)
        if new:
            buffers = (*on_chip_memories(hw), *[np.zeros(decl.shape, dtype=decl.dtype.storage)
                                                for decl in self.program.tensors if decl.kind is TensorKind.SCRATCH])
        else:
            buffers = self._kept
        if not new and not fill and self._kept_zero:
            self._clear_planned(buffers)
        else:
            if not new:
                for array in buffers[2:]:
                    array.fill(0)
            if fill or not new:
                buffers[0][:, :self._reached[Mem.SBUF]] = fill
                buffers[1][:, :self._reached[Mem.PSUM]] = fill
        if keep:
            self._kept, self._kept_zero = buffers, not fill
        return buffers

    def _clear_planned(self, buffers: tuple[np.ndarray, ...]) -> None:
        if self._plan is None:   # at the second run: a program run once never needs it
            self._plan = clearing.clear_plan(self.program, self.table, self.order, (buffers[0].shape, buffers[1].shape))
        for buffer, first, end, lo, hi in self._plan:
            if buffer < 2:
                buffers[buffer][first:end, lo:hi] = 0
            else:
                buffers[buffer].reshape(-1).view(np.uint8)[lo:hi] = 0

    def execute(self, sbuf: np.ndarray, psum: np.ndarray, hbm: list[np.ndarray]) -> None:
        """Run on the given memories, in place: SBUF and PSUM uint8 [partitions, bytes per partition], and one
        C-contiguous array per HBM tensor holding exactly its bytes (the state of runtime/reference.Machine).
        SBUF and PSUM as on_chip_memories lays them out are used directly; others run on a copy so laid out,
        written back after the run."""
        hw = self.hw
        on_chip = []
        for name, mem, kind in (("sbuf", sbuf, Mem.SBUF), ("psum", psum, Mem.PSUM)):
            cols = on_chip_bytes(hw, kind)
            if not (isinstance(mem, np.ndarray) and mem.dtype == np.uint8 and mem.shape == (hw.partitions, cols)
                    and mem.flags.writeable):
                raise TrncError(f"{name} must be a writeable uint8 array of shape ({hw.partitions}, {cols})")
            used = mem
            if mem.strides != (partition_pitch(hw, kind), 1):
                used = _pitched(hw, kind)
                used[...] = mem
            on_chip.append(used)
        if len(hbm) != len(self.program.tensors):
            raise TrncError(f"{len(hbm)} HBM arrays given; the program declares {len(self.program.tensors)} tensors")
        for decl, array in zip(self.program.tensors, hbm):
            if not (isinstance(array, np.ndarray) and array.nbytes == decl.num_bytes and array.flags.c_contiguous
                    and array.flags.writeable):
                raise TrncError(f"HBM tensor '{decl.name}' must be a writeable C-contiguous array of "
                                f"{decl.num_bytes} bytes")
        try:
            self._call([*on_chip, *hbm])
        finally:
            for given, used in zip((sbuf, psum), on_chip):
                if used is not given:
                    given[...] = used

    def _call(self, mems: list[np.ndarray]) -> None:
        """The native run: the serial driver runs every step on the memories (plus a fresh staging buffer), or,
        with TRNC_THREADS > 1 and more than one busy queue, the parallel driver's workers, a staging buffer each."""
        threads = flags.get("TRNC_THREADS") if parallel.supported(self.kernels.codegen.triple) else 1
        if threads > 1 and threads not in self._parallel:
            driven = self._driver_table(threads)
            self._parallel[threads] = driven, parallel.Schedule(self.program, self.order, driven.pieces, threads)
        if threads > 1:
            driven, schedule = self._parallel[threads]
            if schedule.queues < 2 and not schedule.split:
                threads = 1   # one queue and nothing split: nothing to run concurrently
        driven = self._serial if threads == 1 else driven
        stages, bases, statuses = self._native_args(mems, threads)   # stages: live to the end
        if threads == 1:
            codes = [self._driver(driven.table.ctypes.data, len(driven.table), bases[0].ctypes.data,
                                  statuses[0].ctypes.data)]
        else:
            if self._worker_call is None:
                self._worker_call = parallel.worker_function(self.library.address(parallel.WORKER_SYMBOL,
                                                                             self.kernels.worker()))
            codes = schedule.run(self._worker_call, driven.table, bases, statuses)
        faults = [(int(status[0]), code, status) for code, status in zip(codes, statuses) if code]
        if faults:
            _, code, status = min(faults, key=lambda f: f[0])   # the first in the serial order
            raise self._fault(driven.owners, code, status)

    def _native_args(self, mems: list[np.ndarray], threads: int) -> tuple[list[np.ndarray], ...]:
        """Per thread: a staging buffer (the caller keeps it alive while the drivers run), the base addresses of
        the memories and of that buffer, and a status block."""
        stages = [np.zeros(max(self.stage_bytes, 1), dtype=np.uint8) for _ in range(threads)]
        bases = [np.array([m.ctypes.data for m in (*mems, stage)], dtype=np.uint64) for stage in stages]
        return stages, bases, [np.zeros(4, dtype=np.int64) for _ in range(threads)]

    def _bind(self, index: int, value) -> np.ndarray:
        """The array holding input/constant tensor `index`: the caller's when usable in place, else a copy."""
        array = input_array(self.program.tensors[index], value)
        if index in self._written or not (array.flags.c_contiguous and array.flags.aligned):
            return np.array(array, order="C", copy=True)
        return array

    def _fault(self, owners: np.ndarray, code: int, status: np.ndarray) -> ExecutionError:
        index = int(owners[int(status[0])])
        ins = self.program.instructions[index]
        where = f"instruction {index} ({ins.opcode} on {ins.queue_name})"
        if code == FAULT_GATHER_INDEX:
            rows = ins["table"].partitions
            return ExecutionError(f"{where}: gather index {int(status[2])} at partition {int(status[1])} is outside "
                                  f"the table's rows [0, {rows})")
        return ExecutionError(f"{where}: kernel fault code {code}")


def on_chip_memories(hw: HwConfig) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed SBUF and PSUM as the JIT's kernels address them: uint8 [partitions, bytes per partition], each a
    view of rows partition_pitch bytes apart."""
    return _pitched(hw, Mem.SBUF), _pitched(hw, Mem.PSUM)


def _pitched(hw: HwConfig, mem: Mem) -> np.ndarray:
    """Zeroed uint8 [partitions, bytes per partition] of `mem`, a view of rows partition_pitch bytes apart."""
    return np.zeros((hw.partitions, partition_pitch(hw, mem)), dtype=np.uint8)[:, :on_chip_bytes(hw, mem)]


def load(program: Program, *, hw: HwConfig | None = None, verified: bool = False) -> JitProgram:
    """Verify (unless `verified`) and load `program`, compiling its distinct kernels; run it with `.run(inputs)`."""
    return JitProgram(program, hw, verified)


def run(program: Program, inputs: Mapping[str, object], *, hw: HwConfig | None = None, fill_nan: bool = False,
        verified: bool = False) -> dict[str, np.ndarray]:
    """Load and execute `program` once: runtime/reference.run's interface, on the JIT."""
    return load(program, hw=hw, verified=verified).run(inputs, fill_nan=fill_nan)


# -- helpers --------------------------------------------------------------------------------------------

def _contiguous(lay: Layout) -> Layout:
    """The same shape, row-major and dense: the staging copy of an operand."""
    isz = lay.dtype.itemsize
    dims, stride = [], isz
    for _, count in reversed(lay.dims):
        dims.insert(0, (stride, count))
        stride *= count
    return Layout(lay.dtype, lay.partitions, stride, tuple(dims))


def _written_and_reached(table: OperandTable) -> tuple[set[int], dict[Mem, int]]:
    """The HBM tensors some instruction writes, and per on-chip memory the bytes of each partition reached."""
    hbm_writes = (table.mem == Mem.HBM) & table.write
    _, end = table.byte_range
    reached = {}
    for mem in (Mem.SBUF, Mem.PSUM):
        ends = end[table.mem == mem]
        reached[mem] = int(ends.max()) if ends.size else 0
    return set(table.tensor[hbm_writes].tolist()), reached


def _same_groups(operands, staged: list[int]) -> tuple[tuple[str, ...], ...]:
    """Groups (of two or more) of operands that are one access pattern, leaving out staged copies."""
    groups: dict[AP, list[str]] = {}
    for slot, (name, ap, _) in enumerate(operands):
        if slot not in staged:
            groups.setdefault(ap, []).append(name)
    return tuple(tuple(g) for g in groups.values() if len(g) > 1)


def _staged_reads(operands) -> list[int]:
    """Slots of the read operands identical to a written operand whose access pattern repeats an element."""
    return [slot for slot, (_, ap, write) in enumerate(operands)
            if not write and any(w and other == ap and not _injective(other) for _, other, w in operands)]


def _injective(ap: AP) -> bool:
    """Whether the AP reaches each of its elements' bytes once (on chip: within each partition)."""
    addresses = byte_addresses(ap)
    if addresses is None:
        return False
    per_partition = 1 if ap.mem is Mem.HBM else ap.partitions
    return addresses.size * per_partition == ap.num_bytes
