"""Benchmark: torchvision's ResNet-50 on the modeled chip, on the host, and in the compiler, each against its
baseline in the same run.

Goals (issue 14):
- modeled efficiency (roofline / modeled time, runtime/perf.py; the roofline of the model: its convolution and
  matmul MACs at the peak rate, or its compulsory HBM bytes, whichever binds) at 1x3x224x224, bf16
  auto_cast="all", trn2: at least 0.55; also at batch 8; with per-engine utilization;
- host run time of the compiled fp32 model against eager PyTorch at the same thread count: at most 3x;
- cold compile time against Inductor's cold compile of the same model (fresh cache folders, FX graph cache
  off; Inductor's time is its first call minus one eager call): at most 0.5x.

Run: python benchmarks/bench_cnn.py [--model resnet50] [--resolution 224] [--batches 1,8] [--skip-inductor]
Random weights (weights=None), no downloads.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from trnc.bench.vision import torchvision  # noqa: E402  (torchvision beside torch's CPU build)

import trnc.api as trnc_api  # noqa: E402
from trnc import flags  # noqa: E402

ENGINES = ("pe", "act", "dve", "pool")


def model_of(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return getattr(torchvision().models, name)(weights=None).eval()


def modeled(name: str, resolution: int, batch: int) -> None:
    x = torch.randn(batch, 3, resolution, resolution)
    start = time.perf_counter()
    compiled = trnc_api.compile(model_of(name), (x,), precision="bf16", auto_cast="all", cache=False)
    seconds = time.perf_counter() - start
    s = compiled.stats
    util = s["engine_utilization"]
    dma = sum(v for k, v in util.items() if k.startswith("dma")) / sum(1 for k in util if k.startswith("dma"))
    print(f"{name} {batch}x3x{resolution}x{resolution}, bf16 auto_cast=all, trn2 (compiled in {seconds:.1f} s)")
    print(f"  instructions {s['instructions']}, kernels {s['kernels']}, modeled {s['seconds'] * 1e6:.1f} us, "
          f"roofline {s['roofline_seconds'] * 1e6:.1f} us, efficiency {s['efficiency']:.3f}")
    print("  utilization: " + ", ".join(f"{q} {util[q]:.1%}" for q in ENGINES if q in util)
          + f", dma queues mean {dma:.1%}")
    print(f"  dma bytes {s['dma_bytes'] / 1e6:.1f} MB, sbuf peak {s['sbuf_peak_bytes'] / 2**20:.1f} MiB")


def host(name: str, resolution: int, threads: int, repeats: int = 3) -> None:
    torch.set_num_threads(threads)
    model, x = model_of(name), torch.randn(1, 3, resolution, resolution)
    with flags.override(TRNC_THREADS=threads):
        compiled = trnc_api.compile(model, (x,), cache=False)
        compiled(x)
        trnc_s = min(_timed(lambda: compiled(x)) for _ in range(repeats))
    with torch.no_grad():
        model(x)
        eager_s = min(_timed(lambda: model(x)) for _ in range(repeats))
    print(f"{name} 1x3x{resolution}x{resolution} fp32 host run, {threads} thread(s): trnc {trnc_s * 1e3:.1f} ms, "
          f"eager {eager_s * 1e3:.1f} ms, ratio {trnc_s / eager_s:.2f}")


def compile_times(name: str, resolution: int) -> None:
    model, x = model_of(name), torch.randn(1, 3, resolution, resolution)
    with tempfile.TemporaryDirectory() as cache, flags.override(TRNC_CACHE_DIR=cache):
        trnc_s = _timed(lambda: trnc_api.compile(model, (x,), cache=False))
    with torch.no_grad():
        model(x)
        eager_s = _timed(lambda: model(x))
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        import torch._inductor.config as inductor_config
        inductor_config.fx_graph_cache = False
        torch._dynamo.reset()
        opt = torch.compile(model, backend="inductor")
        with torch.no_grad():
            inductor_s = _timed(lambda: opt(x)) - eager_s
    print(f"{name} 1x3x{resolution}x{resolution} fp32 cold compile: trnc.compile {trnc_s:.1f} s, Inductor "
          f"{inductor_s:.1f} s, ratio {trnc_s / inductor_s:.2f}")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a torchvision model name; default resnet50.")
    parser.add_argument("--resolution", type=int, default=224, help="input height and width; default 224.")
    parser.add_argument("--batches", default="1,8", help="batch sizes of the modeled run, e.g. 1,8; default 1,8.")
    parser.add_argument("--threads", default="1,2", help="host thread counts, e.g. 1,2; default 1,2.")
    parser.add_argument("--skip-inductor", action="store_true", help="leave out the compile-time comparison.")
    args = parser.parse_args()
    for batch in map(int, args.batches.split(",")):
        modeled(args.model, args.resolution, batch)
    for threads in map(int, args.threads.split(",")):
        host(args.model, args.resolution, threads)
    if not args.skip_inductor:
        compile_times(args.model, args.resolution)


if __name__ == "__main__":
    main()
