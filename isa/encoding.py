"""Binary encoding of programs: `encode(program) -> bytes`; isa/decoding.py holds `decode(data) -> Program`.

This is the form a program takes inside artifacts and on disk. Every opcode's record is derived
from the opcode table: the fields of `OpSpec.fields` in table order, each in the fixed form of its
`Kind`; no opcode has code of its own here. The byte layout below is built from the same row
tables that compile the `struct` formats, so `LAYOUT_DOC` (which `isa/SPEC.md` includes) cannot
drift from the code; a test checks that this docstring carries it verbatim.

`decode` accepts exactly what `encode` produces: any other input (truncated, corrupted, unknown
codes, counts larger than the data, trailing bytes) raises `EncodingError` naming the byte offset.
It checks well-formedness only (every value of the right type and width, HBM operands naming a
declared tensor, partitions and counts >= 1); the rules of the machine are `isa/verify.py`'s.
Both directions check the same well-formedness, so decode(encode(p)) == p for every p encode
accepts. F32 immediates are Python floats holding fp32 values: encode rounds to nearest even
(overflow to inf) and keeps NaN payloads and the sign of zero; decode gives back those values.

Binary layout, version 1: little-endian, no padding. A program is its header, the tensor
declarations and the instructions; nothing may follow the last instruction.

| part | field | type | meaning |
|---|---|---|---|
| program | magic | 8 bytes | `TRNCISA\\0` |
| program | version | u16 | format version; other versions are rejected |
| program | target | name | machine preset, e.g. `trn2` |
| program | tensor_count | u32 | number of tensor declarations |
| program | tensors | tensor_count x tensor | HBM tensors, referenced by index from HBM operands |
| program | instruction_count | u32 | number of instructions |
| program | instructions | instruction_count x instruction | in program order |
| name | length | u16 | bytes of text |
| name | text | length bytes | UTF-8: a letter or `_`, then letters, digits, `_` or `.` |
| tensor | name | name | unique; `sbuf` and `psum` are reserved |
| tensor | kind | u8 | TensorKind: 0 input, 1 output, 2 const, 3 scratch, 4 seed |
| tensor | dtype | u8 | DType code |
| tensor | rank | u8 | number of dimensions |
| tensor | shape | rank x u64 | sizes, outermost first |
| instruction | opcode | u16 | OpSpec.code |
| instruction | engine | u8 | Engine: 0 pe, 1 act, 2 dve, 3 pool, 4 dma |
| instruction | queue | u8 | DMA queue; 0 on compute engines |
| instruction | wait_count | u16 | number of waits |
| instruction | signal_count | u16 | number of signals |
| instruction | fields | field | each of OpSpec.fields in table order, in the form of its kind |
| instruction | waits | wait_count x wait | all must hold before the instruction starts |
| instruction | signals | signal_count x u16 | semaphores incremented on completion |
| wait | semaphore | u16 | semaphore number |
| wait | value | u32 | count the semaphore must reach |
| field | ap | ap | an access pattern |
| field | f32 | u32 | IEEE binary32 bits: NaN payloads and -0.0 survive |
| field | i32 | i32 | |
| field | u32 | u32 | |
| field | bool | u8 | 0 or 1 |
| field | i32x4 | i32 i32 i32 i32 | one per free dim |
| field | enum | u8 | the enum's value |
| ap | tag | u8 | 0: absent (optional operands only), else Mem: 1 sbuf, 2 psum, 3 hbm |
| ap | body | ap_body | only when tag != 0 |
| ap_body | dtype | u8 | DType code |
| ap_body | ndims | u8 | free dims, 0..4 |
| ap_body | start_partition | u32 | first partition on chip; 0 for HBM |
| ap_body | partitions | u32 | >= 1 |
| ap_body | tensor | i32 | HBM: index of a declared tensor; -1 on chip |
| ap_body | partition_stride | i64 | HBM: elements between partitions; 0 on chip |
| ap_body | offset | i64 | bytes |
| ap_body | dims | ndims x ap_dim | outermost first |
| ap_dim | stride | i64 | elements |
| ap_dim | count | u32 | >= 1 |
"""
from __future__ import annotations

import math
import numbers
import operator
import re
import struct

from trnc.errors import EncodingError
from trnc.isa.ap import AP, MAX_FREE_DIMS, Engine, Mem
from trnc.isa.dtypes import DType
from trnc.isa.opcodes import TABLE, Field, Kind, OpSpec
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind

MAGIC = b"TRNCISA\0"
FORMAT_VERSION = 1

# Names of the target and of tensors: what the assembly text can write as one token.
NAME_RE = re.compile(r"[^\W\d][\w.]*")
RESERVED_NAMES = frozenset({Mem.SBUF.text, Mem.PSUM.text})

_TYPE_NAMES = {"B": "u8", "H": "u16", "I": "u32", "i": "i32", "q": "i64", "Q": "u64", "8s": "8 bytes",
               "4i": "i32 i32 i32 i32"}
_RANGES = {"B": (0, 2**8 - 1), "H": (0, 2**16 - 1), "I": (0, 2**32 - 1), "i": (-2**31, 2**31 - 1),
           "q": (-2**63, 2**63 - 1), "Q": (0, 2**64 - 1)}

# The enum width is the smallest that holds every enum value the table uses.
_ENUM_CODE = "B" if max(max(f.enum) for op in TABLE for f in op.fields if f.kind is Kind.ENUM) < 256 else "H"
_KIND_CODES = {Kind.F32: "I", Kind.I32: "i", Kind.U32: "I", Kind.BOOL: "B", Kind.I32X4: "4i", Kind.ENUM: _ENUM_CODE}
_KIND_MEANINGS = {Kind.AP: "an access pattern", Kind.F32: "IEEE binary32 bits: NaN payloads and -0.0 survive",
                  Kind.I32: "", Kind.U32: "", Kind.BOOL: "0 or 1", Kind.I32X4: "one per free dim",
                  Kind.ENUM: "the enum's value"}

# (part, field, struct code or None for a variable-size part, type text when the code is None, meaning).
# Consecutive rows of one part that have codes form one struct.Struct.
_ROWS = (
    ("program", "magic", "8s", "", "`TRNCISA\\0`"),
    ("program", "version", "H", "", "format version; other versions are rejected"),
    ("program", "target", None, "name", "machine preset, e.g. `trn2`"),
    ("program", "tensor_count", "I", "", "number of tensor declarations"),
    ("program", "tensors", None, "tensor_count x tensor", "HBM tensors, referenced by index from HBM operands"),
    ("program", "instruction_count", "I", "", "number of instructions"),
    ("program", "instructions", None, "instruction_count x instruction", "in program order"),
    ("name", "length", "H", "", "bytes of text"),
    ("name", "text", None, "length bytes", "UTF-8: a letter or `_`, then letters, digits, `_` or `.`"),
    ("tensor", "name", None, "name", "unique; `sbuf` and `psum` are reserved"),
    ("tensor", "kind", "B", "", "TensorKind: " + ", ".join(f"{k.value} {k.text}" for k in TensorKind)),
    ("tensor", "dtype", "B", "", "DType code"),
    ("tensor", "rank", "B", "", "number of dimensions"),
    ("tensor", "shape", None, "rank x u64", "sizes, outermost first"),
    ("instruction", "opcode", "H", "", "OpSpec.code"),
    ("instruction", "engine", "B", "", "Engine: " + ", ".join(f"{e.value} {e.text}" for e in Engine)),
    ("instruction", "queue", "B", "", "DMA queue; 0 on compute engines"),
    ("instruction", "wait_count", "H", "", "number of waits"),
    ("instruction", "signal_count", "H", "", "number of signals"),
    ("instruction", "fields", None, "field", "each of OpSpec.fields in table order, in the form of its kind"),
    ("instruction", "waits", None, "wait_count x wait", "all must hold before the instruction starts"),
    ("instruction", "signals", None, "signal_count x u16", "semaphores incremented on completion"),
    ("wait", "semaphore", "H", "", "semaphore number"),
    ("wait", "value", "I", "", "count the semaphore must reach"),
    *(("field", k.value, _KIND_CODES.get(k), "ap" if k is Kind.AP else "", _KIND_MEANINGS[k]) for k in Kind),
    ("ap", "tag", "B", "", "0: absent (optional operands only), else Mem: "
     + ", ".join(f"{m.value} {m.text}" for m in Mem)),
    ("ap", "body", None, "ap_body", "only when tag != 0"),
    ("ap_body", "dtype", "B", "", "DType code"),
    ("ap_body", "ndims", "B", "", f"free dims, 0..{MAX_FREE_DIMS}"),
    ("ap_body", "start_partition", "I", "", "first partition on chip; 0 for HBM"),
    ("ap_body", "partitions", "I", "", ">= 1"),
    ("ap_body", "tensor", "i", "", "HBM: index of a declared tensor; -1 on chip"),
    ("ap_body", "partition_stride", "q", "", "HBM: elements between partitions; 0 on chip"),
    ("ap_body", "offset", "q", "", "bytes"),
    ("ap_body", "dims", None, "ndims x ap_dim", "outermost first"),
    ("ap_dim", "stride", "q", "", "elements"),
    ("ap_dim", "count", "I", "", ">= 1"),
)


def _render_layout() -> str:
    lines = ["| part | field | type | meaning |", "|---|---|---|---|"]
    for part, name, code, type_text, meaning in _ROWS:
        lines.append(f"| {part} | {name} | {_TYPE_NAMES[code] if code else type_text} | {meaning} |".replace("  ", " "))
    return "\n".join(lines) + "\n"


LAYOUT_DOC = _render_layout()


def _structs(part: str) -> list[struct.Struct]:
    """The structs of `part`: one per run of consecutive fixed-size rows, in layout order."""
    runs, run = [], ""
    for row_part, _, code, _, _ in _ROWS:
        if row_part != part:
            continue
        if code:
            run += code
        elif run:
            runs.append(struct.Struct("<" + run))
            run = ""
    if run:
        runs.append(struct.Struct("<" + run))
    return runs


_HEADER, _TENSOR_COUNT, _INSTR_COUNT = _structs("program")
(_NAME_LEN,) = _structs("name")
(_TENSOR_HEAD,) = _structs("tensor")
(_INSTR_HEAD,) = _structs("instruction")
(_WAIT,) = _structs("wait")
(_AP_TAG,) = _structs("ap")
(_AP_BODY,) = _structs("ap_body")
(_AP_DIM,) = _structs("ap_dim")
_AP_HEAD = struct.Struct(_AP_TAG.format + _AP_BODY.format[1:])   # the tag and the body, read together
_DIMS = tuple(struct.Struct("<" + _AP_DIM.format[1:] * n) for n in range(MAX_FREE_DIMS + 1))
_SHAPE_DIM = struct.Struct("<Q")
_SIGNAL = struct.Struct("<" + _WAIT.format[1])   # a signal is a semaphore number, as in a wait

_U8, _U16, _U32, _I32, _I64, _U64 = (_RANGES[c] for c in "BHIiqQ")
_F32_BITS, _U32_BITS = struct.Struct("<f"), struct.Struct("<I")
_F64_BITS, _U64_BITS = struct.Struct("<d"), struct.Struct("<Q")
# Enum members as module constants: in Python 3.11 `Mem.HBM` is a descriptor call on every use, and the hot
# loops below and in isa/decoding.py would spend more on those than on the bytes.
_HBM, _DMA = Mem.HBM, Engine.DMA
_K_F32, _K_I32, _K_U32, _K_BOOL, _K_I32X4, _K_ENUM = Kind.F32, Kind.I32, Kind.U32, Kind.BOOL, Kind.I32X4, Kind.ENUM
_DTYPE_CODES = {d: d.code for d in DType}


def f32_bits(value: float) -> int:
    """IEEE binary32 bits of fp32(value): nearest even, overflow to inf, NaN sign and payload kept.

    Python floats are doubles; a NaN's fp32 payload is the top 23 bits of the double's (the inverse
    of `f32_value`), and a NaN whose top bits are all zero becomes the quiet NaN of its sign.
    """
    if math.isnan(value):
        bits = _U64_BITS.unpack(_F64_BITS.pack(value))[0]
        return ((bits >> 32) & 0x80000000) | 0x7F800000 | ((bits >> 29) & 0x7FFFFF or 0x400000)
    try:
        return _U32_BITS.unpack(_F32_BITS.pack(value))[0]
    except OverflowError:
        return 0xFF800000 if value < 0 else 0x7F800000


def f32_value(bits: int) -> float:
    """The Python float of fp32 bits; NaNs are built by hand because a C float->double cast quiets them."""
    if bits & 0x7F800000 == 0x7F800000 and bits & 0x7FFFFF:
        double = ((bits & 0x80000000) << 32) | 0x7FF0000000000000 | ((bits & 0x7FFFFF) << 29)
        return _F64_BITS.unpack(_U64_BITS.pack(double))[0]
    return _F32_BITS.unpack(_U32_BITS.pack(bits))[0]


def _int(value, bounds: tuple[int, int], what: str) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise EncodingError(f"{what} must be an integer, got {value!r}") from None
    if not bounds[0] <= v <= bounds[1]:
        raise EncodingError(f"{what} = {v} is outside [{bounds[0]}, {bounds[1]}]")
    return v


def check_name(name, what: str) -> None:
    """Names must be single assembly tokens: a letter or `_`, then letters, digits, `_` or `.`."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise EncodingError(f"{what} {name!r} is not a name (a letter or '_', then letters, digits, '_' or '.')")
    if len(name.encode("utf-8")) > _U16[1]:
        raise EncodingError(f"{what} is longer than {_U16[1]} bytes of UTF-8")


def check_tensor(decl: TensorDecl, taken: set[str]) -> None:
    """A well-formed declaration with a name not in `taken` (which it then joins)."""
    if not isinstance(decl, TensorDecl):
        raise EncodingError(f"tensor declaration must be a TensorDecl, got {decl!r}")
    check_name(decl.name, "tensor name")
    if decl.name in RESERVED_NAMES:
        raise EncodingError(f"tensor name '{decl.name}' is reserved "
                            f"(the on-chip memories are {sorted(RESERVED_NAMES)})")
    if decl.name in taken:
        raise EncodingError(f"tensor name '{decl.name}' is declared twice")
    taken.add(decl.name)
    if not isinstance(decl.kind, TensorKind) or not isinstance(decl.dtype, DType):
        raise EncodingError(f"tensor '{decl.name}': kind must be a TensorKind and dtype a DType")
    if not isinstance(decl.shape, tuple) or len(decl.shape) > _U8[1]:
        raise EncodingError(f"tensor '{decl.name}': shape must be a tuple of at most {_U8[1]} sizes")
    for size in decl.shape:
        _int(size, _U64, f"tensor '{decl.name}' dimension")


def _encode_tensor(decl: TensorDecl, taken: set[str]) -> bytes:
    check_tensor(decl, taken)
    name = decl.name.encode("utf-8")
    return b"".join((_NAME_LEN.pack(len(name)), name, _TENSOR_HEAD.pack(decl.kind, decl.dtype.code, len(decl.shape)),
                     *(_SHAPE_DIM.pack(s) for s in decl.shape)))


def _check_ap(ap, field: Field, ntensors: int) -> None:
    """Raise the precise reason why `ap` is not a well-formed operand; the slow twin of `_encode_ap`."""
    what = f"operand '{field.name}'"
    if not isinstance(ap, AP) or not isinstance(ap.mem, Mem) or not isinstance(ap.dtype, DType):
        raise EncodingError(f"{what} must be an AP with a Mem and a DType, got {ap!r}")
    if not isinstance(ap.dims, tuple) or len(ap.dims) > MAX_FREE_DIMS:
        raise EncodingError(f"{what}: dims must be a tuple of at most {MAX_FREE_DIMS} (stride, count) pairs")
    for dim in ap.dims:
        if not isinstance(dim, tuple) or len(dim) != 2:
            raise EncodingError(f"{what}: dim {dim!r} is not a (stride, count) pair")
        _int(dim[0], _I64, f"{what} stride")
        _int(dim[1], (1, _U32[1]), f"{what} count")
    _int(ap.partitions, (1, _U32[1]), f"{what} partitions")
    _int(ap.offset, _I64, f"{what} offset")
    if ap.mem is _HBM:
        _int(ap.start_partition, (0, 0), f"{what} start_partition (HBM operands have none)")
        _int(ap.tensor, (0, ntensors - 1), f"{what} tensor index (the program declares {ntensors} tensors)")
        _int(ap.partition_stride, _I64, f"{what} partition_stride")
    else:
        _int(ap.tensor, (-1, -1), f"{what} tensor index (on-chip operands have none)")
        _int(ap.partition_stride, (0, 0), f"{what} partition_stride (on-chip operands have none)")
        _int(ap.start_partition, _U32, f"{what} start_partition")


def _encode_ap(ap, field: Field, ntensors: int) -> bytes:
    """The operand's bytes. struct checks every width and type on the fast path; when anything is off,
    `_check_ap` says what."""
    if ap is None:
        if field.optional:
            return _AP_TAG.pack(0)
        raise EncodingError(f"operand '{field.name}' is required")
    try:
        mem, dims = ap.mem, ap.dims
        if (type(mem) is Mem and type(ap.dtype) is DType and type(dims) is tuple and len(dims) <= MAX_FREE_DIMS
                and ap.partitions >= 1 and all(type(d) is tuple and len(d) == 2 and d[1] >= 1 for d in dims)
                and (0 <= ap.tensor < ntensors and ap.start_partition == 0 if mem is _HBM
                     else ap.tensor == -1 and ap.partition_stride == 0)):
            return (_AP_HEAD.pack(mem, _DTYPE_CODES[ap.dtype], len(dims), ap.start_partition, ap.partitions, ap.tensor,
                                  ap.partition_stride, ap.offset)
            + _DIMS[len(dims)].pack(*[v for d in dims for v in d]))
    except (AttributeError, TypeError, struct.error):
        pass
    _check_ap(ap, field, ntensors)
    raise EncodingError(f"operand '{field.name}': {ap!r} is not a well-formed AP")


def _wire_f32(value, field: Field) -> tuple:
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise EncodingError(f"field '{field.name}' must be a float, got {value!r}")
    try:
        value = float(value)
    except OverflowError:   # an int beyond every float: fp32 rounds it to infinity
        value = math.inf if value > 0 else -math.inf
    return (f32_bits(value),)


def _wire_bool(value, field: Field) -> tuple:
    if value is not True and value is not False and value not in (0, 1):
        raise EncodingError(f"field '{field.name}' must be a bool, got {value!r}")
    return (1 if value else 0,)


def _wire_enum(value, field: Field) -> tuple:
    if not isinstance(value, field.enum):
        raise EncodingError(f"field '{field.name}' must be a {field.enum.__name__}, got {value!r}")
    return (int(value),)


def _wire_i32x4(value, field: Field) -> tuple:
    if not isinstance(value, tuple) or len(value) != 4:
        raise EncodingError(f"field '{field.name}' must be a tuple of 4 int32, got {value!r}")
    return tuple(_int(v, _I32, f"field '{field.name}' element") for v in value)


# The slow, checking conversion of each immediate kind to its struct words.
_TO_WIRE = {
    Kind.F32: _wire_f32, Kind.BOOL: _wire_bool, Kind.ENUM: _wire_enum, Kind.I32X4: _wire_i32x4,
    Kind.I32: lambda v, f: (_int(v, _I32, f"field '{f.name}'"),),
    Kind.U32: lambda v, f: (_int(v, _U32, f"field '{f.name}'"),),
}


class _OpCodec:
    """One opcode's record, compiled from its table row: each run of immediates is one struct, each AP its own."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        self.names = tuple(f.name for f in spec.fields)
        # (struct, ((field, byte offset in the struct, kind), ...)) per run of immediates; (None, ((field, 0, AP),))
        # per AP
        self.segments: list[tuple[struct.Struct | None, tuple[tuple[Field, int, Kind], ...]]] = []
        run: list[Field] = []
        for f in (*spec.fields, None):
            if f is not None and f.kind is not Kind.AP:
                run.append(f)
                continue
            if run:
                codes = [_KIND_CODES[r.kind] for r in run]
                offsets = [struct.calcsize("<" + "".join(codes[:i])) for i in range(len(run))]
                self.segments.append((struct.Struct("<" + "".join(codes)),
                                      tuple(zip(run, offsets, [r.kind for r in run]))))
                run = []
            if f is not None:
                self.segments.append((None, ((f, 0, f.kind),)))

    def encode_fields(self, values: list, ntensors: int, out: list) -> None:
        i = 0
        for st, fields in self.segments:
            if st is None:
                out.append(_encode_ap(values[i], fields[0][0], ntensors))
                i += 1
                continue
            first, words = i, []
            for f, _, kind in fields:
                v = values[i]
                i += 1
                if kind is _K_I32 or kind is _K_U32 or (kind is _K_BOOL and (v is True or v is False)):
                    words.append(v)
                elif kind is _K_F32 and type(v) is float:
                    words.append(f32_bits(v))
                elif kind is _K_ENUM and type(v) is f.enum:
                    words.append(v)
                else:
                    words.extend(_TO_WIRE[kind](v, f))
            try:
                out.append(st.pack(*words))
            except struct.error:
                for (f, _, kind), v in zip(fields, values[first:i]):
                    _TO_WIRE[kind](v, f)
                raise EncodingError(f"fields {[f[0].name for f in fields]} do not fit their widths") from None


_CODECS = {op.name: _OpCodec(op) for op in TABLE}


def encode_instruction(instr: Instruction, ntensors: int) -> bytes:
    """The record of one instruction of a program with `ntensors` tensors; EncodingError if ill-formed."""
    out: list[bytes] = []
    _encode_instruction(instr, ntensors, out)
    return b"".join(out)


def _encode_instruction(instr: Instruction, ntensors: int, out: list) -> None:
    if not isinstance(instr, Instruction):
        raise EncodingError(f"expected an Instruction, got {instr!r}")
    codec = _CODECS.get(instr.opcode)
    if codec is None:
        raise EncodingError(f"unknown opcode {instr.opcode!r}; expected one of {', '.join(_CODECS)}")
    engine, args, waits, signals = instr.engine, instr.args, instr.waits, instr.signals
    if type(engine) is not Engine:
        raise EncodingError(f"engine must be an Engine, got {engine!r}")
    queue = instr.queue
    if type(queue) is not int or not (0 <= queue <= _U8[1] if engine is _DMA else queue == 0):
        queue = _int(queue, _U8 if engine is _DMA else (0, 0), f"queue of engine {engine.text}")
    if type(args) is not tuple or len(args) != len(codec.names) \
            or any(type(a) is not tuple or len(a) != 2 or a[0] != n for a, n in zip(args, codec.names)):
        raise EncodingError(f"{instr.opcode}: args must be (name, value) pairs for the fields {list(codec.names)} "
                            "in this order")
    if (type(waits) is not tuple or type(signals) is not tuple
            or any(type(w) is not tuple or len(w) != 2 for w in waits)):
        raise EncodingError("waits must be a tuple of (semaphore, value) pairs and signals a tuple of semaphores")
    if len(waits) > _U16[1] or len(signals) > _U16[1]:
        raise EncodingError(f"{len(waits)} waits and {len(signals)} signals; at most {_U16[1]} of each")
    out.append(_INSTR_HEAD.pack(codec.spec.code, engine, queue, len(waits), len(signals)))
    codec.encode_fields([a[1] for a in args], ntensors, out)
    try:
        out.append(_waits_struct(len(waits), len(signals)).pack(*[x for w in waits for x in w], *signals))
    except struct.error:
        for sem, value in waits:
            _int(sem, _U16, "wait semaphore")
            _int(value, _U32, "wait value")
        for sem in signals:
            _int(sem, _U16, "signal semaphore")
        raise EncodingError("waits or signals do not fit their widths") from None


_SYNC_STRUCTS: dict[tuple[int, int], struct.Struct] = {}


def _waits_struct(nwaits: int, nsignals: int) -> struct.Struct:
    """The struct of `nwaits` waits then `nsignals` signals, built once per pair of counts."""
    st = _SYNC_STRUCTS.get((nwaits, nsignals))
    if st is None:
        st = _SYNC_STRUCTS[nwaits, nsignals] = struct.Struct("<" + _WAIT.format[1:] * nwaits
                                                             + _SIGNAL.format[1:] * nsignals)
    return st


def encode(program: Program) -> bytes:
    """The binary form of `program` (layout in the module docstring); EncodingError if it is not well-formed."""
    if not isinstance(program, Program):
        raise EncodingError(f"expected a Program, got {type(program).__name__}")
    check_name(program.target, "target")
    target = program.target.encode("utf-8")
    tensors, instructions = program.tensors, program.instructions
    if not isinstance(tensors, tuple) or not isinstance(instructions, tuple):
        raise EncodingError("Program.tensors and Program.instructions must be tuples")
    parts = [_HEADER.pack(MAGIC, FORMAT_VERSION), _NAME_LEN.pack(len(target)), target,
             _TENSOR_COUNT.pack(_int(len(tensors), _U32, "number of tensors"))]
    taken: set[str] = set()
    for i, decl in enumerate(tensors):
        try:
            parts.append(_encode_tensor(decl, taken))
        except EncodingError as e:
            raise EncodingError(f"tensor {i}: {e}") from None
    parts.append(_INSTR_COUNT.pack(_int(len(instructions), _U32, "number of instructions")))
    ntensors = len(tensors)
    for i, instr in enumerate(instructions):
        try:
            _encode_instruction(instr, ntensors, parts)
        except EncodingError as e:
            raise EncodingError(f"instruction {i} ({getattr(instr, 'opcode', '?')}): {e}") from None
    return b"".join(parts)
