"""The sorting rules of passes/graph/legalize_sort.py compiled end to end (trnc.compile, the JIT) against eager, bit
for bit: sorting moves values, it computes nothing. Rank counting (rows up to 256) and the bitonic network (longer
rows) both; ties in input order (eager's CPU sort with stable=True, and median, pick them so), NaN after +inf
(before it descending), signed zeros, several dims and dtypes. topk's tie order is eager's partial sort's own, so
its samples have distinct values (or its ties are checked by value and by the index pointing at that value)."""
import pytest
import torch

import trnc
from modules import Fn
from trnc.errors import UnsupportedOpError

NAN, INF = float("nan"), float("inf")


def compiled(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)


def equal_to_eager(fn, *xs, signs=True):
    got = compiled(fn, *xs)(*xs)
    ref = fn(*xs)
    got, ref = (got, ref) if isinstance(ref, tuple) else ((got,), (ref,))
    for k, (g, r) in enumerate(zip(got, ref)):
        torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"output {k}: {m}")
        if signs and r.dtype.is_floating_point:   # signed zeros too (a NaN's sign is not compared)
            assert torch.equal(g.signbit() | g.isnan(), r.signbit() | r.isnan()), f"output {k}: signs"


def awkward(*shape, seed):
    """Seeded values with many ties, signed zeros, infinities and NaNs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, shape, generator=g).float() / 2
    pick = torch.rand(shape, generator=g)
    x[pick < 0.08] = NAN
    x[(pick >= 0.08) & (pick < 0.12)] = INF
    x[(pick >= 0.12) & (pick < 0.16)] = -INF
    x[(pick >= 0.16) & (pick < 0.24)] = -0.0
    return x


@pytest.mark.parametrize("n", [1, 2, 3, 127, 128, 129, 513])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_ties_nan_inf_sizes(n, descending):
    x = awkward(3, n, seed=1600 + n)
    equal_to_eager(lambda x: torch.sort(x, dim=-1, descending=descending, stable=True), x)


@pytest.mark.parametrize("shape, dim", [((4, 5, 6), 0), ((4, 5, 6), 1), ((4, 5, 6), -3), ((2, 300, 3), -2),
                                        ((7,), -1), ((), 0)])
def test_sort_argsort_msort_dims(shape, dim):
    x = awkward(*shape, seed=1610) if shape else torch.tensor(2.5)
    equal_to_eager(lambda x: torch.sort(x, dim=dim, stable=True), x)
    equal_to_eager(lambda x: torch.argsort(x, dim=dim, descending=True, stable=True), x)
    equal_to_eager(lambda x: torch.msort(x), x)


@pytest.mark.parametrize("n", [5, 300])
def test_sort_bf16_and_int32(n):
    x = awkward(4, n, seed=1620).bfloat16()
    equal_to_eager(lambda x: torch.sort(x, stable=True), x)
    g = torch.Generator().manual_seed(1621)
    xi = torch.randint(-(2 ** 20), 2 ** 20, (4, n), generator=g, dtype=torch.int32)
    xi[:, ::3] = 7   # ties
    equal_to_eager(lambda x: torch.sort(x, dim=1, descending=True, stable=True), xi)
    equal_to_eager(lambda x: torch.argsort(x, dim=0, stable=True), xi)


@pytest.mark.parametrize("n", [9, 129, 700])
def test_topk_kthvalue(n):
    g = torch.Generator().manual_seed(1630 + n)
    x = torch.randperm(3 * n, generator=g).float().reshape(3, n) - n   # distinct values
    x[0, 1] = NAN
    for largest in (True, False):
        equal_to_eager(lambda x: torch.topk(x, min(n, 4), dim=1, largest=largest), x)
        equal_to_eager(lambda x: torch.topk(x, 2, dim=0, largest=largest), x)
    equal_to_eager(lambda x: torch.kthvalue(x, 3, 1), x)
    equal_to_eager(lambda x: torch.kthvalue(x, 2, 0, True), x)
    # ties: the values are eager's; the indices point at them
    t = awkward(3, n, seed=1640 + n)
    got_v, got_i = compiled(lambda x: torch.topk(x, 3), t)(t)
    torch.testing.assert_close(got_v, torch.topk(t, 3).values, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(t.gather(1, got_i), got_v, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("n", [5, 6, 300])
def test_median_nanmedian(n):
    x = awkward(5, n, seed=1650 + n)
    x[2] = x[2].nan_to_num(0.0)   # a row without NaN
    for f in (torch.median, torch.nanmedian):
        equal_to_eager(lambda x: f(x, 1), x)
        equal_to_eager(lambda x: f(x, 0, True), x)
        # the median of the whole tensor: eager's nth_element picks either of tied 0.0 and -0.0
        equal_to_eager(lambda x: f(x), x, signs=False)
        equal_to_eager(lambda x: f(x), x[2], signs=False)
    # an all-NaN row: eager's nanmedian index is its nth_element's choice (not (n - 1) // 2 for every n); any NaN's
    # index is a right answer
    x[1] = NAN
    got_v, got_i = compiled(lambda x: torch.nanmedian(x, 1), x)(x)
    ref_v, ref_i = torch.nanmedian(x, 1)
    torch.testing.assert_close(got_v, ref_v, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got_i[[0, 2, 3, 4]], ref_i[[0, 2, 3, 4]], rtol=0, atol=0)
    assert 0 <= got_i[1] < n


def test_too_long_a_row_is_refused():
    x = torch.randn(1 << 17)
    with pytest.raises(UnsupportedOpError, match="sort"):
        compiled(lambda x: torch.sort(x), x)


def test_mode():
    """Ties of counts go to the smallest value, its last index; a tied zero's sign is that element's. Eager sorts
    the row with std::sort, which keeps equal values in input order only up to 16 elements (insertion sort), so
    longer rows with repeated values are checked by value and by the index pointing at it."""
    x = torch.tensor([[2., 2., 1., 1., 5.], [1., 1., 2., 2., 3.], [0., -0., 1., 1., 2.], [-0., 0., 1., 3., 2.],
                      [NAN] * 5, [INF, 3., 3., -INF, -INF]])
    equal_to_eager(lambda x: torch.mode(x, 1), x)
    g = torch.Generator().manual_seed(1660)
    equal_to_eager(lambda x: torch.mode(x, 0, True), torch.randint(-3, 3, (16, 4), generator=g).float())
    equal_to_eager(lambda x: torch.mode(x, -1), torch.randint(-3, 3, (4, 16), generator=g, dtype=torch.int32))
    equal_to_eager(lambda x: torch.mode(x, 0), torch.randperm(600, generator=g).float().reshape(300, 2))
    t = torch.randint(-5, 5, (3, 200), generator=g).float()
    got_v, got_i = compiled(lambda x: torch.mode(x, 1), t)(t)
    torch.testing.assert_close(got_v, torch.mode(t, 1).values, rtol=0, atol=0)
    torch.testing.assert_close(t.gather(1, got_i[:, None])[:, 0], got_v, rtol=0, atol=0)
