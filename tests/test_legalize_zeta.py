"""The Hurwitz zeta and polygamma n >= 1 rules of passes/graph/legalize_zeta.py compiled end to end (trnc.compile, the
JIT) against torch computed in float64 (its cephes zeta in double, nearly correctly rounded where its terms do not
cancel), torch's special values, and the refusal that names the op.

Tolerances, in units of the fp32 ulp of the float64 value (2^(e - 23) for a value in [2^e, 2^(e+1))), measured on
these seeded grids and stated with a margin:
- zeta(x, q), q in (0, 50] (and q down to 1e-6), x in (1, 40] and the integers to 40: ZETA_ULPS. The machine pow
  (up to 4 ulps, runtime/fp32pow.py) on the leading term, the other nine terms and the tail summed in fp32.
- polygamma(n, x), n = 2..5 (n! zeta(n + 1, x)), x in (0, 10]: the same bound; x in [1e-6, 1.2e6] (the tail
  dominating for large x, results above 1e-30): WIDE_ULPS; n = 1 (trigamma) is torch's float
  algorithm transcribed: within TRIGAMMA_ULPS of float64 for x > 0, as eager's own float trigamma (4.31 here), and
  within 4 ulps of eager everywhere. n! is eager's float exp(lgamma(n + 1)), not exactly n! from n = 5 (for
  n = 34 30 ulps off): polygamma 34 is checked against float64 zeta times that factor.
- q < 0 (x an integer s) and polygamma at x < 0: the leading terms f^-s and (1 - f)^-s (f = q - floor(q)) and the
  sums cancel near the zeros of the result, so the bound is NEGATIVE_ULPS ulps of the scale of the terms,
  sum over k of |q + k|^-s (times n! for polygamma), not of the result.
"""
import math

import pytest
import torch

import trnc
from modules import Fn
from trnc.errors import UnsupportedOpError
from trnc.passes.graph.legalize_zeta import factorial_as_eager

ZETA_ULPS = 4.0        # measured 2.44 (zeta), 3.34 (polygamma, n = 5)
TRIGAMMA_ULPS = 4.5    # measured 4.31, eager's float trigamma the same
NEGATIVE_ULPS = 4.0    # measured 2.11 (zeta), 3.52 (polygamma, n = 5)
WIDE_ULPS = 5.0        # measured 4.04 (polygamma, n = 3, x in [1e-6, 1.2e6])
N = 4096
Z = torch.special.zeta


def compiled(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)


def ulp(exact: torch.Tensor) -> torch.Tensor:
    """The fp32 ulp at each float64 value (normal range)."""
    return torch.ldexp(torch.ones_like(exact), torch.frexp(exact.abs().clamp(min=2.0 ** -126))[1] - 24)


def ulps(got: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """|got - exact| in fp32 ulps of `scale` (default: of the exact value), over the finite normal exact values."""
    scale = exact if scale is None else scale
    keep = exact.isfinite() & (exact.abs() > 2.0 ** -126) & (scale.abs() < 3e38)
    return ((got.double() - exact).abs() / ulp(scale))[keep]


@pytest.fixture(scope="module")
def zeta():
    return compiled(Z, torch.full((N,), 2.0), torch.full((N,), 3.0))   # two tensors: one passed twice is one input


def grid(seed: int, negative: bool):
    """x in (1, 40] (a quarter of them integers) and q in (0, 50] (a third of them below 2, some tiny); or, for
    `negative`, integer x in [2, 40] and q in (-20, 0) (one in eight within 1e-3 of a half-integer, where the
    leading terms cancel)."""
    g = torch.Generator().manual_seed(seed)
    if negative:
        x = torch.randint(2, 41, (N,), generator=g).float()
        q = -20 * torch.rand(N, generator=g)
        near = torch.arange(N) % 8 == 0
        q[near] = q[near].floor() + 0.5 + 1e-3 * (torch.rand(int(near.sum()), generator=g) - 0.5)
        q[q.floor() == q] -= 0.25
        return x, q
    x = 1 + 39 * torch.rand(N, generator=g)
    x[: N // 4] = torch.randint(2, 41, (N // 4,), generator=g).float()
    q = 50 * torch.rand(N, generator=g) + 1e-30
    q[: N // 3] = 2 * torch.rand(N // 3, generator=g) + 1e-6
    return x, q


def test_zeta_for_positive_q_within_its_bound(zeta):
    x, q = grid(1701, False)
    err = ulps(zeta(x, q), Z(x.double(), q.double()))
    assert err.numel() > N // 2 and err.max() <= ZETA_ULPS, err.max()
    # large orders (torch's double product x (x+1) ... overflows fp32) and small q
    x = torch.tensor([50.0, 1000.0, 41.0, 40.0, 33.5, 2.0, 1.0001, 1.5, 100.0] * (N // 9 + 1))[:N]
    q = torch.tensor([1.0, 1.0, 0.9, 1.7, 0.999, 1e-3, 3.0, 1e30, 1.25] * (N // 9 + 1))[:N]
    err = ulps(zeta(x, q), Z(x.double(), q.double()))
    assert err.max() <= ZETA_ULPS, err.max()


def test_zeta_for_negative_q_within_its_bound(zeta):
    x, q = grid(1702, True)
    got = zeta(x, q)
    xd, qd = x.double(), q.double()
    f = qd - qd.floor()
    terms = Z(xd, f) + Z(xd, 1 - f) - Z(xd, 1 - qd)   # the sum of |q + k|^-s
    err = ulps(got, Z(xd, qd), terms)
    assert err.max() <= NEGATIVE_ULPS, err.max()
    assert not got.isnan().any()


def test_zeta_special_values_as_torch(zeta):
    inf, nan = math.inf, math.nan
    xs = [1.0, 0.5, -inf, inf, nan, 2.0, 3.0, 2.5, 1e30, 50.0]
    qs = [0.0, -0.0, -1.0, -3.0, -inf, inf, nan, -0.5, -2.5, 1e-30, 0.5, 1.0, 3.0]
    x = torch.tensor(xs).repeat_interleave(len(qs))
    q = torch.tensor(qs).repeat(len(xs))
    pad = N - x.numel()
    x, q = torch.cat([x, torch.full((pad,), 2.0)]), torch.cat([q, torch.full((pad,), 1.0)])
    got, ref = zeta(x, q), Z(x, q)
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(got.isinf() & (got > 0), ref.isinf() & (ref > 0))
    assert torch.equal(got.isinf() & (got < 0), ref.isinf() & (ref < 0))
    finite = ref.isfinite()
    torch.testing.assert_close(got[finite], ref[finite], rtol=ZETA_ULPS * 2.0 ** -23, atol=1e-37)


def test_polygamma_within_its_bounds():
    torch.manual_seed(1703)
    x = torch.cat([10 * torch.rand(2048) + 1e-3, -10 * torch.rand(2048)])
    x[x.floor() == x] += 0.125
    orders = (1, 2, 3, 4, 5, 34)
    fn = compiled(lambda v: tuple(torch.polygamma(n, v) for n in orders), x)
    got = fn(x)
    xd, positive = x.double(), x > 0
    f = xd - xd.floor()
    for n, g in zip(orders, got):
        exact = torch.polygamma(n, xd)
        assert g.dtype == torch.float32 and g.shape == x.shape
        if n == 1:   # torch's float algorithm: as accurate as eager, which is what it transcribes
            eager = torch.polygamma(1, x)
            assert ulps(g[positive], exact[positive]).max() <= TRIGAMMA_ULPS
            torch.testing.assert_close(g, eager, rtol=4 * 2.0 ** -23, atol=0)
            continue
        if n == 34:   # near fp32's largest values, x > 1 (finite); n! as eager's float exp(lgamma(35)), 30 ulps off 34!
            big = x > 1
            exact = -factorial_as_eager(34) * Z(torch.tensor(35.0, dtype=torch.float64), xd)
            assert ulps(g[big], exact[big]).max() <= ZETA_ULPS
            continue
        s = torch.tensor(n + 1.0, dtype=torch.float64)
        assert ulps(g[positive], exact[positive]).max() <= ZETA_ULPS, n
        terms = (Z(s, f) + Z(s, 1 - f) - Z(s, 1 - xd)) * math.factorial(n)
        assert ulps(g[~positive], exact[~positive], terms[~positive]).max() <= NEGATIVE_ULPS, n
    # x from 1e-6 to 1.2e6: the tail dominates for large x (results above 1e-30: smaller ones pass through fp32's
    # subnormals, in eager as here)
    wide = torch.exp(torch.empty(x.numel()).uniform_(-14, 14))
    for n, g in zip(orders[1:5], fn(wide)[1:5]):
        exact = torch.polygamma(n, wide.double())
        keep = exact.abs() > 1e-30
        assert ulps(g[keep], exact[keep]).max() <= WIDE_ULPS, n


def test_scalar_overloads_empty_and_one_element():
    torch.manual_seed(1704)
    q = 3 * torch.rand(7) + 0.1
    x = 1.5 + 5 * torch.rand(7)
    got = compiled(lambda a, b: (torch.special.zeta(2.5, b), torch.special.zeta(a, 0.75)), x, q)(x, q)
    for g, exact in zip(got, (Z(torch.tensor(2.5, dtype=torch.float64), q.double()), Z(x.double(), 0.75))):
        assert ulps(g, exact).max() <= ZETA_ULPS
    one = torch.tensor([1.25])
    assert ulps(compiled(lambda a: torch.polygamma(3, a), one)(one), torch.polygamma(3, one.double())).max() \
        <= ZETA_ULPS
    empty = torch.empty(0, 3)
    out = compiled(lambda a: Z(a, a), empty)(empty)
    assert out.shape == (0, 3) and out.dtype == torch.float32


def test_polygamma_of_too_high_an_order_is_refused_by_name():
    x = torch.rand(4) + 1
    with pytest.raises(UnsupportedOpError, match=r"aten\.polygamma\.default with n=35 .*n! overflows"):
        compiled(lambda a: torch.polygamma(35, a), x)


if __name__ == "__main__":   # print the measured maxima the bounds above state with a margin
    ULPS = []
    ulps_ = ulps

    def ulps(got, exact, scale=None):   # noqa: F811
        err = ulps_(got, exact, scale)
        ULPS.append(float(err.max()) if err.numel() else 0.0)
        return err
    ZETA_ULPS = TRIGAMMA_ULPS = NEGATIVE_ULPS = math.inf
    z = compiled(Z, torch.full((N,), 2.0), torch.full((N,), 2.0))
    for test in (test_zeta_for_positive_q_within_its_bound, test_zeta_for_negative_q_within_its_bound):
        test(z)
    test_polygamma_within_its_bounds()
    print(ULPS)
