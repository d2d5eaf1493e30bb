"""The OpInfo sweep: every op of torch's op_db that takes float32 on CPU through torch.compile(backend="trnc").

Each sample is called in eager PyTorch and compiled, first with options={"fallback": False} and, only when that
raises, again with fallback=True; both must equal eager (structure, shape, dtype, and values within
torch.testing.assert_close's default tolerances, or, where those find a value off eager, no less accurate than
eager against the sample computed in float64, in the max norm: no_less_accurate), and a fallback=False error must be an
UnsupportedOpError that names the op. tests/test_opinfo.py runs the first sample of each op as its own test id; this module run as a
script sweeps in child processes that a crash or a hang cannot take down, and writes docs/coverage.md:

    python tests/opinfo_sweep.py                  # first sample of every op
    python tests/opinfo_sweep.py --all-samples    # every sample (the long run)
    python tests/opinfo_sweep.py --ops abs,cat    # some ops only (prints, does not write coverage.md)

Outcomes (OUTCOMES): "on device" means the fallback=False compile raised nothing, dynamo captured the call
without a graph break, trnc compiled at least one aten node, and the result equalled eager: every aten node
that reads an input ran in a device region (with fallback=False trnc runs in eager only nodes that read no
input, constants; trnc/partition.py). A failure of trnc is cross-checked against torch.compile(backend="aot_eager"):
when that fails the same way (it raises too, or returns what trnc returned and not what eager did), the sample
is put down as "torch cannot trace", torch's limit rather than trnc's.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from core_aten import core_aten_lines

ROOT = Path(__file__).resolve().parents[1]
COVERAGE = ROOT / "docs" / "coverage.md"
_TRNC_DIRS = tuple(str(ROOT / d) + os.sep for d in ("trnc", "passes", "isa", "runtime"))

DEVICE, FALLBACK, NO_GRAPH, TORCH, EXCLUDED = "on device", "fallback", "no aten graph", "torch cannot trace", \
    "excluded"
WRONG, INTERNAL, UNNAMED, CRASH = "wrong", "internal error", "unsupported error not naming the op", "crash"
OUTCOMES = (DEVICE, FALLBACK, NO_GRAPH, TORCH, EXCLUDED, WRONG, INTERNAL, UNNAMED, CRASH)
FAILURES = (WRONG, INTERNAL, UNNAMED, CRASH)   # trnc bugs: the suite fails on these

# Ops whose eager result is memory nobody wrote (a draw of the allocator): compared by structure, shape and
# dtype only. Random draws need no list: an op whose eager result changes with the seed is found by running it.
UNDEFINED_MEMORY = ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
                    "resize_", "resize_as_")
RESEEDS = 4


@dataclass
class Result:
    """What one sample did: its outcome (one of OUTCOMES), why, and what trnc reported about it."""

    op: str
    sample: int
    outcome: str
    detail: str = ""
    inputs: str = ""                      # the sample's shapes and arguments
    fallback_ops: list[str] = field(default_factory=list)
    fallback_reasons: list[str] = field(default_factory=list)   # why each of fallback_ops ran in eager
    device_nodes: int = 0
    device_ops: list[str] = field(default_factory=list)   # the aten ops trnc ran on device
    values_compared: bool = True          # False for random or undefined results: structure, shape, dtype only
    seconds: float = 0.0


@functools.cache
def float32_ops() -> dict:
    """The OpInfos of op_db that support float32 on CPU, by full name ('nn.functional.gelu', 'normal.in_place').

    op_db wraps its random ops (dropout, bernoulli, sdpa, ...) in wrapper_set_seed, which saves the RNG state
    under no_dispatch: dynamo cannot trace that and runs the whole call in eager, so the sweep would measure the
    harness and never reach trnc. Here the wrapper is a plain call; the sweep seeds the RNG before every call."""
    from torch.testing._internal.common_methods_invocations import op_db
    ops = {op.full_name: op for op in op_db if torch.float32 in op.supported_dtypes("cpu")}
    for op in ops.values():
        code = getattr(op.op, "__code__", None)
        if code is not None and "wrapper_set_seed" in code.co_names:
            op.op.__globals__["wrapper_set_seed"] = _plain_call
    return ops


def _plain_call(fn, *args, **kwargs):
    """What op_db's lambdas call in place of wrapper_set_seed."""
    return fn(*args, **kwargs)


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def samples(op, all_samples: bool = False) -> list:
    """The op's first float32 CPU sample, or all of them; drawn at once from an RNG seeded by the op's name, so
    the suite and the script draw the same ones and a process restarted after a crash can skip to where it was."""
    torch.manual_seed(_seed(op.full_name))
    return list(itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=False),
                                 None if all_samples else 1))


def describe(sample) -> str:
    """The sample as text: tensors by shape (and dtype when not float32), everything else by repr."""
    def show(value):
        if isinstance(value, torch.Tensor):
            dtype = "" if value.dtype == torch.float32 else f" {str(value.dtype).removeprefix('torch.')}"
            return f"T{list(value.shape)}{dtype}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(show(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}={show(v)}" for k, v in value.items()) + "}"
        return repr(value)
    parts = [show(sample.input), *(show(a) for a in sample.args)]
    parts += [f"{k}={show(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)[:300]


def _clone(leaves: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]


@dataclass
class _Call:
    """One call of the sample: the result and the inputs after it (an op may write them), or what it raised;
    for a compiled call also trnc's report (None when trnc compiled nothing) and dynamo's graph breaks."""

    out: object = None
    inputs: list | None = None
    error: BaseException | None = None
    report: object = None
    breaks: tuple[str, ...] = ()


@dataclass
class _Sample:
    """One sample, flattened: its leaves (tensors and Python values) and the spec that rebuilds
    (input, args, kwargs); the seed set before every call; eager's call, and whether values are compared."""

    op: object
    leaves: list
    spec: object
    seed: int
    ref: _Call | None = None
    values: bool = True


def _call(s: _Sample, backend=None, options: dict | None = None, seed: int | None = None) -> _Call:
    """op.op on fresh copies of the sample's leaves, in eager (backend None) or through torch.compile. The
    tensors are the compiled function's inputs; Python values in the sample are constants of its graph."""
    import trnc.backend
    from torch._dynamo.utils import counters
    op, spec = s.op, s.spec
    inputs = _clone(s.leaves)
    positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]

    def fn(*tensors):
        full = list(inputs)
        for i, t in zip(positions, tensors):
            full[i] = t
        first, args, kwargs = tree_unflatten(full, spec)
        return op.op(first, *args, **kwargs)

    before = trnc.backend.last_report()
    if backend is not None:
        torch._dynamo.reset()
        counters.clear()
        fn = torch.compile(fn, backend=backend, options=options)
    torch.manual_seed(s.seed if seed is None else seed)
    call = _Call(inputs=inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call.out = fn(*[inputs[i] for i in positions])
        except Exception as e:   # noqa: BLE001 - every exception is an outcome to classify
            call.error = e
    if backend is not None:
        report = trnc.backend.last_report()
        call.report = report if report is not before else None
        call.breaks = tuple(counters["graph_break"])
        torch._dynamo.reset()
    return call


# assert_close's default (rtol, atol) per dtype (torch.testing.assert_close's documentation)
DEFAULT_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
                      torch.float64: (1e-7, 1e-7)}


def no_less_accurate(got: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> bool:
    """Whether `got` is no farther from `exact` (the op computed in float64 on the same inputs) than eager's `ref`
    is, give or take assert_close's default tolerance of the dtype at the output's scale: max |got - exact| <=
    max |ref - exact| + atol + rtol * max |exact|, with NaN where eager has NaN. This arbitrates a result that
    assert_close finds off eager: where a sum cancels (attention over values in the thousands, whose outputs
    are small differences of large terms), fp32's error in a small element is a share of the terms' magnitude,
    beyond the default tolerance of that element, and any summation order other than eager's differs from it
    by that much; an implementation as accurate as eager in the max norm is right."""
    rtol, atol = DEFAULT_TOLERANCES[ref.dtype]
    got, ref, exact = got.double(), ref.double(), exact.double()
    nan = ref.isnan()
    if not torch.equal(nan, got.isnan()):
        return False
    if bool(nan.all()):
        return True
    got, ref, exact = got[~nan], ref[~nan], exact[~nan]
    allowed = (ref - exact).abs().max() + atol + rtol * exact.abs().max()
    return bool((got - exact).abs().max() <= allowed)


def difference(got, ref, values: bool = True, exact=None) -> str | None:
    """How `got` differs from `ref`, or None when they match: structure, then each leaf's type, shape, dtype and
    (when `values`) its values within assert_close's default rtol/atol, or, given `exact` (the float64 result), no
    less accurate than `ref` (no_less_accurate). NaN matches NaN: eager against itself would fail otherwise."""
    got_leaves, got_spec = tree_flatten(got)
    ref_leaves, ref_spec = tree_flatten(ref)
    exact_leaves = tree_flatten(exact)[0] if exact is not None else None
    if exact_leaves is not None and tree_flatten(exact)[1] != ref_spec:
        exact_leaves = None
    if got_spec != ref_spec:
        return f"wrong structure: {_short(got_spec)} instead of {_short(ref_spec)}"
    for k, (g, r) in enumerate(zip(got_leaves, ref_leaves)):
        at = f" at output {k}" if len(ref_leaves) > 1 else ""
        if isinstance(r, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"wrong structure{at}: {type(g).__name__} instead of {type(r).__name__}"
        if isinstance(r, torch.Tensor):
            if g.shape != r.shape:
                return f"wrong shape{at}: {list(g.shape)} instead of {list(r.shape)}"
            if g.dtype != r.dtype:
                return f"wrong dtype{at}: {g.dtype} instead of {r.dtype}"
            if g.layout != r.layout:
                return f"wrong layout{at}: {g.layout} instead of {r.layout}"
        if not isinstance(r, (torch.Tensor, int, float, complex)):   # None, a dtype, a torch.Size, a string
            if g != r:
                return f"wrong value{at}: {g!r} instead of {r!r}"
            continue
        if not values:
            if type(g) is not type(r):
                return f"wrong structure{at}: {type(g).__name__} instead of {type(r).__name__}"
            continue
        try:
            torch.testing.assert_close(g, r, equal_nan=True)
        except AssertionError as e:
            x = exact_leaves[k] if exact_leaves is not None else None
            if isinstance(x, torch.Tensor) and r.dtype in DEFAULT_TOLERANCES and x.shape == r.shape \
                    and no_less_accurate(g, r, x):
                continue
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            return f"wrong value{at}: " + "; ".join(lines[:4])
    return None


def _short(text, limit: int = 160) -> str:
    """`text` on one line, cut to `limit` characters; IR value numbers (%v12) dropped, since they count the nodes
    made before in the process, so that docs/coverage.md does not change with the order ops ran in."""
    return re.sub(r"%v\d+", "%v", re.sub(r"\s+", " ", str(text))).strip()[:limit].rstrip()


def _trnc_frame(error: BaseException) -> str | None:
    """'passes/tile/lower.py:120': where in trnc's code the error started: the innermost trnc frame of the last error
    in its chain of causes that passed through trnc (a pass's IndexError, not the TrncError wrapping it)."""
    where = None
    while error is not None:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(_TRNC_DIRS)]
        if frames:
            where = f"{Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno}"
        error = error.__cause__ or error.__context__
    return where


def _first_line(error: BaseException) -> str:
    """The error's type and message on one line, and where in trnc's code it was raised (if it was)."""
    where = _trnc_frame(error)
    return f"{type(error).__name__}: {_short(error, 400)}" + (f" [{where}]" if where else "")


def _mismatch(call: _Call, ref: _Call, values: bool, exact: _Call | None = None) -> str | None:
    """How a call's result, or the inputs it left (an op may write its arguments), differ from eager's; `exact`,
    the sample in float64, arbitrates values that assert_close finds off eager's."""
    diff = difference(call.out, ref.out, values, exact.out if exact is not None and exact.error is None else None)
    if diff is None:
        diff = difference(call.inputs, ref.inputs, values)
        diff = diff and f"inputs after the call: {diff}"
    return diff


def _judged(call: _Call, s: _Sample) -> str | None:
    """How a trnc call differs from eager, the float64 result arbitrating values assert_close finds off."""
    diff = _mismatch(call, s.ref, s.values)
    if diff is None or not s.values:
        return diff
    wide = [x.double() if isinstance(x, torch.Tensor) and x.dtype in DEFAULT_TOLERANCES else x for x in s.leaves]
    return _mismatch(call, s.ref, s.values, _call(replace(s, leaves=wide)))


def _nondeterministic(s: _Sample) -> bool:
    """Whether eager's result is not a function of the inputs: it changes when run again with the same seed, or
    with any of RESEEDS other seeds (several: a draw of a few Bernoulli values repeats often enough)."""
    if s.op.name in UNDEFINED_MEMORY:
        return True
    calls = [_call(s, seed=s.seed + k) for k in range(RESEEDS + 1)]
    return any(c.error is not None or _mismatch(c, s.ref, True) for c in calls)


def run_sample(op, sample, index: int = 0) -> Result:
    """The outcome of one sample: eager, then trnc with fallback=False, then (if that raised) with fallback=True,
    each failure cross-checked against aot_eager."""
    from trnc.errors import UnsupportedOpError
    start = time.perf_counter()
    leaves, spec = tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    s = _Sample(op, leaves, spec, _seed(f"{op.full_name}/{index}"))
    result = Result(op.full_name, index, DEVICE, inputs=describe(sample))
    s.ref = _call(s)
    if s.ref.error is not None:
        result.outcome, result.detail = EXCLUDED, f"eager raises {_first_line(s.ref.error)}"
        return _timed(result, start)
    s.values = result.values_compared = not _nondeterministic(s)
    strict = _call(s, "trnc", {"fallback": False})
    if strict.error is None:
        diff = _judged(strict, s)
        if diff is not None:
            _fail(result, s, WRONG, f"fallback=False: {diff}", strict)
        elif strict.breaks:
            result.outcome, result.detail = TORCH, "graph break: " + _short("; ".join(strict.breaks), 300)
        elif strict.report is None or strict.report.device_nodes == 0:
            result.outcome, result.detail = NO_GRAPH, _empty_graph(s)
        else:
            result.device_nodes = strict.report.device_nodes
            result.device_ops = list(strict.report.device_ops)
        return _timed(result, start)
    loose = _call(s, "trnc", {"fallback": True})
    if loose.report is not None:
        result.fallback_ops = [f.op for f in loose.report.fallback]
        result.fallback_reasons = [_short(f.reason, 300) for f in loose.report.fallback]
        result.device_nodes = loose.report.device_nodes
        result.device_ops = list(loose.report.device_ops)
    if isinstance(strict.error, UnsupportedOpError):
        result.outcome, result.detail = FALLBACK, _reasons(loose.report) or _first_line(strict.error)
        if not _names_op(str(strict.error), result.fallback_ops):
            _fail(result, s, UNNAMED, f"fallback=False: {_first_line(strict.error)}")
    else:
        _fail(result, s, INTERNAL, f"fallback=False raises {_first_line(strict.error)}", strict)
    if loose.error is not None:
        _fail(result, s, INTERNAL, f"fallback=True raises {_first_line(loose.error)}", loose)
    elif (diff := _judged(loose, s)) is not None:
        _fail(result, s, WRONG, f"fallback=True: {diff}", loose)
    return _timed(result, start)


def _fail(result: Result, s: _Sample, outcome: str, detail: str, call: _Call | None = None) -> None:
    """Record a failure of `call` (the first one stays the outcome; later ones add to the detail), unless it is
    torch's: an exception other than a TrncError that aot_eager raises too (torch.compile cannot do the sample
    without trnc either), or a result that aot_eager returns too. A wrong result is also run with torch's
    decompositions as trnc uses them (no trnc compile), to tell a wrong decomposition from a wrong kernel."""
    from trnc.errors import TrncError
    if call is not None and not isinstance(call.error, TrncError) and (why := _torch_too(s, call)):
        if result.outcome not in FAILURES:
            result.outcome, result.detail = TORCH, why
        return
    if outcome == WRONG:
        decomposed, _ = _decomposed(s)
        if decomposed.error is None and _mismatch(decomposed, s.ref, s.values) is not None:
            detail += " (torch's decompositions that trnc uses, run in eager, give a wrong result too)"
    if result.outcome in FAILURES:
        result.detail += f" | {outcome}: {detail}"
    else:
        result.outcome, result.detail = outcome, detail


def _torch_too(s: _Sample, call: _Call) -> str | None:
    """Why torch.compile(backend="aot_eager") fails like `call` did (raises too, or returns what trnc returned
    and not what eager did), or None when it does not."""
    aot = _call(s, "aot_eager")
    if call.error is not None:
        return f"aot_eager raises {_first_line(aot.error)}" if aot.error is not None else None
    aot_diff = aot.error is None and _mismatch(aot, s.ref, s.values)
    return f"aot_eager gives the same result: {aot_diff}" if aot_diff and _mismatch(call, aot, s.values) is None \
        else None


def _decomposed(s: _Sample) -> tuple[_Call, list[str]]:
    """The sample through aot_autograd with trnc's decomposition table and an eager compiler (no trnc code runs),
    and the aten ops of the graphs it built."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from trnc.capture import decomposition_table
    ops: list[str] = []

    def eager(gm, _):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    return _call(s, aot_autograd(fw_compiler=eager, decompositions=decomposition_table())), ops


def _empty_graph(s: _Sample) -> str:
    """Why trnc put no node on device: the aten graph has none (the result is an input, a view of one, or a
    Python value), or its nodes read no input, and trnc runs such constants in eager (trnc/partition.py)."""
    _, ops = _decomposed(s)
    if not ops:
        return "the aten graph has no node: the result is an input, a view of one, or a Python value"
    return f"its aten nodes ({_short(', '.join(sorted(set(ops))), 200)}) read no input: trnc runs them in eager"


def _names_op(message: str, fallback_ops: list[str]) -> bool:
    """An UnsupportedOpError names the op when it names one that falls back with fallback=True (as
    trnc/partition.py looks for it, to move only that op to eager), or (when that run made no report) some
    aten operator."""
    if fallback_ops:
        return any(name in message for name in fallback_ops)
    return re.search(r"aten\.\w+", message) is not None


def _reasons(report) -> str:
    return _short("; ".join(f"{f.op}: {f.reason}" for f in report.fallback), 400) if report is not None else ""


def _timed(result: Result, start: float) -> Result:
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def share(results: list[Result]) -> str:
    """The on-device share line: ops all of whose samples ran on device, of the ops swept (excluded ones aside)."""
    by_op = _by_op(results)
    swept = [rows for rows in by_op.values() if any(r.outcome != EXCLUDED for r in rows)]
    device = sum(all(r.outcome in (DEVICE, EXCLUDED) for r in rows) for rows in swept)
    return f"on device: {device} of {len(swept)} ops ({100 * device / max(len(swept), 1):.1f}%)"


def _by_op(results: list[Result]) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for r in sorted(results, key=lambda r: (r.op, r.sample)):
        out.setdefault(r.op, []).append(r)
    return out


def coverage_text(results: list[Result], all_samples: bool) -> str:
    """docs/coverage.md: the definitions, the counts, every failure, and one row per op."""
    by_op = _by_op(results)
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    mode = "every sample" if all_samples else "the first sample"
    lines = [
        "# OpInfo coverage of the torch.compile backend",
        "",
        f"Generated by tests/opinfo_sweep.py (torch {torch.__version__}) from {mode} of each of the {len(by_op)} "
        "ops of torch's op_db that take float32 on CPU; do not edit by hand. `pytest -n 2 tests/test_opinfo.py` "
        "rewrites it from the first samples, `python tests/opinfo_sweep.py --all-samples` from all of them.",
        "",
        "Each sample is called in eager PyTorch and through `torch.compile(backend=\"trnc\")` with "
        "`options={\"fallback\": False}`, and again with `fallback=True` only when that raises. Results are "
        "compared by structure, shape, dtype and values (torch.testing.assert_close's default tolerances, NaN "
        "equal to NaN), and so are the inputs after the call; ops whose eager result is a random draw or "
        "unwritten memory are compared by structure, shape and dtype only. Where assert_close finds a value off "
        "eager's, the op computed in float64 on the same inputs arbitrates: the result is right when its largest "
        "error against the float64 result is at most eager's largest error plus the default tolerance at the "
        "output's scale (atol + rtol * max |float64 result|): where a sum cancels, as in attention over large "
        "values, fp32's error in a small element exceeds that element's default tolerance, and any summation "
        "order other than eager's differs from eager by that much.",
        "",
        "Outcomes:",
        "",
        f"- **{DEVICE}**: the fallback=False compile raised nothing, dynamo captured the call without a graph "
        "break, trnc compiled at least one aten node, and the result equalled eager: every aten node that reads "
        "an input ran in a device region (with fallback=False, trnc runs in eager only the nodes that read no "
        "input: constants).",
        f"- **{FALLBACK}**: fallback=False raised an UnsupportedOpError naming the op, and with fallback=True "
        "(the listed ops in eager, the rest on device) the result equalled eager.",
        f"- **{NO_GRAPH}**: the result equalled eager but trnc put no node on device: the aten graph is empty "
        "(the result is an input or a view of one) or reads no input (a constant, which trnc runs in eager).",
        f"- **{TORCH}**: torch.compile itself cannot do it: dynamo breaks the graph (the op then runs in eager; "
        "data-dependent shapes, sparse tensors), or torch.compile(backend=\"aot_eager\") raises too, or returns "
        "the same wrong result. Not a trnc bug.",
        f"- **{EXCLUDED}**: eager itself raises on the sample; nothing to compare.",
        f"- **{WRONG}**, **{INTERNAL}**, **{UNNAMED}**, **{CRASH}** (the process died or hung): trnc bugs. "
        f"An {INTERNAL} is anything a trnc compile raised other than an UnsupportedOpError (a TrncError of "
        "another kind, or a Python exception) that aot_eager does not raise.",
        "",
        f"An op counts as on device when all its samples are; {share(results)}.",
        "",
        "| outcome | samples |",
        "| --- | --- |",
        *(f"| {o} | {n} |" for o, n in counts.items()),
        "",
        "## Failures",
        "",
    ]
    failures = [r for rows in by_op.values() for r in rows if r.outcome in FAILURES]
    lines += ["| op | sample | outcome | inputs | what |", "| --- | --- | --- | --- | --- |"] if failures else ["None."]
    lines += [f"| {r.op} | {r.sample} | {r.outcome} | {_cell(r.inputs)} | {_cell(r.detail)} |" for r in failures]
    unvalued = sorted({r.op for r in results if not r.values_compared})
    lines += ["", "Compared by structure, shape and dtype only (eager's result changes with the seed, or is "
              f"unwritten memory): {', '.join(unvalued) or 'none'}."]
    lines += ["", "## Every op", "", "| op | outcome | fallback ops | why |", "| --- | --- | --- | --- |"]
    for name, rows in by_op.items():
        tally = ", ".join(f"{n} {o}" for o in OUTCOMES if (n := sum(r.outcome == o for r in rows)))
        outcome = rows[0].outcome if len(rows) == 1 else tally
        fallback = sorted({f for r in rows for f in r.fallback_ops})
        why = next((r.detail for r in rows if r.outcome != DEVICE), "")
        lines.append(f"| {name} | {outcome} | {_cell(', '.join(fallback))} | {_cell(why)} |")
    lines += core_aten_lines(results, _cell)
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return _short(text, 300).replace("|", "\\|")


def write_coverage(results: list[Result], all_samples: bool, path: Path = COVERAGE) -> None:
    """Write coverage.md whole or not at all (two pytest workers may finish the sweep at the same moment)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(coverage_text(results, all_samples))
    os.replace(tmp, path)


def _child(names: list[str], all_samples: bool, resume: tuple[str, int] | None, conn, log: str) -> None:
    """A sweep process: the samples of `names` in order, from the one after `resume` (op, index), each announced
    by ("start", op, index, inputs) before it runs and sent as ("done", result) after; ("end",) at the end.
    Drawing an op's samples is announced as its sample -1: a process that dies there skips the op. Its output
    (torch's warnings, trnc's log) goes to `log`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    ops = float32_ops()
    at, after = (names.index(resume[0]), resume[1]) if resume else (0, None)
    for k, name in enumerate(names[at:]):
        if k == 0 and after == -1:
            continue
        conn.send(("start", name, -1, "drawing its samples"))
        for index, sample in enumerate(samples(ops[name], all_samples)):
            if k == 0 and after is not None and index <= after:
                continue
            conn.send(("start", name, index, describe(sample)))
            conn.send(("done", asdict(run_sample(ops[name], sample, index))))
    conn.send(("end",))


class _Lane:
    """One sweep process and the sample it is on; a new process takes over after the sample that killed or hung
    the last one, which is recorded as a crash."""

    def __init__(self, context, names: list[str], all_samples: bool, log: Path):
        self.context, self.names, self.all_samples, self.log = context, names, all_samples, log
        self.current: tuple[str, int, str, float] | None = None   # op, index, inputs, start time
        self.done = False
        self._start(None)

    def _start(self, resume) -> None:
        self.conn, child = self.context.Pipe(duplex=False)
        self.proc = self.context.Process(target=_child, daemon=True,
                                         args=(self.names, self.all_samples, resume, child, str(self.log)))
        self.proc.start()
        child.close()

    def receive(self) -> Result | None:
        try:
            message = self.conn.recv()
        except EOFError:
            self.proc.join()
            return self._crash(f"the process died (exit code {self.proc.exitcode})")
        if message[0] == "start":
            self.current = (*message[1:], time.monotonic())
        elif message[0] == "done":
            self.current = None
            return Result(**message[1])
        else:
            self.done = True
            self.proc.join()
        return None

    def hung(self, timeout: float) -> Result | None:
        if self.current is None or time.monotonic() - self.current[3] < timeout:
            return None
        return self._crash(f"hung: no result after {timeout:.0f} s")

    def _crash(self, why: str) -> Result:
        if self.current is None:
            raise RuntimeError(f"a sweep process stopped between samples ({why}); its output is in {self.log}")
        op, index, inputs, _ = self.current
        self.proc.kill()
        self.proc.join()
        self.conn.close()
        self.current = None
        self._start((op, index))
        return Result(op, index, CRASH, why, inputs=inputs)


def sweep(names: list[str], all_samples: bool, jobs: int, timeout: float, log: Path,
          record: Path | None = None) -> list[Result]:
    """Every sample of `names` (or the first of each) in `jobs` child processes, surviving crashes and hangs;
    each failure is printed as it comes, and each result appended to `record` (JSON lines) so that a long run
    cut short keeps what it did."""
    context = multiprocessing.get_context("spawn")
    lanes = [_Lane(context, names[k::jobs], all_samples, log) for k in range(jobs)]
    results: list[Result] = []
    while not all(lane.done for lane in lanes):
        live = {lane.conn: lane for lane in lanes if not lane.done}
        ready = multiprocessing.connection.wait(list(live), timeout=1.0)
        for lane in live.values():
            result = lane.receive() if lane.conn in ready else lane.hung(timeout)
            if result is not None:
                results.append(result)
                if record is not None:
                    with record.open("a") as f:
                        f.write(json.dumps(asdict(result)) + "\n")
                if result.outcome in FAILURES:
                    print(f"{result.op} [{result.sample}] {result.outcome}: {result.inputs}: {result.detail}")
    return results


def main(argv: list[str] | None = None) -> int:
    """The script: sweep, print the counts and the share, write coverage.md; exit 1 when anything failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all-samples", action="store_true", help="every sample of each op, not only the first")
    parser.add_argument("--ops", help="comma-separated op names (full names, e.g. nn.functional.gelu); then "
                                      "coverage.md is written only with --out")
    parser.add_argument("--jobs", type=int, default=1, help="child processes (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a sample may take before it counts "
                                                                     "as hung (default 300)")
    parser.add_argument("--out", type=Path, help=f"coverage file (default {COVERAGE.relative_to(ROOT)})")
    parser.add_argument("--json", type=Path, help="also write every result to this file as it comes, one JSON "
                                                  "object a line")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRNC_COMPILE_CACHE", "0")   # every sample runs the compiler's passes
    names = list(float32_ops())
    if args.ops:
        unknown = sorted(set(args.ops.split(",")) - set(names))
        if unknown:
            parser.error(f"not ops of op_db that take float32: {', '.join(unknown)}")
        names = [n for n in names if n in args.ops.split(",")]
    log = Path(tempfile.gettempdir()) / f"opinfo_sweep.{os.getpid()}.log"
    start = time.perf_counter()
    if args.json:
        args.json.write_text("")
    results = sweep(names, args.all_samples, args.jobs, args.timeout, log, args.json)
    for outcome in OUTCOMES:
        print(f"{outcome}: {sum(r.outcome == outcome for r in results)}")
    print(f"{share(results)}; {len(results)} samples in {time.perf_counter() - start:.0f} s; output in {log}")
    if args.out or not args.ops:
        write_coverage(results, args.all_samples, args.out or COVERAGE)
    return int(any(r.outcome in FAILURES for r in results))


if __name__ == "__main__":
    sys.exit(main())
