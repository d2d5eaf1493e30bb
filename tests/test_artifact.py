"""The .trnc artifact: round trips of compiled models, the header, and one malformed file per check of load.

`split` and `build` read and write the layout as docs/artifact.md gives it (not through trnc/artifact.py),
so the document is tested too; build recomputes every checksum, which lets a test reach the check
behind them. tests/test_artifact_fuzz.py uses them for its structure-aware mutations.
"""
import copy
import dataclasses
import hashlib
import json
import logging
import pickle
import struct
import sys

import pytest
import torch

import trnc
from trnc import artifact, flags
from trnc.errors import ArtifactError
from trnc.isa.ap import AP, Engine, Mem
from trnc.isa.decoding import decode
from trnc.isa.dtypes import DType
from trnc.isa.encoding import FORMAT_VERSION as ISA_VERSION
from trnc.isa.encoding import encode
from trnc.isa.enums import ReduceOp
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind
from trnc.isa.verify import verify

ALIGN = 64
PREFIX = struct.Struct("<8sIII32s")   # magic, format version, ISA version, header length, header sha256
MAGIC = b"TRNCART\0"


def _align(n):
    return -(-n // ALIGN) * ALIGN


def split(data):
    """(header, {section name: bytes}) of a valid artifact."""
    head_len = PREFIX.unpack_from(data)[3]
    header = json.loads(data[PREFIX.size:PREFIX.size + head_len])
    start = _align(PREFIX.size + head_len)
    return header, {s["name"]: data[start + s["offset"]:start + s["offset"] + s["length"]] for s in header["sections"]}


def build(header, blobs, mutate=None, version=artifact.FORMAT_VERSION, isa_version=ISA_VERSION):
    """An artifact of `blobs` with correct offsets, lengths and checksums; `mutate(header)` then edits the header
    (its checksum is recomputed; the sections stay where the unedited table put them)."""
    header = copy.deepcopy(header)
    offset, placed = 0, []
    for s in header["sections"]:
        blob = blobs[s["name"]]
        s.update(offset=offset, length=len(blob), sha256=hashlib.sha256(blob).hexdigest())
        placed.append((offset, blob))
        offset = _align(offset + len(blob))
    if mutate is not None:
        mutate(header)
    head = json.dumps(header).encode()
    head += b" " * (_align(PREFIX.size + len(head) + ALIGN) - PREFIX.size - len(head))   # slack: JSON whitespace
    out = bytearray(PREFIX.pack(MAGIC, version, isa_version, len(head), hashlib.sha256(head).digest()) + head)
    for at, blob in placed:
        out += bytes(len(head) + PREFIX.size + at - len(out)) + blob
    return bytes(out)


class Embed(torch.nn.Module):
    """int64 ids in, a dict holding a tuple out."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(6, 4)
        self.proj = torch.nn.Linear(4, 2)

    def forward(self, ids, x):
        h = self.emb(ids)
        return {"y": self.proj(h) + x, "rest": (h.sum(-1), x > 0)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(compiled, args, saved path) of an MLP (fp32) and of Embed (bf16)."""
    tmp = tmp_path_factory.mktemp("artifact")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with flags.override(TRNC_CACHE_DIR=str(tmp / "cache")):
        out = {}
        for name, model, args, precision in (
                ("mlp", mlp, (torch.randn(2, 8),), "fp32"),
                ("embed", Embed(), (torch.tensor([[1, 5, 0]]), torch.randn(1, 3, 2)), "bf16")):
            compiled = trnc.compile(model, args, precision=precision)
            compiled.save(tmp / f"{name}.trnc")
            out[name] = (compiled, args, tmp / f"{name}.trnc")
        yield out


@pytest.fixture(autouse=True)
def cache_dir(tmp_path):
    with flags.override(TRNC_CACHE_DIR=str(tmp_path / "cache")):
        yield


# -- round trips -------------------------------------------------------------------------------------------

def test_mlp_round_trip_gives_equal_outputs(models):
    compiled, args, path = models["mlp"]
    loaded = trnc.load(path)
    assert torch.equal(loaded(*args), compiled(*args))
    assert loaded.info.input_dtypes == (torch.float32,)
    assert loaded.info.input_shapes == ((2, 8),)
    assert loaded.info.output_dtypes == (torch.float32,)
    assert loaded.info.in_spec == compiled.info.in_spec and loaded.info.out_spec == compiled.info.out_spec
    assert loaded.info.input_leaves == compiled.info.input_leaves
    assert vars(loaded.options) == vars(compiled.options)
    assert loaded.stats == compiled.stats
    assert {"compile_seconds", "cycles", "sbuf_peak_bytes"} <= set(loaded.stats)


def test_int64_inputs_and_dict_tuple_outputs_round_trip(models):
    compiled, args, path = models["embed"]
    loaded = trnc.load(path)
    assert loaded.info.input_dtypes == (torch.int64, torch.float32)
    assert loaded.options.precision == "bf16"
    want, got = compiled(*args), loaded(*args)
    assert set(got) == {"y", "rest"} and isinstance(got["rest"], tuple) and len(got["rest"]) == 2
    for a, b in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert got["rest"][1].dtype == torch.bool


def test_saving_a_loaded_model_writes_the_same_bytes(models, tmp_path):
    _, _, path = models["embed"]
    trnc.load(path).save(tmp_path / "again.trnc")
    assert (tmp_path / "again.trnc").read_bytes() == path.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_header_fields(models):
    compiled, _, path = models["embed"]
    data = path.read_bytes()
    magic, version, isa_version, head_len, _ = PREFIX.unpack_from(data)
    assert (magic, version, isa_version) == (MAGIC, artifact.FORMAT_VERSION, ISA_VERSION)
    header = artifact.read_header(path)
    assert header == json.loads(data[PREFIX.size:PREFIX.size + head_len])
    assert header["trnc_version"] == trnc.__version__
    assert header["target"] == "trn2" and header["options"] == {"precision": "bf16", "auto_cast": "matmult",
                                                                "target": "trn2", "fp8_format": "e4m3",
                                                                "fp8_scaling": "dynamic", "mx_scale": "floor",
                                                                "emulate": False, "keep_precision": {},
                                                                "rounding": "nearest", "seed": 0,
                                                                    "attention_precision": "auto"}
    assert [(i["name"], i["shape"], i["dtype"], i["torch_dtype"]) for i in header["inputs"]] == [
        (d.name, list(d.shape), d.dtype.text, t) for d, t in zip(compiled.inputs, ("int64", "float32"))]
    assert [o["torch_dtype"] for o in header["outputs"]] == ["float32", "float32", "bool"]
    assert header["out_spec"][0] == 1 and header["in_spec"][0] == 1 and header["input_leaves"] == [0, 1]
    assert header["stats"]["instructions"] == compiled.stats["instructions"]
    names = [s["name"] for s in header["sections"]]
    assert names == ["program"] + [f"const:{d.name}" for d in compiled.program.tensors_of(TensorKind.CONST)]
    for s in header["sections"]:
        start = _align(PREFIX.size + head_len) + s["offset"]
        assert s["offset"] % ALIGN == 0
        assert hashlib.sha256(data[start:start + s["length"]]).hexdigest() == s["sha256"]
    program = decode(split(data)[1]["program"])
    assert program == compiled.program


def test_load_uses_no_pickle(models, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    compiled, args, path = models["mlp"]
    assert torch.equal(trnc.load(path)(*args), compiled(*args))


# -- malformed files ---------------------------------------------------------------------------------------

def _load_bytes(tmp_path, data):
    path = tmp_path / "bad.trnc"
    path.write_bytes(data)
    return trnc.load(path)


def _rejects(tmp_path, data, *words):
    with pytest.raises(ArtifactError) as e:
        _load_bytes(tmp_path, data)
    for w in words:
        assert w in str(e.value), str(e.value)
    return str(e.value)


def _parts(models, name="mlp"):
    return split(models[name][2].read_bytes())


def _with_program(models, change):
    header, blobs = _parts(models)
    program = decode(blobs["program"])
    return build(header, {**blobs, "program": encode(change(program))})


def _set_prefix(data, index, value):
    fields = list(PREFIX.unpack_from(data))
    fields[index] = value
    return PREFIX.pack(*fields) + data[PREFIX.size:]


def test_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="cannot read"):
        trnc.load(tmp_path / "nope.trnc")


@pytest.mark.parametrize("cut", [0, 10, PREFIX.size, PREFIX.size + 30, -1])
def test_truncated(models, tmp_path, cut):
    data = models["mlp"][2].read_bytes()
    _rejects(tmp_path, data[:cut], "truncated")


def test_wrong_magic_and_bare_program(models, tmp_path):
    data = models["mlp"][2].read_bytes()
    _rejects(tmp_path, b"PK\3\4" + data[4:], "not a .trnc artifact", "magic")
    _rejects(tmp_path, _parts(models)[1]["program"], "bare program", "trnc disasm")


@pytest.mark.parametrize("version,words", [(3, ("format version 3", "older")), (5, ("format version 5", "newer"))])
def test_wrong_format_version(models, tmp_path, version, words):
    _rejects(tmp_path, _set_prefix(models["mlp"][2].read_bytes(), 1, version), *words)


def test_wrong_isa_version(models, tmp_path):
    header, blobs = _parts(models)
    _rejects(tmp_path, build(header, blobs, isa_version=ISA_VERSION + 1), "ISA", f"version {ISA_VERSION + 1}")


@pytest.mark.parametrize("length,words", [(2**32 - 1, ("over the limit",)), (10**6, ("truncated", "header length"))])
def test_oversized_header_length(models, tmp_path, length, words):
    _rejects(tmp_path, _set_prefix(models["mlp"][2].read_bytes(), 3, length), *words)


def test_header_checksum(models, tmp_path):
    data = bytearray(models["mlp"][2].read_bytes())
    data[PREFIX.size + 5] ^= 1
    _rejects(tmp_path, bytes(data), "header fails its sha256")


def _raw_header(head: bytes) -> bytes:
    return PREFIX.pack(MAGIC, artifact.FORMAT_VERSION, ISA_VERSION, len(head), hashlib.sha256(head).digest()) + head


def test_header_not_json_or_not_an_object(tmp_path):
    _rejects(tmp_path, _raw_header(b"{not json"), "not valid UTF-8 JSON")
    _rejects(tmp_path, _raw_header(b"\xff\xfe"), "not valid UTF-8 JSON")
    _rejects(tmp_path, _raw_header(b"[" * 100_000), "not valid UTF-8 JSON")
    _rejects(tmp_path, _raw_header(b"[1, 2]"), "JSON list, not an object")


@pytest.mark.parametrize("path,value,words", [
    (("options",), [], ("options must be an object",)),
    (("options", "precision"), 16, ("options.precision must be a string",)),
    (("inputs", 0, "shape"), "2x8", ("inputs[0].shape must be a list",)),
    (("inputs", 0, "shape"), [2, -8], ("inputs[0].shape must hold sizes",)),
    (("outputs",), {"a": 1}, ("outputs must be a list",)),
    (("trnc_version",), None, ("trnc_version must be a string",)),
    (("sections", 0, "offset"), 0.0, ("sections[0].offset must be an integer",)),
    (("sections", 1, "length"), True, ("sections[1].length must be an integer",)),
    (("stats", "pass_seconds"), {"a": {"b": 1}}, ("stats.pass_seconds",)),
    (("input_leaves",), ["0"], ("input_leaves",)),
    (("out_spec",), "*", ("out_spec must be a pytree spec",)),
])
def test_wrong_json_types(models, tmp_path, path, value, words):
    header, blobs = _parts(models)

    def mutate(h):
        obj = h
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    _rejects(tmp_path, build(header, blobs, mutate), *words)


def test_missing_key(models, tmp_path):
    header, blobs = _parts(models)
    _rejects(tmp_path, build(header, blobs, lambda h: h.pop("stats")), "missing key 'stats'")


def _section(key, value, index=1):
    def mutate(h):
        h["sections"][index][key] = value
    return mutate


@pytest.mark.parametrize("mutate,words", [
    (_section("offset", 2**63), ("past the end of the file",)),
    (_section("length", 2**62), ("past the end of the file",)),
    (_section("length", -1), ("negative length",)),
    (_section("offset", -ALIGN), ("multiple of 64",)),
    (_section("offset", 4), ("multiple of 64",)),
    (_section("offset", 0), ("overlap",)),
    (_section("name", "const:c_0_bias", index=3), ("listed twice",)),
    (_section("name", "weights"), ("unknown section 'weights'",)),
    (lambda h: h["sections"].append({**h["sections"][-1], "name": "const:c_extra", "length": 0,
                                     "sha256": hashlib.sha256(b"").hexdigest()}), ("names no constant",)),
    (_section("sha256", "ABC"), ("64 lowercase hex",)),
    (_section("sha256", "0" * 64), ("fails its sha256 checksum",)),
    (lambda h: h["sections"].pop(0), ("no 'program' section",)),
    (lambda h: h["sections"].pop(), ("bytes follow the last section",)),
])
def test_bad_section_table(models, tmp_path, mutate, words):
    header, blobs = _parts(models)
    _rejects(tmp_path, build(header, blobs, mutate), *words)


def test_missing_constant_section(models, tmp_path):
    header, blobs = _parts(models)
    gone = header["sections"].pop(1)["name"]
    _rejects(tmp_path, build(header, blobs), f"no section holds constant '{gone[6:]}'")


def test_reordered_section_table_loads(models, tmp_path):
    header, blobs = _parts(models)
    compiled, args, _ = models["mlp"]
    loaded = _load_bytes(tmp_path, build(header, blobs, lambda h: h["sections"].reverse()))
    assert torch.equal(loaded(*args), compiled(*args))


def test_section_checksum(models, tmp_path):
    data = bytearray(models["mlp"][2].read_bytes())
    data[-1] ^= 0x40   # the last constant's last byte
    _rejects(tmp_path, bytes(data), "section 'const:", "fails its sha256 checksum")


def test_padding_must_be_zero(models, tmp_path):
    data = bytearray(models["mlp"][2].read_bytes())
    header, _ = _parts(models)
    program = header["sections"][0]
    assert program["length"] % ALIGN, "the test needs padding after the program"
    data[_align(PREFIX.size + PREFIX.unpack_from(data)[3]) + program["length"]] = 1
    _rejects(tmp_path, bytes(data), "padding before section", "not zero")


def test_trailing_bytes(models, tmp_path):
    _rejects(tmp_path, models["mlp"][2].read_bytes() + b"\0" * ALIGN, "bytes follow the last section")


def test_invalid_instruction_fields(models, tmp_path):
    header, blobs = _parts(models)
    program = blobs["program"]
    start = len(encode(dataclasses.replace(decode(program), instructions=())))   # the first opcode's offset
    bad = program[:start] + b"\xff\xff" + program[start + 2:]
    _rejects(tmp_path, build(header, {**blobs, "program": bad}), "invalid program section", "unknown opcode 65535")
    _rejects(tmp_path, build(header, {**blobs, "program": program[:-3]}), "invalid program section", " left")


def test_access_out_of_bounds_fails_verification(models, tmp_path):
    def far(program):
        ins = program.instructions[0]
        name, ap, _ = next(o for o in ins.operands() if o[1].mem is not Mem.HBM)
        moved = dataclasses.replace(ap, offset=ap.offset + 2**30)
        instructions = (ins.replace(args=tuple((k, moved if k == name else v) for k, v in ins.args)),
                        *program.instructions[1:])
        return dataclasses.replace(program, instructions=instructions)
    _rejects(tmp_path, _with_program(models, far), "fails verification", "ap-bounds")


def test_tensors_over_hbm_capacity(models, tmp_path):
    def huge(program):
        tensors = tuple(dataclasses.replace(t, shape=(2**40,)) if t.kind is TensorKind.SCRATCH else t
                        for t in program.tensors)
        return dataclasses.replace(program, tensors=tensors)
    _rejects(tmp_path, _with_program(models, huge), "bytes of HBM")


def test_unbounded_work_is_refused(models, tmp_path):
    """Zero-stride reads pass the verifier (each operand stays within its 2^32-element bound), but 17 of them
    reach 17 * 65535^2 elements, past the 2^36 a call may run."""
    out = TensorDecl("o", TensorKind.OUTPUT, DType.FP32, (1, 1))
    dst = AP(Mem.SBUF, DType.FP32, 1, ((1, 1),))
    src = AP(Mem.SBUF, DType.FP32, 1, ((0, 65535),) * 2, offset=64)
    reduces = tuple(Instruction.make("tensor_reduce", Engine.DVE, dst=dst, src=src, op=ReduceOp.SUM, axes=3)
                    for _ in range(16))
    program = Program((out,), (
        Instruction.make("memset", Engine.DVE, dst=AP(Mem.SBUF, DType.FP32, 1, ((1, 1),), offset=64), value=1.0),
        *reduces,
        Instruction.make("tensor_reduce", Engine.DVE, dst=dst, src=src, op=ReduceOp.SUM, axes=3, signals=(0,)),
        Instruction.make("dma_copy", Engine.DMA, dst=AP(Mem.HBM, DType.FP32, 1, ((1, 1),), tensor=0), src=dst,
                         waits=((0, 1),))), "trn2")
    verify(program)
    header, blobs = _parts(models)
    _rejects(tmp_path, build(header, {**blobs, "program": encode(program)}), f"{17 * 65535**2 + 2} elements",
             "2^36")


def test_constant_size_and_dtype_must_match_the_program(models, tmp_path):
    header, blobs = _parts(models)
    name = header["sections"][1]["name"]
    _rejects(tmp_path, build(header, {**blobs, name: blobs[name][:-4]}), f"constant '{name[6:]}'", "needs")
    _rejects(tmp_path, build(header, blobs, _section("dtype", "bf16")), "the program declares fp32")
    _rejects(tmp_path, build(header, blobs, _section("shape", [1, 2])), "the program declares fp32")


@pytest.mark.parametrize("mutate,words", [
    (lambda h: h["inputs"][0].update(shape=[3, 8]), ("inputs[0] is in0 [3, 8]", "the program's is in0 [2, 8]")),
    (lambda h: h["inputs"][0].update(dtype="bf16"), ("the program's is",)),
    (lambda h: h["outputs"][0].update(name="y"), ("outputs[0] is y",)),
    (lambda h: h["inputs"].append(dict(h["inputs"][0])), ("lists 2 inputs; the program has 1",)),
    (lambda h: h["inputs"][0].update(torch_dtype="complex64"), ("torch_dtype 'complex64' is not one of",)),
    (lambda h: h["inputs"][0].update(torch_dtype="int64"), ("cannot be exchanged",)),
    (lambda h: h["options"].update(precision="fp64"), ("header options: precision='fp64' is not allowed",)),
    (lambda h: h["options"].update(target="trn3"), ("differs from options.target",)),
    (lambda h: h.update(target="trn1") or h["options"].update(target="trn1"), ("the program is for target 'trn2'",)),
    (lambda h: h.update(out_spec=[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]),
     ("out_spec has 0 leaves",)),
    (lambda h: h.update(input_leaves=[5]), ("input_leaves",)),
    (lambda h: h["stats"].update(efficiency="high"), ("stats.efficiency is \"high\"",)),
    (lambda h: h["stats"]["engine_busy"].pop("pe"), ("stats.engine_busy",)),
])
def test_header_disagreeing_with_the_program(models, tmp_path, mutate, words):
    header, blobs = _parts(models)
    _rejects(tmp_path, build(header, blobs, mutate), *words)


def test_pytree_specs_that_would_import_code_are_refused(models, tmp_path):
    header, blobs = _parts(models)
    assert "wave" not in sys.modules   # a harmless stdlib module, named by the specs below
    leaf = {"type": None, "context": None, "children_spec": []}
    factory = {"type": "collections.defaultdict", "children_spec": [leaf],
               "context": {"default_factory_module": "wave", "default_factory_name": "open", "dict_context": ["a"]}}
    enum = {"type": "builtins.list", "children_spec": [leaf],
            "context": json.dumps({"__enum__": True, "fqn": "wave:Error", "name": "x"})}
    _rejects(tmp_path, build(header, blobs, lambda h: h.update(out_spec=[1, factory])), "would run its deserializer")
    _rejects(tmp_path, build(header, blobs, lambda h: h.update(out_spec=[1, enum])), "enum")
    deep = leaf
    for _ in range(100):
        deep = {"type": "builtins.tuple", "context": "null", "children_spec": [deep]}
    _rejects(tmp_path, build(header, blobs, lambda h: h.update(out_spec=[1, deep])), "nests deeper")
    assert "wave" not in sys.modules


def test_unregistered_pytree_type_loads_with_flat_outputs(models, tmp_path, caplog):
    header, blobs = _parts(models)
    compiled, args, _ = models["mlp"]
    spec = [1, {"type": "some.module.Output", "context": "[\"logits\"]",
                "children_spec": [{"type": None, "context": None, "children_spec": []}]}]
    with caplog.at_level(logging.WARNING, logger="trnc"):
        loaded = _load_bytes(tmp_path, build(header, blobs, lambda h: h.update(out_spec=spec)))
    assert "some.module.Output" in caplog.text
    out = loaded(*args)
    assert isinstance(out, tuple) and torch.equal(out[0], compiled(*args))


def test_read_header_checks_without_reading_sections(models, tmp_path):
    header, blobs = _parts(models)
    data = models["mlp"][2].read_bytes()
    corrupt = data[:-1] + bytes([data[-1] ^ 1])   # a section's checksum fails: only load sees it
    (tmp_path / "c.trnc").write_bytes(corrupt)
    assert artifact.read_header(tmp_path / "c.trnc")["sections"] == header["sections"]
    (tmp_path / "t.trnc").write_bytes(data[:-1])
    with pytest.raises(ArtifactError, match="past the end of the file"):
        artifact.read_header(tmp_path / "t.trnc")
    (tmp_path / "m.trnc").write_bytes(b"\0" * 100)
    with pytest.raises(ArtifactError, match="not a .trnc artifact"):
        artifact.read_header(tmp_path / "m.trnc")


def test_save_to_a_missing_directory(models, tmp_path):
    with pytest.raises(ArtifactError, match="cannot write"):
        models["mlp"][0].save(tmp_path / "no" / "such" / "dir.trnc")
