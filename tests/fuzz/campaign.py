"""The long run: n programs through trnc in worker processes, then every failure shrunk and written as a
reproducer, and a summary of the outcomes, the unsupported ops and the distinct bugs.

Program i of a campaign with seed S has seed S * 10**6 + i, so a failure is regenerated from its seed alone
and two campaigns with different seeds never share programs. Failures are grouped into bugs: errors and
crashes by signature (the exception, the pass and the innermost trnc frame, or the signal), mismatches by
signature and the set of op kinds left in the shrunk program. Each written reproducer is run once as its own
process to confirm that it fails on its own.
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import repro
from .build import Invalid
from .generate import generate
from .pool import Pool
from .program import Op, Program
from .reference import prepare
from .run import KINDS, Config, Outcome
from .shrink import shrink

SEED_STRIDE = 10 ** 6
SLOW = 20.0     # seconds: such programs are logged, as a slow compile is worth a look


@dataclass
class Bug:
    signature: str
    ops: tuple[str, ...]
    seeds: list[int] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    confirmed: list[bool] = field(default_factory=list)
    message: str = ""
    size: str = ""


@dataclass
class Report:
    config: Config
    outcomes: dict[int, Outcome]
    bugs: dict[tuple, Bug]
    seconds: float

    def text(self) -> str:
        counts = collections.Counter(o.kind for o in self.outcomes.values())
        n = len(self.outcomes)
        times = sorted(o.seconds for o in self.outcomes.values() if o.seconds)
        lines = [f"{n} programs at {self.config.name} in {self.seconds:.0f} s"
                 + (f" (per program: median {times[len(times) // 2]:.2f} s, max {times[-1]:.1f} s)" if times else ""),
                 "outcomes: " + ", ".join(f"{k} {counts[k]}" for k in KINDS if counts[k])]
        unsupported = collections.Counter(op for o in self.outcomes.values() for op in o.unsupported)
        if unsupported:
            lines.append("unsupported ops: " + ", ".join(f"{op} x{c}" for op, c in unsupported.most_common()))
        redraws = collections.Counter(r for o in self.outcomes.values() for r in o.redraws)
        if redraws:
            lines.append("drafts re-drawn: " + ", ".join(f"{r} x{c}" for r, c in redraws.most_common()))
        invalid = collections.Counter(o.message.split("\n")[0][:100] for o in self.outcomes.values()
                                      if o.kind == "invalid")
        lines.extend(f"invalid ({c}): {m}" for m, c in invalid.most_common(5))
        if self.bugs:
            lines.append(f"{len(self.bugs)} distinct bug(s):")
        for bug in self.bugs.values():
            lines.append(f"- {bug.signature} [{', '.join(bug.ops)}] x{len(bug.seeds)} (seeds {bug.seeds[:5]}): "
                         f"{bug.size}")
            lines.append(f"    {bug.message}")
            for f, ok in zip(bug.files, bug.confirmed):
                lines.append(f"    {f}{'' if ok else '  (did not fail on its own)'}")
        return "\n".join(lines)


def run_campaign(n: int, seed: int, config: Config, jobs: int, out: Path, timeout: float = 300.0,
                 shrink_budget: int = 300, shrink_limit: int | None = None, log=print, first: int = 0) -> Report:
    """Run programs first .. first+n-1, shrink, write. shrink_limit: at most this many failures shrunk per
    signature (None: all); the others are written as they are. first resumes a run that was stopped."""
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    pool = Pool(max(jobs, 1), timeout)
    try:
        outcomes = _run_all(pool, [seed * SEED_STRIDE + i for i in range(first, first + n)], config, max(jobs, 1), log)
        failures = {s: o for s, o in outcomes.items() if o.failed}
        log(f"{len(failures)} failure(s); shrinking")
        shrunk = _shrink_all(pool, failures, config, max(jobs, 1), shrink_budget, shrink_limit, log)
    finally:
        pool.close()
    bugs: dict[tuple, Bug] = {}
    for s, (program, outcome, runs) in sorted(shrunk.items()):
        ops = tuple(sorted({n.kind for n in program.nodes if isinstance(n, Op)}))
        key = (outcome.signature, ops if outcome.kind == "mismatch" else ())
        bug = bugs.setdefault(key, Bug(outcome.signature, ops, message=_first_line(outcome.message),
                                       size=program.describe()))
        path = out / f"{config.precision}-{config.via}-{_slug(outcome.signature)}-{s}.py"
        _write(path, program, config, outcome, f"seed {s}, shrunk in {runs} runs")
        bug.seeds.append(s)
        bug.files.append(str(path))
        bug.confirmed.append(_fails_alone(path, timeout))
    return Report(config, outcomes, bugs, time.perf_counter() - start)


def _run_all(pool: Pool, seeds: list[int], config: Config, jobs: int, log) -> dict[int, Outcome]:
    outcomes: dict[int, Outcome] = {}
    with ThreadPoolExecutor(jobs) as threads:
        for k, (s, outcome) in enumerate(zip(seeds, threads.map(lambda s: pool.run(("seed", (s, config))), seeds))):
            outcomes[s] = outcome
            if outcome.failed:
                log(f"seed {s}: {outcome.signature}: {_first_line(outcome.message)}")
            elif outcome.seconds > SLOW:
                log(f"seed {s}: {outcome.kind} in {outcome.seconds:.0f} s ({outcome.program.describe()[:100]})")
            if (k + 1) % 50 == 0:
                counts = collections.Counter(o.kind for o in outcomes.values())
                log(f"{k + 1}/{len(seeds)}: " + ", ".join(f"{kind} {c}" for kind, c in counts.items()))
    return outcomes


def _shrink_all(pool: Pool, failures: dict[int, Outcome], config: Config, jobs: int, budget: int,
                limit: int | None, log) -> dict[int, tuple[Program, Outcome, int]]:
    per_signature: collections.Counter = collections.Counter()
    todo = []
    for s, outcome in sorted(failures.items()):
        program = outcome.program or generate(s, config.precision).program   # a crash sent no program back
        per_signature[outcome.signature] += 1
        todo.append((s, program, outcome, limit is None or per_signature[outcome.signature] <= limit))

    def one(item):
        s, program, outcome, wanted = item
        if not wanted:
            return s, (program, outcome, 0)
        small, result, runs = shrink(program, outcome, lambda p: pool.run(("program", (p, config))), budget)
        log(f"seed {s}: {outcome.signature} shrunk from {program.ops} to {small.ops} ops in {runs} runs")
        return s, (small, result, runs)
    with ThreadPoolExecutor(jobs) as threads:
        return dict(threads.map(one, todo))


def _write(path: Path, program: Program, config: Config, outcome: Outcome, origin: str) -> None:
    try:
        case = prepare(program, config.precision)
    except Invalid:
        case = None
    path.write_text(repro.source(program, config, outcome, case, path.name, origin))


def _fails_alone(path: Path, timeout: float) -> bool:
    env = dict(os.environ, TRNC_COMPILE_CACHE="0", PYTHONWARNINGS="ignore")
    try:
        done = subprocess.run([sys.executable, str(path)], capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return True
    return done.returncode != 0


def _first_line(message: str) -> str:
    return message.strip().split("\n")[0][:200]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")[:60]
