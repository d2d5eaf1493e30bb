"""A plain (non-editable) install maps isa/, passes/ and runtime/ into the trnc package."""
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_trnc_isa_runtime_passes(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("trnc-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("trnc/isa/opcodes.py", "trnc/isa/SPEC.md", "trnc/runtime/__init__.py",
                     "trnc/passes/__init__.py", "trnc/passes/graph/legalize.py", "trnc/passes/tile/kernels/__init__.py",
                     "trnc/cli/main.py", "trnc/runtime/jit/codegen.py"):
        assert required in names
    assert not any(n.startswith(("isa/", "runtime/", "passes/")) for n in names)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    probe = ("import trnc.isa, trnc.runtime, trnc.passes, trnc.runtime.jit.executor, trnc.isa.opcodes as o; "
             "assert trnc.isa.__file__.startswith(%r); print(len(o.TABLE))" % str(target))
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(__import__("trnc.isa.opcodes", fromlist=["TABLE"]).TABLE)
