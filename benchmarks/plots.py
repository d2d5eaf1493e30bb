"""The report's plots (matplotlib, the bench extra), each a PNG beside report.md:

- roofline.png: per model's headline run, arithmetic intensity (FLOPs over compulsory HBM bytes) against the
  modeled TFLOP/s, under each target's compute ceiling (the headline dtype's peak) and HBM slope;
- utilization.png: per model, each engine's busy share of the headline run;
- compile.png: trnc's cold compile time against Inductor's, per model;
- precision.png: per model and precision, the SQNR against eager fp32 over the modeled speedup against bf16 on
  the same target.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .measure import ENGINES, bf16_times, dma_share, headline


def write_plots(out: Path, results: list[dict]) -> dict[str, str]:
    """Write the plots into `out`; returns {title: file name}."""
    done = {}
    for title, name, draw in (("roofline", "roofline.png", _roofline), ("engine utilization", "utilization.png",
                                                                          _utilization),
                              ("compile time", "compile.png", _compile), ("precision", "precision.png", _precision)):
        fig, ax = plt.subplots(figsize=(8, 5))
        draw(ax, results)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        done[title] = name
    return done


def _roofline(ax, results) -> None:
    heads = [(row["name"], h) for row in results if (h := headline(row))]
    ceilings = {(h["target"], h["precision"]): (h["peak_tflops"], h["hbm_gbps"]) for _, h in heads}
    xs = [h["flops"] / max(h["hbm_bytes"], 1) for _, h in heads] or [1.0]
    grid = [min(xs) / 4 * (max(xs) * 16 / min(xs)) ** (i / 99) for i in range(100)]
    for (target, precision), (peak, gbps) in ceilings.items():
        ax.plot(grid, [min(peak, x * gbps / 1e3) for x in grid], "--", label=f"{target} {precision} ceiling")
    for name, h in heads:
        x = h["flops"] / max(h["hbm_bytes"], 1)
        ax.plot([x], [h["tflops"]], "o")
        ax.annotate(name, (x, h["tflops"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per compulsory HBM byte)")
    ax.set_ylabel("modeled TFLOP/s")
    ax.set_title("Roofline: each model's headline run")
    if ceilings:
        ax.legend(fontsize=8)


def _utilization(ax, results) -> None:
    heads = [(row["name"], h) for row in results if (h := headline(row))]
    engines = (*ENGINES, "dma")
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        shares = [dma_share(h["utilization"]) if engine == "dma" else h["utilization"].get(engine, 0.0)
                  for _, h in heads]
        ax.bar([j + i * width for j in range(len(heads))], shares, width, label=engine)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(heads))], [n for n, _ in heads], rotation=30, ha="right")
    ax.set_ylabel("busy share of the modeled time")
    ax.set_ylim(0, 1)
    ax.set_title("Engine utilization (DMA: the mean of the queues in use)")
    ax.legend(fontsize=8)


def _compile(ax, results) -> None:
    rows = [r for r in results if "compile" in r]
    names = [r["name"] for r in rows]
    ax.bar([i - 0.2 for i in range(len(rows))], [r["compile"]["trnc_s"] for r in rows], 0.4, label="trnc")
    ax.bar([i + 0.2 for i in range(len(rows))], [r["compile"].get("inductor_s", 0.0) for r in rows], 0.4,
           label="Inductor")
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set_ylabel("cold compile seconds (fp32)")
    ax.set_title("Compile time against Inductor")
    ax.legend(fontsize=8)


def _precision(ax, results) -> None:
    for row in results:
        base = bf16_times(row)
        points = [(base[r["target"]] / r["modeled_us"], r["sqnr_db"], r["precision"]) for r in row.get("runs", [])
                  if "error" not in r and r["target"] in base and r.get("sqnr_db") is not None]
        if points:
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], "o", label=row["name"])
            for x, y, precision in points:
                ax.annotate(precision, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7,
                            color=line.get_color())
    ax.set_xlabel("modeled speedup against bf16 on the same target")
    ax.set_ylabel("SQNR against eager fp32 (dB)")
    ax.set_title("What each precision costs and gains")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
