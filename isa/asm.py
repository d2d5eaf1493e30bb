"""Assembly text of programs: `format_program`, `parse_program`, and one-line forms for messages.

The text is the readable twin of the binary form (isa/encoding.py). Both walk the opcode table,
so no opcode has code of its own here; both accept the same well-formed programs, and
parse_program(format_program(p)) == p for every program encode accepts (F32 values included:
NaN payloads and -0.0 survive). `format_instruction` and `format_ap` are what the verifier and
the CLI print in messages.

Grammar. One statement per line; `#` starts a comment; blank lines are ignored; tokens hold no
spaces except inside a `.tensor` shape.

    .target NAME                              machine preset, at most once (default trn2)
    .tensor NAME KIND DTYPE [D0, D1, ...]     an HBM tensor; KIND: input, output, const, scratch
    QUEUE OPCODE FIELD=VALUE ... [wait=sA>=N,sB>=M] [signal=sA,sB]

    QUEUE    pe, act, dve, pool, or dmaN (DMA queue N)
    NAME     a letter or `_`, then letters, digits, `_` or `.` (Unicode letters and digits count);
             `sbuf` and `psum` are reserved
    wait     the instruction starts once semaphore A has count >= N (and B >= M)
    signal   on completion, each listed semaphore is incremented

A FIELD is any field of the opcode (see isa/SPEC.md), in any order. Omitted immediates take the
table's default, omitted optional operands are absent. VALUE by the field's kind:

    ap     on chip:  MEM[START:END]+OFFSET:DTYPE[STRIDE,COUNT]...     MEM: sbuf or psum
           HBM:      NAME[PARTITION_STRIDE;PARTITIONS]+OFFSET:DTYPE[STRIDE,COUNT]...
           END is exclusive (partitions = END - START); OFFSET in bytes, signed, `+0` may be
           left out; one [STRIDE,COUNT] per free dim (0 to 4), strides in elements
    f32    the shortest decimal that reads back as the same fp32 value, inf, -inf, nan
           (the quiet NaN 0x7fc00000) or nan:0xXXXXXXXX (a NaN by its fp32 bits)
    i32    decimal or 0x hex, with an optional sign; u32 likewise, not negative
    bool   0 or 1 (true and false are accepted)
    i32x4  four i32 separated by commas: steps=1,0,0,0
    enum   the value's lower-case name: add, exp, sum, rne, floor, ...

Example (the printer pads the queue and omits default immediates):

    .target trn2
    .tensor a input bf16 [128, 512]
    .tensor out output fp32 [128, 512]

    dma0  dma_copy dst=sbuf[0:128]+0:bf16[1,512] src=a[512;128]+0:bf16[1,512] signal=s0
    pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+0:bf16[1,128] moving=sbuf[0:128]+0:bf16[1,512] \
wait=s0>=1 signal=s1
    act   activation dst=sbuf[0:128]+1024:fp32[1,512] src=psum[0:128]+0:fp32[1,512] func=gelu scale=0.5 wait=s1>=1 \
signal=s2
    dma1  dma_copy dst=out[512;128]+0:fp32[1,512] src=sbuf[0:128]+1024:fp32[1,512] wait=s2>=1

(each instruction is one line; in the source of this docstring a backslash folds the long ones.)
"""
from __future__ import annotations

import operator
import re

import numpy as np

from trnc.errors import EncodingError
from trnc.isa.ap import AP, QUEUES, Engine, Mem
from trnc.isa.config import DEFAULT_TARGET
from trnc.isa.dtypes import DType
from trnc.isa.decoding import no_gc
from trnc.isa.encoding import (NAME_RE, RESERVED_NAMES, check_name, check_tensor, encode, encode_instruction, f32_bits,
                                f32_value)
from trnc.isa.opcodes import BY_NAME, Field, Kind
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind

QUIET_NAN = 0x7FC00000
_EXP_MASK, _MANT_MASK = 0x7F800000, 0x007FFFFF

_AP_RE = re.compile(rf"(?P<name>{NAME_RE.pattern})\[(?P<a>[+-]?[0-9]+)(?P<sep>[:;])(?P<b>[0-9]+)\]"
                    r"(?P<offset>[+-][0-9]+)?:(?P<dtype>\w+)(?P<dims>(?:\[[^\]]*\])*)")
_DIM_RE = re.compile(r"\[(?P<stride>[+-]?[0-9]+),(?P<count>[0-9]+)\]")
_BRACKETS_RE = re.compile(r"\[[^\]]*\]")
_INT_RE = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+)")
_F32_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NAN_RE = re.compile(r"nan:0x([0-9a-fA-F]{8})")
_WAIT_RE = re.compile(r"s([0-9]+)>=([0-9]+)")
_SEM_RE = re.compile(r"s([0-9]+)")
_DMA_QUEUE_RE = re.compile(rf"{Engine.DMA.text}([0-9]+)")   # any number: the verifier checks it
_TENSOR_RE = re.compile(r"(?P<name>\S+)\s+(?P<kind>\S+)\s+(?P<dtype>\S+)\s*\[(?P<shape>[^\]]*)\]")

_QUEUES = {e.text: e for e in Engine if e is not Engine.DMA}
_TENSOR_KINDS = {k.text: k for k in TensorKind}
_BOOLS = {"0": False, "1": True, "false": False, "true": True}
_BOOL_TEXT = {False: "0", True: "1"}
_ON_CHIP = {Mem.SBUF.text: Mem.SBUF, Mem.PSUM.text: Mem.PSUM}
_QUEUE_WIDTH = max(map(len, QUEUES))


# ---------------------------------------------------------------------------------------------
# Printing


def format_f32(value: float) -> str:
    """The text of fp32(value) that parses back to the same bits (see the grammar)."""
    bits = f32_bits(value)
    if bits & _EXP_MASK == _EXP_MASK:
        if bits & _MANT_MASK:
            return "nan" if bits == QUIET_NAN else f"nan:0x{bits:08x}"
        return "-inf" if bits >> 31 else "inf"
    exact = f32_value(bits)
    text = str(np.float32(exact))
    return text if f32_bits(float(text)) == bits else repr(exact)


def format_ap(ap: AP, program: Program | None = None) -> str:
    """One operand in the grammar's form; HBM operands print their tensor's name (`hbm@N` without a program)."""
    dims = "".join(f"[{stride},{count}]" for stride, count in ap.dims)
    tail = f"{ap.offset:+d}:{ap.dtype.text}{dims}"
    if ap.mem is Mem.HBM:
        known = program is not None and 0 <= ap.tensor < len(program.tensors)
        name = program.tensors[ap.tensor].name if known else f"hbm@{ap.tensor}"
        return f"{name}[{ap.partition_stride};{ap.partitions}]{tail}"
    return f"{ap.mem.text}[{ap.start_partition}:{ap.start_partition + ap.partitions}]{tail}"


def _format_value(field: Field, value, program: Program | None) -> str | None:
    kind = field.kind
    if kind is Kind.AP:
        return None if value is None else format_ap(value, program)
    if kind is Kind.F32:
        return format_f32(value)
    if kind is Kind.BOOL:
        return _BOOL_TEXT[value]
    if kind is Kind.ENUM:
        return value.text
    if kind is Kind.I32X4:
        return ",".join(str(operator.index(v)) for v in value)
    return str(operator.index(value))


_FIELDS = {op.name: {f.name: f for f in op.fields} for op in BY_NAME.values()}
_DEFAULT_TEXT = {(op.name, f.name): _format_value(f, f.default, None)
                 for op in BY_NAME.values() for f in op.fields if f.kind is not Kind.AP}


def format_instruction(instr: Instruction, program: Program | None = None) -> str:
    """One line: queue, opcode, the fields that are present and not default, waits, signals.

    Used in error messages about possibly ill-formed instructions, so a value of the wrong type
    prints as `?repr` instead of raising.
    """
    spec = BY_NAME.get(instr.opcode)
    parts = [f"{instr.queue_name:<{_QUEUE_WIDTH}}", str(instr.opcode)]
    for name, value in instr.args:
        field = _FIELDS[spec.name].get(name) if spec else None
        if field is None:
            parts.append(f"{name}=?{value!r}")
            continue
        try:
            text = _format_value(field, value, program)
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
            text = f"?{value!r}"
        if text is not None and (field.kind is Kind.AP or text != _DEFAULT_TEXT[(spec.name, name)]):
            parts.append(f"{name}={text}")
    try:
        sync = ([f"wait={','.join(f's{s}>={v}' for s, v in instr.waits)}"] if instr.waits else []) + \
            ([f"signal={','.join(f's{s}' for s in instr.signals)}"] if instr.signals else [])
    except (TypeError, ValueError):   # waits that are not pairs, or not iterable (the verifier says so)
        sync = [f"wait=?{instr.waits!r}", f"signal=?{instr.signals!r}"]
    return " ".join(parts + sync)


def format_program(program: Program) -> str:
    """The whole program as assembly text; EncodingError for a program the binary form refuses too,
    so the text never silently drops a value the grammar cannot write."""
    encode(program)
    lines = [f".target {program.target}"]
    lines += [f".tensor {t.name} {t.kind.text} {t.dtype.text} [{', '.join(str(s) for s in t.shape)}]"
              for t in program.tensors]
    if program.tensors and program.instructions:
        lines.append("")
    lines += [format_instruction(instr, program) for instr in program.instructions]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Parsing


def _int(text: str, what: str) -> int:
    if not _INT_RE.fullmatch(text):
        raise EncodingError(f"{what}: expected an integer (decimal or 0x hex), got {text!r}")
    sign = -1 if text[0] == "-" else 1
    body = text.lstrip("+-")
    try:
        return sign * int(body, 16 if body[:2].lower() == "0x" else 10)
    except ValueError:
        raise EncodingError(f"{what}: integer {text[:40]!r}... is too long") from None


def _decimal(text: str, what: str) -> int:
    """A decimal the grammar's regex has already matched."""
    try:
        return int(text)
    except ValueError:
        raise EncodingError(f"{what}: integer {text[:40]!r}... is too long") from None


def _f32(text: str, what: str) -> float:
    low = text.lower()
    if low in ("inf", "+inf", "-inf"):
        return float(low)
    if low == "nan":
        return f32_value(QUIET_NAN)
    match = _NAN_RE.fullmatch(low)
    if match:
        bits = int(match.group(1), 16)
        if bits & _EXP_MASK != _EXP_MASK or not bits & _MANT_MASK:
            raise EncodingError(f"{what}: 0x{bits:08x} is not the bit pattern of a NaN")
        return f32_value(bits)
    if not _F32_RE.fullmatch(text):
        raise EncodingError(f"{what}: expected an f32 (a decimal, inf, -inf, nan or nan:0xXXXXXXXX), got {text!r}")
    return f32_value(f32_bits(float(text)))


class _Parser:
    """Line-by-line state: the target, the tensors declared so far (by name) and the instructions."""

    def __init__(self):
        self.target: str | None = None
        self.tensors: list[TensorDecl] = []
        self.index: dict[str, int] = {}
        self.instructions: list[Instruction] = []
        self.aps: dict[str, AP] = {}

    def directive(self, line: str) -> None:
        head, *tail = line.split(None, 1)
        rest = tail[0].strip() if tail else ""
        if head == ".target":
            check_name(rest, "target")
            if self.target is not None:
                raise EncodingError(f"second .target (the first was '{self.target}')")
            self.target = rest
        elif head == ".tensor":
            m = _TENSOR_RE.fullmatch(rest)
            if not m:
                raise EncodingError("expected .tensor NAME KIND DTYPE [D0, D1, ...]")
            kind = _TENSOR_KINDS.get(m["kind"])
            if kind is None:
                raise EncodingError(f"unknown tensor kind '{m['kind']}'; expected one of {', '.join(_TENSOR_KINDS)}")
            dims = m["shape"].strip()
            shape = tuple(_int(d.strip(), "shape") for d in dims.split(",")) if dims else ()
            decl = TensorDecl(m["name"], kind, _dtype(m["dtype"]), shape)
            check_tensor(decl, set(self.index))
            self.index[decl.name] = len(self.tensors)
            self.tensors.append(decl)
        else:
            raise EncodingError(f"unknown directive '{head}'; expected .target or .tensor")

    def instruction(self, line: str) -> None:
        tokens = line.split()
        if len(tokens) < 2:
            raise EncodingError("expected QUEUE OPCODE FIELD=VALUE ...")
        engine, queue = _queue(tokens[0])
        spec = BY_NAME.get(tokens[1])
        if spec is None:
            raise EncodingError(f"unknown opcode '{tokens[1]}'; expected one of {', '.join(BY_NAME)}")
        fields = {f.name: f for f in spec.fields}
        values: dict = {}
        for token in tokens[2:]:
            key, eq, text = token.partition("=")
            if not eq or not text:
                raise EncodingError(f"expected FIELD=VALUE, got '{token}'")
            if key in values:
                raise EncodingError(f"'{key}' given twice")
            if key == "wait":
                values[key] = tuple(_wait(t) for t in text.split(","))
            elif key == "signal":
                values[key] = tuple(_semaphore(t) for t in text.split(","))
            elif key in fields:
                values[key] = self.value(fields[key], text)
            else:
                raise EncodingError(f"{spec.name} has no field '{key}'; its fields are "
                                    f"{', '.join(fields)}, plus wait and signal")
        args = []
        for f in spec.fields:
            if f.name not in values and f.kind is Kind.AP and not f.optional:
                raise EncodingError(f"{spec.name} needs operand '{f.name}'")
            args.append((f.name, values.get(f.name, None if f.kind is Kind.AP else f.default)))
        instr = Instruction(spec.name, engine, tuple(args), queue, values.get("wait", ()), values.get("signal", ()))
        encode_instruction(instr, len(self.tensors))
        self.instructions.append(instr)

    def value(self, field: Field, text: str):
        what = f"field '{field.name}'"
        kind = field.kind
        if kind is Kind.AP:
            return self.ap(text, what)
        if kind is Kind.F32:
            return _f32(text, what)
        if kind is Kind.BOOL:
            if text.lower() not in _BOOLS:
                raise EncodingError(f"{what}: expected 0, 1, true or false, got '{text}'")
            return _BOOLS[text.lower()]
        if kind is Kind.ENUM:
            try:
                return field.enum.from_text(text)
            except ValueError as e:
                raise EncodingError(f"{what}: {e}") from None
        if kind is Kind.I32X4:
            parts = text.split(",")
            if len(parts) != 4:
                raise EncodingError(f"{what}: expected four integers separated by commas, got '{text}'")
            return tuple(_int(p, what) for p in parts)
        return _int(text, what)

    def ap(self, text: str, what: str) -> AP:
        """The operand `text`; programs repeat operands, so each distinct text is parsed once."""
        ap = self.aps.get(text)
        if ap is None:
            ap = self.aps[text] = self.parse_ap(text, what)
        return ap

    def parse_ap(self, text: str, what: str) -> AP:
        m = _AP_RE.fullmatch(text)
        if not m:
            raise EncodingError(f"{what}: expected an access pattern, MEM[START:END]+OFFSET:DTYPE[STRIDE,COUNT]... "
                                f"or TENSOR[PARTITION_STRIDE;PARTITIONS]+OFFSET:DTYPE[STRIDE,COUNT]..., got '{text}'")
        dims = []
        for bracket in _BRACKETS_RE.findall(m["dims"]):
            d = _DIM_RE.fullmatch(bracket)
            if not d:
                raise EncodingError(f"{what}: expected a free dim [STRIDE,COUNT], got '{bracket}'")
            dims.append((_decimal(d["stride"], what), _decimal(d["count"], what)))
        dtype = _dtype(m["dtype"])
        offset = _decimal(m["offset"], what) if m["offset"] else 0
        a, b, name = _decimal(m["a"], what), _decimal(m["b"], what), m["name"]
        mem = _ON_CHIP.get(name)
        if mem is not None:
            if m["sep"] != ":" or a < 0 or b <= a:
                raise EncodingError(f"{what}: on-chip partitions are [START:END] with 0 <= START < END, "
                                    f"got '{name}[{m['a']}{m['sep']}{m['b']}]'")
            return AP(mem, dtype, b - a, tuple(dims), offset, start_partition=a)
        if m["sep"] != ";":
            raise EncodingError(f"{what}: an HBM operand is TENSOR[PARTITION_STRIDE;PARTITIONS], got '{text}'")
        if name not in self.index:
            declared = ", ".join(self.index) or "none"
            raise EncodingError(f"{what}: unknown tensor '{name}' (declared so far: {declared}; on chip: "
                                f"{', '.join(sorted(RESERVED_NAMES))})")
        return AP(Mem.HBM, dtype, b, tuple(dims), offset, tensor=self.index[name], partition_stride=a)


def _dtype(text: str) -> DType:
    try:
        return DType.from_text(text)
    except ValueError as e:
        raise EncodingError(str(e)) from None


def _queue(text: str) -> tuple[Engine, int]:
    if text in _QUEUES:
        return _QUEUES[text], 0
    m = _DMA_QUEUE_RE.fullmatch(text)
    if m:
        return Engine.DMA, _int(m.group(1), "DMA queue")
    raise EncodingError(f"unknown queue '{text}'; expected one of {', '.join(_QUEUES)} or dmaN")


def _wait(text: str) -> tuple[int, int]:
    m = _WAIT_RE.fullmatch(text)
    if not m:
        raise EncodingError(f"expected a wait sN>=V, got '{text}'")
    return _int(m.group(1), "semaphore"), _int(m.group(2), "wait value")


def _semaphore(text: str) -> int:
    m = _SEM_RE.fullmatch(text)
    if not m:
        raise EncodingError(f"expected a semaphore sN, got '{text}'")
    return _int(m.group(1), "semaphore")


def parse_program(text: str) -> Program:
    """The program written in `text`; EncodingError naming the line, its text and what was expected."""
    if not isinstance(text, str):
        raise EncodingError(f"expected assembly text (str), got {type(text).__name__}")
    parser = _Parser()
    with no_gc():
        for lineno, raw in enumerate(text.split("\n"), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                if line.startswith("."):
                    parser.directive(line)
                else:
                    parser.instruction(line)
            except EncodingError as e:
                raise EncodingError(f"line {lineno}: {e}\n    {lineno} | {raw.strip()}") from None
    return Program(tuple(parser.tensors), tuple(parser.instructions), parser.target or DEFAULT_TARGET)
