"""Fractional max pooling and grid sampling (passes/graph/legalize_sample.py) compiled end to end (trnc.compile, the
JIT) against eager torch.

Fractional max pools: values and indices bit for bit (the window starts are the same fp32 roundings as torch's,
the max only selects), on many random `_random_samples`, output sizes 1 and larger, NaN inputs, unbatched input;
non-float32 input is refused by name.
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
        for _ in range(6):
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
