"""The .trnc artifact: a compiled model in one file, with no pickle and nothing executed on load.

Layout (little-endian):
  magic    8 bytes  b"TRNCART\\0"
  version  u32      FORMAT_VERSION
  length   u32      bytes of the JSON header
  header   JSON     trnc version, target, options, input/output signature, output pytree spec,
                    stats, and `sections`: [{name, offset, length, sha256}] (offsets after the header)
  sections          "program" (isa/encoding.py binary), then one "const:<tensor>" per constant
                    (raw little-endian elements of the tensor's declared dtype and shape)
Loading checks the magic, version, every length and checksum, decodes and verifies the program,
and only then returns a model that can run.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

import trnc
from trnc.errors import ArtifactError, TrncError
from trnc.isa.config import TARGETS, get_target
from trnc.isa.decoding import decode
from trnc.isa.encoding import encode
from trnc.isa.program import TensorKind
from trnc.isa.verify import verify

MAGIC = b"TRNCART\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")


@dataclass
class ArtifactInfo:
    """The part of the capture a loaded model needs: how to rebuild the output structure."""

    out_spec: object
    output_dtypes: list


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def save(model, path: Path) -> None:
    program_bytes = encode(model.program)
    blobs = [("program", program_bytes)]
    for decl in model.program.tensors_of(TensorKind.CONST):
        value = np.ascontiguousarray(model.constants[decl.name])
        blobs.append((f"const:{decl.name}", value.tobytes()))
    try:
        out_spec = pytree.treespec_dumps(model.info.out_spec) if model.info.out_spec is not None else None
    except Exception:   # a pytree node type torch cannot serialize: results come back as a flat tuple
        out_spec = None
    sections, offset = [], 0
    for name, data in blobs:
        sections.append({"name": name, "offset": offset, "length": len(data),
                         "sha256": hashlib.sha256(data).hexdigest()})
        offset += len(data)
    header = {"trnc_version": trnc.__version__, "target": model.program.target,
              "options": vars(model.options), "out_spec": out_spec,
              "output_dtypes": [_dtype_name(d) for d in model.info.output_dtypes],
              "inputs": [{"name": t.name, "dtype": t.dtype.text, "shape": list(t.shape)} for t in model.inputs],
              "outputs": [{"name": t.name, "dtype": t.dtype.text, "shape": list(t.shape)} for t in model.outputs],
              "stats": {k: v for k, v in model.stats.items() if isinstance(v, (int, float, str, dict))},
              "sections": sections}
    head = json.dumps(header).encode()
    path.write_bytes(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)) + head + b"".join(d for _, d in blobs))


def _fail(path: Path, what: str) -> ArtifactError:
    return ArtifactError(f"{path}: {what}; write it again with CompiledModel.save or `trnc compile`")


def load(path: Path):
    from trnc.api import CompiledModel
    from trnc.passes.pipeline import Options
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"cannot read {path}: {e.strerror}") from None
    if len(data) < _PREFIX.size:
        raise _fail(path, f"only {len(data)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, version, head_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise _fail(path, f"not a .trnc artifact (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise _fail(path, f"format version {version}; this trnc reads version {FORMAT_VERSION}")
    body = _PREFIX.size + head_len
    if body > len(data):
        raise _fail(path, f"header length {head_len} runs past the end of the file ({len(data)} bytes)")
    try:
        header = json.loads(data[_PREFIX.size:body])
        sections = {s["name"]: s for s in header["sections"]}
        options = Options(**header["options"])
        output_dtypes = [getattr(torch, d) for d in header["output_dtypes"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise _fail(path, f"malformed header ({type(e).__name__}: {e})") from None
    if options.target not in TARGETS:
        raise _fail(path, f"unknown target {options.target!r}")
    blobs = {}
    for name, s in sections.items():
        start, length = s.get("offset"), s.get("length")
        if not (isinstance(start, int) and isinstance(length, int) and 0 <= start and 0 <= length
                and body + start + length <= len(data)):
            raise _fail(path, f"section {name!r} (offset {start}, length {length}) lies outside the file")
        blob = data[body + start: body + start + length]
        if hashlib.sha256(blob).hexdigest() != s.get("sha256"):
            raise _fail(path, f"section {name!r} fails its checksum")
        blobs[name] = blob
    if "program" not in blobs:
        raise _fail(path, "no program section")
    try:
        program = decode(blobs["program"])
        verify(program, get_target(program.target))
    except TrncError as e:
        raise _fail(path, f"invalid program: {e}") from None
    constants = {}
    for decl in program.tensors_of(TensorKind.CONST):
        blob = blobs.get(f"const:{decl.name}")
        if blob is None or len(blob) != decl.num_bytes:
            raise _fail(path, f"constant {decl.name} is missing or not {decl.num_bytes} bytes")
        constants[decl.name] = np.frombuffer(blob, dtype=decl.dtype.storage).reshape(decl.shape)
    try:
        out_spec = pytree.treespec_loads(header["out_spec"]) if header.get("out_spec") else None
    except Exception as e:
        raise _fail(path, f"malformed output structure ({e})") from None
    if len(output_dtypes) != len(program.tensors_of(TensorKind.OUTPUT)):
        raise _fail(path, "output signature does not match the program's outputs")
    model = CompiledModel(program, constants, ArtifactInfo(out_spec, output_dtypes), options)
    return model
