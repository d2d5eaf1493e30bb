"""The scatter and index update rules of passes/graph/legalize_scatter.py compiled end to end (trnc.compile, the
JIT) against eager, seeded.

Moves and selections (scatter, index_copy, index_fill, put, masked_scatter, amax/amin, index_put without
accumulate) are compared bit for bit: they only move, select or compare values (the duplicate indices' last
writer is eager's CPU result: its loop writes in order along the scattered dim).

Sums (scatter_add, index_add, index_put accumulate, scatter_reduce sum/mean): each output is x plus up to M
source terms, which eager adds in order into x and the kernel sums in its own order in fp32 before adding x.
Both are recursive summations of the same k + 1 <= M + 1 terms, each within gamma(k) * sum |terms| of the
exact sum (Higham, Accuracy and Stability, 4.2; gamma(k) = k u / (1 - k u), u = 2^-24), so they differ by at
most 2 gamma(M + 1) * (|x| + sum |src hits|) (+ a rounding of the mean's division, u |result|, and of prod's
M products, 2 gamma(M) |result| in any order), computed per element below from |x| and |src| scattered in
float64.
"""
import pytest
import torch

import trnc
from modules import Fn
from trnc.errors import UnsupportedOpError

U = 2.0 ** -24


def run(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)(*xs)


def gamma(k):
    return k * U / (1 - k * U)


def exact(fn, *xs):
    got, ref = run(fn, *xs), fn(*xs)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    if ref.dtype.is_floating_point:
        assert torch.equal(got.signbit() | got.isnan(), ref.signbit() | ref.isnan())


def summed(fn, abs_fn, m, *xs, extra=0.0):
    """fn's result within 2 gamma(m + 1) * abs_fn(|xs|) (+ extra relative) of eager's."""
    got, ref = run(fn, *xs), fn(*xs)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    scale = abs_fn(*(x.abs().double() if x.is_floating_point() else x for x in xs))
    bound = 2 * gamma(m + 1) * scale + extra * ref.double().abs() + 1e-30
    assert ((got.double() - ref.double()).abs() <= bound).all()


def idx(*shape, high, gen):
    return torch.randint(0, high, shape, generator=gen)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_add_and_index_add(dim):
    g = torch.Generator().manual_seed(1)
    x, src = torch.randn(6, 7, generator=g), torch.randn(9, 7, generator=g) if dim == 0 else torch.randn(6, 9,
                                                                                                       generator=g)
    shape = list(src.shape)
    index = idx(*shape, high=x.shape[dim], gen=g)   # duplicates: 9 indices into <= 7 places
    summed(lambda a, i, s: a.scatter_add(dim, i, s), lambda a, i, s: a + torch.zeros_like(a).scatter_add(dim, i, s),
           9, x, index, src)
    one = idx(9, high=x.shape[dim], gen=g)
    summed(lambda a, i, s: a.index_add(dim, i, s, alpha=0.5),
           lambda a, i, s: a + torch.zeros_like(a).index_add(dim, i, s, alpha=0.5), 9, x, one, src)


def test_scatter_last_writer_and_value_and_bf16():
    g = torch.Generator().manual_seed(2)
    x, src = torch.randn(5, 6, generator=g), torch.randn(3, 8, generator=g)
    index = idx(3, 4, high=5, gen=g)   # a smaller index than src and x in dim 1; duplicates along dim 0
    exact(lambda a, i, s: a.scatter(0, i, s), x, index, src)
    exact(lambda a, i: a.scatter(1, i, -2.5), x, idx(5, 3, high=6, gen=g))
    exact(lambda a, i, s: a.scatter(1, i, s), x.bfloat16(), idx(3, 6, high=6, gen=g), src.bfloat16())


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    g = torch.Generator().manual_seed(3)
    x, src = torch.randn(4, 5, 3, generator=g), torch.randn(4, 8, 3, generator=g)
    index = idx(4, 8, 3, high=5, gen=g)
    fn = lambda a, i, s: a.scatter_reduce(1, i, s, reduce, include_self=include_self)  # noqa: E731
    if reduce in ("amax", "amin"):
        exact(fn, x, index, src)
    elif reduce == "prod":
        summed(fn, lambda a, i, s: torch.zeros_like(a), 8, x, index, src, extra=4 * gamma(9))
    else:
        scale = lambda a, i, s: a + torch.zeros_like(a).scatter_add(1, i, s)  # noqa: E731
        summed(fn, scale, 8, x, index, src, extra=U if reduce == "mean" else 0.0)


def test_index_ops_and_negative_indices():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 4, 3, generator=g)
    exact(lambda a, i, s: a.index_copy(1, i, s), x, torch.tensor([3, 0, 2]), torch.randn(5, 3, 3, generator=g))
    exact(lambda a, i: a.index_fill(2, i, 7.0), x, torch.tensor([2, 0]))
    exact(lambda a, i, v: a.index_put((i,), v), x, torch.tensor([-1, 1, -5]), torch.randn(3, 4, 3, generator=g))
    exact(lambda a, i, j, v: a.index_put((i, j), v), x, torch.tensor([[0], [-2]]), torch.tensor([1, -1, 2, 1]),
          torch.randn(2, 4, 3, generator=g))
    v = torch.randn(7, 3, generator=g)
    i, j = torch.tensor([0, 4, 0, -1, 2, 4, 0]), torch.tensor([1, 1, 1, 3, -4, 1, 1])
    summed(lambda a, i, j, v: a.index_put((i, j), v, accumulate=True),
           lambda a, i, j, v: a + torch.zeros_like(a).index_put((i, j), v, accumulate=True), 7, x, i, j, v)
    exact(lambda a, m: a.index_put((m,), torch.tensor(1.5)), x, torch.randn(5, 4, generator=g) > 0)
    exact(lambda a, i, s: a.put(i, s), x, torch.tensor([[0, -1], [59, 3]]), torch.randn(2, 2, generator=g))
    exact(lambda a, m, s: a.masked_scatter(m, s), x, torch.randn(5, 4, 3, generator=g) > 0,
          torch.randn(70, generator=g))
    exact(lambda a, i, s: a.index_reduce(0, i, s, "amax", include_self=False), x, torch.tensor([1, 1, 4]),
          torch.randn(3, 4, 3, generator=g))


def test_int32_with_a_bound_and_refusals():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(6, 4, generator=g), torch.randn(9, 4, generator=g)
    index = idx(9, 4, high=6, gen=g)
    exact(lambda a, b, i: (a > 0).int().scatter_add(0, i, (b < 0).int()), a, b, index)
    exact(lambda a, b, i: (a > 0).int().scatter(0, i, (b < 0).int() * 3), a, b, index)
    with pytest.raises(UnsupportedOpError, match="scatter_add"):
        run(lambda x, i, s: x.scatter_add(0, i, s), torch.ones(6, 4, dtype=torch.int32), index,
            torch.ones(9, 4, dtype=torch.int32))
    with pytest.raises(UnsupportedOpError, match="one-hot"):
        run(lambda x, i, s: x.scatter_add(0, i, s), torch.zeros(5000, 8), torch.zeros(5000, 8, dtype=torch.long),
            torch.ones(5000, 8))


def test_out_of_range_index_is_an_error():
    x, src = torch.zeros(4, 3), torch.ones(2, 3)
    with pytest.raises(UnsupportedOpError, match="out of range"):   # a constant: at compile time
        run(lambda a, s: a.scatter_add(0, torch.tensor([[0, 4, 1], [1, 1, 1]]), s), x, src)
    compiled = trnc.compile(Fn(lambda a, i, s: a.scatter(0, i, s)).eval(),
                            (x, torch.zeros(2, 3, dtype=torch.long), src), cache=False)
    for bad in (torch.tensor([[0, 4, 1], [1, 1, 1]]), torch.tensor([[0, -1, 1], [1, 1, 1]])):
        with pytest.raises(Exception):   # noqa: B017 - the gather's execution fault, as torch raises
            compiled(x, bad, src)


def test_indices_past_256_stay_exact_under_auto_cast_all():
    """Positions, iotas and counts are fp32 integers marked keep_fp32: auto_cast="all" storing them in bf16 (exact
    only up to 256) would scatter to the wrong places. Values round to bf16 (2^-9 relative) as inputs and as the
    result: a moved value within 2^-8 of itself, a mean within 2^-7 of its terms' magnitudes |x| + sum |src|."""
    g = torch.Generator().manual_seed(6)
    x, src = torch.randn(2, 600, generator=g), torch.randn(2, 300, generator=g)
    index = torch.stack([torch.randperm(600, generator=g)[:300] for _ in range(2)])
    for fn in (lambda a, i, s: a.scatter(1, i, s), lambda a, i, s: a.scatter_reduce(1, i, s, "mean")):
        got = trnc.compile(Fn(fn).eval(), (x, index, src), cache=False, precision="bf16", auto_cast="all")(x, index,
                                                                                                           src)
        ref = fn(x, index, src)
        scale = x.abs() + torch.zeros_like(x).scatter_add(1, index, src.abs())
        assert ((got.float() - ref).abs() <= scale * 2.0 ** -7).all()
    got = trnc.compile(Fn(lambda a, i, s: a.scatter(1, i, s)).eval(), (x, index, src), cache=False, precision="bf16",
                       auto_cast="all")(x, index, src)
    ref = x.scatter(1, index, src)
    assert ((got.float() - ref).abs() <= ref.abs() * 2.0 ** -8).all()
