"""Fractional max pooling and grid sampling (passes/graph/legalize_sample.py) compiled end to end (trnc.compile, the
JIT) against eager torch.

Fractional max pools: values and indices bit for bit (the window starts are the same fp32 roundings as torch's,
the max only selects), on many random `_random_samples`, output sizes 1 and larger, NaN inputs, unbatched input;
non-float32 input is refused by name.

Grid samplers: nearest bit for bit (the source coordinates are computed with torch's own fp32 roundings: the
vectorized 2-d kernel's (g + 1) * f - 1/2, the scalar 3-d kernel's ((g + 1) * size - 1) / 2, so rint picks the same
pixel); bilinear within |got - eager| <= (2^rank + 4 S) 2^-24 max|x| (S the largest input size): a sum of 2^rank
products of one rounding each, and the weights' rounding (their factors are differences of coordinates below S,
formed in another order than torch's 3-d kernel); bicubic (2-d) within 2.25 (16 + 4 S) 2^-24 max|x| (16 products,
coefficients of absolute sum at most 1.375 per axis). Grid values at -1, 1, far outside (reflections over several
spans), an input axis of size 1; non-float32 input and too many sampled points refused by name.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import trnc
from modules import Fn
from trnc.errors import UnsupportedOpError


def compiled(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)


def equal_to_eager(got, ref):
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("rank", [2, 3])
def test_fractional_max_pool_matches_eager_bit_for_bit(rank):
    torch.manual_seed(rank)
    shape, kernel = ((2, 3, 10, 13), (2, 3)) if rank == 2 else ((1, 2, 6, 8, 7), (2, 3, 2))
    pool = torch.ops.aten.fractional_max_pool2d if rank == 2 else torch.ops.aten.fractional_max_pool3d
    x = torch.randn(shape)
    x.view(-1)[::17] = math.nan
    x.view(-1)[5::23] = -math.inf
    for out in [(1,) * rank, tuple(s - k - 1 for s, k in zip(shape[2:], kernel)), (2, 5, 3)[:rank]]:
        def fn(a, u):
            return pool(a, kernel, out, u)
        run = compiled(fn, x, torch.rand(shape[0], shape[1], rank))
        for _ in range(3):
            u = torch.rand(shape[0], shape[1], rank)
            u.view(-1)[0] = 0.0
            u.view(-1)[1] = 1.0 - 2.0 ** -24   # the largest draw below 1
            equal_to_eager(run(x, u), fn(x, u))


def test_fractional_max_pool_functional_unbatched_and_errors():
    torch.manual_seed(5)
    x, u = torch.randn(3, 9, 9), torch.rand(1, 3, 2)

    def fn(a, s):
        return F.fractional_max_pool2d(a, 3, output_size=(4, 5), return_indices=True, _random_samples=s)
    run = compiled(fn, x, u)
    equal_to_eager(run(x, u), fn(x, u))
    u = torch.tensor([[[0.0, 0.999], [3.0, 7.5], [-0.25, 0.5]]])   # draws outside [0, 1): the same starts as eager
    equal_to_eager(run(x, u), fn(x, u))
    with pytest.raises(UnsupportedOpError, match="fractional_max_pool2d.*float32 only"):
        xb = x.bfloat16()
        compiled(fn, xb, u.bfloat16())


def grid_values(shape):
    """Uniform in [-1.6, 1.6], with exact -1, 1, 0 and some far outside (several reflections)."""
    g = torch.rand(shape) * 3.2 - 1.6
    flat = g.view(-1)
    flat[:4] = torch.tensor([-1.0, 1.0, 0.0, 1.0])
    flat[4::29] = flat[4::29] * 5
    return g


@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sampler_matches_eager(rank, align):
    torch.manual_seed(10 + rank + 2 * align)
    shapes = [((2, 3, 5, 7), (2, 6, 4, 2)), ((1, 2, 1, 6), (1, 3, 3, 2))] if rank == 2 else \
        [((2, 3, 4, 5, 6), (2, 3, 2, 4, 3)), ((1, 2, 3, 1, 4), (1, 2, 2, 2, 3))]
    op = torch.ops.aten.grid_sampler_2d if rank == 2 else torch.ops.aten.grid_sampler_3d
    for x_shape, g_shape in shapes[:1] if not align else shapes:   # the axis of size 1 aligned: reflection is 0
        x, g = torch.randn(x_shape), grid_values(g_shape)
        bound = (2 ** rank + 4 * max(x_shape[2:])) * 2.0 ** -24 * float(x.abs().max())
        for mode in (0, 1, 2) if rank == 2 else (0, 1):
            for padding in (0, 1, 2):
                def fn(a, b):
                    return op(a, b, mode, padding, align)
                got, ref = compiled(fn, x, g)(x, g), fn(x, g)
                assert got.shape == ref.shape
                if mode == 1:
                    torch.testing.assert_close(got, ref, rtol=0, atol=0)
                else:
                    err = float((got - ref).abs().max())
                    limit = bound if mode == 0 else 2.25 * (16 + 4 * max(x_shape[2:])) * 2.0 ** -24 * float(x.abs().max())
                    assert err <= limit, (mode, padding, err, limit)


def test_grid_sample_functional_and_refusals():
    torch.manual_seed(3)
    x, g = torch.randn(1, 2, 6, 6), grid_values((1, 4, 4, 2))

    def fn(a, b):
        return F.grid_sample(a, b, mode="bilinear", padding_mode="reflection", align_corners=False)
    torch.testing.assert_close(compiled(fn, x, g)(x, g), fn(x, g), rtol=0, atol=2e-6)

    def bicubic(a, b):
        return F.grid_sample(a, b, mode="bicubic", padding_mode="border", align_corners=True)
    torch.testing.assert_close(compiled(bicubic, x, g)(x, g), bicubic(x, g), rtol=0, atol=4e-6)
    with pytest.raises(UnsupportedOpError, match="grid_sampler_2d.*float32 only"):
        compiled(fn, x.bfloat16(), g.bfloat16())
    with pytest.raises(UnsupportedOpError, match="grid_sampler_2d.*sampled points"):
        compiled(fn, x, torch.zeros(1, 520, 520, 2))
