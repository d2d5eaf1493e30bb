"""recognize on its own and end to end: spelled-out RMS norms become rms_norm nodes and tanh GELUs gelu_tanh
activations (and only they), the rewritten graph means what the model computes, and the compiled kernels match
eager and the reference's bits."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import trnc
from trnc.passes.pipeline import CompileState

from harness import through


class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, op for op."""

    def __init__(self, c: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.randn(c)), eps

    def forward(self, h):
        dtype = h.dtype
        h = h.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(dtype)


def recognized(model: nn.Module, *inputs: torch.Tensor, tol: float = 1e-5) -> CompileState:
    """The state after recognize; its graph computes what the model does (checked here within `tol`)."""
    return through("recognize", model, *inputs, tol=tol)


def nodes(state: CompileState, op: str) -> list:
    return [n for n in state.graph.nodes if n.op == op]


@pytest.mark.parametrize("norm", [LlamaRMSNorm(64), nn.RMSNorm(64, eps=1e-5)], ids=["llama", "torch"])
def test_an_rms_norm_with_its_weight_becomes_one_node(norm):
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    state = recognized(norm, torch.randn(2, 16, 64))
    (node,) = nodes(state, "rms_norm")
    assert node.attrs == {"eps": pytest.approx(norm.eps), "has_weight": True}
    assert node.inputs[0].op == "input" and node.inputs[1].op == "const" and state.graph.outputs == [node]
    assert not nodes(state, "reduce") and not nodes(state, "unary") and not nodes(state, "binary")


def test_two_norms_of_one_input_each_become_a_node():
    """CSE merges the mean of both; each norm recomputes it and the shared nodes go."""
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = LlamaRMSNorm(32), LlamaRMSNorm(32, eps=1e-5)

        def forward(self, x):
            return self.a(x), self.b(x)
    state = recognized(Two(), torch.randn(8, 32))
    assert sorted(n.attrs["eps"] for n in nodes(state, "rms_norm")) == pytest.approx([1e-6, 1e-5])
    assert not nodes(state, "reduce")


def test_a_bf16_norm_reads_x_itself_and_keeps_its_bf16_weight_product():
    """The fp32 cast of x is exact, so the norm reads the bf16 x; the product is cast back to bf16 before the
    weight, so the weight's product stays an elementwise node (rounded twice, as eager does)."""
    model = LlamaRMSNorm(64).to(torch.bfloat16)
    state = recognized(model, torch.randn(4, 64, dtype=torch.bfloat16), tol=0)
    (node,) = nodes(state, "rms_norm")
    assert node.inputs[0].op == "input" and not node.attrs["has_weight"]
    assert [n.op for n in state.graph.nodes if n.op in ("cast", "binary")] == ["cast", "binary"]


class Lookalikes(nn.Module):
    """Formulas near an RMS norm that are not one: the mean over another axis, the squares of another tensor
    (twice: y, and x * 2), a sum without the 1/C; and a weight product of one of them."""

    def forward(self, x, y):
        w = torch.arange(16, dtype=torch.float32)
        axis0 = x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)
        other = x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        no_mean = x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)
        doubled = x * torch.rsqrt((x * 2).pow(2).mean(-1, keepdim=True) + 1e-6)
        return axis0, other, no_mean, doubled, doubled * w


def test_lookalikes_stay_as_they_are():
    state = recognized(Lookalikes(), torch.randn(16, 16), torch.randn(16, 16))
    assert state.stats["recognize"]["rms_norms"] == 0 and len(nodes(state, "reduce")) == 4


def test_a_norm_whose_product_has_another_reader_keeps_the_weight_apart():
    class Both(nn.Module):
        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return h, h * torch.linspace(0.5, 2, 32)
    state = recognized(Both(), torch.randn(8, 32))
    (node,) = nodes(state, "rms_norm")
    assert not node.attrs["has_weight"] and state.graph.outputs[0] is node


class NormThenLinear(nn.Module):
    """A pre-norm projection with 128-row tiles: the norm hands the matmul its transpose in SBUF and stores
    nothing (the matmul is its only reader)."""

    def __init__(self):
        super().__init__()
        self.norm, self.proj = LlamaRMSNorm(256), nn.Linear(256, 128, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x)), self.norm(x * 2)


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("bf16", 2 ** -7)])
def test_compiled_rms_norms_match_eager_and_the_reference(precision, tol):
    """fp32 within 1e-5 of eager (the statistic's summation order differs); bf16 auto_cast="all" within a bf16
    rounding of the result (one rounding of the norm's output and of the matmul's operands, fp32 sums).
    The JIT's bits are the reference's in both."""
    torch.manual_seed(0)
    model, x = NormThenLinear().eval(), torch.randn(1, 256, 256)
    with torch.no_grad():
        model.norm.weight.normal_(1.0, 0.3)
        want = model(x)
        compiled = trnc.compile(model, (x,), precision=precision, **({"auto_cast": "all"} if precision == "bf16" else {}))
        got, ref = compiled(x), compiled.run_reference(x)
    assert compiled.stats["kernels"] == 4   # x * 2, two norms and the matmul
    for g, r, w in zip(got, ref, want, strict=True):
        assert torch.equal(g, r)
        assert float((g.double() - w.double()).abs().max() / w.double().abs().max()) <= tol


class NewGELU(nn.Module):
    """transformers' NewGELUActivation (GPT-2's gelu_new), op for op."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_a_spelled_out_tanh_gelu_becomes_one_activation():
    """Within 1e-5 (absolute and relative) of eager's nine roundings, over x in [-12, 12]."""
    state = recognized(NewGELU(), torch.linspace(-12, 12, 4097).reshape(17, 241))
    (node,) = state.graph.nodes[1:]
    assert node.op == "unary" and node.attrs == {"func": "gelu_tanh"} and node.inputs[0].op == "input"
    assert state.stats["recognize"]["gelu_tanh"] == 1


class GELULookalikes(nn.Module):
    """transformers' FastGELU spelling (another order of the same formula: left alone), a wrong coefficient, and
    the right formula over a tensor other than its half."""

    def forward(self, x, y):
        fast = 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
        wrong = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.04 * torch.pow(x, 3.0))))
        mixed = 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return fast, wrong, mixed


def test_gelu_lookalikes_stay_as_they_are():
    state = recognized(GELULookalikes(), torch.randn(8, 32), torch.randn(8, 32))
    assert state.stats["recognize"]["gelu_tanh"] == 0 and len(nodes(state, "unary")) >= 3


def test_a_compiled_gelu_after_a_linear_matches_eager_and_the_reference():
    """The matmul's epilogue: one activation instead of nine passes. fp32 within 1e-5 of eager."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(128, 256), NewGELU()).eval(), torch.randn(256, 128) * 2
    with torch.no_grad():
        want = model(x)
        compiled = trnc.compile(model, (x,))
        got = compiled(x)
    assert torch.equal(got, compiled.run_reference(x)) and compiled.stats["kernels"] == 1
    assert float((got.double() - want.double()).abs().max() / want.double().abs().max()) <= 1e-5
