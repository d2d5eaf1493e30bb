"""The trnc command on ISA programs, end to end in a subprocess: asm, verify, disasm, run, and its errors."""
import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
GEMM = ROOT / "examples" / "gemm.s"


def trnc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "trnc.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


def test_asm_disasm_round_trip(tmp_path):
    out = trnc("asm", GEMM, "-o", tmp_path / "gemm.bin")
    assert out.returncode == 0, out.stderr
    assert "8 instructions, verified" in out.stdout
    text = trnc("disasm", tmp_path / "gemm.bin")
    assert text.returncode == 0, text.stderr
    (tmp_path / "again.s").write_text(text.stdout)
    again = trnc("asm", tmp_path / "again.s", "-o", tmp_path / "again.bin")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.bin").read_bytes() == (tmp_path / "gemm.bin").read_bytes()


def test_run_gemm_matches_torch(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((256, 512)).astype(ml_dtypes.bfloat16)
    # .npy holds no bf16: run converts these fp32 arrays, exactly bf16-valued, to the tensors' dtype.
    np.save(tmp_path / "a.npy", a.astype(np.float32))
    np.save(tmp_path / "b.npy", b.astype(np.float32))
    out = trnc("run", GEMM, "--input", f"a={tmp_path / 'a.npy'}", "--input", f"b={tmp_path / 'b.npy'}",
               "--save-outputs", tmp_path / "out", "--trace", tmp_path / "trace.json")
    assert out.returncode == 0, out.stderr
    assert "matmul" in out.stdout and "dma_copy" in out.stdout and "efficiency" in out.stdout
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    c = np.load(tmp_path / "out" / "c.npy")
    ref = trnc("run", GEMM, "--engine", "reference", "--input", f"a={tmp_path / 'a.npy'}",
               "--input", f"b={tmp_path / 'b.npy'}", "--save-outputs", tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    assert np.array_equal(np.load(tmp_path / "ref" / "c.npy"), c)   # JIT and reference agree bit for bit
    expect = a.astype(np.float64).T @ b.astype(np.float64)
    # bf16 products are exact; fp32 accumulation over K=256 is within 256 * 2^-24 * sum|a*b|.
    bound = 256 * 2.0**-24 * (np.abs(a.astype(np.float64)).T @ np.abs(b.astype(np.float64)))
    assert np.all(np.abs(c - expect) <= bound)


def test_run_host_profile_prints_the_host_time_per_opcode():
    out = trnc("run", GEMM, "--host-profile")
    assert out.returncode == 0, out.stderr
    table = out.stdout.split("host profile")[1].splitlines()[1:]
    assert table[0].split() == ["opcode", "instrs", "host", "ms", "share", "again", "ms"]
    counts = {line.split()[0]: int(line.split()[1]) for line in table[1:]}
    assert counts == {"matmul": 2, "dma_copy": 5, "activation": 1, "total": 8}   # examples/gemm.s's instructions
    wrong = trnc("run", GEMM, "--host-profile", "--engine", "reference")
    assert wrong.returncode == 2 and "--host-profile times the JIT" in wrong.stderr


def test_verify_reports_a_broken_rule(tmp_path):
    bad = GEMM.read_text().replace("wait=s4>=1 signal=s5", "signal=s5")  # evacuation no longer waits for pe
    (tmp_path / "race.s").write_text(bad)
    out = trnc("verify", tmp_path / "race.s")
    assert out.returncode == 2
    assert "race" in out.stderr


@pytest.mark.parametrize("args,message", [
    (("verify", "missing.s"), "No such file"),
    (("disasm", "garbage.bin"), "neither trnc assembly"),
    (("run", "bad.s"), "line 1"),
])
def test_bad_input_is_one_error_line(tmp_path, args, message):
    (tmp_path / "garbage.bin").write_bytes(b"\xff\xfe\x00junk")
    (tmp_path / "bad.s").write_text("pe frobnicate dst=sbuf[0:1]+0:fp32[1,1]\n")
    out = trnc(*args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and message in out.stderr
    assert "Traceback" not in out.stderr


def test_no_subcommand_is_a_usage_error():
    out = trnc()
    assert out.returncode == 1 and "usage" in out.stderr


def test_help_shows_an_example():
    for sub in ("asm", "verify", "disasm", "run"):
        out = trnc(sub, "--help")
        assert out.returncode == 0 and "example:" in out.stdout
