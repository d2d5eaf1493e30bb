"""A mixture of experts on the device, piece by piece: transformers' grouped matmul (its custom operator, over
offsets of every kind), histc's counts bit for bit, their cumsum to int32, and the integer floor division of the
routing (sorted positions // top-k). The whole model is tests/test_models.py's Mixtral.

Tolerance of the grouped matmul: each output is a dot product of D fp32 terms, summed in another order than
eager's, so |got - eager| <= 2 D u (|x| @ |w|) with u = 2^-24 (Higham 3.1, both sums' error)."""
import math

import pytest
import torch
import transformers.integrations.moe  # noqa: F401  (registers torch.ops.transformers.grouped_mm_fallback)
from modules import Fn

import trnc
from trnc.errors import UnsupportedOpError

U = 2.0 ** -24


def run(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)(*xs)


def grouped_mm(x, w, offs):
    return torch.ops.transformers.grouped_mm_fallback(x, w, offs)


@pytest.mark.parametrize("offs", [
    [3, 3, 9, 17],          # cumulative counts with an empty expert, every row covered
    [0, 5, 5, 11],          # an empty first expert, the last rows in no range (they stay zero)
    [6, 2, 12, 17],         # an end going backwards: the third range starts at 2 and overwrites rows 2..5
    [-12, 9, -1, 40],       # negative ends count from S, as Python slices; an end past S stops at S
    [0, 0, 0, 0],
], ids=["counts", "uncovered", "backwards", "negative", "empty"])
def test_grouped_matmul_equals_transformers_kernel(offs):
    g = torch.Generator().manual_seed(1701)
    s, d, e, o = 17, 40, 4, 24
    x, w = torch.randn(s, d, generator=g), torch.randn(e, d, o, generator=g)
    offs = torch.tensor(offs, dtype=torch.int32)
    got, ref = run(grouped_mm, x, w, offs), grouped_mm(x, w, offs)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    bound = 2 * d * U * torch.stack([x.abs() @ w[i].abs() for i in range(e)]).amax(0)
    assert ((got - ref).abs() <= bound).all()
    assert torch.equal(got == 0, ref == 0)     # the rows no range covers are exact zeros


def test_histc_counts_equal_torch_bit_for_bit():
    """Values at, just below and just above every bin edge, outside the range, NaN and infinities; ranges whose
    widths do not divide evenly."""
    g = torch.Generator().manual_seed(1702)
    for bins, lo, hi in [(7, -3.3, 5.1), (1, 0.0, 1.0), (8, 0.0, 7.0), (50, 1e-3, 2e-3), (3, -1e30, 1e30)]:
        edges = torch.linspace(lo, hi, bins + 1)
        x = torch.cat([edges, torch.nextafter(edges, edges + 1), torch.nextafter(edges, edges - 1),
                       torch.rand(300, generator=g) * (hi - lo + 2) + lo - 1,
                       torch.tensor([math.nan, math.inf, -math.inf])]).reshape(-1, 3)
        fn = lambda t: torch.histc(t, bins=bins, min=lo, max=hi)  # noqa: E731
        got, ref = run(fn, x), fn(x)
        assert got.dtype == ref.dtype and torch.equal(got, ref), (bins, lo, hi)


def test_the_cumsum_of_histc_counts_is_an_exact_int32():
    """A mixture of experts' offsets: histc of the sorted expert ids, cumsum to int32."""
    ids = torch.randint(0, 6, (2, 40), generator=torch.Generator().manual_seed(1703))

    def offsets(i):
        return torch.cumsum(torch.histc(i.float(), bins=6, min=0, max=5), dim=0, dtype=torch.int32)
    got, ref = run(offsets, ids), offsets(ids)
    assert got.dtype == torch.int32 and torch.equal(got, ref)


def test_histc_over_the_datas_range_and_float_cumsums_to_int_are_refused():
    x = torch.randn(10)
    with pytest.raises(UnsupportedOpError, match=r"aten\.histc\.default with min = max = 0 is not supported"):
        run(lambda t: torch.histc(t, bins=4), x)
    with pytest.raises(UnsupportedOpError, match=r"aten\.histc\.default with min = max = 2\.5 "):
        run(lambda t: torch.histc(t, bins=4, min=2.5, max=2.5), x)
    with pytest.raises(UnsupportedOpError, match=r"aten\.cumsum\.default of a float tensor to int32"):
        run(lambda t: torch.cumsum(t * 3, 0, dtype=torch.int32), x)


def test_integer_division_and_remainders_of_bounded_values_are_exact():
    """Sorted positions // top-k (the tokens of a mixture's routing), and bounded values of both signs by positive
    and negative divisors: floor and trunc division, remainder (Python's sign) and fmod (C's)."""
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(1704))

    def divided(t):
        perm = t.argsort(dim=-1)
        shifted = perm - 23
        return (perm // 2, shifted // 3, shifted // -3, torch.div(shifted, 4, rounding_mode="trunc"),
                torch.div(shifted, -7, rounding_mode="trunc"), torch.floor_divide(shifted, 5), shifted % 7,
                shifted % -4, torch.fmod(shifted, 6), torch.fmod(shifted, -5), torch.remainder(perm, 3))
    got, ref = run(divided, x), divided(x)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and torch.equal(g, r)


def test_integer_division_that_fp32_cannot_prove_exact_is_refused():
    ids = torch.arange(12, dtype=torch.int32)
    with pytest.raises(UnsupportedOpError, match=r"no such bound on its values is known"):
        run(lambda t: t // 3, ids)
    with pytest.raises(UnsupportedOpError, match=r"a zero divisor raises in torch"):
        run(lambda t: t.argsort() // 0, torch.randn(12))
    with pytest.raises(UnsupportedOpError, match=r"of integer tensors is not supported: torch raises on a zero"):
        run(lambda t, d: t.argsort() // d, torch.randn(12), ids + 1)


def test_routing_stays_exact_under_auto_cast_all():
    """bf16 holds integers exactly only up to 256: row numbers, expert bounds and histc's counts must stay fp32
    under auto_cast="all". 600 rows in ranges past 256, and counts of 300."""
    g = torch.Generator().manual_seed(1705)
    x, w = torch.randn(600, 16, generator=g), torch.randn(3, 16, 8, generator=g)
    offs = torch.tensor([257, 301, 599], dtype=torch.int32)
    got = trnc.compile(Fn(grouped_mm).eval(), (x, w, offs), cache=False, precision="bf16", auto_cast="all")(x, w, offs)
    ref = grouped_mm(x, w, offs)
    owner = torch.bucketize(torch.arange(600), offs, right=True)    # the expert of each row; 3: none
    assert torch.equal(got[owner == 3] == 0, torch.ones_like(got[owner == 3], dtype=torch.bool))
    bf16_bound = 2.0 ** -7 * torch.stack([x.abs() @ w[i].abs() for i in range(3)])   # bf16 operands and result
    for e in range(3):
        rows = owner == e
        assert ((got[rows] - ref[rows]).abs() <= bf16_bound[e][rows] + 2.0 ** -8 * ref[rows].abs()).all(), e
    ids = torch.cat([torch.zeros(300), torch.ones(257), torch.full((43,), 2.0)])

    def offsets(i):
        return torch.cumsum(torch.histc(i, bins=3, min=0, max=2), dim=0, dtype=torch.int32)
    got = trnc.compile(Fn(offsets).eval(), (ids,), cache=False, precision="bf16", auto_cast="all")(ids)
    assert torch.equal(got, offsets(ids))
