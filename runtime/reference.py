"""The reference interpreter: machine state, addressing, and the in-order, semaphore-driven executor.

This is the executable form of isa/spec_intro.md, written to be read rather than to be fast. A
`Machine` holds the memories of one program (SBUF, PSUM, one byte array per HBM tensor, the
semaphore counts); `read` and `write` gather and scatter an access pattern's elements byte by
byte, and `execute` runs one instruction through the semantics in runtime/reference_ops.py.
`run` binds a program's inputs, executes its queues in one fixed legal order and returns its
outputs; the JIT (runtime/jit) must agree with it bit for bit.

The host is assumed little-endian, like HBM (numpy views of the raw bytes give the values).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import ml_dtypes
import numpy as np

from trnc.errors import ExecutionError, TrncError
from trnc.isa.ap import AP, QUEUES, Mem
from trnc.isa import native
from trnc.isa.config import SEMAPHORES, HwConfig, get_target
from trnc.isa.program import BOUND_KINDS, Instruction, Program, TensorKind
from trnc.isa.sync_table import sync_table
from trnc.isa.verify import verify
from trnc.runtime.reference_ops import SEMANTICS

# The fixed order in which `run` looks for a queue whose head may start: any order is legal for a
# verified program (all legal interleavings compute the same result); this one makes runs repeatable.
QUEUE_ORDER = QUEUES


class Machine:
    """The state of one program on one NeuronCore: memories, HBM tensors and semaphore counts."""

    def __init__(self, program: Program, hw: HwConfig | None = None, fill_nan: bool = False):
        self.program = program
        self.hw = hw if hw is not None else get_target(program.target)
        self.sbuf = np.zeros((self.hw.partitions, self.hw.sbuf_bytes_per_partition), dtype=np.uint8)
        self.psum = np.zeros((self.hw.partitions, self.hw.psum_bytes_per_partition), dtype=np.uint8)
        if fill_nan:  # 0xFF bytes are NaN in fp32, bf16, fp16 and fp8: reads of unwritten memory show
            self.sbuf.fill(0xFF)
            self.psum.fill(0xFF)
        self.hbm = {i: np.zeros(t.num_bytes, dtype=np.uint8) for i, t in enumerate(program.tensors)}
        self.semaphores = [0] * program.num_semaphores

    # -- addressing ---------------------------------------------------------------------------

    def _byte_index(self, ap: AP) -> np.ndarray:
        """Byte addresses [P, F * itemsize] of every element of `ap`, in (p, e) order, within a partition
        (on chip) or the tensor (HBM): the addressing rule of spec_intro.md, "Access patterns"."""
        isz = ap.dtype.itemsize
        elems = np.broadcast_to(ap.free_offsets(), (ap.partitions, ap.free_size))
        if ap.mem is Mem.HBM:
            elems = elems + np.arange(ap.partitions, dtype=np.int64)[:, None] * ap.partition_stride
        byte = ap.offset + isz * elems[:, :, None] + np.arange(isz, dtype=np.int64)
        return byte.reshape(ap.partitions, -1)

    def _locate(self, ap: AP) -> tuple[np.ndarray, np.ndarray]:
        """The flat byte array of the memory holding `ap` and the addresses [P, F * itemsize] of its bytes.

        Addresses are checked against the bounds: a verified program never fails the check, but
        Machine used directly would otherwise let numpy wrap a negative address silently.
        """
        byte = self._byte_index(ap)
        if ap.mem is Mem.HBM:
            if ap.tensor not in self.hbm:
                raise ExecutionError(f"HBM access pattern names tensor {ap.tensor}; the program declares "
                                     f"{len(self.hbm)} tensors")
            mem, where = self.hbm[ap.tensor], f"tensor {ap.tensor} ({self.hbm[ap.tensor].size} bytes)"
        else:
            mem = self.sbuf if ap.mem is Mem.SBUF else self.psum
            lo, hi = ap.partition_range()
            if lo < 0 or hi > mem.shape[0]:
                raise ExecutionError(f"{ap.mem.text} access pattern covers partitions [{lo}, {hi}), outside "
                                     f"[0, {mem.shape[0]})")
            where = f"{ap.mem.text} partitions ({mem.shape[1]} bytes each)"
        if byte.size and (byte.min() < 0 or byte.max() >= mem.shape[-1]):
            raise ExecutionError(f"access pattern reaches bytes [{byte.min()}, {byte.max() + 1}), outside {where}")
        if ap.mem is not Mem.HBM:
            byte = byte + np.arange(lo, hi, dtype=np.int64)[:, None] * mem.shape[1]
        return mem.reshape(-1), byte

    def read(self, ap: AP) -> np.ndarray:
        """The elements of `ap` as an array of ap.dtype.storage shaped ap.shape (a copy)."""
        mem, addr = self._locate(ap)
        return mem[addr].view(ap.dtype.storage).reshape(ap.shape)

    def write(self, ap: AP, values: np.ndarray) -> None:
        """Store `values` (ap.dtype.storage, ap.partitions rows, one value per element in (p, e) order).

        Elements are stored one after the other in (p, e) order, so where elements of `ap` share
        bytes memory keeps the last one; numpy's fancy assignment leaves that order unspecified,
        hence the explicit choice of the last writer of every byte.
        """
        values = np.asarray(values)
        if values.dtype != ap.dtype.storage:
            raise TrncError(f"write of {values.dtype} values to a {ap.dtype.text} access pattern: convert first")
        if values.size != ap.num_elements or (values.ndim and values.shape[0] != ap.partitions):
            raise TrncError(f"write of shape {values.shape} to an access pattern of shape {ap.shape}")
        mem, addr = self._locate(ap)
        addr = addr.reshape(-1)
        data = np.ascontiguousarray(values).reshape(ap.partitions, -1).view(np.uint8).reshape(-1)
        _, first_from_end = np.unique(addr[::-1], return_index=True)
        last = addr.size - 1 - first_from_end
        mem[addr[last]] = data[last]

    # -- tensors ------------------------------------------------------------------------------

    def bind(self, name: str, value) -> None:
        """Fill HBM tensor `name` from a numpy array or torch tensor of exactly its shape and dtype."""
        index = self._tensor_index(name)
        array = input_array(self.program.tensors[index], value)
        self.hbm[index] = np.ascontiguousarray(array).reshape(-1).view(np.uint8).copy()

    def output(self, name: str) -> np.ndarray:
        """HBM tensor `name` as an array of its dtype's storage type and its declared shape (a copy)."""
        index = self._tensor_index(name)
        decl = self.program.tensors[index]
        return self.hbm[index].view(decl.dtype.storage).reshape(decl.shape).copy()

    def _tensor_index(self, name: str) -> int:
        try:
            return self.program.tensor_index(name)
        except KeyError:
            names = ", ".join(t.name for t in self.program.tensors)
            raise TrncError(f"no tensor named '{name}'; the program declares: {names}") from None

    # -- execution ----------------------------------------------------------------------------

    def execute(self, instr: Instruction, index: int | None = None) -> None:
        """Run one instruction (its waits are the caller's business), then signal its semaphores.

        `index` (its position in the program) only serves to name the instruction in a fault.
        Overflow, NaN and division by zero are IEEE results here, not numpy warnings.
        """
        try:
            with np.errstate(all="ignore"):
                SEMANTICS[instr.opcode](self, instr)
        except ExecutionError as err:
            where = f"instruction {index}" if index is not None else "instruction"
            raise ExecutionError(f"{where} ({instr.opcode} on {instr.queue_name}): {err}") from None
        for s in instr.signals:
            self.semaphores[s] += 1


def run(program: Program, inputs: Mapping[str, object], *, hw: HwConfig | None = None, fill_nan: bool = False,
        verified: bool = False, on_instruction: Callable[[int, Instruction], None] | None = None
        ) -> dict[str, np.ndarray]:
    """Execute `program` on `inputs` (numpy arrays or torch tensors, by tensor name) and return its outputs.

    Input and constant tensors must all be given with their declared shape and dtype; scratch and
    output tensors start as zeros. `verified=True` skips the verifier when the caller already ran
    it. `on_instruction(index, instr)` is called before each instruction executes.
    """
    if not verified:
        verify(program, hw)
    machine = Machine(program, hw=hw, fill_nan=fill_nan)
    bound = {t.name for t in program.tensors if t.kind in BOUND_KINDS}
    missing, unknown = sorted(bound - set(inputs)), sorted(set(inputs) - bound)
    if missing or unknown:
        raise TrncError(f"inputs do not match the program: missing {missing}, unknown {unknown}; "
                        f"expected exactly {sorted(bound)}")
    for name, value in inputs.items():
        machine.bind(name, value)
    for index in execution_order(program):
        instr = program.instructions[index]
        if on_instruction is not None:
            on_instruction(index, instr)
        machine.execute(instr, index)
    return {t.name: machine.output(t.name) for t in program.tensors_of(TensorKind.OUTPUT)}


def execution_order(program: Program) -> list[int]:
    """Instruction indices in the order `run` executes them: the one execution order of the runtimes.

    The reference starts, each time, the head of the first queue in QUEUE_ORDER whose waits are met, and counts
    its signals. The loop is isa/native.py's (a few integer operations per queue looked at), over the program's
    sync table.
    """
    sync = sync_table(program)
    unknown = [name for name in sync.names if name not in QUEUE_ORDER]
    if unknown:
        index = int(np.flatnonzero(sync.queue == sync.names.index(unknown[0]))[0])
        ins = program.instructions[index]
        raise TrncError(f"instruction {index} ({ins.opcode}) is on queue '{ins.queue_name}'; queues are "
                        f"{', '.join(QUEUE_ORDER)}")
    semaphores = np.concatenate([sync.wait_semaphore, sync.signal_semaphore])
    if semaphores.size and semaphores.min() < 0:
        raise TrncError(f"a semaphore number is negative ({semaphores.min()}); semaphores are 0..{SEMAPHORES - 1}")
    grouped, start = sync.by_queue
    members = {name: grouped[start[k]:start[k + 1]] for k, name in enumerate(sync.names)}
    empty = np.zeros(0, dtype=np.int64)
    order = native.execution_order([members.get(name, empty) for name in QUEUE_ORDER], sync.wait_first,
                                   sync.wait_semaphore, sync.wait_value, sync.signal_first, sync.signal_semaphore,
                                   int(semaphores.max(initial=-1)) + 1).tolist()
    if len(order) < len(sync.queue):
        signalled = [sync.signal_semaphore[sync.signal_first[i]:sync.signal_first[i + 1]] for i in order]
        counts = np.bincount(np.concatenate([empty, *signalled]), minlength=int(semaphores.max()) + 1)
        started = set(order)
        heads = [next((int(i) for i in members.get(name, empty) if int(i) not in started), None)
                 for name in QUEUE_ORDER]
        raise ExecutionError("deadlock: no queue can start its next instruction; "
                             + "; ".join(_blocked(program, i, counts) for i in heads if i is not None))
    return order


def _blocked(program: Program, index: int, counts: list[int]) -> str:
    ins = program.instructions[index]
    unmet = ", ".join(f"sem {s} >= {v} (count {counts[s]})" for s, v in ins.waits if counts[s] < v)
    return f"instruction {index} ({ins.opcode} on {ins.queue_name}) waits for {unmet}"


# torch dtypes whose bits map one to one onto a storage dtype; bf16 and the fp8 types have no numpy
# equivalent in torch's .numpy(), so their bytes are reinterpreted through ml_dtypes.
def _torch_storage():
    import torch
    pairs = [(torch.float32, np.float32), (torch.bfloat16, ml_dtypes.bfloat16), (torch.float16, np.float16),
             (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn), (torch.float8_e5m2, ml_dtypes.float8_e5m2),
             (torch.float8_e8m0fnu, ml_dtypes.float8_e8m0fnu), (torch.int8, np.int8), (torch.uint8, np.uint8),
             (torch.int32, np.int32)]
    return {t: np.dtype(n) for t, n in pairs}


def input_array(decl, value) -> np.ndarray:
    """`value` (numpy array or torch tensor) viewed as tensor `decl`'s storage, bit-exact; a TrncError naming the
    tensor, the expected and the given shape and dtype when it does not fit."""
    array, given_dtype = _as_numpy(value)
    shape = tuple(array.shape) if array is not None else tuple(value.shape)
    if array is None or array.dtype != decl.dtype.storage or shape != tuple(decl.shape):
        raise TrncError(f"tensor '{decl.name}': expected shape {tuple(decl.shape)} and dtype {decl.dtype.text} "
                        f"(numpy {decl.dtype.storage}), got shape {shape} and dtype {given_dtype}")
    return array


def _as_numpy(value) -> tuple[np.ndarray | None, str]:
    """(array, dtype name) for a numpy array or torch tensor, bit-exact; array None when not representable."""
    if isinstance(value, np.ndarray):
        return value, str(value.dtype)
    import torch
    if not isinstance(value, torch.Tensor):
        raise TrncError(f"expected a numpy array or torch tensor, got {type(value).__name__}")
    storage = _torch_storage().get(value.dtype)
    if storage is None:
        return None, str(value.dtype)
    flat = value.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().view(storage).reshape(tuple(value.shape)), str(value.dtype)
