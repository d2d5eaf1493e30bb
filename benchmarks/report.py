"""The report of a `trnc bench` run: report.json (every figure, with the machine, the versions and the date),
report.md (the tables) and the plots (plots.py), in one folder beside the traces.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
from pathlib import Path

from trnc.errors import TrncError

from .measure import ENGINES, bf16_times, dma_share, headline

PACKAGES = ("trnc", "torch", "numpy", "llvmlite", "transformers", "torchvision", "matplotlib")


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform(), "python": platform.python_version()}


def versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def write_report(out: Path, results: list[dict], run: dict) -> dict:
    """Write report.json, report.md and the plots into `out`; returns the JSON data."""
    data = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "versions": versions(), "run": run, "models": results}
    try:
        from .plots import write_plots
    except ImportError as e:
        raise TrncError(f"the report's plots need matplotlib ({e}); install the bench extra: "
                        "pip install -e '.[bench]'") from e
    data["plots"] = write_plots(out, results)
    (out / "report.json").write_text(json.dumps(data, indent=1, allow_nan=False, default=_finite) + "\n")
    (out / "report.md").write_text(markdown(data))
    return data


def _finite(value):
    raise TypeError(f"{value!r} is not JSON")


def _num(value, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def markdown(data: dict) -> str:
    run, m = data["run"], data["machine"]
    lines = [f"# trnc bench, {data['date'][:10]}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['system']}, Python {m['python']}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in data["versions"].items() if v) + ".",
             f"Run: {'--quick, ' if run['quick'] else ''}precisions {', '.join(run['precisions'])}, targets "
             f"{', '.join(run['targets'])}, host repeats {run['repeats']}, {run['seconds']:.0f} s in all.", "",
             "## Headline", "",
             "Compile: trnc's cold compile against Inductor's (fp32). Modeled: the headline precision (bf16 unless "
             "the model has one precision) on its target; efficiency is the roofline time over the modeled time. "
             "Host: the fp32 compiled model on the host JIT against eager PyTorch, same thread count.", "",
             "| model | trnc compile s | Inductor s | ratio | precision | target | modeled us | roofline us | "
             "efficiency | bound | host ms | eager ms | host ratio |",
             "|---|" + "---:|" * 3 + "---|---|" + "---:|" * 3 + "---|" + "---:|" * 3]
    for row in data["models"]:
        if "error" in row:
            lines.append(f"| {row['name']} | cannot run: {row['error']} |" + " |" * 11)
            continue
        c, h, head = row["compile"], row["host"], headline(row) or {}
        lines.append(
            f"| {row['name']} | {c['trnc_s']:.1f}{'' if c['jit_load'] else '*'} | "
            f"{_num(c.get('inductor_s'), '.1f')} | {_num(c.get('ratio'), '.2f')}"
            f" | {head.get('precision', '-')} | {head.get('target', '-')} | {_num(head.get('modeled_us'), '.1f')} | "
            f"{_num(head.get('roofline_us'), '.1f')} | {_num(head.get('efficiency'), '.3f')} | "
            f"{head.get('bound', '-')} | {_num(h.get('trnc_ms'), '.1f')} | {_num(h.get('eager_ms'), '.1f')} | "
            f"{_num(h.get('ratio'), '.2f')} |")
    lines += ["", "\\* modeled only (the host does not run it): the compile time leaves out the JIT's load.",
              "", "## Precisions", "",
              "Per precision, on the first target that has it: modeled time, its speedup over bf16 on the same "
              "target, and the SQNR of the outputs against eager fp32 (exact: equal outputs; -: modeled only, not "
              "run on the host).", "",
              "| model | precision | target | modeled us | vs bf16 | efficiency | bound | SQNR dB |",
              "|---|---|---|---:|---:|---:|---|---:|"]
    for row in data["models"]:
        base = bf16_times(row)
        for r in row.get("runs", []):
            if "error" in r:
                lines.append(f"| {row['name']} | {r['precision']} | {r.get('target', '-')} | cannot run: {r['error']} |"
                             + " |" * 4)
                continue
            speedup = base[r["target"]] / r["modeled_us"] if r["target"] in base else None
            sqnr = "-" if "sqnr_db" not in r else "exact" if r["sqnr_db"] is None else f"{r['sqnr_db']:.1f}"
            lines.append(f"| {row['name']} | {r['precision']} | {r['target']} | {r['modeled_us']:.1f} | "
                         f"{_num(speedup, '.2f')}x | {r['efficiency']:.3f} | {r['bound']} | {sqnr} |")
    lines += ["", "## Engine utilization (headline run)", "",
              "| model | PE | ACT | DVE | Pool | DMA queues (mean) | instructions |", "|---|" + "---:|" * 6]
    for row in data["models"]:
        head = headline(row)
        if head:
            u = head["utilization"]
            lines.append(f"| {row['name']} | " + " | ".join(f"{u.get(e, 0):.1%}" for e in ENGINES)
                         + f" | {dma_share(u):.1%} | {head['instructions']} |")
    lines += ["", "## Plots", ""] + [f"![{name}]({path})" for name, path in data["plots"].items()]
    traces = [(row["name"], headline(row)["trace"]) for row in data["models"] if headline(row)]
    lines += ["", "## Traces", "", "Gzipped Chrome trace JSON for Perfetto (ui.perfetto.dev) or chrome://tracing, "
              "one per model's headline run: " + ", ".join(f"[{n}]({t})" for n, t in traces) + "."]
    return "\n".join(lines) + "\n"
