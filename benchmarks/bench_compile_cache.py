"""Benchmark: trnc.compile with a cold compile cache against a warm one (trnc/compile_cache.py), and where time goes.

Goal (issue 5): recompiling an unchanged model with a warm cache is near-instant; the warm time and its
ratio to the cold compile go in the resolving note. Two models, random-init from transformers configs
(no downloads): the tiny BERT of tests/test_models.py (hidden 64, 2 layers, ids [2, 16]) and BERT-base
(12 layers, sequence 128, as benchmarks/bench_bert.py builds it), fp32, trn2.

Each model is compiled in fresh processes sharing one empty cache folder, as a user reruns a script:
the first process compiles cold (a miss: capture, every pass, the performance model, storing the
entry), then calls trnc.compile again in the same process (a hit in a warm interpreter); a second
process compiles once (a hit in a fresh interpreter, the common case). Printed: each time, the warm/cold
ratios, and the warm time split into capture (torch.export and import), the cache key (hashing the graph
and every constant) and the cache load (trnc.artifact.load of a trusted entry: read, checksums, decode;
the cache's own entries are not verified again and keep their saved stats). JIT kernels are not part
of trnc.compile (they build on the first call) and are not timed.

Run: python benchmarks/bench_compile_cache.py [--model tiny|base|both]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def build(name: str):
    import torch
    import transformers as tf
    torch.manual_seed(0)
    if name == "tiny":
        cfg = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            vocab_size=120, max_position_embeddings=64, attn_implementation="sdpa")
        return tf.BertModel(cfg).eval(), torch.randint(0, 120, (2, 16))
    from bench_bert import bert_base_config
    return tf.BertModel(bert_base_config(12)).eval(), torch.randint(0, 30522, (1, 128))


def child(name: str, repeat: bool) -> None:
    """One process: compile (and again when `repeat`); print each compile's stats as a JSON line."""
    import trnc
    model, ids = build(name)
    for _ in range(2 if repeat else 1):
        start = time.perf_counter()
        compiled = trnc.compile(model, (ids,))
        wall = time.perf_counter() - start
        s = compiled.stats
        print(json.dumps({"wall": wall, "cache": s["cache"], "steps": s["pass_seconds"],
                          "instructions": s["instructions"]}))


def run(name: str, cache_dir: str, repeat: bool) -> list[dict]:
    env = {**os.environ, "TRNC_CACHE_DIR": cache_dir, "TRNC_CACHE": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", name] + (["--repeat"] if repeat else []),
                         capture_output=True, text=True, env=env, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def split(record: dict) -> str:
    steps = record["steps"]
    return ", ".join(f"{k} {steps[k]:.2f}" for k in ("capture", "cache-key", "cache-load") if k in steps)


def measure(name: str) -> None:
    with tempfile.TemporaryDirectory() as cache_dir:
        cold, same_process = run(name, cache_dir, repeat=True)
        [fresh_process] = run(name, cache_dir, repeat=False)
        size = sum(os.path.getsize(os.path.join(cache_dir, "models", f))
                   for f in os.listdir(os.path.join(cache_dir, "models")))
    assert cold["cache"] == "miss" and same_process["cache"] == "hit" and fresh_process["cache"] == "hit"
    title = {"tiny": "tiny BERT (tests/test_models.py)", "base": "BERT-base, 12 layers, seq 128"}[name]
    print(f"{title}, fp32, trn2: {cold['instructions']} instructions, cache entry {size / 1e6:.1f} MB")
    cold_steps = cold["steps"]
    passes = sum(v for k, v in cold_steps.items() if k not in ("capture", "cache-key", "perf-model", "cache-store"))
    print(f"  cold (miss)           {cold['wall']:7.2f} s  (capture {cold_steps['capture']:.2f}, cache-key "
          f"{cold_steps['cache-key']:.2f}, passes {passes:.2f}, perf-model {cold_steps['perf-model']:.2f}, "
          f"cache-store {cold_steps['cache-store']:.2f})")
    for label, warm in (("warm, new process", fresh_process), ("warm, same process", same_process)):
        print(f"  {label:21s} {warm['wall']:7.2f} s  ({split(warm)})  warm/cold = {warm['wall'] / cold['wall']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "base", "both"), default="both")
    parser.add_argument("--child", choices=("tiny", "base"), help=argparse.SUPPRESS)
    parser.add_argument("--repeat", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.repeat)
        return
    for name in ("tiny", "base") if args.model == "both" else (args.model,):
        measure(name)


if __name__ == "__main__":
    main()
