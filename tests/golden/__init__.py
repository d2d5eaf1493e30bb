"""Golden programs: compiled programs kept in the repository, so that every change to generated code is seen.

Each golden is a model, its example inputs and its options; its program's assembly is kept gzipped
(`<name>.s.gz`, a few of them are megabytes of text; unnamed IR values renumbered, `canonical`) beside its
modeled figures (`<name>.json`).
tests/test_golden.py compiles each again and fails with a readable diff of the assembly and of the
figures when anything differs. A deliberate change to generated code rewrites them:

    python -m tests.golden [--only NAME ...]

and the commit says why, with the figures before and after (the diff of the .json files).
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).parent

# The modeled figures kept beside each program (the keys of CompiledModel.stats).
FIGURES = ("instructions", "kernels", "seconds", "roofline_seconds", "efficiency", "executed_macs_efficiency",
           "dma_bytes", "sbuf_peak_bytes", "psum_peak_bytes")


@dataclass(frozen=True)
class Golden:
    name: str
    build: Callable[[], tuple[nn.Module, tuple]]   # a fresh model (eval mode) and its example inputs
    options: dict
    slow: bool = False

    def compile(self):
        import trnc
        model, inputs = self.build()
        with torch.no_grad():
            return trnc.compile(model, inputs, cache=False, **self.options)

    @property
    def program_path(self) -> Path:
        return HERE / f"{self.name}.s.gz"

    @property
    def figures_path(self) -> Path:
        return HERE / f"{self.name}.json"


class MLP(nn.Module):
    """Also tests/test_models.py's MLP."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(48, 96), nn.Linear(96, 96), nn.Linear(96, 10)

    def forward(self, x):
        return self.fc3(F.silu(self.fc2(F.gelu(self.fc1(x)))))


class Matmul(nn.Module):
    def forward(self, a, b):
        return a @ b


class FirstOutput(nn.Module):
    """A Hugging Face layer's first output (the hidden states)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, h):
        return self.layer(h)[0]


def _mlp():
    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(40, 48),)


def _hugging_face(kind: str):
    """The small configs of tests/test_models.py."""
    import transformers as tf
    torch.manual_seed(0)
    common = dict(vocab_size=120, attn_implementation="sdpa")
    if kind == "bert":
        model = tf.BertModel(tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=128, max_position_embeddings=64, **common))
    elif kind == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False, **common))
    else:
        model = tf.LlamaModel(tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                             use_cache=False, **common))
    return model.eval(), (torch.randint(0, 120, (2, 16)),)


def _bert_base_layer():
    """One BERT-base encoder layer at sequence 512: benchmarks/bench_bert.py's efficiency case."""
    import transformers as tf
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=768, num_hidden_layers=1, num_attention_heads=12, intermediate_size=3072,
                        vocab_size=30522, max_position_embeddings=512, attn_implementation="sdpa")
    return FirstOutput(tf.models.bert.modeling_bert.BertLayer(cfg)).eval(), (torch.randn(1, 512, 768),)


def _gemm_4096():
    a = torch.zeros(4096, 4096, dtype=torch.bfloat16)
    return Matmul(), (a, a.clone())


GOLDENS = (
    Golden("mlp", _mlp, {}),
    Golden("tiny_bert", lambda: _hugging_face("bert"), {}),
    Golden("tiny_gpt2", lambda: _hugging_face("gpt2"), {}),
    Golden("tiny_llama", lambda: _hugging_face("llama"), {}),
    Golden("tiny_llama_bf16", lambda: _hugging_face("llama"), {"precision": "bf16", "auto_cast": "all"}),
    Golden("bert_base_layer_bf16", _bert_base_layer, {"precision": "bf16", "auto_cast": "all"}, slow=True),
    Golden("gemm_4096_bf16", _gemm_4096, {"precision": "bf16"}, slow=True),
)


def figures(compiled) -> dict:
    return {k: compiled.stats[k] for k in FIGURES}


# IR values made without a name are numbered by a process-wide counter (trnc/ir.py), so the tensors named after
# them (t_v12_t) depend on what ran before in the process: renumbered by first appearance, they do not
_VALUE_NAME = re.compile(r"(?<![A-Za-z0-9])v(\d+)(?![0-9])")


def canonical(text: str) -> str:
    numbers: dict[str, int] = {}
    return _VALUE_NAME.sub(lambda m: f"v{numbers.setdefault(m.group(1), len(numbers))}", text)


def assembly(compiled) -> str:
    from trnc.isa.asm import format_program
    return canonical(format_program(compiled.program))


def write(golden: Golden) -> None:
    compiled = golden.compile()
    # mtime=0: the same program gives the same bytes, so git sees no change where there is none
    golden.program_path.write_bytes(gzip.compress(assembly(compiled).encode(), mtime=0))
    golden.figures_path.write_text(json.dumps(figures(compiled), indent=1) + "\n")


def read(golden: Golden) -> tuple[str, dict]:
    return gzip.decompress(golden.program_path.read_bytes()).decode(), json.loads(golden.figures_path.read_text())
