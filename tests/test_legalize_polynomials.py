"""The orthogonal polynomial rules of passes/graph/legalize_polynomials.py compiled end to end (trnc.compile, the JIT)
against torch: Chebyshev T/U/V/W, plain and shifted, and Hermite H/He, on x grids in [-2.5, 2.5] (and the special
values), n from -3 to 1000 and beyond, and the refusals.

Tolerance (fp32), per n, over the x grid, with `exact` the op in float64 and `eager` torch's fp32 kernel:
max |got - exact| <= max |eager - exact| + 1e-5 + 1.3e-6 max |exact|, the sweep's max-norm arbiter
(tests/opinfo_sweep.py, assert_close's fp32 atol and rtol). It covers the unfused steps (torch's kernels contract
c q - k p into an FMA, the rule rounds the product too, an ulp per step at most) and the trigonometric forms near
|y| = 1, whose error n |d acos| / sin t is eager's too, with the machine's acos (1 ulp) for libm's. Beyond n = 32 at |y| > 1 the rule's hyperbolic closed forms have a relative error of at most
HYPERBOLIC_RTOL = 1.2e-5 (measured 9.7e-6: z = n acosh|y| <= 89 times log's ulp, a and z being fp32 pairs),
checked against float64 elementwise. NaN must sit where eager has it (except x = NaN, where torch's U and W read
an uninitialized value and the rule gives NaN), and n < 0, NaN or +-Inf gives 0, as in torch.
"""
import math

import pytest
import torch

import trnc
from modules import Fn
from trnc.errors import UnsupportedOpError

S = torch.special
CHEBYSHEV = [S.chebyshev_polynomial_t, S.chebyshev_polynomial_u, S.chebyshev_polynomial_v, S.chebyshev_polynomial_w,
             S.shifted_chebyshev_polynomial_t, S.shifted_chebyshev_polynomial_u, S.shifted_chebyshev_polynomial_v,
             S.shifted_chebyshev_polynomial_w]
HERMITE = [S.hermite_polynomial_h, S.hermite_polynomial_he]
ATOL, RTOL = 1e-5, 1.3e-6   # assert_close's fp32 defaults, as the sweep's arbiter
HYPERBOLIC_RTOL = 1.2e-5
SPECIAL = [1.0, -1.0, 0.0, 0.5, -0.5, 0.999999, -0.999999, 1.0000001, -1.0000001, 1e20, -1e20]


def compiled(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)


def grid(count: int = 301) -> torch.Tensor:
    torch.manual_seed(1616)
    return torch.cat([torch.linspace(-2.5, 2.5, count), torch.rand(64) * 5 - 2.5, torch.tensor(SPECIAL)])


def run(op, *blocks) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]]:
    """(trnc, eager, float64, orders) per block (x, orders), rows n, all blocks in one flat tensor and one compile."""
    xs = torch.cat([x.repeat(len(orders)) for x, orders in blocks])
    ns = torch.cat([torch.tensor([float(n) for n in orders]).repeat_interleave(len(x)) for x, orders in blocks])
    results = compiled(op, xs, ns)(xs, ns), op(xs, ns), op(xs.double(), ns.double())
    out, start = [], 0
    for x, orders in blocks:
        size = len(x) * len(orders)
        out.append(tuple(r[start:start + size].reshape(len(orders), -1) for r in results) + (orders,))
        start += size
    return out


def check_rows(op, got, eager, exact, orders):
    for k, n in enumerate(orders):
        g, r, e = got[k], eager[k], exact[k]
        assert torch.equal(g.isnan(), r.isnan()), f"{op.__name__} n={n}: NaN at {torch.nonzero(g.isnan() != r.isnan())}"
        assert torch.equal(g.isinf(), r.isinf()), f"{op.__name__} n={n}: Inf where eager {r[g.isinf() != r.isinf()]}"
        fine = torch.isfinite(r) & torch.isfinite(e)
        if not fine.any():
            continue
        g, r, e = g[fine].double(), r[fine].double(), e[fine]
        allowed = (r - e).abs().max() + ATOL + RTOL * e.abs().max()
        assert (g - e).abs().max() <= allowed, f"{op.__name__} n={n}: {(g - e).abs().max()} > {allowed}"


@pytest.mark.parametrize("op", CHEBYSHEV, ids=lambda f: f.__name__)
def test_chebyshev_matches_eager_for_small_and_large_n(op):
    """n up to 32 (the unrolled recurrence and, above torch's threshold, its trigonometric forms inside) and large n
    inside [-1, 1] (x in [0, 1] for the shifted forms), against float64 with eager's error as the scale."""
    inside = torch.linspace(-1, 1, 401) if "shifted" not in op.__name__ else \
        torch.cat([torch.linspace(0, 1, 401), torch.tensor([5.587935447692871e-08, 1e-7, 0.99999994, 0.9999999])])
    for block in run(op, (grid(), [-3, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 31, 32]),
                     (inside, [33, 100, 1000, 54321])):
        check_rows(op, *block)


@pytest.mark.parametrize("op", CHEBYSHEV[:4], ids=lambda f: f.__name__)
def test_chebyshev_closed_forms_beyond_the_unroll(op):
    """|y| > 1 beyond n = 32: the hyperbolic forms within HYPERBOLIC_RTOL of float64 where both are finite, Inf where
    the value overflows, NaN where torch's recurrence has overflowed two steps back (Inf - Inf)."""
    y = torch.cat([torch.linspace(1.0001, 3, 500), -torch.linspace(1.0001, 3, 500)])
    got, eager, exact, _ = run(op, (y, [33, 50, 80, 200, 1000]))[0]
    finite = torch.isfinite(exact) & (exact.abs() < 3e38) & torch.isfinite(eager)
    assert finite.sum() > 1500
    rel = (got.double() - exact).abs() / exact.abs()
    assert rel[finite].max() <= HYPERBOLIC_RTOL
    assert rel[finite].max() > 1e-7   # the check compares something
    far = exact.abs() > 1e40   # overflowed long before: torch's recurrence is NaN there, and so is the rule
    assert far.any() and eager[far].isnan().all() and got[far].isnan().all()


@pytest.mark.parametrize("op", HERMITE, ids=lambda f: f.__name__)
def test_hermite_matches_eager(op):
    """The unrolled recurrence: values, and Inf and NaN where torch overflows (n from 20 at |x| near 6), NaN from 70
    on and beyond torch's 128."""
    torch.manual_seed(1618)
    x = torch.cat([torch.linspace(-6, 6, 241), torch.randn(64) * 20, torch.tensor(SPECIAL[:9])])
    small, large = run(op, (x, [-2, 0, 1, 2, 3, 5, 8, 13, 20, 30, 40, 50, 55, 59, 65]), (x, [70, 100, 129, 5000]))
    check_rows(op, *small)
    got, eager, _, _ = large
    assert eager.isnan().all() and got.isnan().all()


@pytest.mark.parametrize("op", CHEBYSHEV + HERMITE, ids=lambda f: f.__name__)
def test_special_values(op):
    """n < 0, NaN, +-Inf give 0 (torch's cast to int64 is negative); a NaN x gives NaN for n >= 1; x = +-Inf as
    eager (+-Inf for n = 1 and 2, NaN above)."""
    inf, nan = math.inf, math.nan
    x = torch.tensor([0.3, 2.0, -2.0, inf, -inf, nan, nan, inf, -inf, inf, 0.7, 0.7, 0.7])
    n = torch.tensor([-1.0, nan, -inf, 1.0, 2.0, 1.0, 7.0, 9.0, 10.0, inf, inf, 3.9, -0.5])
    got, ref = compiled(op, x, n)(x, n), op(x, n)
    assert torch.equal(got[:3], torch.zeros(3)) and got[9:11].eq(0).all()
    assert got[5].isnan() and got[6].isnan()
    keep = torch.tensor([True, True, True, True, True, True, False, True, True, True, True, True, True])
    torch.testing.assert_close(got[keep], ref[keep], equal_nan=True)


def test_shapes_broadcast_empty_and_scalar_n():
    torch.manual_seed(1617)
    op = S.chebyshev_polynomial_u
    x, n = torch.rand(4, 1, 3) * 2 - 1, torch.randint(0, 12, (5, 1)).float()
    torch.testing.assert_close(compiled(op, x, n)(x, n), op(x, n))
    empty = torch.zeros(0, 3)
    assert compiled(op, empty, torch.tensor(3.0))(empty, torch.tensor(3.0)).shape == (0, 3)
    x1 = torch.tensor([0.25, -1.5, 1.0])
    torch.testing.assert_close(compiled(lambda v: S.hermite_polynomial_he(v, 6), x1)(x1), S.hermite_polynomial_he(x1, 6))


def test_refusals_name_the_op():
    x, n = torch.rand(5), torch.randint(0, 5, (5,))
    with pytest.raises(UnsupportedOpError, match="aten.special_chebyshev_polynomial_t.default.*integer n"):
        compiled(S.chebyshev_polynomial_t, x, n)
    for op in (S.laguerre_polynomial_l, S.legendre_polynomial_p):
        with pytest.raises(UnsupportedOpError, match=f"aten.special_{op.__name__[len('special_'):]}"):
            compiled(op, x, n.float())
