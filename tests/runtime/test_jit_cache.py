"""The JIT's kernel cache: disk hits across Codegens and processes, corrupt entries, flags, and key coverage."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from aps import hbm, onchip
from trnc import flags, version
from trnc.errors import TrncError
from trnc.isa import AluOp, DType, Engine, Instruction, Program, TensorDecl, TensorKind
from trnc.runtime import reference
from trnc.runtime.jit import cache as cache_module
from trnc.runtime.jit.cache import DIGEST, MAGIC, KernelCache, source_digest
from trnc.runtime.jit.codegen import Codegen, codegen
from trnc.runtime.jit.executor import JitProgram, Kernels
from trnc.runtime.jit.kernels import driver_ir

F32 = DType.FP32


def scale_program() -> Program:
    """y = 2 x + 1 through SBUF: three kernels (two copies and a tensor_scalar), plus the driver: four objects."""
    shape = (4, 8)
    tensors = (TensorDecl("x", TensorKind.INPUT, F32, shape), TensorDecl("y", TensorKind.OUTPUT, F32, shape))
    tile = onchip(F32, shape)
    return Program(tensors, (
        Instruction.make("dma_copy", Engine.DMA, dst=tile, src=hbm(0, F32, shape), signals=(0,)),
        Instruction.make("tensor_scalar", Engine.DVE, dst=tile, src=tile, op0=AluOp.MUL, scalar0=2.0, op1=AluOp.ADD,
                         scalar1=1.0,
                         waits=((0, 1),), signals=(1,)),
        Instruction.make("dma_copy", Engine.DMA, queue=1, dst=hbm(1, F32, shape), src=tile, waits=((1, 1),))))


@pytest.fixture(autouse=True)
def serial_driver():
    """The counts below are those of the serial driver: the program's three kernels and the driver (the
    parallel driver's worker would be one more object)."""
    with flags.override(TRNC_THREADS=1):
        yield


def fresh_table() -> Kernels:
    """A kernel table as a new process would have it: a new Codegen (engine) and empty memory cache."""
    cg = Codegen()
    return Kernels(cg, KernelCache(cg))


def run_fresh(program: Program, inputs) -> tuple[dict, Kernels]:
    table = fresh_table()
    return JitProgram(program, table=table).run(inputs), table


def entries(directory: Path) -> list[Path]:
    return sorted((directory / "kernels").glob("*.o"))


def test_a_second_codegen_loads_the_kernel_from_disk(tmp_path):
    program, x = scale_program(), np.arange(32, dtype=np.float32).reshape(4, 8)
    with flags.override(TRNC_CACHE_DIR=tmp_path):
        first, t1 = run_fresh(program, {"x": x})
        assert (t1.cache.stats.misses, t1.cache.stats.disk_hits) == (4, 0)
        assert len(entries(tmp_path)) == 4
        second, t2 = run_fresh(program, {"x": x})
        assert (t2.cache.stats.misses, t2.cache.stats.disk_hits) == (0, 4)
    assert np.array_equal(first["y"], 2 * x + 1) and np.array_equal(second["y"], first["y"])
    assert not list((tmp_path / "kernels").glob(".tmp-*")), "a temp file of an atomic write was left behind"


def test_the_memory_cache_answers_before_the_disk(tmp_path):
    cache = KernelCache(codegen())
    with flags.override(TRNC_CACHE_DIR=tmp_path):
        obj = cache.object_code("driver", driver_ir)
        assert cache.object_code("driver", driver_ir) is obj
    assert (cache.stats.misses, cache.stats.memory_hits, cache.stats.disk_hits) == (1, 1, 0)


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate", "wrong magic", "empty"])
def test_a_corrupt_entry_is_discarded_and_rebuilt_never_loaded(tmp_path, damage):
    program, x = scale_program(), np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)
    with flags.override(TRNC_CACHE_DIR=tmp_path):
        run_fresh(program, {"x": x})
        for path in entries(tmp_path):
            data = bytearray(path.read_bytes())
            if damage == "flip a payload byte":
                data[len(MAGIC) + DIGEST + len(data) // 3] ^= 0x40
            elif damage == "truncate":
                data = data[: len(data) // 2]
            elif damage == "wrong magic":
                data[0] ^= 1
            else:
                data = bytearray()
            path.write_bytes(bytes(data))
        got, table = run_fresh(program, {"x": x})
        assert (table.cache.stats.discarded, table.cache.stats.misses, table.cache.stats.disk_hits) == (4, 4, 0)
        _, again = run_fresh(program, {"x": x})   # the rebuilt entries are whole again
        assert (again.cache.stats.disk_hits, again.cache.stats.misses) == (4, 0)
    assert np.array_equal(got["y"], reference.run(program, {"x": x})["y"])


def test_trnc_cache_0_keeps_kernels_in_memory_only(tmp_path):
    with flags.override(TRNC_CACHE_DIR=tmp_path, TRNC_CACHE=False):
        run_fresh(scale_program(), {"x": np.zeros((4, 8), np.float32)})
    assert not (tmp_path / "kernels").exists()


def test_assert_cached_fails_on_a_compile_and_passes_when_warm(tmp_path):
    program, x = scale_program(), np.ones((4, 8), np.float32)
    with flags.override(TRNC_CACHE_DIR=tmp_path, TRNC_ASSERT_CACHED=True):
        with pytest.raises(TrncError, match="TRNC_ASSERT_CACHED=1 but kernel"):
            run_fresh(program, {"x": x})
    with flags.override(TRNC_CACHE_DIR=tmp_path):
        run_fresh(program, {"x": x})
    with flags.override(TRNC_CACHE_DIR=tmp_path, TRNC_ASSERT_CACHED=True):
        got, table = run_fresh(program, {"x": x})
    assert table.cache.stats.misses == 0 and np.array_equal(got["y"], 3 * x)


def test_the_key_covers_the_name_the_sources_the_host_and_the_trnc_version(monkeypatch):
    cg = codegen()
    name = "kernel tensor_scalar dst=fp32[4@64|4x8] src=fp32[4@64|4x8] same:dst=src"
    key = KernelCache(cg).key(name)
    assert KernelCache(cg).key(name + " ") != key
    monkeypatch.setattr(version, "__version__", "0.0.0-other")
    assert KernelCache(cg).key(name) != key
    monkeypatch.undo()
    monkeypatch.setattr(Codegen, "identity", property(lambda self: "another host"))
    assert KernelCache(cg).key(name) != key
    monkeypatch.undo()
    monkeypatch.setattr(cache_module, "source_digest", lambda: "other sources")
    assert KernelCache(cg).key(name) != key


def test_the_source_digest_changes_with_any_byte_or_name_of_a_source(tmp_path):
    (tmp_path / "jit").mkdir()
    lowering = tmp_path / "jit" / "kernels.py"
    lowering.write_text("UNROLL = 4\n")
    digest = source_digest([tmp_path])
    lowering.write_text("UNROLL = 8\n")
    assert source_digest([tmp_path]) != digest
    lowering.write_text("UNROLL = 4\n")
    assert source_digest([tmp_path]) == digest
    lowering.rename(tmp_path / "jit" / "kernels_pe.py")
    assert source_digest([tmp_path]) != digest
    assert len(source_digest()) == 64   # the packages' own digest, over trnc.runtime and trnc.isa


def test_a_hit_builds_no_ir(tmp_path):
    """The point of keying by name: a warm load skips building each kernel's IR (about 4 ms of Python each)."""
    built = []

    def build():
        built.append(1)
        return driver_ir()

    with flags.override(TRNC_CACHE_DIR=tmp_path):
        KernelCache(codegen()).object_code("driver", build)
        KernelCache(Codegen()).object_code("driver", build)   # a new process: from disk
    assert built == [1]


NEW_PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_jit_cache import scale_program
    from trnc.runtime.jit.executor import kernels, load
    y = load(scale_program()).run({{"x": np.full((4, 8), 2.0, np.float32)}})["y"]
    stats = kernels().cache.stats
    print(json.dumps({{"misses": stats.misses, "disk_hits": stats.disk_hits, "y": float(y[0, 0])}}))
""")


def test_a_new_process_hits_the_disk_cache_through_the_environment(tmp_path):
    here = Path(__file__).resolve().parent
    script = NEW_PROCESS.format(tests=str(here))
    env = {**os.environ, "TRNC_CACHE_DIR": str(tmp_path), "PYTHONPATH": f"{here.parent}{os.pathsep}{here}",
           "TRNC_THREADS": "1"}
    runs = []
    for assert_cached in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", script], env={**env, "TRNC_ASSERT_CACHED": assert_cached},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["misses"] == 4 and runs[1] == {"misses": 0, "disk_hits": 4, "y": 5.0}
