"""Reproducers: a failing program written as one standalone Python file that imports torch and trnc only.

The file holds the draw and check code (copied from draw.py and check.py, so it decides as the fuzzer
decided), the Model with its seeded parameters, the inputs, and the tolerance of every float output (packed;
it came from the perturbed lanes of reference.py, which the file does not need). It computes the float64
reference itself (a float64 copy of the model under check.Float64Casts), compiles the model as the fuzzer
did, compares, and exits 1 while the bug is present (an exception or a crash also ends it non-zero) and 0
once trnc matches; an UnsupportedOpError exits 0 too, as trnc then refuses the program rather than failing it.
"""
from __future__ import annotations

import ast
import base64
import inspect
import zlib

import numpy as np

from . import check, draw
from .build import module_source, resolve
from .program import Input, Program
from .reference import Case
from .run import AUTO_CAST, PARALLEL_THREADS, Config, Outcome

HEADER = '''"""trnc fuzz reproducer: {signature} at precision={precision} via {via}.

{message}

Found by python -m tests.fuzz ({origin}); {ops} ops. Run: python {name}
Exits 1 while the bug is present, 0 once trnc matches eager within the fuzzer's tolerance (or refuses the
program with UnsupportedOpError, which is not this bug).
"""
import base64
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn

import trnc
from trnc import flags
from trnc.errors import UnsupportedOpError

'''

MAIN = '''

def inputs():
    return [{inputs}]


def tolerances():
    """The fuzzer's per-element tolerance of each output leaf (float32, rounded up), None for exact leaves."""
    return [None if t is None else torch.from_numpy(np.frombuffer(zlib.decompress(base64.b64decode(t)),
            dtype=np.float32).reshape(s).astype(np.float64)) for t, s in zip(TOLERANCES, SHAPES)]


def main() -> int:
    model, args = Model().eval(), inputs()
    with torch.no_grad():
        eager = model(*args)
        with Float64Casts():
            ref = Model().double().eval()(*[a.double() if a.is_floating_point() else a for a in args])
        refs = [r if r.is_floating_point() else None for r in pytree.tree_leaves(ref)]
        try:
            with flags.override(TRNC_THREADS=PARALLEL_THREADS):
                if VIA == "api":
                    compiled = trnc.compile(model, tuple(args), precision=PRECISION, auto_cast=AUTO_CAST, cache=False)
                    got = compiled(*args)
                else:
                    options = {{"precision": PRECISION, "auto_cast": AUTO_CAST, "fallback": False}}
                    got = torch.compile(model, backend="trnc", options=options)(*args)
        except UnsupportedOpError as e:
            print(f"trnc refuses the program (not this bug): {{e}}")
            return 0
        problems = compare(got, eager, refs, tolerances())
        if not problems and VIA == "api":
            with flags.override(TRNC_THREADS=1):
                problems = same_bits(got, compiled(*args))
        if not problems and CHECK_REFERENCE:
            problems = same_bits(got, compiled.run_reference(*args))
    print("\\n".join(problems) if problems else "ok: trnc matches eager within the tolerance")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _body(module) -> str:
    """A module's source without its docstring and imports, headed by where it comes from."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    lines = source.splitlines()
    start = max(n.end_lineno for n in tree.body if isinstance(n, (ast.Expr, ast.Import, ast.ImportFrom))
                and tree.body.index(n) < 4)
    return f"# from tests/fuzz/{module.__name__.rsplit('.', 1)[-1]}.py\n" + "\n".join(lines[start:]).strip() + "\n"


def _packed(tol) -> str | None:
    if tol is None:
        return None
    t = tol.numpy()
    up = t.astype(np.float32)
    up = np.where(up < t, np.nextafter(up, np.float32(np.inf)), up).astype(np.float32)
    return base64.b64encode(zlib.compress(up.tobytes(), 9)).decode()


def source(program: Program, config: Config, outcome: Outcome, case: Case | None, name: str, origin: str) -> str:
    """The reproducer's text; `case` gives the tolerances (None when the program cannot be prepared here)."""
    _, params = resolve(program)
    message = "\n".join(line[:116] for line in outcome.message.strip().splitlines()[:6])
    head = HEADER.format(signature=outcome.signature, precision=config.precision, via=config.via, origin=origin,
                         ops=program.ops, name=name, message=message.replace('"""', "'''"))
    tols = case.tol if case is not None else [None] * len(program.outputs)
    ins = ", ".join(f"draw({n.shape!r}, {n.dtype!r}, {n.kind!r}, {n.seed}, 1.0, {n.high})"
                    for n in program.nodes if isinstance(n, Input))
    constants = (f"PRECISION, AUTO_CAST, VIA = {config.precision!r}, {AUTO_CAST[config.precision]!r}, {config.via!r}\n"
                 f"PARALLEL_THREADS = {PARALLEL_THREADS}\n"
                 f"CHECK_REFERENCE = {outcome.signature == 'mismatch:bits' or outcome.reference_run!r}\n"
                 f"SHAPES = {[tuple(t.shape) if t is not None else None for t in tols]!r}\n"
                 f"TOLERANCES = {[_packed(t) for t in tols]!r}\n")
    return (head + _body(draw) + "\n\n" + _body(check) + "\n\n" + module_source(program, params) + "\n\n" + constants
            + MAIN.format(inputs=ins))
