"""segment_reduce and embedding_bag (passes/graph/legalize_segments.py) compiled end to end (trnc.compile, the JIT)
against torch: max and min bit for bit against eager (they select), sums, means and products against float64
within the summation bound, the empty-segment and empty-bag values, NaN, torch's include_last_offset quirk,
the execution fault on bad lengths and the refusals that name the op.

Tolerance (fp32): a segment (bag) of m elements sums in another order than eager, so
|got - exact| <= (m + 1) 2^-24 sum |x| + 2^-24 |exact| with `exact` the float64 result (Higham 4.2, any order);
a mean divides that by the count (one more rounding); a product of m factors is within (m + 1) 2^-24 relative.
The tests check twice that bound.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import trnc
from modules import Fn
from trnc.errors import ExecutionError, UnsupportedOpError

U = 2.0 ** -24


def compiled(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)


def segment_bound(x, reduce, m, **kw):
    """Twice the bound of the docstring, elementwise, for segment_reduce(x, reduce, ...)."""
    exact = torch.segment_reduce(x.double(), reduce, **kw)
    if reduce in ("max", "min"):
        return exact, torch.zeros_like(exact)
    if reduce == "prod":
        return exact, 2 * (m + 1) * U * exact.abs()
    kw = dict(kw, initial=abs(kw["initial"]) if kw.get("initial") is not None else None)
    mass = torch.segment_reduce(x.double().abs(), reduce, **kw)
    return exact, 2 * ((m + 2) * U * mass + U * exact.abs())


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 1.5])
@pytest.mark.parametrize("by", ["lengths", "offsets"])
def test_segment_reduce_matches_eager(reduce, initial, by):
    torch.manual_seed(0)
    cases = [((9,), 0, torch.tensor([2, 0, 3, 0, 4])),
             ((6, 4, 3), 1, torch.tensor([[0, 1, 3], [4, 0, 0], [1, 1, 2], [2, 2, 0], [0, 0, 4], [3, 0, 1]]))]
    for shape, axis, lengths in cases:
        x = torch.randn(shape)
        if by == "lengths":
            kw = dict(lengths=lengths, axis=axis, initial=initial)
        else:
            zero = torch.zeros(lengths.shape[:-1] + (1,), dtype=torch.long)
            kw = dict(offsets=torch.cat([zero, lengths], -1).cumsum(-1), axis=axis, initial=initial)
        key = "lengths" if by == "lengths" else "offsets"
        def fn(a, b):
            return torch.segment_reduce(a, reduce, **{key: b}, axis=axis, initial=initial)
        got = compiled(fn, x, kw[key])(x, kw[key])
        ref = torch.segment_reduce(x, reduce, **kw)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        exact, bound = segment_bound(x, reduce, int(lengths.max()), **kw)
        if reduce in ("max", "min"):
            torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
        else:
            both_nan = got.isnan() & ref.isnan()
            bad = ~both_nan & ~((got.double() - exact).abs() <= bound)
            assert not bad.any(), f"got {got[bad].tolist()} exact {exact[bad].tolist()}"
        assert torch.equal(got.isnan(), ref.isnan())   # the empty means of no initial are NaN
        if reduce == "mean" and initial is None:
            assert bool(ref.isnan().any())


def test_segment_reduce_nan_and_unsafe_lengths():
    x = torch.tensor([1.0, math.nan, 3.0, -2.0, 5.0, 0.5])
    lengths = torch.tensor([3, 2, 0])
    for reduce in ("max", "min", "sum"):
        def fn(a, b):
            return torch.segment_reduce(a, reduce, lengths=b, unsafe=True)
        got = compiled(fn, x, lengths)(x, lengths)
        torch.testing.assert_close(got, fn(x, lengths), rtol=0, atol=0, equal_nan=True)
    def fn(a, b):
        return torch.segment_reduce(a, "sum", lengths=b)
    run = compiled(fn, x, torch.tensor([3, 2, 1]))
    for bad in ([3, 2, 0], [3, -1, 4], [7, 0, 0]):   # not summing to 6, negative, past the end: torch raises
        with pytest.raises(ExecutionError, match="gather index"):
            run(x, torch.tensor(bad))
    def fn(a, b):
        return torch.segment_reduce(a, "sum", lengths=b, unsafe=True)
    run = compiled(fn, x, lengths)
    with pytest.raises(ExecutionError, match="gather index"):   # a negative length faults, as torch raises
        run(x, torch.tensor([3, -1, 4]))


def test_segment_reduce_refusals_name_the_op():
    x = torch.randn(4000)
    with pytest.raises(UnsupportedOpError, match="segment_reduce.*2\\^24"):
        compiled(lambda a, b: torch.segment_reduce(a, "sum", lengths=b), x, torch.ones(5000, dtype=torch.long))
    offsets = torch.arange(5001).clamp(max=4000)
    with pytest.raises(UnsupportedOpError, match="segment_reduce.*masked data"):
        compiled(lambda a, b: torch.segment_reduce(a, "sum", offsets=b), x, offsets)


def bag_close(got, ref, exact, mass, counts):
    bound = 2 * ((counts + 2) * U * mass + U * exact.abs())
    bad = ~((got.double() - exact).abs() <= bound)
    assert got.shape == ref.shape and not bad.any(), f"got {got[bad].tolist()} exact {exact[bad].tolist()}"


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3])
@pytest.mark.parametrize("last", [False, True])
def test_embedding_bag_matches_eager(mode, padding_idx, last):
    torch.manual_seed(1)
    w = torch.randn(10, 6)
    i = torch.tensor([3, 1, 3, 9, 0, 3, 2, 7, 5, 4, 3])
    o = torch.tensor([0, 2, 2, 6, 9])   # an empty bag; with include_last_offset, indices 9 and 10 are a tail
    def fn(a, b, c):
        return F.embedding_bag(b, a, c, mode=mode, padding_idx=padding_idx, include_last_offset=last)
    got = compiled(fn, w, i, o)(w, i, o)
    ref = fn(w, i, o)
    if mode == "max":
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    else:
        # float64 eager takes another path (it sums the tail): fp32 eager is the reference, the bound covers both
        bag_close(got, ref, ref.double(), fn(w.abs(), i, o).double(), 6)
    assert torch.equal(got[1], torch.zeros(6))   # the empty bag


def test_embedding_bag_weights_2d_nan_and_empty():
    torch.manual_seed(2)
    w, i, psw = torch.randn(7, 3), torch.randint(0, 7, (4, 5)), torch.randn(4, 5)
    def fn(a, b, p):
        return F.embedding_bag(b, a, mode="sum", per_sample_weights=p)
    got = compiled(fn, w, i, psw)(w, i, psw)
    bag_close(got, fn(w, i, psw), fn(w.double(), i, psw.double()), fn(w.double().abs(), i, psw.double().abs()), 5)
    w = torch.tensor([[1.0, math.nan], [math.nan, 2.0], [3.0, -1.0]])
    def fn(a, b, c):
        return F.embedding_bag(b, a, c, mode="max")
    for order in ([0, 1, 2], [1, 0, 2], [2, 2, 1]):   # a NaN wins only as the first entry of its bag (eager's loop)
        i, o = torch.tensor(order + [1]), torch.tensor([0, 3, 4])
        got = compiled(fn, w, i, o)(w, i, o)
        torch.testing.assert_close(got, fn(w, i, o), rtol=0, atol=0, equal_nan=True)
    i, o = torch.tensor([0, 1, 2], dtype=torch.long), torch.tensor([0, 3])
    run = compiled(fn, w, i, o)
    with pytest.raises(ExecutionError, match="gather index"):   # an index outside the table, as torch raises
        run(w, torch.tensor([0, 5, 1]), o)
