"""The .trnc artifact, the last step of the pipeline: a compiled model in one file, no pickle, nothing executed on load.

docs/artifact.md gives every byte: a 52-byte prefix (magic, format version, the program encoding's
version, header length, header sha256), a UTF-8 JSON header (input/output signature with machine and
torch dtypes, pytree specs, target and options, trnc version, stats, section table), then sections at
64-byte-aligned offsets: the program in isa/encoding.py's binary form and one raw little-endian array
per constant. `load` checks, in this order, the prefix, the header's checksum and JSON types, the
section table (bounds, alignment, overlaps, trailing bytes), zero padding and each section's sha256, the
program (decoder, HBM capacity, verifier, a bound on its work), the header's signature and constants
against the program, the pytree specs, and the saved stats against the performance model's; every
failure is an ArtifactError naming the problem. Sizes are compared with the file before anything is
allocated from them. The file is read and written as a plain Record; trnc/api.py wraps a Record into a
CompiledModel, and the compile cache (trnc/compile_cache.py) stores Records.

The pytree specs are checked node by node before torch parses them: torch's deserializer imports the
modules a spec names (enum contexts, defaultdict factories), which would run code chosen by the file.
torch and the performance model are imported only inside the functions that need them, so `read_header`
(for tools) stays cheap.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trnc import version
from trnc.errors import ArtifactError, TrncError
from trnc.isa.config import get_target
from trnc.isa.decoding import decode
from trnc.isa.encoding import FORMAT_VERSION as ISA_VERSION
from trnc.isa.encoding import encode
from trnc.isa.program import Program, TensorKind
from trnc.isa.verify import verify
from trnc.log import get_logger
from trnc.options import OPTION_NAMES, Options
from trnc.pytree_spec import SpecError, Unregistered, check_spec_nodes

MAGIC = b"TRNCART\0"
FORMAT_VERSION = 4   # 3: options fp8_format, fp8_scaling, emulate; 4: keep_precision, rounding, seed,
                     # attention_precision
PREFIX = struct.Struct("<8sIII32s")   # magic, format version, ISA encoding version, header length, header sha256
ALIGN = 64                            # section offsets are multiples of this: constants are used in place, aligned
MAX_HEADER_BYTES = 16 * 2**20
MAX_WORK_ELEMENTS = 2**36             # elements one run may reach: minutes on the JIT, far above any real model
_PROGRAM_MAGIC = b"TRNCISA\0"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REWRITE = "write it again with CompiledModel.save or `trnc compile`"

log = get_logger(__name__)


class _Bad(Exception):
    """A problem found by a check; load and read_header turn it into an ArtifactError naming the file."""

    def __init__(self, what: str, fix: str = _REWRITE):
        super().__init__(what)
        self.fix = fix


@dataclass(frozen=True)
class Record:
    """What an artifact holds: the program, its constants by name, how the model is called and answers
    (capture's CaptureInfo, or ArtifactInfo once loaded), the options it was compiled with and its stats."""

    program: Program
    constants: dict[str, np.ndarray]
    info: object
    options: Options
    stats: dict


@dataclass(frozen=True)
class ArtifactInfo:
    """CaptureInfo's counterpart for a loaded model (the same field names): how it is called and answers.

    `in_spec` (the pytree spec of `(args, kwargs)`) and `input_leaves` are None when the artifact has
    none; `out_spec` None means the outputs come back as a flat tuple.
    """

    in_spec: object
    out_spec: object
    input_leaves: tuple[int, ...] | None
    input_dtypes: tuple
    input_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple
    trnc_version: str
    input_layouts: tuple | None = None   # CaptureInfo's: each input's (strides, storage offset), checked per call


# -- writing -----------------------------------------------------------------------------------------------

def save(record: Record, path: Path) -> None:
    """Write `record` to `path` atomically (a temporary file, then a rename)."""
    program, info = record.program, record.info
    blobs = [("program", encode(program), {})]
    for decl in program.tensors_of(TensorKind.CONST):
        value = np.ascontiguousarray(record.constants[decl.name], dtype=decl.dtype.storage)
        blobs.append((f"const:{decl.name}", value.tobytes(), {"dtype": decl.dtype.text, "shape": list(decl.shape)}))
    header = {"trnc_version": version.__version__, "target": program.target, "options": vars(record.options),
              "inputs": _signature_json(program.tensors_of(TensorKind.INPUT), info.input_dtypes),
              "outputs": _signature_json(program.tensors_of(TensorKind.OUTPUT), info.output_dtypes),
              "in_spec": _spec_json(getattr(info, "in_spec", None), "input"),
              "input_leaves": _leaves_json(getattr(info, "input_leaves", None)),
              "out_spec": _spec_json(info.out_spec, "output"),
              "input_layouts": _layouts_json(getattr(info, "input_layouts", None)),
              "stats": _stats_json(record.stats), "sections": []}
    if header["in_spec"] is None:
        header["input_leaves"] = None
    offset = 0
    for name, data, extra in blobs:
        header["sections"].append({"name": name, "offset": offset, "length": len(data),
                                   "sha256": hashlib.sha256(data).hexdigest(), **extra})
        offset = _align(offset + len(data))
    head = json.dumps(header, separators=(",", ":")).encode()
    if len(head) > MAX_HEADER_BYTES:
        raise ArtifactError(f"{path}: the header would be {len(head)} bytes, over the limit of {MAX_HEADER_BYTES}")
    start = _align(PREFIX.size + len(head))
    out = bytearray(PREFIX.pack(MAGIC, FORMAT_VERSION, ISA_VERSION, len(head), hashlib.sha256(head).digest()))
    out += head
    for (_, data, _), section in zip(blobs, header["sections"]):
        out += bytes(start + section["offset"] - len(out))
        out += data
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(out)
        os.replace(tmp, path)
    except OSError as e:
        raise ArtifactError(f"cannot write {path}: {e.strerror}") from None


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _signature_json(decls, torch_dtypes) -> list[dict]:
    return [{"name": d.name, "shape": list(d.shape), "dtype": d.dtype.text, "torch_dtype": _dtype_name(t)}
            for d, t in zip(decls, torch_dtypes, strict=True)]


def _leaves_json(leaves) -> list[int] | None:
    return None if leaves is None else [int(i) for i in leaves]


def _layouts_json(layouts) -> list | None:
    return None if layouts is None else [None if x is None else [[int(s) for s in x[0]], int(x[1])] for x in layouts]


def _spec_json(spec, what: str):
    """The spec as JSON that load accepts, or None (with a warning: results then come back as a flat tuple)."""
    if spec is None:
        return None
    import torch.utils._pytree as pytree
    try:
        value = json.loads(pytree.treespec_dumps(spec))
        check_spec_nodes(value)
    except (SpecError, TypeError, ValueError, NotImplementedError) as e:
        log.warning("the %s structure is not saved (%s); the loaded model takes and returns flat tuples", what, e)
        return None
    return value


_DROP = object()


def _scalar(value):
    """`value` as a JSON scalar (non-finite numbers as null), or _DROP when it is not a scalar."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (bool, int, float, str)) else _DROP


def _stats_json(stats: dict) -> dict:
    """The stats that are scalars or flat dicts of scalars."""
    out = {}
    for key, value in stats.items():
        if isinstance(value, dict):
            out[key] = {str(k): v for k, v in ((k, _scalar(v)) for k, v in value.items()) if v is not _DROP}
        elif _scalar(value) is not _DROP:
            out[key] = _scalar(value)
    return out


# -- the prefix and the header ---------------------------------------------------------------------------

def read_header(path) -> dict:
    """The validated header of the artifact at `path`, reading only its prefix and header.

    Checks the prefix, the header checksum, the JSON types of every key and the section table against
    the file's size; not the sections' contents (that is `load`'s work).
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(PREFIX.size)
            head_len = _check_prefix(prefix, size)
            return _parse_header(prefix, f.read(head_len), size)
    except OSError as e:
        raise ArtifactError(f"cannot read {path}: {e.strerror}") from None
    except _Bad as e:
        raise ArtifactError(f"{path}: {e}; {e.fix}") from None


def _check_prefix(prefix: bytes, size: int) -> int:
    """The header length, after checking the prefix's magic, versions and lengths."""
    if len(prefix) < PREFIX.size:
        raise _Bad(f"truncated: {size} bytes, shorter than the {PREFIX.size}-byte prefix")
    magic, version, isa_version, head_len, _ = PREFIX.unpack(prefix)
    if magic == _PROGRAM_MAGIC:
        raise _Bad("this is a bare program, not a .trnc artifact", "inspect it with `trnc disasm`")
    if magic != MAGIC:
        raise _Bad(f"not a .trnc artifact: magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        newer = "a newer trnc: upgrade trnc to read it, or " if version > FORMAT_VERSION else ""
        raise _Bad(f"format version {version}; this trnc reads version {FORMAT_VERSION}",
                   f"it was written by {newer or 'an older trnc: '}compile the model again with this trnc")
    if isa_version != ISA_VERSION:
        raise _Bad(f"program encoding (ISA) version {isa_version}; this trnc's is version {ISA_VERSION}",
                   "compile the model again with this trnc")
    if head_len > MAX_HEADER_BYTES:
        raise _Bad(f"header length {head_len} is over the limit of {MAX_HEADER_BYTES} bytes")
    if PREFIX.size + head_len > size:
        raise _Bad(f"truncated: the header length {head_len} runs past the end of the file ({size} bytes)")
    return head_len


def _parse_header(prefix: bytes, head: bytes, size: int) -> dict:
    if hashlib.sha256(head).digest() != PREFIX.unpack(prefix)[4]:
        raise _Bad("the header fails its sha256 checksum (the file is corrupted)")
    try:
        header = json.loads(head.decode("utf-8"))
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _Bad(f"the header is not valid UTF-8 JSON ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict):
        raise _Bad(f"the header is a JSON {type(header).__name__}, not an object")
    _check_header(header, _align(PREFIX.size + len(head)), size)
    return header


def _get(obj: dict, key: str, where: str, types: tuple, type_text: str):
    """obj[key] (`where` names obj in the header, "" at the top) after checking its JSON type."""
    if key not in obj:
        raise _Bad(f"header {where or 'top level'}: missing key '{key}'")
    value = obj[key]
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise _Bad(f"header {where + '.' if where else ''}{key} must be {type_text}, got {json.dumps(value)[:60]}")
    return value


def _int(obj: dict, key: str, where: str) -> int:
    return _get(obj, key, where, (int,), "an integer")


def _str(obj: dict, key: str, where: str) -> str:
    return _get(obj, key, where, (str,), "a string")


def _shape(obj: dict, key: str, where: str) -> list[int]:
    shape = _get(obj, key, where, (list,), "a list of sizes")
    if not all(type(s) is int and 0 <= s < 2**63 for s in shape):
        raise _Bad(f"header {where}.{key} must hold sizes in [0, 2^63), got {json.dumps(shape)[:60]}")
    return shape


def _objects(obj: dict, key: str) -> list[dict]:
    items = _get(obj, key, "", (list,), "a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _Bad(f"header {key}[{i}] must be an object, got {json.dumps(item)[:60]}")
    return items


def _check_header(header: dict, data_start: int, size: int) -> None:
    """The JSON type of every key, and the section table against the file's size."""
    top = ""
    _str(header, "trnc_version", top)
    _str(header, "target", top)
    options = _get(header, "options", top, (dict,), "an object")
    if set(options) != set(OPTION_NAMES):
        raise _Bad(f"header options has keys {sorted(options)}; expected {', '.join(sorted(OPTION_NAMES))}")
    for key in options:
        if key == "emulate":
            _get(options, key, "options", (bool,), "true or false")
        elif key == "seed":
            _get(options, key, "options", (int,), "an integer")
        elif key == "keep_precision":
            kept = _get(options, key, "options", (dict,), "an object")
            for pattern in kept:
                _str(kept, pattern, "options.keep_precision")
        else:
            _str(options, key, "options")
    for part in ("inputs", "outputs"):
        for i, entry in enumerate(_objects(header, part)):
            where = f"{part}[{i}]"
            for key in ("name", "dtype", "torch_dtype"):
                _str(entry, key, where)
            _shape(entry, "shape", where)
    for key in ("in_spec", "out_spec"):
        _get(header, key, top, (list, type(None)), "a pytree spec or null")
    leaves = _get(header, "input_leaves", top, (list, type(None)), "a list of leaf indices or null")
    if leaves is not None and not all(type(i) is int and i >= 0 for i in leaves):
        raise _Bad(f"header input_leaves must hold indices >= 0, got {json.dumps(leaves)[:60]}")
    _check_stats(_get(header, "stats", top, (dict,), "an object"))
    _check_sections(_objects(header, "sections"), data_start, size)


def _check_stats(stats: dict) -> None:
    scalars = (type(None), bool, int, float, str)
    for key, value in stats.items():
        values = value.values() if isinstance(value, dict) else (value,)
        if not all(isinstance(v, scalars) for v in values):
            raise _Bad(f"header stats.{key} must be a number, string, null or an object of those")


def _check_sections(sections: list[dict], data_start: int, size: int) -> None:
    """Names known and unique, offsets aligned, every byte inside the file, no overlaps, nothing after the end."""
    names: set[str] = set()
    spans = []
    for i, s in enumerate(sections):
        where = f"sections[{i}]"
        name = _str(s, "name", where)
        if name in names:
            raise _Bad(f"section '{name}' is listed twice")
        if name != "program" and not name.startswith("const:"):
            raise _Bad(f"unknown section '{name}' (sections are 'program' and 'const:<tensor>')")
        names.add(name)
        offset, length = _int(s, "offset", where), _int(s, "length", where)
        if offset < 0 or offset % ALIGN:
            raise _Bad(f"section '{name}' offset {offset} is not a multiple of {ALIGN} >= 0")
        if length < 0:
            raise _Bad(f"section '{name}' has a negative length {length}")
        if data_start + offset + length > size:
            raise _Bad(f"truncated or bad length: section '{name}' (offset {offset}, length {length}) ends at byte "
                       f"{data_start + offset + length}, past the end of the file ({size} bytes)")
        if not _SHA256.fullmatch(_str(s, "sha256", where)):
            raise _Bad(f"section '{name}' sha256 is not 64 lowercase hex digits")
        if name != "program":
            _str(s, "dtype", where)
            _shape(s, "shape", where)
        spans.append((offset, offset + length, name))
    if "program" not in names:
        raise _Bad("the section table has no 'program' section")
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if end > start:
            raise _Bad(f"sections '{first}' and '{second}' overlap")
    end = data_start + max(e for _, e, _ in spans)
    if end != size:
        raise _Bad(f"{size - end} bytes follow the last section (the file should end at byte {end})")


# -- loading -----------------------------------------------------------------------------------------------

def load(path: Path, *, trusted: bool = False) -> Record:
    """The Record in the artifact at `path`, checked (docs/artifact.md) and verified before it can run; its
    stats are the performance model's with the saved ones (compile-side values) laid over them.

    trusted=True is for the compile cache's own entries, written by this very compiler (the cache key holds a
    fingerprint of its source) after the verifier accepted the program: every check of the file still runs,
    checksums included, but the program is not verified again and the saved stats are taken as they are
    (the performance model runs only if `.perf` is asked for). A user's artifact is never trusted."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ArtifactError(f"cannot read {path}: {e.strerror}") from None
    try:
        return _load(data, trusted)
    except _Bad as e:
        raise ArtifactError(f"{path}: {e}; {e.fix}") from None


def _load(data: bytes, trusted: bool) -> Record:
    prefix = data[:PREFIX.size]
    head_len = _check_prefix(prefix, len(data))
    header = _parse_header(prefix, data[PREFIX.size:PREFIX.size + head_len], len(data))
    try:
        options = Options(**header["options"])
    except TrncError as e:
        raise _Bad(f"header options: {e}") from None
    if header["target"] != options.target:
        raise _Bad(f"header target {header['target']!r} differs from options.target {options.target!r}")
    blobs = _sections(data, header, _align(PREFIX.size + head_len))
    program = _program(blobs.pop("program"), header["target"], trusted)
    inputs, outputs = _signature(program, header, TensorKind.INPUT), _signature(program, header, TensorKind.OUTPUT)
    _check_constant_entries(program, header)
    constants = _constants(program, blobs)
    in_spec = _spec(header["in_spec"], "in_spec")
    out_spec = _spec(header["out_spec"], "out_spec")
    leaves = _input_leaves(header["input_leaves"], in_spec, len(inputs))
    if out_spec is not None and out_spec.num_leaves != len(outputs):
        raise _Bad(f"header out_spec has {out_spec.num_leaves} leaves; the program has {len(outputs)} outputs")
    info = ArtifactInfo(in_spec, out_spec, leaves, tuple(t for _, t in inputs),
                        tuple(tuple(d.shape) for d, _ in inputs), tuple(t for _, t in outputs),
                        header["trnc_version"], _input_layouts(header.get("input_layouts"), inputs))
    return Record(program, constants, info, options, header["stats"] if trusted else _stats(program, header))


def _stats(program: Program, header: dict) -> dict:
    """The performance model's stats of the program, the saved ones (compile-side values: they win, as in
    compile) laid over them after each matched the form of the model's."""
    from trnc.passes.roofline import program_stats
    from trnc.runtime import perf
    hw = get_target(program.target)
    try:
        stats = program_stats(perf.simulate(program, hw, verified=True), hw)
    except TrncError as e:
        raise _Bad(f"the program cannot be modeled: {e}") from None
    for key, value in header["stats"].items():
        if key in stats and _kind(value) != _kind(stats[key]):
            raise _Bad(f"header stats.{key} is {json.dumps(value)[:60]}; the model's {key} is of the form "
                       f"{json.dumps(_kind(stats[key]))[:60]}")
        stats[key] = value
    return stats


def _kind(value):
    """'number' (null too: a non-finite number is saved as null), 'str', 'bool', or for a dict the kinds of its
    values: the form that readers of stats rely on."""
    if isinstance(value, dict):
        return {k: _kind(v) for k, v in value.items()}
    if isinstance(value, (bool, str)):
        return type(value).__name__
    return "number" if value is None or isinstance(value, (int, float, np.number)) else type(value).__name__


def _sections(data: bytes, header: dict, data_start: int) -> dict[str, memoryview]:
    """Each section's bytes (views into `data`, not copies), after its sha256 matched and the padding before
    it was zero: every byte of the file is checked."""
    view = memoryview(data)
    blobs = {}
    end = PREFIX.size + PREFIX.unpack_from(data)[3]
    for s in sorted(header["sections"], key=lambda s: (s["offset"], s["length"])):
        start = data_start + s["offset"]
        if view[end:start].tobytes().strip(b"\0"):
            raise _Bad(f"the padding before section '{s['name']}' is not zero (the file is corrupted)")
        end = start + s["length"]
        blob = view[start:end]
        if hashlib.sha256(blob).hexdigest() != s["sha256"]:
            raise _Bad(f"section '{s['name']}' fails its sha256 checksum (the file is corrupted)")
        blobs[s["name"]] = blob
    return blobs


def _program(blob: memoryview, target: str, trusted: bool) -> Program:
    """The decoded program, on the header's target, fitting the target's HBM, and verified (unless trusted)."""
    try:
        program = decode(blob)
    except TrncError as e:
        raise _Bad(f"invalid program section: {e}") from None
    if program.target != target:
        raise _Bad(f"the program is for target {program.target!r}; the header says {target!r}")
    hw = get_target(target)
    hbm = sum(t.num_bytes for t in program.tensors)
    if hbm > hw.hbm_bytes:
        raise _Bad(f"the program's tensors need {hbm} bytes of HBM; {target} has {hw.hbm_bytes}")
    if trusted:     # the compiler's own output, verified when it was compiled
        return program
    try:
        verify(program, hw)
    except TrncError as e:
        raise _Bad(f"the program fails verification: {e}") from None
    work = _work(program)
    if work > MAX_WORK_ELEMENTS:
        raise _Bad(f"the program's instructions reach {work} elements in all; trnc runs at most "
                   f"{MAX_WORK_ELEMENTS} (2^36) per call (repeated reads through zero strides count each time)")
    return program


def _work(program: Program) -> int:
    """Elements the instructions reach: per instruction its largest operand, each read of a repeated element
    counted. The verifier bounds where an operand reaches, not how often (a zero-stride read of 65535^4
    elements is legal), so this bounds how long running the program can take."""
    sizes: dict = {}
    total = 0
    for ins in program.instructions:
        largest = 0
        for _, ap, _ in ins.operands():
            n = sizes.get(ap)
            if n is None:
                n = sizes[ap] = ap.num_elements
            largest = max(largest, n)
        total += largest
    return total


def _torch_dtypes() -> dict:
    """torch dtypes a caller may pass or get, by name: those capture maps to a machine dtype."""
    from trnc.dtypes import DTYPES
    return {_dtype_name(t): t for t in DTYPES}


def _signature(program: Program, header: dict, kind: TensorKind) -> list[tuple]:
    """(declaration, torch dtype) per program input or output, after the header's entry matched it."""
    from trnc.dtypes import EXCHANGED_DTYPES
    part = "inputs" if kind is TensorKind.INPUT else "outputs"
    decls, entries = program.tensors_of(kind), header[part]
    if len(entries) != len(decls):
        raise _Bad(f"the header lists {len(entries)} {part}; the program has {len(decls)}")
    names = _torch_dtypes()
    out = []
    for i, (decl, entry) in enumerate(zip(decls, entries)):
        given = (entry["name"], tuple(entry["shape"]), entry["dtype"])
        if given != (decl.name, decl.shape, decl.dtype.text):
            raise _Bad(f"header {part}[{i}] is {given[0]} {list(given[1])} {given[2]}; the program's is "
                       f"{decl.name} {list(decl.shape)} {decl.dtype.text}")
        torch_dtype = names.get(entry["torch_dtype"])
        if torch_dtype is None:
            raise _Bad(f"header {part}[{i}] torch_dtype {entry['torch_dtype']!r} is not one of {', '.join(names)}")
        if decl.dtype not in EXCHANGED_DTYPES or torch_dtype.is_floating_point != decl.dtype.is_float:
            raise _Bad(f"header {part}[{i}]: a torch {entry['torch_dtype']} tensor cannot be exchanged with "
                       f"program tensor {decl.name} ({decl.dtype.text})")
        out.append((decl, torch_dtype))
    return out


def _constants(program: Program, blobs: dict[str, memoryview]) -> dict[str, np.ndarray]:
    """Each constant the program declares, as a read-only array over the file's bytes."""
    constants = {}
    for decl in program.tensors_of(TensorKind.CONST):
        blob = blobs.pop(f"const:{decl.name}", None)
        if blob is None:
            raise _Bad(f"no section holds constant '{decl.name}'")
        if len(blob) != decl.num_bytes:
            raise _Bad(f"constant '{decl.name}' section has {len(blob)} bytes; {decl.dtype.text} "
                       f"{list(decl.shape)} needs {decl.num_bytes}")
        constants[decl.name] = np.frombuffer(blob, dtype=decl.dtype.storage).reshape(decl.shape)
    if blobs:
        raise _Bad(f"section '{next(iter(blobs))}' names no constant of the program")
    return constants


def _check_constant_entries(program: Program, header: dict) -> None:
    """The section table's declared dtype and shape of each constant equal the program's declaration."""
    decls = {d.name: d for d in program.tensors_of(TensorKind.CONST)}
    for s in header["sections"]:
        decl = decls.get(s["name"].removeprefix("const:")) if s["name"] != "program" else None
        if decl is not None and (s["dtype"], tuple(s["shape"])) != (decl.dtype.text, decl.shape):
            raise _Bad(f"section '{s['name']}' is {s['dtype']} {s['shape']}; the program declares "
                       f"{decl.dtype.text} {list(decl.shape)}")


def _spec(value, key: str):
    """The TreeSpec of header `key`, None when absent or of a node type this process has not registered."""
    if value is None:
        return None
    import torch.utils._pytree as pytree
    try:
        check_spec_nodes(value)
    except Unregistered as e:
        log.warning("the artifact's %s uses pytree type %s, not registered here (import its module before "
                    "trnc.load to get it back); using flat tuples", key, e.kind)
        return None
    except SpecError as e:
        raise _Bad(f"header {key}: {e}") from None
    try:
        spec = pytree.treespec_loads(json.dumps(value))
        pytree.tree_unflatten([None] * spec.num_leaves, spec)
    except Exception as e:   # torch raises assorted types for specs whose contexts do not fit their nodes
        raise _Bad(f"header {key} is not a valid pytree spec ({type(e).__name__}: {e})") from None
    return spec


def _input_layouts(layouts, inputs) -> tuple | None:
    """The optional header input_layouts: None, or per input None or [strides of its rank, storage offset]."""
    if layouts is None:
        return None

    def layout(x, decl) -> tuple | None:
        if x is None:
            return None
        if not (isinstance(x, list) and len(x) == 2 and isinstance(x[0], list) and len(x[0]) == len(decl.shape)
                and all(type(v) is int for v in x[0] + [x[1]])):
            raise _Bad(f"header input_layouts entries must be null or [strides of the input's rank, storage offset], "
                       f"got {json.dumps(x)[:60]}")
        return tuple(x[0]), x[1]
    if not isinstance(layouts, list) or len(layouts) != len(inputs):
        raise _Bad(f"header input_layouts must be null or a list of {len(inputs)} layouts")
    return tuple(layout(x, decl) for x, (decl, _) in zip(layouts, inputs))


def _input_leaves(leaves: list[int] | None, in_spec, inputs: int) -> tuple[int, ...] | None:
    if leaves is None or in_spec is None:
        return None
    if len(leaves) != inputs or len(set(leaves)) != inputs or max(leaves, default=-1) >= in_spec.num_leaves:
        raise _Bad(f"header input_leaves {leaves[:8]} must be {inputs} distinct indices below the in_spec's "
                   f"{in_spec.num_leaves} leaves")
    return tuple(leaves)
