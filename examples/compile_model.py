"""Compile a small transformer block with trnc.compile, run it on the JIT, compare with eager PyTorch and
print the chip-level profile of the compiled program.

Run: python examples/compile_model.py [--precision bf16] [--auto-cast all] [--print-after fuse]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import trnc


class Block(nn.Module):
    """A pre-norm transformer encoder block: attention with sdpa, then a GELU MLP."""

    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--auto-cast", default=None, choices=("none", "matmult", "all"))
    parser.add_argument("--target", default="trn2", choices=("trn1", "trn2", "trn3"))
    parser.add_argument("--print-after", default="", help="pass names, comma-separated, e.g. 'fuse,tile'")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 128, 256)
    start = time.perf_counter()
    compiled = trnc.compile(model, (x,), precision=args.precision, auto_cast=args.auto_cast, target=args.target,
                            print_after=[p for p in args.print_after.split(",") if p])
    print(f"compiled in {time.perf_counter() - start:.2f} s: {compiled.stats['kernels']} kernels, "
          f"{compiled.stats['instructions']} instructions")
    with torch.no_grad():
        ref = model(x)
    got = compiled(x)
    rel = float((got - ref).abs().max() / ref.abs().max())
    print(f"max |trnc - eager| / max |eager| = {rel:.2e}")
    print(compiled.perf.table())


if __name__ == "__main__":
    main()
