"""rounding="stochastic": values written in bf16 round to one of their two neighbours, unbiased, reproducibly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trnc
from modules import Fn
from trnc.errors import TrncError
from trnc.options import Options

DRAWS = 64


class Twice(nn.Module):
    def forward(self, x):
        return (x * 2).to(torch.bfloat16)


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x whose doubles lie a quarter of a bf16 ulp above a bf16 value g: round to nearest always gives g (a bias
    of -1/4 ulp), stochastic rounding gives g + ulp a quarter of the time. Returns x, g, the ulp."""
    mantissa = 1 + torch.randint(1, 128, (2048,)) / 128          # bf16 values in (1, 2), no power of two
    scale = 2.0 ** torch.randint(-20, 20, (2048,)) * torch.where(torch.rand(2048) < 0.5, -1.0, 1.0)
    g, ulp = mantissa * scale, scale.abs() / 128
    return (g + ulp / 4) / 2, g, ulp


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    x, g, ulp = inputs()
    nearest = trnc.compile(Twice(), (x,), cache=False, precision="bf16")(x).float()
    assert torch.equal(nearest, g)                                  # always rounded down: biased
    draws = torch.stack([trnc.compile(Twice(), (x,), cache=False, precision="bf16", rounding="stochastic",
                                      seed=seed)(x).float() for seed in range(DRAWS)])
    up = g + ulp                     # the other neighbour of g + ulp / 4, whatever g's sign
    assert ((draws == g) | (draws == up)).all()                     # one of the two neighbours
    share = (draws == up).double().mean().item()
    # each element rounds up with probability 1/4: over 2048 x 64 draws the share's standard deviation is 0.0017
    assert abs(share - 0.25) < 0.01


def test_the_same_seed_gives_the_same_bits():
    x, _, _ = inputs()
    runs = [trnc.compile(Twice(), (x,), cache=False, rounding="stochastic", seed=seed)(x) for seed in (7, 7, 8)]
    assert torch.equal(runs[0].view(torch.int16), runs[1].view(torch.int16))
    assert not torch.equal(runs[0].view(torch.int16), runs[2].view(torch.int16))


def test_bad_rounding_options_are_refused():
    with pytest.raises(TrncError, match="rounding='up' is not allowed"):
        Options(rounding="up")
    with pytest.raises(TrncError, match="seed=-1 is not allowed"):
        Options(seed=-1)


def test_a_matmuls_fp8_activation_rounds_stochastically():
    """fp8's activation quantization (in the matmul kernel) rounds by the program's rule too: every fp8 write of
    the activation is a stochastic tensor_copy, the same seed gives the same bits and another seed others."""
    torch.manual_seed(2)
    a, w = torch.randn(64, 256), torch.randn(256, 32) * 0.1

    class MatMul(nn.Module):
        def forward(self, x):
            return x @ w

    def compiled(seed):
        return trnc.compile(MatMul(), (a,), cache=False, precision="fp8", fp8_scaling="static",
                            rounding="stochastic", seed=seed)
    c = compiled(3)
    fp8_writes = [i for i in c.program.instructions if i.opcode in ("tensor_copy", "tensor_scalar")
                  and i["dst"].dtype.is_fp8]
    assert fp8_writes and all(i.opcode == "tensor_copy" and i["rounding"].name == "SR" for i in fp8_writes)
    assert torch.equal(c(a), compiled(3)(a)) and not torch.equal(c(a), compiled(4)(a))


# -- every conversion rounds so: norms, softmax, attention and the conversions DMA made (issue 15) ------------

def representable(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors rounded to bf16 and back: loads and auto_cast's casts of them are exact."""
    return [t.bfloat16().float() for t in tensors]


def neighbours(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two bf16 values around each fp32 value (both the value itself when bf16 holds it): truncation toward
    zero and the next bf16 away from zero."""
    low = (value.view(torch.int32) & -0x10000).view(torch.float32)
    high = (low.view(torch.int32) + 0x10000).view(torch.float32)
    return low, torch.where(low == value, low, high)


def stochastic_copies(compiled) -> int:
    return sum(1 for i in compiled.program.instructions
               if i.opcode == "tensor_copy" and i["rounding"].name == "SR")


def converting_dmas(compiled) -> int:
    """DMAs that round a value into a narrow float (the DMA rounds to nearest even)."""
    return sum(1 for i in compiled.program.instructions if i.opcode == "dma_copy" and i["dst"].dtype.is_float
               and i["dst"].dtype.itemsize < i["src"].dtype.itemsize)


def compile_three(model, args, **options):
    """The model at nearest rounding and at stochastic rounding with seeds 5, 5 and 6: (nearest, [three])."""
    nearest = trnc.compile(model, args, cache=False, **options)
    return nearest, [trnc.compile(model, args, cache=False, rounding="stochastic", seed=seed, **options)
                     for seed in (5, 5, 6)]


def check_seeds(runs: list[torch.Tensor]) -> None:
    """The same seed gives the same bits, another seed others."""
    bits = [r.contiguous().view(torch.int16 if r.dtype == torch.bfloat16 else torch.int32) for r in runs]
    assert torch.equal(bits[0], bits[1]) and not torch.equal(bits[0], bits[2])


def check_rounds_fp32_value(fn, args, **options) -> None:
    """fn's result cast to bf16 at `options`: SR programs round in the kernel (tensor_copy sr, no converting DMA),
    and every element is one of the two bf16 neighbours of the fp32 value (fn compiled at fp32: the same
    instructions in fp32), so within one ulp of the nearest-rounded result; seeds give reproducible bits."""
    exact = trnc.compile(Fn(fn), args, cache=False)(*args)
    model = Fn(lambda *a: fn(*a).to(torch.bfloat16))
    nearest, compiled = compile_three(model, args, **options)
    assert stochastic_copies(nearest) == 0 and all(stochastic_copies(c) for c in compiled)
    assert converting_dmas(compiled[0]) == 0
    runs = [c(*args) for c in compiled]
    low, high = neighbours(exact)
    for r in runs + [nearest(*args)]:
        assert ((r.float() == low) | (r.float() == high)).all()
    assert not torch.equal(runs[0], nearest(*args))
    check_seeds(runs)


def test_softmax_and_log_softmax_round_stochastically():
    torch.manual_seed(11)
    x, = representable(torch.randn(130, 96) * 3)       # two row tiles, the second of 2 rows
    for fn in (lambda t: torch.softmax(t, -1), lambda t: torch.log_softmax(t, -1)):
        check_rounds_fp32_value(fn, (x,), precision="bf16", auto_cast="all")


def test_layer_norm_rounds_stochastically():
    torch.manual_seed(12)
    norm = nn.LayerNorm(256)
    with torch.no_grad():
        norm.weight.copy_(representable(torch.rand(256) + 0.5)[0])
        norm.bias.copy_(representable(torch.randn(256))[0])
    x, = representable(torch.randn(256, 256) + 2)       # two row tiles: the last goes in column halves
    check_rounds_fp32_value(norm, (x,), precision="bf16", auto_cast="all")


def test_a_matmul_operand_loaded_in_bf16_rounds_stochastically():
    """x (fp32) is loaded as a bf16 operand: under SR in fp32, then a stochastic tensor_copy. With an identity
    weight the result is the loaded operand itself, so each element must be a bf16 neighbour of x."""
    torch.manual_seed(13)
    x = torch.randn(64, 128)
    eye = torch.eye(128)

    class MatMul(nn.Module):
        def forward(self, t):
            return t @ eye
    nearest, compiled = compile_three(MatMul(), (x,), precision="bf16")
    assert converting_dmas(nearest) and converting_dmas(compiled[0]) == 0
    assert stochastic_copies(nearest) == 0 and stochastic_copies(compiled[0])
    runs = [c(x) for c in compiled]
    low, high = neighbours(x)
    assert torch.equal(nearest(x), x.bfloat16().float())
    for r in runs:
        assert ((r == low) | (r == high)).all()
    assert not torch.equal(runs[0], nearest(x))
    check_seeds(runs)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_rounds_stochastically(causal):
    """Attention at bf16 (both plans: causal takes the standard one at D = 48): the probabilities and the output
    round stochastically. P's rounding moves the fp32 output by at most 2^-7 (SR) + 2^-8 (nearest) of the
    P-weighted |v|, and each result rounds once more: so far from the nearest-rounded result at most."""
    torch.manual_seed(14 + causal)
    d = 48 if causal else 32
    q, k, v = representable(*(torch.randn(1, 2, 160, d) for _ in range(3)))

    def attention(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=causal).to(torch.bfloat16)
    nearest, compiled = compile_three(Fn(attention), (q, k, v), precision="bf16")
    assert stochastic_copies(nearest) == 0 and stochastic_copies(compiled[0])
    assert converting_dmas(compiled[0]) == 0
    runs = [c(q, k, v) for c in compiled]
    check_seeds(runs)
    near = nearest(q, k, v).float()
    scores = q @ k.transpose(-1, -2) / d ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(160, 160).triu(1).bool(), float("-inf"))
    spread = torch.softmax(scores, -1) @ v.abs()
    ulp = 2.0 ** (torch.floor(torch.log2(near.abs().clamp_min(2.0 ** -100))) - 7)
    bound = 3 * 2.0 ** -8 * spread + 2 * ulp
    for r in runs:
        assert ((r.float() - near).abs() <= bound).all()
    assert not torch.equal(runs[0], runs[2])


def test_casts_copies_and_reduction_stores_round_stochastically():
    """Conversions a DMA made: a cast between HBM tensors (plain and permuted, several boxes through SBUF) and a
    reduction's fp32 accumulator stored in bf16; each element a bf16 neighbour of the fp32 value."""
    torch.manual_seed(16)
    x = torch.randn(260, 96)
    for fn in (lambda t: t, lambda t: t.t(), lambda t: t.reshape(2, 130, 96).sum(1)):
        check_rounds_fp32_value(fn, (x,))
