"""The benchmark zoo: each entry builds a model with random weights (no downloads) and its example inputs.

Full sizes are the published shapes: BERT-base at seq 128, GPT-2 small at seq 256, a TinyLlama-1.1B decoder layer
(hidden 2048, 32 heads of which 4 key-value, MLP 5632) in prefill at seq 512 and in decode (one token against a KV
cache of 1024), ViT-B/16, ResNet-50 and MobileNetV2 at 224x224, and a GEMM sweep with AWS's NKI matmul tutorial
shape ([4096, 8192] x [8192, 8192], bf16 on trn1). `--quick` takes the entries marked quick at their small sizes,
so the whole run takes minutes on two cores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from .vision import torchvision


@dataclass(frozen=True)
class Entry:
    """One zoo model. `build(quick)` returns (model, example inputs); `targets` pins the targets (None: the
    run's); `host` says whether the host run is timed against eager (the largest GEMMs are modeled only)."""

    name: str
    about: str
    build: Callable[[bool], tuple[nn.Module, tuple]]
    quick: bool = False
    targets: tuple[str, ...] | None = None
    precisions: tuple[str, ...] | None = None
    host: bool = True
    tags: tuple[str, ...] = field(default=())


class MatMul(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) / math.sqrt(k))

    def forward(self, x):
        return x @ self.weight


def gemm(m: int, k: int, n: int) -> Callable[[bool], tuple[nn.Module, tuple]]:
    def build(quick: bool):
        torch.manual_seed(0)
        return MatMul(k, n).eval(), (torch.randn(m, k),)
    return build


def mlp(quick: bool):
    torch.manual_seed(0)
    width, tokens = (256, 64) if quick else (1024, 512)
    model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.LayerNorm(width))
    return model.eval(), (torch.randn(tokens, width),)


def _transformers():
    torchvision()          # transformers imports torchvision, which needs the shim beside torch's CPU build
    import transformers
    return transformers


def bert(quick: bool):
    tf = _transformers()
    torch.manual_seed(0)
    size = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024) if quick else {}
    model = tf.BertModel(tf.BertConfig(vocab_size=8192, attn_implementation="sdpa", **size)).eval()
    return model, (torch.randint(0, 8192, (1, 64 if quick else 128)),)


def gpt2(quick: bool):
    tf = _transformers()
    torch.manual_seed(0)
    size = dict(n_layer=2, n_embd=256, n_head=4) if quick else {}
    config = tf.GPT2Config(vocab_size=8192, use_cache=False, attn_implementation="sdpa", bos_token_id=0,
                           eos_token_id=0, **size)
    return tf.GPT2Model(config).eval(), (torch.randint(0, 8192, (1, 64 if quick else 256)),)


class LlamaLayer(nn.Module):
    """A Llama decoder layer (RMSNorm, rotary q and k, grouped-query attention, SwiGLU MLP) that attends to an
    optional KV cache passed as inputs, so prefill and decode are both static-shape graphs."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, mlp: int):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.dim, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * mlp, bias=False)
        self.down = nn.Linear(mlp, hidden, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(hidden, eps=1e-5), nn.RMSNorm(hidden, eps=1e-5)

    def rotate(self, x, start: int):
        half = self.dim // 2
        pos = torch.arange(start, start + x.shape[-2], dtype=torch.float32)[:, None]
        angle = pos * 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def forward(self, x, k_cache=None, v_cache=None):
        b, s, h = x.shape
        past = 0 if k_cache is None else k_cache.shape[2]
        y = self.norm1(x)
        q = self.rotate(self.q(y).view(b, s, self.heads, self.dim).transpose(1, 2), past)
        k, v = self.kv(y).view(b, s, 2, self.kv_heads, self.dim).permute(2, 0, 3, 1, 4)
        k = self.rotate(k, past)
        if k_cache is not None:
            k, v = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=k_cache is None)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


def llama(decode: bool):
    def build(quick: bool):
        torch.manual_seed(0)
        hidden, heads, kv_heads, width, tokens, cache = (
            (256, 4, 2, 704, 64, 128) if quick else (2048, 32, 4, 5632, 512, 1024))
        model = LlamaLayer(hidden, heads, kv_heads, width).eval()
        if not decode:
            return model, (torch.randn(1, tokens, hidden),)
        kv = (1, kv_heads, cache, hidden // heads)
        return model, (torch.randn(1, 1, hidden), torch.randn(kv), torch.randn(kv))
    return build


def vision_model(name: str, quick_resolution: int):
    """A torchvision model with random weights. Its init zeroes some classifiers (ViT's head): they are drawn too,
    else every output is 0 at every precision and the SQNRs say nothing."""
    def build(quick: bool):
        torch.manual_seed(0)
        model = getattr(torchvision().models, name)(weights=None).eval()
        with torch.no_grad():
            for layer in model.modules():
                if isinstance(layer, nn.Linear) and not layer.weight.any():
                    nn.init.normal_(layer.weight, std=layer.in_features ** -0.5)
        resolution = quick_resolution if quick else 224
        return model, (torch.randn(1, 3, resolution, resolution),)
    return build


ZOO = {e.name: e for e in (
    Entry("gemm-1024", "GEMM 1024 x 1024 x 1024", gemm(1024, 1024, 1024), quick=True, tags=("gemm",)),
    Entry("gemm-4096", "GEMM 4096 x 4096 x 4096", gemm(4096, 4096, 4096), tags=("gemm",)),
    Entry("gemm-qkv", "GEMM of a Llama-7B QKV projection: [2048, 4096] x [4096, 12288]", gemm(2048, 4096, 12288),
          tags=("gemm",), host=False),
    Entry("gemm-mlp", "GEMM of a Llama-7B MLP down projection: [2048, 11008] x [11008, 4096]",
          gemm(2048, 11008, 4096), tags=("gemm",), host=False),
    Entry("gemm-nki", "AWS's NKI matmul tutorial: [4096, 8192] x [8192, 8192], bf16 on trn1",
          gemm(4096, 8192, 8192), targets=("trn1",), precisions=("bf16",), host=False, tags=("gemm",)),
    Entry("mlp", "two linear layers, GELU and a layer norm (1024 wide, 512 tokens; quick 256, 64)", mlp, quick=True),
    Entry("bert-base", "Hugging Face BERT-base, seq 128 (quick: 2 layers, hidden 256, seq 64)", bert, quick=True),
    Entry("gpt2", "Hugging Face GPT-2 small, seq 256 (quick: 2 layers, hidden 256, seq 64)", gpt2),
    Entry("llama-prefill", "a TinyLlama-1.1B decoder layer, prefill of 512 tokens (quick: hidden 256, 64 tokens)",
          llama(decode=False)),
    Entry("llama-decode", "the same layer decoding one token against a KV cache of 1024 (quick: 128)",
          llama(decode=True)),
    Entry("vit-b16", "torchvision ViT-B/16, 1x3x224x224", vision_model("vit_b_16", 224)),
    Entry("resnet50", "torchvision ResNet-50, 1x3x224x224", vision_model("resnet50", 64)),
    Entry("mobilenet-v2", "torchvision MobileNetV2, 1x3x224x224 (quick: 64x64)", vision_model("mobilenet_v2", 64),
          quick=True),
)}
