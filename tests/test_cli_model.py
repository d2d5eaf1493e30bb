"""The trnc command on models and artifacts, end to end in a subprocess: compile, run, profile, disasm, bad input.

Every subprocess gets TRNC_CACHE_DIR in a temporary folder, so nothing touches the user's cache.
"""
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trnc
from trnc import flags
from trnc.artifact import MAGIC
from trnc.cli import artifact_cmds
from trnc.isa.asm import parse_program

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "mlp.py"
TINY_BERT = ROOT / "examples" / "tiny_bert.py"
REL_TOL = 1e-5   # fp32 end to end: max |trnc - eager| / max |eager|, as in tests/test_models.py


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


# `python -m trnc.cli.main`, after what conftest does in this process: transformers' models import torchvision, which
# needs the op schemas benchmarks/vision.py (trnc.bench.vision) defines beside torch's CPU build
CLI = ("import runpy, sys; from trnc.bench.vision import torchvision; torchvision(); sys.argv[0] = 'trnc'; "
       "runpy.run_module('trnc.cli.main', run_name='__main__')")


def trnc_cli(*args, cache: Path, cwd=None, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRNC_")}
    path = os.pathsep.join(p for p in (os.path.dirname(__file__), environ.get("PYTHONPATH")) if p)
    environ.update(TRNC_CACHE_DIR=str(cache), PYTHONPATH=path, **env)
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=environ)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max())


@pytest.fixture(scope="module")
def mlp(tmp_path_factory, cache):
    """examples/mlp.py compiled once for the tests that read its artifact: (path, the compile's output)."""
    out = tmp_path_factory.mktemp("mlp") / "mlp.trnc"
    done = trnc_cli("compile", MLP, "-o", out, cache=cache)
    assert done.returncode == 0, done.stderr
    return out, done


def test_compile_prints_the_summary(mlp):
    path, done = mlp
    assert path.read_bytes().startswith(MAGIC)
    with flags.override(TRNC_CACHE=False):
        program = trnc.load(path).program
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    assert int(rows["total"][1]) == len(program.instructions)
    matmuls = sum(1 for ins in program.instructions if str(ins.opcode) == "matmul")
    assert f"matmul {matmuls}" in " ".join(rows["pe"])
    dma = sum(1 for ins in program.instructions if ins.queue_name.startswith("dma"))
    assert int(rows["dma"][1]) == dma
    for line in ("SBUF peak", "PSUM peak", "modeled time", "efficiency", "DMA bytes", "compile time", "capture"):
        assert line in done.stdout


def test_compile_json_default_output_and_print_after(tmp_path, cache):
    model_file = tmp_path / "mlp.py"
    model_file.write_text(MLP.read_text())
    done = trnc_cli("compile", model_file, "--json", "--print-after", "fuse,tile", "--print-after", "emit",
                    cache=cache)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)   # stdout holds the JSON and nothing else
    with flags.override(TRNC_CACHE=False):
        loaded = trnc.load(tmp_path / "mlp.trnc")
    assert stats["instructions"] == len(loaded.program.instructions)
    assert {"capture", "fuse", "emit"} <= set(stats["pass_seconds"])
    assert stats["sbuf_peak_bytes"] > 0 and 0 < stats["efficiency"] <= 1
    for name in ("fuse", "tile", "emit"):   # the IR went to stderr
        assert f"after {name}" in done.stderr


def test_run_matches_load_and_eager(mlp, tmp_path, cache):
    path, _ = mlp
    eager = runpy.run_path(str(MLP))
    x = torch.randn(eager["example_inputs"][0].shape, generator=torch.Generator().manual_seed(3))
    np.save(tmp_path / "x.npy", x.numpy())
    done = trnc_cli("run", path, "--inputs", tmp_path / "x.npy", "--save-outputs", tmp_path / "out", "--host-profile",
                    cache=cache)
    assert done.returncode == 0, done.stderr
    assert "host time" in done.stdout and "(best of 3 calls)" in done.stdout and "float32 [64, 256]" in done.stdout
    program = trnc.load(path).program
    total = done.stdout.split("host profile")[1].splitlines()[-1].split()
    assert total[:2] == ["total", str(len(program.instructions))]   # the profile ran the whole program
    got = torch.from_numpy(np.load(tmp_path / "out" / "out0.npy"))
    with flags.override(TRNC_CACHE_DIR=cache):
        assert torch.equal(got, trnc.load(path)(x))
    with torch.no_grad():
        assert rel_err(got, eager["model"](x)) <= REL_TOL


def test_run_random_inputs_and_reference_engine_agree(mlp, tmp_path, cache):
    path, _ = mlp
    for engine in ("jit", "reference"):
        done = trnc_cli("run", path, "--engine", engine, "--seed", "5", "--save-outputs", tmp_path / engine,
                        cache=cache)
        assert done.returncode == 0, done.stderr
        assert "random, seed 5" in done.stdout
    assert np.array_equal(np.load(tmp_path / "jit" / "out0.npy"), np.load(tmp_path / "reference" / "out0.npy"))


def test_profile_writes_a_trace(mlp, tmp_path, cache):
    path, _ = mlp
    done = trnc_cli("profile", path, "--trace", tmp_path / "trace.json", cache=cache)
    assert done.returncode == 0, done.stderr
    for word in ("stall sem", "roofline", "efficiency", "util", "opcodes"):
        assert word in done.stdout
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


def test_profile_takes_an_isa_program_too(tmp_path, cache):
    done = trnc_cli("profile", ROOT / "examples" / "gemm.s", "--trace", tmp_path / "trace.json", cache=cache)
    assert done.returncode == 0, done.stderr
    assert "roofline" in done.stdout and "matmul 2" in done.stdout
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_disasm_parses_back(mlp, cache):
    path, _ = mlp
    done = trnc_cli("disasm", path, cache=cache)
    assert done.returncode == 0, done.stderr
    with flags.override(TRNC_CACHE=False):
        program = trnc.load(path).program
    assert len(parse_program(done.stdout).instructions) == len(program.instructions)


@pytest.mark.slow
def test_tiny_bert_compiles_and_runs(tmp_path, cache):
    """A function naming the model (FILE.py:NAME), and integer inputs: int32 ids in a .npy file become the
    recorded int64; random ones lie in [0, 2), inside every embedding table."""
    out = tmp_path / "bert.trnc"
    done = trnc_cli("compile", f"{TINY_BERT}:bert", "-o", out, cache=cache)
    assert done.returncode == 0, done.stderr
    model, (ids,) = runpy.run_path(str(TINY_BERT))["bert"]()
    np.save(tmp_path / "ids.npy", ids.numpy().astype(np.int32))
    done = trnc_cli("run", out, "--inputs", tmp_path / "ids.npy", "--save-outputs", tmp_path / "out", cache=cache)
    assert done.returncode == 0, done.stderr
    assert "int64 [2, 32]" in done.stdout
    with torch.no_grad():
        ref = model(ids)
    assert rel_err(torch.from_numpy(np.load(tmp_path / "out" / "out0.npy")), ref.last_hidden_state) <= REL_TOL
    assert rel_err(torch.from_numpy(np.load(tmp_path / "out" / "out1.npy")), ref.pooler_output) <= REL_TOL
    with flags.override(TRNC_CACHE=False):
        loaded = trnc.load(out)
    (random_ids,) = artifact_cmds.random_inputs(loaded, list(loaded.info.input_dtypes), seed=0)
    assert random_ids.dtype == torch.int64 and random_ids.shape == ids.shape
    assert set(random_ids.unique().tolist()) == {0, 1}


BAD_FILES = {
    "nomodel.py": "def helper():\n    return 1\n\ndef make():\n    return None\n",
    "raises.py": "raise ValueError('boom at import')\n",
    "untraceable.py": ("import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                       "        if x.sum() > 0:\n            return x * 2\n        return x\n\n"
                       "model = M()\nexample_inputs = torch.randn(4, 4)\n"),
}


@pytest.mark.parametrize("args,words", [
    (("compile", "missing.py"), ["missing.py: no such file", "example_inputs"]),
    (("compile", "nomodel.py"), ["defines no model or example_inputs", "FILE.py:NAME", "helper, make"]),
    (("compile", "nomodel.py:nope"), ["no function 'nope'", "helper, make"]),
    (("compile", "nomodel.py:make"), ["must return (model, example_inputs)"]),
    (("compile", "raises.py"), ["raised ValueError while importing: boom at import"]),
    (("compile", "untraceable.py"), ["could not trace", "untraceable.py:5", "data-dependent"]),
    (("run", "truncated.trnc"), ["truncated.trnc", "write it again"]),
    (("disasm", "truncated.trnc"), ["truncated.trnc"]),
    (("profile", "wrong_magic.trnc"), ["not a .trnc artifact"]),
])
def test_bad_input_is_one_error_line(mlp, tmp_path, cache, args, words):
    for name, text in BAD_FILES.items():
        (tmp_path / name).write_text(text)
    data = mlp[0].read_bytes()
    (tmp_path / "truncated.trnc").write_bytes(data[:len(data) // 2])
    (tmp_path / "wrong_magic.trnc").write_bytes(b"NOTTRNC\0" + data[8:])
    done = trnc_cli(*args, cache=cache, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0]


def test_debug_log_shows_the_traceback(tmp_path, cache):
    (tmp_path / "raises.py").write_text(BAD_FILES["raises.py"])
    done = trnc_cli("compile", "raises.py", cache=cache, cwd=tmp_path, TRNC_LOG="debug")
    assert done.returncode == 2
    assert "Traceback" in done.stderr and 'raises.py", line 1' in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")


def test_help_shows_an_example(cache):
    for sub in ("compile", "run", "profile", "disasm"):
        done = trnc_cli(sub, "--help", cache=cache)
        assert done.returncode == 0 and "example" in done.stdout
