"""Benchmark: what each precision costs in accuracy and gains in modeled time, on transformers.

Goal (issue 15): one table of BERT, GPT-2 and a Llama-style model, in a small config and in one of hidden size
1024, at every precision: the output's SQNR against eager fp32 and the modeled time relative to bf16 on the same
target. fp32, bf16, fp16 and fp8 run on trn2; mxfp8 and mxfp4 need trn3, where bf16 is measured again as their
baseline. Models are random-init from transformers configs (no downloads); the SQNR is over the last hidden state.

Run: python benchmarks/bench_precision.py [--models bert,gpt2,llama] [--sizes small,1024] [--seq 128]
"""
from __future__ import annotations

import argparse
import math

import torch

from trnc.bench.vision import torchvision  # noqa: E402

torchvision()   # transformers imports torchvision, which needs the shim beside torch's CPU build
import transformers as tf  # noqa: E402

import trnc  # noqa: E402

PRECISIONS = (("fp32", "trn2"), ("bf16", "trn2"), ("fp16", "trn2"), ("fp8", "trn2"), ("bf16", "trn3"),
              ("mxfp8", "trn3"), ("mxfp4", "trn3"))
SIZES = {"small": dict(hidden=256, layers=2, heads=4), "1024": dict(hidden=1024, layers=2, heads=16)}


def model_of(name: str, hidden: int, layers: int, heads: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "bert":
        config = tf.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                               intermediate_size=4 * hidden, vocab_size=1000, attn_implementation="sdpa")
        return tf.BertModel(config).eval()
    if name == "gpt2":
        config = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=1000,
                               attn_implementation="sdpa", use_cache=False)
        return tf.GPT2Model(config).eval()
    config = tf.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=heads, intermediate_size=4 * hidden, vocab_size=1000,
                            attn_implementation="sdpa", use_cache=False)
    return tf.LlamaModel(config).eval()


def sqnr(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref, got = ref.double(), got.double()
    noise = float(((got - ref) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((ref ** 2).sum()) / noise)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,gpt2,llama", help="models, e.g. bert,gpt2; default all three.")
    parser.add_argument("--sizes", default="small,1024", help=f"configs among {', '.join(SIZES)}; default both.")
    parser.add_argument("--seq", type=int, default=128, help="tokens; default 128.")
    args = parser.parse_args()
    print("| model | size | " + " | ".join(f"{p} ({t})" for p, t in PRECISIONS) + " |")
    print("|---|---|" + "---|" * len(PRECISIONS))
    for name in args.models.split(","):
        for size in args.sizes.split(","):
            model = model_of(name, **SIZES[size])
            ids = torch.randint(0, 1000, (1, args.seq))
            with torch.no_grad():
                ref = model(ids).last_hidden_state
            cells, base = [], {}
            for precision, target in PRECISIONS:
                compiled = trnc.compile(model, (ids,), precision=precision, target=target, cache=False)
                seconds = compiled.stats["seconds"]
                if precision == "bf16":
                    base[target] = seconds
                db = sqnr(ref, compiled(ids).last_hidden_state)
                cells.append((db, seconds, target))
            row = [f"{db:.1f} dB, {seconds / base[target]:.2f}x" for db, seconds, target in cells]
            print(f"| {name} | {size} | " + " | ".join(row) + " |", flush=True)
    print("\nEach cell: output SQNR against eager fp32, and modeled time relative to bf16 on the same target.")


if __name__ == "__main__":
    main()
