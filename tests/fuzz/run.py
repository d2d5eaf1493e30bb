"""One program through trnc, classified: the Outcome of a Case under a Config.

A Config is a precision (fp32: auto_cast="none"; bf16: auto_cast="all", every intermediate in bf16) and a way
in: `api` is trnc.compile (with cache=False, so every program really compiles; its run on the parallel driver
must agree bit for bit with a run on the serial one), `backend` is
torch.compile(backend="trnc", options={"fallback": False}), so an op trnc cannot lower raises
UnsupportedOpError instead of running in eager. Small programs on the api also run on the reference
interpreter, which must agree with the JIT bit for bit.

Outcome kinds: match; mismatch (structure, shape, dtype, value or bits, see check.py); error (any exception
but UnsupportedOpError, including TrncError "internal error in pass ..."); unsupported (with the ops named);
crash (the worker process died from a signal or hung: pool.py); invalid (the program is not a test case:
shrinking candidates that eager rejects, or whose reference is unfit).
"""
from __future__ import annotations

import os
import re
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree

import trnc
from trnc import flags
from trnc.errors import UnsupportedOpError

from .build import Invalid
from .check import compare, same_bits
from .generate import generate
from .program import Program
from .reference import Case, prepare

AUTO_CAST = {"fp32": "none", "bf16": "all"}
VIAS = ("api", "backend")
PARALLEL_THREADS = 3   # programs run on the parallel driver with more workers than cores (api: checked serially)
REFERENCE_ELEMENTS = 2 ** 14   # programs whose values all stay below this also run on the reference interpreter
KINDS = ("match", "mismatch", "error", "unsupported", "crash", "invalid")
TRNC_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(trnc.__file__))) + os.sep
TESTS = os.path.join(TRNC_ROOT, "tests") + os.sep

os.environ["TRNC_COMPILE_CACHE"] = "0"   # backend regions compile through trnc.compile's default cache=True
os.environ["TRNC_DEBUG"] = "1"           # the tile-level verifier after every tile pass


@dataclass(frozen=True)
class Config:
    precision: str = "fp32"
    via: str = "api"
    reference: bool = True     # run small programs on the reference interpreter too

    @property
    def name(self) -> str:
        return f"{self.precision}/{self.via}"


@dataclass
class Outcome:
    kind: str                   # one of KINDS
    detail: str = ""            # what kind of mismatch, error or crash: the shrinker keeps it
    message: str = ""
    unsupported: tuple[str, ...] = ()
    seconds: float = 0.0
    reference_run: bool = False
    program: Program | None = field(default=None, repr=False)
    redraws: tuple[str, ...] = ()   # generate.py's dropped drafts (eager outside its bound, ...)

    @property
    def signature(self) -> str:
        return f"{self.kind}:{self.detail}" if self.detail else self.kind

    @property
    def failed(self) -> bool:
        return self.kind in ("mismatch", "error", "crash")


def run_seed(seed: int, config: Config) -> Outcome:
    """Generate the program of `seed` for the config's precision and run it."""
    start = time.perf_counter()
    case = generate(seed, config.precision)
    outcome = run_case(case, config)
    outcome.seconds, outcome.redraws = time.perf_counter() - start, case.redraws
    return outcome


def run_program(program: Program, config: Config) -> Outcome:
    """Run a given program (a shrinking candidate): invalid if it is not a test case."""
    start = time.perf_counter()
    try:
        case = prepare(program, config.precision)
    except Invalid as e:
        return Outcome("invalid", message=str(e), program=program)
    outcome = run_case(case, config)
    outcome.seconds = time.perf_counter() - start
    return outcome


def compile_and_call(case: Case, config: Config):
    """(outputs, the CompiledModel or None for the backend)."""
    auto_cast = AUTO_CAST[config.precision]
    with torch.no_grad():
        if config.via == "api":
            compiled = trnc.compile(case.module, tuple(case.inputs), precision=config.precision, auto_cast=auto_cast,
                                    cache=False)
            return compiled(*case.inputs), compiled
        torch._dynamo.reset()
        options = {"precision": config.precision, "auto_cast": auto_cast, "fallback": False}
        compiled = torch.compile(case.module, backend="trnc", options=options)
        try:
            return compiled(*case.inputs), None
        finally:
            torch._dynamo.reset()


def run_case(case: Case, config: Config) -> Outcome:
    program = case.program
    try:
        with flags.override(TRNC_THREADS=PARALLEL_THREADS):
            got, compiled = compile_and_call(case, config)
    except UnsupportedOpError as e:
        return Outcome("unsupported", message=str(e), unsupported=unsupported_ops(str(e)), program=program)
    except Exception as e:
        return Outcome("error", error_detail(e), _error_text(e), program=program)
    problems = compare(got, case.eager, case.ref, case.tol)
    if problems:
        return Outcome("mismatch", problems[0].split(":")[0], "\n".join(problems), program=program)
    if compiled is not None:
        with flags.override(TRNC_THREADS=1), torch.no_grad():
            problems = same_bits(got, compiled(*case.inputs))
        if problems:
            return Outcome("mismatch", "threads", "the serial driver differs:\n" + "\n".join(problems),
                           program=program)
    if not (config.reference and config.via == "api" and small(case)):
        return Outcome("match", program=program)
    try:
        with torch.no_grad():
            reference = compiled.run_reference(*case.inputs)
    except Exception as e:
        return Outcome("error", "reference interpreter: " + error_detail(e), _error_text(e), program=program,
                       reference_run=True)
    problems = same_bits(got, reference)
    if problems:
        return Outcome("mismatch", "bits", "\n".join(problems), program=program, reference_run=True)
    return Outcome("match", program=program, reference_run=True)


def small(case: Case) -> bool:
    leaves = pytree.tree_leaves(case.eager)
    return max(x.numel() for x in [*case.inputs, *leaves]) <= REFERENCE_ELEMENTS and case.program.ops <= 20


ATEN = re.compile(r"aten\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?")


def unsupported_ops(message: str) -> tuple[str, ...]:
    """The ops an UnsupportedOpError names (aten names), or, when it names none, its words before the first
    parenthesis or colon with the numbers masked ("attention with head dim D=N")."""
    ops = tuple(dict.fromkeys(ATEN.findall(message)))
    return ops or (re.sub(r"\d+", "N", re.split(r"[(:]", message, maxsplit=1)[0]).strip()[:80],)


def error_detail(e: BaseException) -> str:
    """The class of an error, kept while shrinking: the exception type (the inner one of an internal error),
    the pass, and the innermost trnc frame of its root cause."""
    frames = _trnc_frames(e)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].name}" if frames else ""
    internal = re.search(r"internal error in pass '([^']+)': (\w+)", str(e))
    if internal:
        return f"internal error in {internal.group(1)}: {internal.group(2)}{where}"
    in_pass = re.search(r"\(in pass '([^']+)'\)", str(e))
    return f"{type(e).__name__}{f' in {in_pass.group(1)}' if in_pass else ''}{where}"


def _trnc_frames(e: BaseException) -> list[traceback.FrameSummary]:
    """The frames of the error's root cause inside trnc (not torch's, not the fuzzer's)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(TRNC_ROOT)
            and not f.filename.startswith(TESTS)]


def _error_text(e: BaseException) -> str:
    """The error and the innermost trnc frames of its root cause, where it was raised."""
    return f"{type(e).__name__}: {e}\n" + "".join(traceback.format_list(_trnc_frames(e)[-3:]))
