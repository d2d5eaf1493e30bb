"""torch's random ops compiled (passes/graph/legalize_random.py): the draws are the `random` opcode's for each
element's row-major counter, each call draws a new seed from torch's default generator, and every distribution
has torch's support and moments.

Moment bounds: with N = 2^16 draws the standard error of a mean is sigma / 256; the tests allow 6 standard
errors (a false failure once in 5e8 runs), and each test seeds torch's generator, so a run is repeatable.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import trnc
from trnc.errors import UnsupportedOpError
from trnc.runtime.convert import uniform_draws

N = 1 << 16
SIGMAS = 6


class Draw(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def compiled(fn, x=None, **options):
    x = torch.zeros(N) if x is None else x
    return trnc.compile(Draw(fn), (x,), **options), x


def run_seed(seed: int) -> int:
    """The SEED value a call under torch.manual_seed(seed) gets (trnc/api.py's draw)."""
    torch.manual_seed(seed)
    return int(torch.randint(-2 ** 31, 2 ** 31, (1,), dtype=torch.int64).to(torch.int32))


def near(value: float, expected: float, sigma: float, n: int = N) -> bool:
    return abs(value - expected) <= SIGMAS * sigma / math.sqrt(n)


@pytest.mark.parametrize("shape", [(3, 5000), (129, 2048), (7,)])
def test_rand_is_the_draw_of_each_row_major_counter(shape):
    """Whatever the tiling (full rows, a partial row, more than one 128-row tile), element i is draw(seed, 1, i)."""
    model, x = compiled(lambda x: torch.rand(shape) + x.sum() * 0, torch.zeros(4))
    torch.manual_seed(11)
    got = model(x).numpy()
    expected = uniform_draws(run_seed(11), 1, np.arange(math.prod(shape))).reshape(shape)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_calls_differ_and_manual_seed_repeats_them():
    model, x = compiled(lambda x: torch.randn_like(x))
    torch.manual_seed(3)
    first, second = model(x), model(x)
    torch.manual_seed(3)
    again = model(x)
    assert not torch.equal(first, second)
    assert torch.equal(first, again)


def test_jit_and_reference_draw_the_same_bits():
    model, x = compiled(lambda x: torch.nn.functional.dropout(torch.randn_like(x) + x, 0.4, training=True),
                        torch.randn(4, 1000))
    torch.manual_seed(5)
    jit = model(x)
    torch.manual_seed(5)
    assert torch.equal(jit, model.run_reference(x))


@pytest.mark.parametrize("name, fn, lo, hi, mean, std", [
    ("rand", lambda x: torch.rand_like(x), 0.0, 1.0, 0.5, math.sqrt(1 / 12)),
    ("uniform", lambda x: torch.ops.aten.uniform(x, -2.0, 3.0), -2.0, 3.0, 0.5, 5 * math.sqrt(1 / 12)),
    ("randn", lambda x: torch.randn_like(x), -6.0, 6.0, 0.0, 1.0),
    ("normal", lambda x: torch.normal(x + 2.0, 0.5), 2.0 - 3.0, 2.0 + 3.0, 2.0, 0.5),
    ("exponential", lambda x: torch.ops.aten.exponential(x, 2.0), 0.0, math.inf, 0.5, 0.5),
    ("cauchy_median", lambda x: torch.ops.aten.cauchy(x, 1.0, 2.0), -math.inf, math.inf, None, None),
    ("log_normal", lambda x: torch.ops.aten.log_normal(x, 0.0, 0.25), 0.0, math.inf,
     math.exp(0.25 ** 2 / 2), math.sqrt((math.exp(0.25 ** 2) - 1) * math.exp(0.25 ** 2))),
])
def test_continuous_distributions(name, fn, lo, hi, mean, std):
    model, x = compiled(fn)
    torch.manual_seed(1)
    y = model(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    y = y.double()
    assert bool(((y > lo) & (y < hi)).all()), (y.min(), y.max())
    if mean is None:   # Cauchy: no mean; its median is 1 and half the mass lies within 2 of it
        assert near(float((y < 1.0).double().mean()), 0.5, 0.5)
        assert near(float(((y - 1.0).abs() < 2.0).double().mean()), 0.5, 0.5)
        return
    assert near(float(y.mean()), mean, std)
    assert abs(float(y.std()) / std - 1) < 0.02


def test_geometric_counts_trials():
    model, x = compiled(lambda x: torch.ops.aten.geometric(x, 0.25))
    torch.manual_seed(2)
    y = model(x).double()
    assert bool((y >= 1).all()) and torch.equal(y, y.round())
    assert near(float(y.mean()), 4.0, math.sqrt(0.75) / 0.25)


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_bernoulli_rate(p):
    model, x = compiled(lambda x: torch.bernoulli(x + p))
    torch.manual_seed(4)
    y = model(x)
    assert set(torch.unique(y).tolist()) <= {0.0, 1.0}
    assert near(float(y.mean()), p, math.sqrt(p * (1 - p)) + 1e-9)


def test_randint_covers_the_range_uniformly():
    model, x = compiled(lambda x: torch.randint_like(x, 3, 13).to(torch.int32))
    torch.manual_seed(6)
    y = model(x)
    assert y.dtype == torch.int32
    counts = torch.bincount(y.long() - 3, minlength=10)
    assert len(counts) == 10 and int(y.min()) == 3 and int(y.max()) == 12
    assert all(near(float(c) / N, 0.1, math.sqrt(0.09)) for c in counts)


def test_randint_beyond_fp32_integers_is_refused():
    with pytest.raises(UnsupportedOpError, match=r"randint_like.*ranges of 1 to 2\^24"):
        compiled(lambda x: torch.randint_like(x, 0, 2 ** 25))


def test_bf16_rand_stays_below_one():
    model, x = compiled(lambda x: torch.rand_like(x, dtype=torch.bfloat16))
    torch.manual_seed(8)
    y = model(x)
    assert y.dtype == torch.bfloat16 and float(y.max()) < 1.0 and float(y.min()) > 0.0


@pytest.mark.parametrize("p", [0.25, 1.0])
def test_training_dropout_scales_survivors(p):
    x = torch.randn(64, 1024)
    model, _ = compiled(lambda x: torch.ops.aten.native_dropout(x, p, True), x)
    torch.manual_seed(9)
    y, keep = model(x)
    assert keep.dtype == torch.bool and y.shape == keep.shape == x.shape
    assert near(float(keep.double().mean()), 1 - p, math.sqrt(p * (1 - p)) + 1e-9, x.numel())
    expected = torch.where(keep, x * (0.0 if p == 1 else 1 / (1 - p)), torch.zeros(()))
    assert torch.equal(y, expected)


def test_training_rrelu_noise_is_the_slope():
    x = torch.randn(64, 1024)
    model, _ = compiled(lambda x: torch.ops.aten.rrelu_with_noise_functional(x, torch.zeros_like(x), 0.1, 0.3, True),
                        x)
    torch.manual_seed(10)
    y, noise = model(x)
    negative = x <= 0
    assert torch.equal(noise[~negative], torch.ones_like(noise[~negative]))
    assert bool(((noise[negative] >= 0.1) & (noise[negative] <= 0.3)).all())
    assert torch.equal(y, x * noise)


def test_fp16_draws_stay_below_one_under_auto_cast_all():
    """Regression (fuzz seed 11000008, bf16/api): auto_cast "all" stored the fp16 draw in bf16, which rounds fp16's
    largest value below 1 (1 - 2^-11) up to 1, so rand_like(x).floor() was 1 at about one element in 500."""
    torch.manual_seed(1710)
    x = torch.randn(89, 6).half()
    fn = lambda v: v + torch.rand_like(v).floor()   # noqa: E731
    model, _ = compiled(fn, x, precision="bf16", auto_cast="all", cache=False)
    for _ in range(40):
        assert torch.equal(model(x), x)
