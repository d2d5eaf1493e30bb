"""Fuzzing the .trnc loader: 1,200 seeded mutations of two real artifacts, each loaded and run in a forked child.

Raw mutations (bit flips, byte overwrites, truncations, splices, oversized prefix lengths) test the
checks in front of the checksums. Structure-aware mutations rebuild a valid file around a change
(section table entries, header JSON values, program bytes, program fields through isa encode,
constant bytes), recomputing every checksum, so the decoder, the verifier and the JIT see them.

A child loads its mutation and, if that succeeds, calls the model (JIT) on inputs of the recorded
shapes. It exits with a code naming the outcome; the parent asserts that no child died of a signal,
hung (timeout), or raised anything but ArtifactError at load or TrncError at run. The parent imports
torch once and forks per mutation, two children at a time. Mutation i is in tmp_path/m{i}.trnc; a
failure names the files. Run with `-s` to see the outcome counts and the histogram of reasons.
"""
import dataclasses
import faulthandler
import json
import os
import random
import re
import select
import signal
import struct
import sys
import time
import traceback
from collections import Counter

import pytest
import torch

import trnc
from trnc import artifact, flags
from trnc.errors import ArtifactError, EncodingError, TrncError
from trnc.isa.ap import Mem
from trnc.isa.decoding import decode
from trnc.isa.dtypes import DType
from trnc.isa.encoding import encode
from trnc.isa.opcodes import Kind, opspec

from test_artifact import ALIGN, PREFIX, Embed, build, split

SEED = 5
WORKERS = 2
TIMEOUT = 30.0       # seconds per child; a tiny program loads and runs in well under one
# mutations per kind (1,200 in all)
PLAN = {"bitflip": 130, "overwrite": 100, "truncate": 80, "splice": 80, "prefix_length": 40, "section_entry": 110,
        "header_value": 170, "program_bytes": 170, "program_field": 270, "constant": 50}
CHUNK = 25          # mutations per forked worker (a fork of this process costs tens of milliseconds)
RAN, REJECTED, RUN_ERROR, LOAD_OTHER, CRASH, STARTED = 10, 11, 12, 20, 30, -1
FRAME = struct.Struct("<iiI")   # worker -> parent: mutation index, outcome (STARTED first), message length
OUTCOMES = {RAN: "ran", REJECTED: "rejected at load", RUN_ERROR: "TrncError at run",
            LOAD_OTHER: "non-ArtifactError at load", CRASH: "crash (other exception)"}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Two real artifacts (an MLP; an embedding with int64 ids and a dict output), their kernels warm in memory."""
    tmp = tmp_path_factory.mktemp("fuzz")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with flags.override(TRNC_CACHE_DIR=str(tmp / "cache")):
        datas = []
        for name, model, args in (("mlp", mlp, (torch.randn(2, 4),)),
                                  ("embed", Embed(), (torch.tensor([[1, 5, 0]]), torch.randn(1, 3, 2)))):
            compiled = trnc.compile(model, args)
            compiled.save(tmp / f"{name}.trnc")
            trnc.load(tmp / f"{name}.trnc")(*args)   # children inherit the compiled kernels
            datas.append((tmp / f"{name}.trnc").read_bytes())
        yield tmp, datas


# -- mutations ---------------------------------------------------------------------------------------------

DEEP = json.loads("[" * 40 + "0" + "]" * 40)   # nested lists
INTERESTING = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


def _flip(rng, data, bits):
    b = bytearray(data)
    for _ in range(bits):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _overwrite(rng, data):
    b = bytearray(data)
    i = rng.randrange(len(b))
    value = rng.choice(INTERESTING)
    width = rng.choice((1, 2, 4))
    word = (value & (256**width - 1)).to_bytes(width, "little")
    b[i:i + width] = word[:len(b) - i]
    return bytes(b)


def _byte_edit(rng, data):
    """One edit of a byte string: flips, an overwrite, +-1 on a byte, an insertion or a deletion."""
    choice = rng.randrange(5)
    if choice == 0:
        return _flip(rng, data, rng.randint(1, 3))
    if choice == 1:
        return _overwrite(rng, data)
    i = rng.randrange(len(data))
    if choice == 2:
        return data[:i] + bytes([(data[i] + rng.choice((1, -1))) % 256]) + data[i + 1:]
    if choice == 3:
        return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[i:]
    return data[:i] + data[i + rng.randint(1, 8):]


def _json_paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_paths(v, (*path, k))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            yield from _json_paths(v, (*path, k))


def _new_value(rng, old):
    candidates = [None, True, 0, -1, 1.5, "", "x" * 300, [], {}, DEEP,
                  2**31, 2**63, 2**64, -2**63, 10**30, "bf16", "trn1", "nope", "int64", "bool", "float16",
                  "complex64", "collections.defaultdict", {"__enum__": True, "fqn": "os:sep", "name": "x"}]
    if type(old) is int:
        candidates += [old + 1, old - 1, old * 2, old + ALIGN, old - ALIGN, -old]
    if isinstance(old, str):
        candidates += [old + "x", old[:-1], old.upper()]
    if isinstance(old, list) and old:
        candidates += [old[:-1], old + old[-1:], old[::-1]]
    return rng.choice(candidates)


def _set(header, path, value, delete=False):
    obj = header
    for k in path[:-1]:
        obj = obj[k]
    if delete:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


def _header_value(rng, header, blobs):
    paths = [p for p in _json_paths(header) if p]
    path = rng.choice(paths)
    old = header
    for k in path:
        old = old[k]
    value, delete = _new_value(rng, old), rng.random() < 0.1
    return build(header, blobs, lambda h: _set(h, path, value, delete))


def _section_entry(rng, header, blobs):
    i = rng.randrange(len(header["sections"]))

    def mutate(h):
        sections = h["sections"]
        s = sections[i]
        key = rng.choice(("offset", "length", "offset", "length", "sha256", "name", "dtype", "shape", "drop",
                          "duplicate", "reorder"))
        if key == "drop":
            del sections[i]
        elif key == "duplicate":
            sections.append(dict(s))
        elif key == "reorder":
            rng.shuffle(sections)
        elif key in ("offset", "length"):
            s[key] = rng.choice((-1, -ALIGN, 2**31, 2**32, 2**62, 2**63, 2**64, 10**20, s[key] + 1, s[key] - 1,
                                 s[key] + ALIGN, s[key] * 4, 0, 1.0, "0", None,
                                 sections[rng.randrange(len(sections))]["offset"]))
        elif key in s:
            s[key] = _new_value(rng, s[key])
    return build(header, blobs, mutate)


def _ap_change(rng, ap):
    isz = ap.dtype.itemsize
    field = rng.choice(("offset", "partitions", "start_partition", "stride", "count", "dtype", "mem", "tensor",
                        "partition_stride"))
    if field == "offset":
        return dataclasses.replace(ap, offset=max(0, ap.offset + isz * rng.choice((-64, -1, 1, 4, 64, 4096, 2**20))))
    if field == "partitions":
        return dataclasses.replace(ap, partitions=max(1, rng.choice((ap.partitions - 1, ap.partitions + 1,
                                                                     ap.partitions * 2, 128, 129))))
    if field == "start_partition" and ap.mem is not Mem.HBM:
        return dataclasses.replace(ap, start_partition=rng.choice((0, 1, 32, 64, 96, 127)))
    if field in ("stride", "count") and ap.dims:
        j = rng.randrange(len(ap.dims))
        stride, count = ap.dims[j]
        new = ((rng.choice((0, 1, -1, stride + 1, stride * 2, -stride)), count) if field == "stride" else
               (stride, max(1, rng.choice((count - 1, count + 1, count * 2, 65535)))))
        return dataclasses.replace(ap, dims=ap.dims[:j] + (new,) + ap.dims[j + 1:])
    if field == "dtype":
        return dataclasses.replace(ap, dtype=rng.choice(list(DType)))
    if field == "mem" and ap.mem is not Mem.HBM:
        return dataclasses.replace(ap, mem=Mem.PSUM if ap.mem is Mem.SBUF else Mem.SBUF)
    if field == "tensor" and ap.mem is Mem.HBM:
        return dataclasses.replace(ap, tensor=max(0, ap.tensor + rng.choice((-1, 1))))
    if field == "partition_stride" and ap.mem is Mem.HBM:
        return dataclasses.replace(ap, partition_stride=ap.partition_stride + rng.choice((-1, 1, 8)))
    return dataclasses.replace(ap, offset=ap.offset + isz)


def _immediate(rng, field, old):
    if field.kind is Kind.F32:
        return rng.choice((0.0, -0.0, 1.0, -1.0, 1e30, float("inf"), float("nan"), old * 2 if old else 3.0))
    if field.kind is Kind.BOOL:
        return not old
    if field.kind is Kind.ENUM:
        return rng.choice(list(field.enum))
    if field.kind is Kind.I32X4:
        return tuple(v + rng.choice((0, 1, -1)) for v in old)
    return max(0, old + rng.choice((-1, 1, 7, 2**16)))


def _program_field(rng, program):
    """The program with one field changed: an operand, an immediate, a wait or signal, the engine or queue,
    a tensor declaration, or the order and number of instructions."""
    instructions = list(program.instructions)
    i = rng.randrange(len(instructions))
    ins = instructions[i]
    what = rng.choice(("ap", "ap", "ap", "ap", "imm", "imm", "sync", "engine", "tensor", "order"))
    if what == "ap":
        name, ap, _ = rng.choice(list(ins.operands()))
        instructions[i] = ins.replace(args=tuple((k, _ap_change(rng, v) if k == name else v) for k, v in ins.args))
    elif what == "imm" and any(f.kind is not Kind.AP for f in opspec(ins.opcode).fields):
        field = rng.choice([f for f in opspec(ins.opcode).fields if f.kind is not Kind.AP])
        instructions[i] = ins.replace(args=tuple((k, _immediate(rng, field, v) if k == field.name else v)
                                                 for k, v in ins.args))
    elif what == "sync":
        waits, signals = list(ins.waits), list(ins.signals)
        if waits and rng.random() < 0.5:
            j = rng.randrange(len(waits))
            waits[j] = (waits[j][0], max(0, waits[j][1] + rng.choice((-1, 1, 100))))
        elif signals and rng.random() < 0.5:
            signals.pop(rng.randrange(len(signals)))
        else:
            signals.append(rng.randrange(8))
        instructions[i] = ins.replace(waits=tuple(waits), signals=tuple(signals))
    elif what == "engine":
        instructions[i] = ins.replace(engine=rng.choice(list(type(ins.engine))), queue=rng.choice((0, ins.queue, 3)))
    elif what == "tensor":
        tensors = list(program.tensors)
        t = rng.randrange(len(tensors))
        shape = tensors[t].shape
        new_shape = shape[:-1] + (max(1, shape[-1] + rng.choice((-1, 1, 2**40))),) if shape else (2,)
        tensors[t] = dataclasses.replace(tensors[t], shape=new_shape)
        return dataclasses.replace(program, tensors=tuple(tensors))
    else:
        j = rng.randrange(len(instructions))
        action = rng.randrange(3)
        if action == 0:
            instructions[i], instructions[j] = instructions[j], instructions[i]
        elif action == 1:
            del instructions[i]
        else:
            instructions.insert(j, ins)
    return dataclasses.replace(program, instructions=tuple(instructions))


def mutation(rng, kind, data, other):
    """A mutated copy of artifact `data` (`other` is the second artifact, for splices)."""
    header, blobs = split(data)
    if kind == "bitflip":
        return _flip(rng, data, rng.choice((1, 1, 2, 4, 8)))
    if kind == "overwrite":
        return _overwrite(rng, data)
    if kind == "truncate":
        return data[:rng.choice((0, 1, 7, 8, 12, PREFIX.size - 1, PREFIX.size, PREFIX.size + 10, len(data) // 2,
                                 len(data) - 1, rng.randrange(len(data))))]
    if kind == "splice":
        source = rng.choice((data, other))
        i, j = rng.randrange(len(data)), rng.randrange(len(source))
        return rng.choice((data[:i] + source[j:], data[:i] + source[j:j + 64] + data[i:], data + source))
    if kind == "prefix_length":
        b = bytearray(data)
        length = rng.choice((0, 1, 2**32 - 1, 2**31, artifact.MAX_HEADER_BYTES + 1, len(data),
                             PREFIX.unpack_from(data)[3] + rng.choice((-1, 1, ALIGN))))
        struct.pack_into("<I", b, 16, length % 2**32)
        return bytes(b)
    if kind == "section_entry":
        return _section_entry(rng, header, blobs)
    if kind == "header_value":
        return _header_value(rng, header, blobs)
    if kind == "program_bytes":
        return build(header, {**blobs, "program": _byte_edit(rng, blobs["program"])})
    if kind == "program_field":
        try:
            program = encode(_program_field(rng, decode(blobs["program"])))
        except EncodingError:   # a value the encoding cannot hold: mutate the bytes instead
            program = _byte_edit(rng, blobs["program"])
        return build(header, {**blobs, "program": program})
    name = rng.choice([n for n in blobs if n != "program"])
    blob = rng.choice((_byte_edit(rng, blobs[name]), _flip(rng, blobs[name], 4), blobs[name][:-4]))
    return build(header, {**blobs, name: blob})


def all_mutations(datas):
    rng = random.Random(SEED)
    cases = []
    for kind, count in PLAN.items():
        for _ in range(count):
            k = rng.randrange(2)
            cases.append((kind, mutation(rng, kind, datas[k], datas[1 - k])))
    return cases


# -- children ----------------------------------------------------------------------------------------------

def _inputs(info):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen).to(dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
            for shape, dtype in zip(info.input_shapes, info.input_dtypes)]


def _child(path):
    """(exit code, message): load the artifact and, if it loads, run it on the JIT."""
    try:
        model = trnc.load(path)
    except ArtifactError as e:
        return REJECTED, str(e).removeprefix(f"{path}: ")
    except TrncError as e:
        return LOAD_OTHER, f"{type(e).__name__}: {e}"
    except BaseException:
        return CRASH, traceback.format_exc()
    try:
        model(*_inputs(model.info))
    except TrncError as e:
        return RUN_ERROR, f"{type(e).__name__}: {e}"
    except BaseException:
        return CRASH, traceback.format_exc()
    return RAN, ""


def _worker(paths, indices, fd):
    """Load and run mutations one after another, framing each start and each result on the pipe `fd`."""
    for i in indices:
        os.write(fd, FRAME.pack(i, STARTED, 0))
        code, message = _child(paths[i])
        data = message.encode("utf-8", "replace")[:2000]   # one frame stays under PIPE_BUF: written whole
        os.write(fd, FRAME.pack(i, code, len(data)) + data)


@dataclasses.dataclass
class Worker:
    fd: int
    todo: list            # indices not yet finished
    current: int | None = None
    since: float = 0.0
    buffer: bytes = b""


def _start(paths, indices):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            _worker(paths, indices, write)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, Worker(read, list(indices))


def _frames(w, results):
    while len(w.buffer) >= FRAME.size:
        index, code, size = FRAME.unpack_from(w.buffer)
        if len(w.buffer) < FRAME.size + size:
            return
        message = w.buffer[FRAME.size:FRAME.size + size].decode("utf-8", "replace")
        w.buffer = w.buffer[FRAME.size + size:]
        if code == STARTED:
            w.current, w.since = index, time.monotonic()
        else:
            results[index] = (code, message)
            w.todo.remove(index)
            w.current = None


def run_children(paths, indices, chunk=CHUNK):
    """{index: (outcome, message)} for the mutations at `indices`; outcome is an exit code of OUTCOMES,
    'signal N', 'exit N' or 'timeout'. When a worker dies or hangs on a mutation, that mutation gets the
    outcome and a new worker takes the rest of its chunk."""
    queue = [list(indices[i:i + chunk]) for i in range(0, len(indices), chunk)]
    running, results = {}, {}
    while queue or running:
        while queue and len(running) < WORKERS:
            pid, w = _start(paths, queue.pop(0))
            running[pid] = w
        ready, _, _ = select.select([w.fd for w in running.values()], [], [], 0.05)
        for pid, w in list(running.items()):
            ended = None
            if w.fd in ready:
                data = os.read(w.fd, 65536)
                w.buffer += data
                _frames(w, results)
                if not data:
                    _, status = os.waitpid(pid, 0)
                    ended = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
            if ended is None and w.current is not None and time.monotonic() - w.since > TIMEOUT:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                ended = "timeout"
            if ended is not None:
                os.close(w.fd)
                del running[pid]
                if w.current is not None:
                    results[w.current] = (ended, "")
                    w.todo.remove(w.current)
                if w.todo:
                    queue.insert(0, w.todo)
    return results


def reason(message):
    """The message with names and numbers blanked, cut short: one bucket per kind of rejection."""
    text = re.sub(r"'[^']*'", "'_'", message.split("; write it again")[0].replace("\n", " | "))
    return re.sub(r"-?\d+", "N", text)[:70]


def test_fuzz_mutated_artifacts_never_crash_or_hang(artifacts, tmp_path):
    tmp, datas = artifacts
    cases = all_mutations(datas)
    assert len(cases) >= 1000
    paths = []
    for i, (_, data) in enumerate(cases):
        paths.append(tmp_path / f"m{i}.trnc")
        paths[-1].write_bytes(data)
    with flags.override(TRNC_CACHE_DIR=str(tmp / "cache")):
        results = run_children(paths, range(len(paths)))
        bad = {i: r for i, r in results.items() if r[0] not in (RAN, REJECTED, RUN_ERROR)}
        alone = run_children(paths, sorted(bad), chunk=1)   # each failure again, in a fresh child of its own
    outcomes = Counter(OUTCOMES.get(o, o) for o, _ in results.values())
    by_kind = Counter((cases[i][0], OUTCOMES.get(o, o)) for i, (o, _) in results.items())
    reasons = Counter(reason(m) for o, m in results.values() if o in (REJECTED, RUN_ERROR))
    print(f"\n{len(cases)} mutations: {dict(outcomes)}")
    for (kind, outcome), n in sorted(by_kind.items()):
        print(f"  {kind:14} {outcome:28} {n}")
    print("reasons:")
    for text, n in reasons.most_common(40):
        print(f"  {n:5}  {text}")
    assert not bad, "children failed:\n" + "\n".join(
        f"{paths[i]} ({cases[i][0]}): {OUTCOMES.get(o, o)}: {m[-1500:]} (alone: {OUTCOMES.get(alone[i][0], alone[i][0])})"
        for i, (o, m) in sorted(bad.items())[:10])
    assert len(results) == len(cases)
    # The structure-aware mutations reach past the checksums: some programs fail the decoder, some the
    # verifier, and some load and run on the JIT.
    assert outcomes["ran"] >= 50
    assert by_kind[("program_field", "ran")] >= 10
    assert any(r.startswith("invalid program section") for r in reasons)
    assert any(r.startswith("the program fails verification") for r in reasons)


def test_harness_reports_signals_hangs_and_crashes(tmp_path, monkeypatch):
    """The parent sees a child killed by a signal, a hung child and an unexpected exception, and the other
    mutations of the same worker still run."""
    def child(path):
        if path.name == "segv":
            faulthandler.disable()   # pytest's handler would print this intended crash's stack
            os.kill(os.getpid(), signal.SIGSEGV)
        if path.name == "hang":
            time.sleep(60)
        if path.name == "crash":
            return CRASH, "ValueError"
        return RAN, ""
    monkeypatch.setattr(sys.modules[__name__], "_child", child)
    monkeypatch.setattr(sys.modules[__name__], "TIMEOUT", 0.5)
    paths = [tmp_path / n for n in ("ok", "segv", "ok", "hang", "crash", "ok")]
    results = run_children(paths, range(len(paths)), chunk=6)
    assert [results[i][0] for i in range(len(paths))] == [RAN, f"signal {signal.SIGSEGV}", RAN, "timeout", CRASH, RAN]
