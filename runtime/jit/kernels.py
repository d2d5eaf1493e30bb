"""Kernel signatures, the kernel ABI, IR-building helpers, the lowering registry and the driver loop.

A kernel is the LLVM function of one *signature*: an opcode, the static layout of each operand (dtype,
partition count, partition stride and free-dim strides in bytes, counts), the fields that shape the
code (enums, bools, reduce axes, affine steps) and which operands are one access pattern (in place).
The memory an operand lives in enters only through its partition stride, so one kernel serves SBUF and
HBM operands alike. Its ABI is

    i32 kernel(i8** mems, i64* args, i64* status)

`mems` holds the base address of each memory of a run (SBUF, PSUM, each HBM tensor, the staging
buffer); `args` is the instruction's argument block, prepared once at load time: per present operand,
in table order, the memory number and the byte offset of its element (0, 0), then the lowering's
dynamic words (f32 immediates as bits, seeds, int immediates). The kernel returns 0, or a fault code
with details in status[1:] (status[0] is the driver's). The driver (`driver_ir`) is one native function
that walks a table of (kernel address, argument block address) pairs in execution order and stops at
the first non-zero return, so a run costs one call from Python.

Elements are visited in the reference's (p, e) order. Operands whose free dims split the same element
count differently are walked by one loop nest over the common refinement of their dims when their
radixes nest (the usual case), else by one flat loop that derives each operand's offset by div/mod.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from trnc.isa.ap import AP, Mem
from trnc.isa.config import HwConfig
from trnc.isa.dtypes import DType
from trnc.isa.opcodes import opspec
from trnc.isa.rows import field_words

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
I8P = I8.as_pointer()
KERNEL_TYPE = ir.FunctionType(I32, [I8P.as_pointer(), I64.as_pointer(), I64.as_pointer()])
INT_OF_SIZE = {1: I8, 2: I16, 4: I32}
WORDS_PER_OPERAND = 2

# Fault codes a kernel returns (0 is success); runtime/jit/executor.py turns them into ExecutionErrors.
FAULT_GATHER_INDEX = 1


def i64(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


# -- static layouts and signatures ----------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """An operand as the kernel sees it: dtype, partitions, and strides in bytes (memory-independent)."""

    dtype: DType
    partitions: int
    pstride: int                          # bytes from one partition's element (p, 0) to the next one's
    dims: tuple[tuple[int, int], ...]     # (byte stride, count) per free dim, outermost first

    @property
    def free_size(self) -> int:
        return math.prod(c for _, c in self.dims)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(c for _, c in self.dims)

    @property
    def text(self) -> str:
        dims = ",".join(f"{s}x{c}" for s, c in self.dims)
        return f"{self.dtype.text}[{self.partitions}@{self.pstride}|{dims}]"


CACHE_LINE = 64   # bytes


def on_chip_bytes(hw: HwConfig, mem: Mem) -> int:
    """Bytes per partition of SBUF or PSUM."""
    return hw.sbuf_bytes_per_partition if mem is Mem.SBUF else hw.psum_bytes_per_partition


def partition_pitch(hw: HwConfig, mem: Mem) -> int:
    """Host bytes from one partition of SBUF or PSUM to the next: its bytes padded to an odd number of cache
    lines. A power-of-two pitch such as PSUM's 16 KiB puts a column of every partition in one set of L1 (and
    4 of L2), where a matmul's 128 rows evict each other; an odd number of lines spreads them over all sets."""
    return (-(-on_chip_bytes(hw, mem) // CACHE_LINE) | 1) * CACHE_LINE


def layout_of(ap: AP, hw: HwConfig) -> Layout:
    isz = ap.dtype.itemsize
    pstride = ap.partition_stride * isz if ap.mem is Mem.HBM else partition_pitch(hw, ap.mem)
    return Layout(ap.dtype, ap.partitions, pstride, tuple((s * isz, c) for s, c in ap.dims))


@dataclass(frozen=True)
class KernelSig:
    """Everything static about one kernel; equal signatures share one compiled function."""

    opcode: str
    operands: tuple[tuple[str, Layout], ...]   # present AP fields, in table order
    statics: tuple[tuple[str, object], ...]    # fields baked into the code, as (name, int/bool value)
    same: tuple[tuple[str, ...], ...] = ()     # groups of operands that are one access pattern (in place)

    def layout(self, name: str) -> Layout | None:
        for k, lay in self.operands:
            if k == name:
                return lay
        return None

    def static(self, name: str):
        for k, v in self.statics:
            if k == name:
                return v
        raise KeyError(f"{self.opcode} kernel has no static field '{name}'")

    def slot(self, name: str) -> int:
        """Index of the operand among the present operands (its words in the argument block)."""
        return [k for k, _ in self.operands].index(name)

    @property
    def text(self) -> str:
        ops = " ".join(f"{k}={lay.text}" for k, lay in self.operands)
        statics = " ".join(f"{k}={v}" for k, v in self.statics)
        same = " ".join("=".join(g) for g in self.same)
        return f"{self.opcode} {ops} {statics} same:{same}"

    @property
    def symbol(self) -> str:
        return "trnc_" + self.opcode + "_" + hashlib.sha256(self.text.encode()).hexdigest()[:20]

    @property
    def dynamic_base(self) -> int:
        """Index of the first dynamic word of the argument block."""
        return WORDS_PER_OPERAND * len(self.operands)


@dataclass(frozen=True)
class FieldColumns:
    """The fields of some instructions of one opcode as columns, from their field rows (isa/field_table.py),
    with the dtype of each named operand: what a lowering computes its dynamic words from, for all at once."""

    opcode: str
    words: np.ndarray                              # [instructions, words of the opcode's field row]
    operand_dtype: Callable[[str], np.ndarray]     # DType codes of the named operand, per instruction

    def int(self, name: str) -> np.ndarray:
        return self.words[:, field_words(self.opcode, name)[0]]

    def double(self, name: str) -> np.ndarray:
        """An F32 field as the Python float it was (its row holds the double's bits)."""
        return self.int(name).view(np.float64)

    def f32(self, name: str) -> np.ndarray:
        """An F32 field's bits as np.float32 rounds it, the reference's rounding of a Python float."""
        with np.errstate(over="ignore", invalid="ignore"):   # to inf, and NaN, as np.float32 rounds them
            return self.double(name).astype(np.float32).view(np.uint32).astype(np.int64)


@dataclass(frozen=True)
class Lowering:
    """How one opcode becomes kernels: its static fields, its dynamic words (columns, one word per instruction
    each), its IR."""

    statics: tuple[str, ...]
    dynamics: Callable[[FieldColumns], tuple[np.ndarray, ...]]
    build: Callable[["KernelBuilder", KernelSig], None]


LOWERINGS: dict[str, Lowering] = {}


def lowering(opcode: str, statics: tuple[str, ...] = (), dynamics: Callable = lambda fields: ()):
    """Register the decorated `build(kb, sig)` as the lowering of `opcode`."""
    def register(build):
        LOWERINGS[opcode] = Lowering(statics, dynamics, build)
        return build
    return register


def static_value(value) -> object:
    """A static field as a plain int or bool (enum members by value), so signature texts are stable."""
    if isinstance(value, bool):
        return value
    if isinstance(value, tuple):
        return tuple(int(v) for v in value)
    return int(value)


# -- access streams and their loop nests ----------------------------------------------------------

@dataclass(frozen=True)
class Stream:
    """An affine sequence over (p, e): offset = p * pstride + sum(i_j * stride_j) over the free dims."""

    pstride: int
    dims: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return math.prod(c for _, c in self.dims)


def stream(lay: Layout) -> Stream:
    return Stream(lay.pstride, lay.dims)


def flat_stream(counts: Sequence[int]) -> Stream:
    """The element index e itself (row-major over `counts`), as a stream."""
    return Stream(0, ((1, math.prod(counts)),))


def canonical(dims: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Drop count-1 dims and merge an outer dim into the next when it continues it; the order is unchanged."""
    out: list[tuple[int, int]] = []
    for s, c in dims:
        if c == 1:
            continue
        if out and out[-1][0] == s * c:
            out[-1] = (s, out[-1][1] * c)
        else:
            out.append((s, c))
    return tuple(out)


def _inner_products(dims: Sequence[tuple[int, int]]) -> list[int]:
    """For each dim, the product of the counts inside it."""
    inner, acc = [], 1
    for _, c in reversed(dims):
        inner.append(acc)
        acc *= c
    return inner[::-1]


@dataclass(frozen=True)
class Nest:
    """Loop counts (outermost first) and, per loop, the stride of each stream; None counts: one flat loop."""

    counts: tuple[int, ...] | None
    strides: tuple[tuple[int, ...], ...]


def plan(streams: Sequence[Stream], size: int) -> Nest:
    """The common refinement of the streams' dims when their boundaries form a divisibility chain."""
    dims = [canonical(s.dims) for s in streams]
    bounds = {size}
    for d in dims:
        bounds.update(ip * c for ip, (_, c) in zip(_inner_products(d), d))
    chain = sorted(bounds)
    if any(b % a for a, b in zip(chain, chain[1:])):
        return Nest(None, ())
    counts, levels = [], []
    inner = 1
    for b in chain:
        if b == 1:
            continue
        counts.append(b // inner)
        per_stream = []
        for d in dims:
            stride = 0
            for ip, (s, c) in zip(_inner_products(d), d):
                if ip <= inner < ip * c:
                    stride = s * (inner // ip)
            per_stream.append(stride)
        levels.append(tuple(per_stream))
        inner = b
    return Nest(tuple(reversed(counts)), tuple(reversed(levels)))


# -- the IR builder -----------------------------------------------------------------------------------

class KernelBuilder:
    """One kernel function under construction, with loop, address and load/store helpers.

    Aliasing: the verifier guarantees that a written operand is either the same access pattern as
    another operand (in place) or disjoint from it. Operands that are the same share one base pointer,
    so LLVM sees equal addresses; every written operand gets an alias scope, and each access to any
    other operand is marked `noalias` with it. Without this, LLVM's vectorizer would guard each loop
    with a run-time overlap test of the whole loop nest's address ranges, which fails for operands that
    interleave across partitions, and fall back to scalar code.
    """

    def __init__(self, sig: KernelSig):
        self.sig = sig
        self.module = ir.Module(name=sig.symbol)
        self.fn = ir.Function(self.module, KERNEL_TYPE, name=sig.symbol)
        self.mems, self.args, self.status = self.fn.args
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self._words: dict[int, ir.Value] = {}
        self._bases: dict[str, ir.Value] = {}
        self._root = {name: group[0] for group in sig.same for name in group}
        self._root_of_base: dict[int, str] = {}
        self._metadata = self._alias_metadata()

    def _alias_metadata(self) -> dict[str, dict[str, object]]:
        """Per operand group (by its root name): the `alias.scope` and `noalias` lists of its accesses."""
        written = {self._root.get(f.name, f.name) for f in opspec(self.sig.opcode).aps
                   if f.out and self.sig.layout(f.name) is not None}
        domain = self.module.add_metadata([ir.MetaDataString(self.module, "trnc.operands")])
        scopes = {w: self.module.add_metadata([ir.MetaDataString(self.module, f"trnc.{w}"), domain])
                  for w in sorted(written)}
        out: dict[str, dict[str, object]] = {}
        for name, _ in self.sig.operands:
            root = self._root.get(name, name)
            kinds = {}
            if root in scopes:
                kinds["alias.scope"] = self.module.add_metadata([scopes[root]])
            others = [scopes[w] for w in sorted(written) if w != root]
            if others:
                kinds["noalias"] = self.module.add_metadata(others)
            out[root] = kinds
        return out

    # values of the argument block, loaded once in the entry block
    def word(self, index: int) -> ir.Value:
        if index not in self._words:
            with self.b.goto_block(self.entry):
                ptr = self.b.gep(self.args, [i64(index)], inbounds=True)
                self._words[index] = self.b.load(ptr, name=f"w{index}")
        return self._words[index]

    def dynamic(self, k: int) -> ir.Value:
        """The k-th dynamic word (i64)."""
        return self.word(self.sig.dynamic_base + k)

    def dynamic_f32(self, k: int) -> ir.Value:
        return self.b.bitcast(self.b.trunc(self.dynamic(k), I32), F32)

    def base(self, name: str) -> ir.Value:
        """i8* address of element (0, 0) of operand `name` (computed once, in the entry block; operands in
        one `same` group share it)."""
        name = self._root.get(name, name)
        if name not in self._bases:
            slot = self.sig.slot(name)
            mem, off = self.word(WORDS_PER_OPERAND * slot), self.word(WORDS_PER_OPERAND * slot + 1)
            with self.b.goto_block(self.entry):
                base = self.b.load(self.b.gep(self.mems, [mem], inbounds=True), name=f"{name}.mem")
                self._bases[name] = self.b.gep(base, [off], inbounds=True, name=f"{name}.base")
                self._root_of_base[id(self._bases[name])] = name
        return self._bases[name]

    def alloca(self, ty: ir.Type, count: int = 1, name: str = "", align: int | None = None) -> ir.Value:
        """A stack slot in the entry block (where LLVM promotes scalars to registers)."""
        with self.b.goto_block(self.entry):
            slot = self.b.alloca(ty, size=count if count > 1 else None, name=name)
        if align:
            slot.align = align
        return slot

    # control flow
    @contextlib.contextmanager
    def loop(self, count: int, name: str) -> Iterator[ir.Value]:
        """for i in [0, count): a do-while loop (count >= 1 is static); yields i as i64."""
        if count == 1:
            yield i64(0)
            return
        b = self.b
        before = b.block
        body = self.fn.append_basic_block(f"{name}.body")
        b.branch(body)
        b.position_at_end(body)
        i = b.phi(I64, name=name)
        i.add_incoming(i64(0), before)
        yield i
        nxt = b.add(i, i64(1), flags=("nuw", "nsw"))
        i.add_incoming(nxt, b.block)
        end = self.fn.append_basic_block(f"{name}.end")
        b.cbranch(b.icmp_unsigned("<", nxt, i64(count)), body, end)
        b.position_at_end(end)

    @contextlib.contextmanager
    def elements(self, streams: Sequence[Stream], starts: Sequence[ir.Value], size: int
                 ) -> Iterator[list[ir.Value]]:
        """Loops over the `size` free elements in order; yields each stream's offset (start + free offset)."""
        nest = plan(streams, size)
        with contextlib.ExitStack() as stack:
            offs = list(starts)
            if nest.counts is None:
                e = stack.enter_context(self.loop(size, "e"))
                offs = [self.add(o, self.stream_offset(e, s)) for o, s in zip(offs, streams)]
            else:
                for level, (count, strides) in enumerate(zip(nest.counts, nest.strides)):
                    i = stack.enter_context(self.loop(count, f"i{level}"))
                    offs = [self.add(o, self.mul(i, st)) for o, st in zip(offs, strides)]
            yield offs

    def stream_offset(self, e: ir.Value, s: Stream) -> ir.Value:
        """The free offset of element e (an i64 value) of stream s: sum_j ((e / inner_j) % count_j) * stride_j."""
        dims = canonical(s.dims)
        total: ir.Value = i64(0)
        for inner, (stride, count) in zip(_inner_products(dims), dims):
            idx = self.b.urem(self.b.udiv(e, i64(inner)), i64(count)) if inner > 1 else self.b.urem(e, i64(count))
            total = self.add(total, self.mul(idx, stride))
        return total

    def flat_offset(self, e: ir.Value, lay: Layout) -> ir.Value:
        """Byte offset of free element e (an i64 value) of `lay` from its partition's element 0."""
        return self.stream_offset(e, stream(lay))

    # arithmetic that folds constants
    def mul(self, x: ir.Value, k: int) -> ir.Value:
        if k == 0:
            return i64(0)
        if k == 1:
            return x
        if isinstance(x, ir.Constant):
            return i64(x.constant * k)
        return self.b.mul(x, i64(k))

    def add(self, x: ir.Value, y: ir.Value) -> ir.Value:
        if isinstance(y, ir.Constant) and y.constant == 0:
            return x
        if isinstance(x, ir.Constant) and x.constant == 0:
            return y
        if isinstance(x, ir.Constant) and isinstance(y, ir.Constant):
            return i64(x.constant + y.constant)
        return self.b.add(x, y)

    # memory
    def at(self, base: ir.Value, offset: ir.Value, ty: ir.Type) -> ir.Value:
        """Typed pointer to base + offset bytes."""
        ptr = self.b.gep(base, [offset], inbounds=True) if not (isinstance(offset, ir.Constant)
                                                                and offset.constant == 0) else base
        return self.b.bitcast(ptr, ty.as_pointer())

    def load_bits(self, base: ir.Value, offset: ir.Value, dtype: DType) -> ir.Value:
        """The raw storage bits of one element of the operand at `base`, as an integer of the dtype's width."""
        ty = INT_OF_SIZE[dtype.itemsize]
        return self._tag(self.b.load(self.at(base, offset, ty), align=dtype.itemsize), base)

    def store_bits(self, bits: ir.Value, base: ir.Value, offset: ir.Value, dtype: DType) -> None:
        ty = INT_OF_SIZE[dtype.itemsize]
        self._tag(self.b.store(bits, self.at(base, offset, ty), align=dtype.itemsize), base)

    def _tag(self, inst: ir.Instruction, base: ir.Value) -> ir.Instruction:
        """Attach the alias scopes of the operand whose base `base` is."""
        for kind, node in self._metadata[self._root_of_base[id(base)]].items():
            inst.set_metadata(kind, node)
        return inst

    def fail(self, code: int, details: Sequence[ir.Value]) -> None:
        """Store fault details in status[1:] and return `code` (the current block ends here)."""
        for k, v in enumerate(details):
            self.b.store(v, self.b.gep(self.status, [i64(1 + k)], inbounds=True))
        self.b.ret(ir.Constant(I32, code))


def partition_blocks(partitions: int, lanes: int) -> list[tuple[int, int, int]]:
    """(lanes, block count, first partition): whole blocks of `lanes` partitions that a kernel handles side by
    side, then the rest one partition at a time."""
    blocks, rest = divmod(partitions, lanes)
    return [(lanes, blocks, 0)] + ([(1, rest, blocks * lanes)] if rest else [])


def partition_starts(kb: KernelBuilder, p: ir.Value, lays: Sequence[Layout]) -> list[ir.Value]:
    """Each layout's byte offset of partition p's element 0."""
    return [kb.mul(p, lay.pstride) for lay in lays]


def build_kernel(sig: KernelSig) -> str:
    """The LLVM IR text of the module holding the kernel of `sig`."""
    kb = KernelBuilder(sig)
    # Code starts in its own block so that `word`, `base` and `alloca` can keep adding to the entry block.
    body = kb.fn.append_basic_block("body")
    kb.b.position_at_end(body)
    LOWERINGS[sig.opcode].build(kb, sig)
    kb.b.ret(ir.Constant(I32, 0))
    with kb.b.goto_block(kb.entry):
        kb.b.branch(body)
    return str(kb.module)


# -- the driver ---------------------------------------------------------------------------------------

DRIVER_SYMBOL = "trnc_driver"


def driver_ir() -> str:
    """i32 trnc_driver(i64* table, i64 n, i8** mems, i64* status): call table[2i](mems, table[2i+1], status)
    for i in [0, n); at the first non-zero return r, store i in status[0] and return r; else return 0."""
    module = ir.Module(name=DRIVER_SYMBOL)
    fn = ir.Function(module, ir.FunctionType(I32, [I64.as_pointer(), I64, I8P.as_pointer(), I64.as_pointer()]),
                     name=DRIVER_SYMBOL)
    table, n, mems, status = fn.args
    entry, body, latch, fault, done = (fn.append_basic_block(x) for x in ("entry", "body", "latch", "fault", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, i64(0)), body, done)
    b.position_at_end(body)
    i = b.phi(I64, name="i")
    i.add_incoming(i64(0), entry)
    slot = b.shl(i, i64(1))
    kernel = b.inttoptr(b.load(b.gep(table, [slot], inbounds=True)), KERNEL_TYPE.as_pointer())
    args = b.inttoptr(b.load(b.gep(table, [b.add(slot, i64(1))], inbounds=True)), I64.as_pointer())
    code = b.call(kernel, [mems, args, status])
    b.cbranch(b.icmp_unsigned("!=", code, ir.Constant(I32, 0)), fault, latch)
    b.position_at_end(latch)
    nxt = b.add(i, i64(1))
    i.add_incoming(nxt, latch)
    b.cbranch(b.icmp_signed("<", nxt, n), body, done)
    b.position_at_end(fault)
    b.store(i, status)
    b.ret(code)
    b.position_at_end(done)
    b.ret(ir.Constant(I32, 0))
    return str(module)
