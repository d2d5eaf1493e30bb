"""Binary decoding of programs: `decode(data) -> Program`, the inverse of isa/encoding.py's `encode`.

The layout and the contract (exactly what encode produces is accepted; anything else raises
`EncodingError` naming the byte offset) are in isa/encoding.py's docstring. The decoder reads with the
structs and per-opcode codecs that isa/encoding.py compiles from its layout rows and the opcode table,
so the two directions cannot disagree on a width or an offset.
"""
from __future__ import annotations

import contextlib
import gc
import struct

from trnc.errors import EncodingError
from trnc.isa.ap import AP, MAX_FREE_DIMS, Engine, Mem
from trnc.isa.dtypes import DType
from trnc.isa.encoding import (FORMAT_VERSION, MAGIC, RESERVED_NAMES, check_name, f32_value, _AP_DIM, _AP_HEAD,
                                _CODECS, _DIMS, _DMA, _HBM, _HEADER, _INSTR_COUNT, _INSTR_HEAD, _K_BOOL, _K_ENUM,
                                _K_F32, _K_I32X4, _NAME_LEN, _OpCodec, _SHAPE_DIM, _SIGNAL, _TENSOR_COUNT,
                                _TENSOR_HEAD, _WAIT, _waits_struct)
from trnc.isa.opcodes import TABLE, Field, Kind
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind
from trnc.isa.rows import checked_rows

_STRIDE_BYTES = struct.calcsize("<" + _AP_DIM.format[1])
_DTYPES = {d.code: d for d in DType}
_MEMS = {m.value: m for m in Mem}
_ENGINES = {e.value: e for e in Engine}
_TENSOR_KINDS = {k.value: k for k in TensorKind}
_ENUM_VALUES = {f.enum: {m.value: m for m in f.enum} for op in TABLE for f in op.fields if f.kind is Kind.ENUM}
_CODECS_BY_CODE = {op.code: _CODECS[op.name] for op in TABLE}


def _choices(by_value: dict) -> str:
    return ", ".join(f"{v} {m.text}" for v, m in by_value.items())


class _Reader:
    """A cursor over the input that checks every length before reading and names the offset on failure."""

    def __init__(self, data: bytes):
        self.data, self.pos, self.where = data, 0, "header"
        self.aps: dict[bytes, AP] = {}   # operands already decoded, by their bytes: programs repeat them

    def fail(self, what: str, pos: int | None = None):
        where = f"instruction {self.where}" if isinstance(self.where, int) else self.where
        raise EncodingError(f"byte {self.pos if pos is None else pos}: {where}: {what}")

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def unpack(self, st: struct.Struct, what: str, name: str = "") -> tuple:
        pos = self.pos
        if pos + st.size > len(self.data):
            self.fail(f"truncated {what}{name}: needs {st.size} bytes, {len(self.data) - pos} left")
        self.pos = pos + st.size
        return st.unpack_from(self.data, pos)

    def count(self, st: struct.Struct, what: str, min_item_bytes: int) -> int:
        """A count, refused when its items could not fit in the remaining bytes (no huge loops)."""
        start = self.pos
        (n,) = self.unpack(st, what)
        if n * min_item_bytes > self.remaining():
            self.fail(f"{what} {n} needs at least {n * min_item_bytes} bytes, {self.remaining()} left", start)
        return n

    def name(self, what: str) -> str:
        start = self.pos
        (n,) = self.unpack(_NAME_LEN, what, " length")
        if n > self.remaining():
            self.fail(f"{what} length {n} exceeds the {self.remaining()} bytes left", start)
        raw = self.data[self.pos:self.pos + n]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            text = None
            reason = f"{what} is not UTF-8 ({e.reason} at text byte {e.start})"
        if text is None:
            self.fail(reason, self.pos)
        try:
            check_name(text, what)
        except EncodingError as e:
            self.fail(str(e), self.pos)
        self.pos += n
        return text


def _decode_ap(r: _Reader, field: Field, ntensors: int) -> AP | None:
    data, start = r.data, r.pos
    if start < len(data) and data[start] == 0:
        if not field.optional:
            r.fail(f"operand '{field.name}' is required but absent (tag 0)")
        r.pos += 1
        return None
    ndims = data[start + 2] if start + 2 < len(data) else 0
    if ndims > MAX_FREE_DIMS:
        r.fail(f"operand '{field.name}': {ndims} free dims, at most {MAX_FREE_DIMS}", start + 2)
    end = start + _AP_HEAD.size + ndims * _AP_DIM.size
    key = data[start:end]
    ap = r.aps.get(key)
    if ap is not None:
        r.pos = end
        return ap
    if end > len(data):
        r.fail(f"truncated operand '{field.name}': needs {end - start} bytes, {len(data) - start} left")
    tag, code, ndims, first, partitions, tensor, pstride, offset = _AP_HEAD.unpack_from(data, start)
    mem, dtype = _MEMS.get(tag), _DTYPES.get(code)
    if mem is None:
        r.fail(f"operand '{field.name}': unknown memory tag {tag} (0 absent, {_choices(_MEMS)})", start)
    if dtype is None:
        r.fail(f"operand '{field.name}': unknown dtype code {code}", start + 1)
    if partitions < 1:
        r.fail(f"operand '{field.name}': partitions is 0, must be >= 1", start + 7)
    if mem is _HBM:
        if first != 0:
            r.fail(f"operand '{field.name}': start_partition {first} of an HBM operand must be 0", start + 3)
        if not 0 <= tensor < ntensors:
            r.fail(f"operand '{field.name}': tensor index {tensor} outside the {ntensors} declared tensors", start + 11)
    elif tensor != -1 or pstride != 0:
        r.fail(f"operand '{field.name}': an on-chip operand has tensor -1 and partition_stride 0, "
               f"got {tensor} and {pstride}", start + 11)
    dims_at = start + _AP_HEAD.size
    words = _DIMS[ndims].unpack_from(data, dims_at)
    for k in range(1, len(words), 2):
        if words[k] < 1:
            r.fail(f"operand '{field.name}': dim {k // 2} has count 0, must be >= 1",
                   dims_at + _AP_DIM.size * (k // 2) + _STRIDE_BYTES)
    ap = r.aps[key] = AP(mem, dtype, partitions, tuple(zip(words[::2], words[1::2])), offset, first, tensor, pstride)
    r.pos = end
    return ap


def _decode_fields(codec: _OpCodec, r: _Reader, ntensors: int) -> list:
    """The values of the opcode's fields, segment by segment as `_OpCodec` compiled them."""
    values = []
    for st, fields in codec.segments:
        if st is None:
            values.append(_decode_ap(r, fields[0][0], ntensors))
            continue
        start = r.pos
        words = r.unpack(st, "immediate fields")
        j = 0
        for f, offset, kind in fields:
            if kind is _K_I32X4:
                values.append(words[j:j + 4])
                j += 4
                continue
            w = words[j]
            j += 1
            if kind is _K_F32:
                values.append(f32_value(w))
            elif kind is _K_BOOL:
                if w > 1:
                    r.fail(f"field '{f.name}': bool byte is {w}, not 0 or 1", start + offset)
                values.append(w == 1)
            elif kind is _K_ENUM:
                member = _ENUM_VALUES[f.enum].get(w)
                if member is None:
                    r.fail(f"field '{f.name}': {w} is not a {f.enum.__name__} ({_choices(_ENUM_VALUES[f.enum])})",
                           start + offset)
                values.append(member)
            else:
                values.append(w)
    return values


def _decode_tensor(r: _Reader, taken: set[str]) -> TensorDecl:
    start = r.pos
    name = r.name("tensor name")
    if name in RESERVED_NAMES or name in taken:
        r.fail(f"tensor name '{name}' is {'reserved' if name in RESERVED_NAMES else 'declared twice'}", start)
    taken.add(name)
    head = r.pos
    kind_v, code, rank = r.unpack(_TENSOR_HEAD, "tensor declaration")
    kind = _TENSOR_KINDS.get(kind_v)
    if kind is None:
        r.fail(f"unknown tensor kind {kind_v} ({_choices(_TENSOR_KINDS)})", head)
    if code not in _DTYPES:
        r.fail(f"unknown dtype code {code}", head + 1)
    if rank * _SHAPE_DIM.size > r.remaining():
        r.fail(f"rank {rank} needs {rank * _SHAPE_DIM.size} bytes, {r.remaining()} left", head + 2)
    shape = struct.unpack_from(f"<{rank}{_SHAPE_DIM.format[1:]}", r.data, r.pos)
    r.pos += rank * _SHAPE_DIM.size
    return TensorDecl(name, kind, _DTYPES[code], shape)


def _decode_instruction(r: _Reader, ntensors: int) -> Instruction:
    start = r.pos
    code, engine_v, queue, nwaits, nsignals = r.unpack(_INSTR_HEAD, "instruction header")
    codec = _CODECS_BY_CODE.get(code)
    if codec is None:
        r.fail(f"unknown opcode {code}; known: {', '.join(f'{c} {k.spec.name}' for c, k in _CODECS_BY_CODE.items())}",
               start)
    engine = _ENGINES.get(engine_v)
    if engine is None:
        r.fail(f"unknown engine {engine_v} ({_choices(_ENGINES)})", start + 2)
    if engine is not _DMA and queue != 0:
        r.fail(f"queue {queue} on compute engine {engine.text}; only DMA instructions have a queue", start + 3)
    values = _decode_fields(codec, r, ntensors)
    sync = nwaits * _WAIT.size + nsignals * _SIGNAL.size
    if sync > r.remaining():
        r.fail(f"{nwaits} waits and {nsignals} signals need {sync} bytes, {r.remaining()} left", start + 4)
    words = _waits_struct(nwaits, nsignals).unpack_from(r.data, r.pos) if sync else ()
    r.pos += sync
    waits = tuple(zip(words[:2 * nwaits:2], words[1:2 * nwaits:2]))
    args = tuple(zip(codec.names, values))
    return Instruction.with_rows(codec.spec.name, engine, args, queue, waits, words[2 * nwaits:],
                                 checked_rows(codec.spec.name, engine, queue, args, words, nwaits, nsignals))


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic garbage collector. Decoding and parsing allocate millions of small objects that all
    stay alive; the collector would traverse them again and again (most of a 100k-instruction decode) and
    could free none of them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode(data: bytes) -> Program:
    """The program encoded in `data`; EncodingError (with the byte offset) for anything encode could not produce."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EncodingError(f"expected bytes, got {type(data).__name__}")
    with no_gc():
        return _decode(_Reader(bytes(data)))


def _decode(r: _Reader) -> Program:
    head = r.data[:len(MAGIC)]
    if head != MAGIC[:len(head)]:
        r.fail(f"bad magic {head!r}, expected {MAGIC!r}", 0)
    _, version = r.unpack(_HEADER, "header")
    if version != FORMAT_VERSION:
        r.fail(f"unsupported format version {version}; this trnc reads version {FORMAT_VERSION}", len(MAGIC))
    target = r.name("target")
    r.where = "tensors"
    ntensors = r.count(_TENSOR_COUNT, "tensor count", _NAME_LEN.size + _TENSOR_HEAD.size)
    taken: set[str] = set()
    tensors = []
    for i in range(ntensors):
        r.where = f"tensor {i}"
        tensors.append(_decode_tensor(r, taken))
    r.where = "instructions"
    count = r.count(_INSTR_COUNT, "instruction count", _INSTR_HEAD.size)
    instructions = []
    for i in range(count):
        r.where = i
        instructions.append(_decode_instruction(r, ntensors))
    if r.remaining():
        r.where = "end"
        r.fail(f"{r.remaining()} bytes of trailing garbage after the last instruction")
    return Program(tuple(tensors), tuple(instructions), target)
