"""rounding="stochastic": values written in bf16 round to one of their two neighbours, unbiased, reproducibly."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import trnc
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
