"""What `trnc bench` measures of one zoo model, each figure against its baseline in the same run.

- compile: trnc's cold compile (a fresh cache folder; trnc.compile plus the JIT's load on the first call, which
  models that are modeled only leave out) against
  Inductor's cold compile of the same model (fresh cache folders, FX graph cache off; its first call minus its
  second, as for trnc: a GEMM's compile is a few tens of ms beside a run of a second, so an eager call's noise
  made the difference meaningless), both at fp32;
- modeled: per precision and target, the modeled time, the roofline bound and efficiency, each engine's
  utilization and what binds, the model's FLOPs and compulsory HBM bytes (the roofline plot's coordinates);
- host: the fp32 compiled model's run on the host against eager PyTorch at the same thread count, best of
  `repeats` after a warm-up, the two alternating so they see the same machine load;
- accuracy: per precision, the SQNR of the compiled model's outputs against eager fp32.

A run that cannot happen (an unsupported op, a precision the target lacks) is recorded with its reason.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

import trnc
from trnc import flags
from trnc.errors import TrncError
from trnc.isa.config import TARGETS
from trnc.options import PRECISIONS
from trnc.runtime.trace import chrome_trace

ENGINES = ("pe", "act", "dve", "pool")
LATENCY_BOUND = 0.5   # no engine busier than this share of the modeled time: waits on semaphores bind


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def sqnr_db(ref, got) -> float | None:
    """Signal over noise of every float output leaf, in dB; None when the outputs are equal."""
    pairs = [(r.double(), g.double()) for r, g in zip(pytree.tree_leaves(ref), pytree.tree_leaves(got))
             if isinstance(r, torch.Tensor) and r.is_floating_point()]
    signal = sum(float((r ** 2).sum()) for r, _ in pairs)
    noise = sum(float(((g - r) ** 2).sum()) for r, g in pairs)
    return None if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise)


def dma_share(utilization: dict[str, float]) -> float:
    """DMA's busy share: the mean of its queues in use."""
    dma = [v for k, v in utilization.items() if k.startswith("dma")]
    return sum(dma) / len(dma) if dma else 0.0


def bound_of(utilization: dict[str, float]) -> str:
    """What binds: the busiest of TensorE (pe), the vector engines and DMA (dma_share), or semaphore waits when
    none is busy for at least LATENCY_BOUND of the time."""
    shares = {e: utilization.get(e, 0.0) for e in ENGINES} | {"dma": dma_share(utilization)}
    busiest = max(shares, key=shares.get)
    return busiest if shares[busiest] >= LATENCY_BOUND else "semaphore waits"


def headline(row: dict) -> dict | None:
    """The model's headline run (its precision is row["headline"]), when it ran."""
    return next((r for r in row.get("runs", []) if r["precision"] == row.get("headline") and "error" not in r), None)


def bf16_times(row: dict) -> dict[str, float]:
    """The modeled microseconds of the model's bf16 runs by target: the baselines of the speedups."""
    return {r["target"]: r["modeled_us"] for r in row.get("runs", []) if r["precision"] == "bf16" and "error" not in r}


def target_for(precision: str, targets: tuple[str, ...]) -> str | None:
    """The first of `targets` that runs `precision` natively (MX needs trn3, fp8 double rows trn2 or later)."""
    for t in targets:
        hw = TARGETS[t]
        if (precision in ("mxfp8", "mxfp4") and not hw.mx) or (precision == "fp8" and not hw.fp8_double_row):
            continue
        return t
    return None


def modeled(compiled, precision: str, target: str) -> dict:
    s, perf = compiled.stats, compiled.perf
    flops = 2.0 * s["model_macs"]
    hw = TARGETS[target]
    dtype = PRECISIONS["bf16" if precision in ("fp8", "mxfp8", "mxfp4") else precision]
    return {"precision": precision, "target": target, "modeled_us": s["seconds"] * 1e6,
            "roofline_us": s["roofline_seconds"] * 1e6, "efficiency": s["efficiency"],
            "utilization": dict(s["engine_utilization"]), "bound": bound_of(s["engine_utilization"]),
            "instructions": s["instructions"], "flops": flops, "hbm_bytes": perf.compulsory_bytes,
            "dma_bytes": s["dma_bytes"], "tflops": flops / s["seconds"] / 1e12 if s["seconds"] else 0.0,
            "peak_tflops": hw.peak_flops(dtype) / 1e12, "hbm_gbps": hw.hbm_bytes_per_s / 1e9}


@contextmanager
def _fresh_inductor():
    """Inductor with empty cache folders and its FX graph cache off, restored afterwards."""
    import torch._inductor.config as inductor_config
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), inductor_config.fx_graph_cache
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        inductor_config.fx_graph_cache = False
        torch._dynamo.reset()
        try:
            yield
        finally:
            torch._dynamo.reset()
            inductor_config.fx_graph_cache = saved[1]
            if saved[0] is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved[0]


class Measure:
    """The figures of one model; each step reports its stage to `stage` (the progress display)."""

    def __init__(self, name: str, model, inputs: tuple, stage=lambda text: None, host: bool = True):
        """host: whether the compiled models run on the host (the JIT load in the compile time, the SQNRs);
        the largest GEMMs are modeled only."""
        self.name, self.model, self.inputs, self.stage, self.runs_on_host = name, model, inputs, stage, host
        with torch.no_grad():
            self.reference = model(*inputs)

    def compile_times(self, inductor: bool) -> tuple[dict, object]:
        """trnc's cold compile (and its fp32 CompiledModel, for the host run) and Inductor's."""
        self.stage("trnc compile fp32 (cold)")
        with tempfile.TemporaryDirectory() as cache, flags.override(TRNC_CACHE_DIR=cache):
            compile_s, compiled = timed(lambda: trnc.compile(self.model, self.inputs, cache=False))
            first_s = again_s = 0.0
            if self.runs_on_host:
                first_s, _ = timed(lambda: compiled(*self.inputs))
                again_s, _ = timed(lambda: compiled(*self.inputs))
        out = {"trnc_s": compile_s + max(0.0, first_s - again_s), "jit_load": self.runs_on_host}
        if inductor:
            self.stage("Inductor compile fp32 (cold)")
            with _fresh_inductor(), torch.no_grad():
                opt = torch.compile(self.model, backend="inductor")
                first_s, _ = timed(lambda: opt(*self.inputs))
                again_s, _ = timed(lambda: opt(*self.inputs))
            out["inductor_s"] = max(first_s - again_s, 1e-9)
            out["ratio"] = out["trnc_s"] / out["inductor_s"]
        return out, compiled

    def host(self, compiled, repeats: int) -> dict:
        """The fp32 compiled model against eager at torch's thread count (TRNC_THREADS follows it)."""
        self.stage("host run against eager")
        threads = torch.get_num_threads()
        best_trnc = best_eager = math.inf
        with flags.override(TRNC_THREADS=threads), torch.no_grad():
            compiled(*self.inputs)
            for _ in range(repeats):
                best_trnc = min(best_trnc, timed(lambda: compiled(*self.inputs))[0])
                best_eager = min(best_eager, timed(lambda: self.model(*self.inputs))[0])
        return {"threads": threads, "trnc_ms": best_trnc * 1e3, "eager_ms": best_eager * 1e3,
                "ratio": best_trnc / best_eager}

    def precision(self, precision: str, target: str, trace_dir: Path | None, compiled=None) -> dict:
        """Modeled figures and SQNR of one precision on one target; `compiled`: that CompiledModel when the caller
        has it already (the fp32 one of compile_times)."""
        self.stage(f"compile {precision} on {target}")
        try:
            if compiled is None:
                compiled = trnc.compile(self.model, self.inputs, precision=precision, target=target, cache=False)
        except TrncError as e:
            return {"precision": precision, "target": target, "error": str(e).splitlines()[0]}
        row = modeled(compiled, precision, target)
        if self.runs_on_host:
            self.stage(f"run {precision} for its SQNR")
            row["sqnr_db"] = sqnr_db(self.reference, compiled(*self.inputs))
        if trace_dir is not None:     # gzip: Perfetto and chrome://tracing open it, at a tenth of the size
            path = trace_dir / f"{self.name}-{precision}-{target}.json.gz"
            with gzip.open(path, "wt") as f:
                json.dump(chrome_trace(compiled.program, compiled.perf), f)
            row["trace"] = str(path.relative_to(trace_dir.parent))
        return row
