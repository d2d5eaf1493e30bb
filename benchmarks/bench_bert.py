"""Benchmark: a BERT-base encoder layer's modeled efficiency, and BERT-base's cold compile time against Inductor.

Goals (issue 4):
- modeled efficiency (roofline / modeled time, runtime/perf.py, trn2, bf16; the roofline of the model:
  its matmul and attention MACs at the peak rate, or its compulsory HBM bytes) of one BERT-base encoder
  layer (hidden 768, 12 heads, intermediate 3072) at sequence length 512: at least 0.70;
- cold compile time of BERT-base (12 layers, sequence 128) at most 0.5x Inductor's cold compile of the
  same model, both measured in this run. Inductor's time is its first call (dynamo, AOT, Inductor, C++
  build) minus one eager call, with a fresh cache directory and its FX graph cache off; trnc's is
  trnc.compile (capture, every pass, the verifier, the performance model) and, reported beside it,
  the first call (which JIT-compiles the kernels with an empty kernel cache).

Run: python benchmarks/bench_bert.py [--layer-only | --compile-only] [--seq 512]
Models are random-init from transformers configs (no downloads).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from trnc.bench.vision import torchvision  # noqa: E402

torchvision()   # transformers imports torchvision, which needs the shim beside torch's CPU build
import transformers as tf  # noqa: E402

import trnc.api as trnc_api  # noqa: E402
from trnc import flags  # noqa: E402


def bert_base_config(layers: int) -> tf.BertConfig:
    return tf.BertConfig(hidden_size=768, num_hidden_layers=layers, num_attention_heads=12, intermediate_size=3072,
                         vocab_size=30522, max_position_embeddings=512, attn_implementation="sdpa")


def layer_efficiency(seq: int, auto_cast: str) -> None:
    torch.manual_seed(0)
    layer = tf.models.bert.modeling_bert.BertLayer(bert_base_config(1)).eval()

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, h):
            return self.layer(h)[0]

    x = torch.randn(1, seq, 768)
    start = time.perf_counter()
    compiled = trnc_api.compile(Layer().eval(), (x,), precision="bf16", auto_cast=auto_cast, cache=False)
    seconds = time.perf_counter() - start
    s = compiled.stats
    print(f"BERT-base encoder layer, seq {seq}, bf16 auto_cast={auto_cast}, trn2 (compiled in {seconds:.1f} s)")
    print(f"  instructions {s['instructions']}, kernels {s['kernels']}, modeled {s['seconds'] * 1e6:.1f} us, "
          f"roofline {s['roofline_seconds'] * 1e6:.1f} us, efficiency {s['efficiency']:.3f} "
          f"(against the executed MACs, as runtime/perf.py counts them: {s['executed_macs_efficiency']:.3f})")
    util = s["engine_utilization"]
    print("  utilization: " + ", ".join(f"{q} {util[q]:.1%}" for q in ("pe", "act", "dve", "pool") if q in util) +
          f", dma queues mean {sum(v for k, v in util.items() if k.startswith('dma')) / 16:.1%}")
    print(f"  dma bytes {s['dma_bytes'] / 1e6:.1f} MB, sbuf peak {s['sbuf_peak_bytes'] / 2**20:.1f} MiB")


def compile_times(seq: int) -> None:
    torch.manual_seed(0)
    model = tf.BertModel(bert_base_config(12)).eval()
    ids = torch.randint(0, 30522, (1, seq))
    with tempfile.TemporaryDirectory() as cache, flags.override(TRNC_CACHE_DIR=cache):
        start = time.perf_counter()
        compiled = trnc_api.compile(model, (ids,), cache=False)   # the compile itself, no cache store
        trnc_compile = time.perf_counter() - start
        start = time.perf_counter()
        compiled(ids)
        trnc_first = time.perf_counter() - start
    with torch.no_grad():
        model(ids)
        start = time.perf_counter()
        model(ids)
        eager = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        import torch._inductor.config as inductor_config
        inductor_config.fx_graph_cache = False
        torch._dynamo.reset()
        opt = torch.compile(model, backend="inductor")
        start = time.perf_counter()
        with torch.no_grad():
            opt(ids)
        inductor = time.perf_counter() - start - eager
    print(f"BERT-base 12 layers, seq {seq}, fp32, cold caches")
    print(f"  trnc.compile {trnc_compile:.1f} s ({compiled.stats['instructions']} instructions); first call "
          f"(JIT build) {trnc_first:.1f} s")
    print(f"  Inductor first call minus eager {inductor:.1f} s")
    print(f"  ratio trnc.compile / Inductor = {trnc_compile / inductor:.2f}; "
          f"(trnc.compile + first call) / Inductor = {(trnc_compile + trnc_first) / inductor:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer-only", action="store_true")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--seq", type=int, default=512, help="sequence length of the layer benchmark")
    parser.add_argument("--auto-cast", default="all", choices=("matmult", "all"))
    args = parser.parse_args()
    if not args.compile_only:
        layer_efficiency(args.seq, args.auto_cast)
    if not args.layer_only:
        compile_times(128)


if __name__ == "__main__":
    main()
