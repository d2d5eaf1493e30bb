"""`trnc bench` (also `python -m benchmarks`): runs the zoo (zoo.py), measures each model (measure.py) and
writes the report (report.py, plots.py) into --out.

Per model: the cold compile against Inductor and the host run against eager (fp32), then per precision the
modeled figures on the first of --targets that has the format, and the SQNR against eager fp32; bf16 runs on
every target used, as the baseline of the speedups. The headline
run of a model (its trace, the roofline point) is bf16, or the model's only precision. A progress line names
the model and stage running on a terminal; one line per finished model goes to stdout.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from trnc.errors import TrncError
from trnc.progress import Progress

from .measure import Measure, target_for
from .report import write_report
from .zoo import ZOO

PRECISIONS = ("fp32", "bf16", "fp8", "mxfp8", "mxfp4")
QUICK_PRECISIONS = ("fp32", "bf16", "fp8", "mxfp8")
TARGETS = ("trn2", "trn3")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="the quick subset (" + ", ".join(n for n, e in ZOO.items() if e.quick)
                        + f") at small sizes and precisions {','.join(QUICK_PRECISIONS)}: minutes on two cores.")
    p.add_argument("--models", help="comma-separated zoo names (see below). Defaults to the whole zoo, or the "
                                    "quick subset with --quick.")
    p.add_argument("--precisions", help=f"comma-separated, among {','.join(PRECISIONS)}. Defaults to all of them "
                                        f"({','.join(QUICK_PRECISIONS)} with --quick).")
    p.add_argument("--targets", default=",".join(TARGETS),
                   help="targets in order of preference; each precision runs on the first that has it natively. "
                        f"Defaults to {','.join(TARGETS)}.")
    p.add_argument("--out", default="bench-report", help="report folder. Defaults to ./bench-report.")
    p.add_argument("--repeats", type=int, help="host-run repeats (best of). Defaults to 3, or 2 with --quick.")
    p.add_argument("--no-inductor", action="store_true", help="leave out Inductor's compile time.")


def epilog() -> str:
    width = max(map(len, ZOO))
    rows = "\n".join(f"  {n:<{width}}  {e.about}{' [quick]' if e.quick else ''}" for n, e in ZOO.items())
    return ("the zoo (random weights, no downloads):\n" + rows
            + "\n\nexample:\n  trnc bench --quick --out bench-report\n  trnc bench --models bert-base,resnet50 "
              "--precisions bf16,fp8")


def _names(text: str | None, allowed, what: str) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise TrncError(f"unknown {what} {', '.join(unknown) or '(none given)'}; choose among {', '.join(allowed)}")
    return names


def run(args) -> dict:
    """Run the benchmark the parsed `args` ask for and write its report; returns the report's data."""
    from trnc.isa.config import TARGETS as ALL_TARGETS
    models = _names(args.models, ZOO, "model") or [n for n, e in ZOO.items() if e.quick or not args.quick]
    precisions = _names(args.precisions, PRECISIONS, "precision") or list(
        QUICK_PRECISIONS if args.quick else PRECISIONS)
    targets = tuple(_names(args.targets, ALL_TARGETS, "target"))
    repeats = args.repeats or (2 if args.quick else 3)
    out = Path(args.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    results, start = [], time.perf_counter()
    with Progress(len(models), label="trnc bench") as progress:
        for name in models:
            progress.begin(name)
            results.append(_bench(ZOO[name], args.quick, precisions, targets, not args.no_inductor, repeats,
                                  out / "traces", lambda text: progress.status(f"{name}: {text}")))
            progress.close()
            print(_summary(results[-1]), flush=True)
    data = write_report(out, results, {"quick": args.quick, "models": models, "precisions": precisions,
                                       "targets": list(targets), "repeats": repeats,
                                       "seconds": time.perf_counter() - start})
    print(f"report: {out / 'report.md'} (and report.json, plots, traces/)")
    return data


def _bench(entry, quick: bool, precisions, targets, inductor: bool, repeats: int, trace_dir: Path, stage) -> dict:
    row = {"name": entry.name, "about": entry.about}
    try:
        stage("build")
        model, inputs = entry.build(quick)
        m = Measure(entry.name, model, inputs, stage, host=entry.host)
        row["inputs"] = [list(x.shape) for x in inputs]
        row["compile"], fp32 = m.compile_times(inductor)
        row["host"] = m.host(fp32, repeats) if entry.host else {"skipped": "modeled only (too long for the host)"}
    except TrncError as e:
        row["error"] = str(e).splitlines()[0]
        return row
    except Exception as e:   # a bug in trnc: listed with the model, not dropped, and the run goes on
        row["error"] = f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return row
    wanted = entry.precisions or precisions
    headline = "bf16" if "bf16" in wanted else wanted[0]
    row["runs"] = []
    for precision in wanted:
        target = target_for(precision, entry.targets or targets)
        if target is None:
            row["runs"].append({"precision": precision, "error": f"none of the targets {', '.join(targets)} has "
                                                                 f"{precision} (see --targets)"})
            continue
        reuse = fp32 if precision == "fp32" and target == fp32.options.target else None
        row["runs"].append(m.precision(precision, target, trace_dir if precision == headline else None, reuse))
    measured = {(r["precision"], r["target"]) for r in row["runs"] if "target" in r}
    for target in sorted({t for _, t in measured} - {t for p, t in measured if p == "bf16"}):
        row["runs"].append(m.precision("bf16", target, None))   # each target's baseline of the speedups
    row["headline"] = headline
    return row


def _summary(row: dict) -> str:
    if "error" in row:
        return f"{row['name']}: cannot run: {row['error']}"
    head = next((r for r in row["runs"] if r["precision"] == row["headline"] and "error" not in r), None)
    text = f"{row['name']}: compile {row['compile']['trnc_s']:.1f} s"
    if "ratio" in row["compile"]:
        text += f" ({row['compile']['ratio']:.2f}x Inductor)"
    if head:
        text += (f", {head['precision']} on {head['target']} {head['modeled_us']:.1f} us modeled, efficiency "
                 f"{head['efficiency']:.2f}, bound {head['bound']}")
    if "ratio" in row["host"]:
        text += f", host {row['host']['ratio']:.2f}x eager"
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0],
                                     epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except TrncError as e:
        sys.exit(f"error: {e}")
