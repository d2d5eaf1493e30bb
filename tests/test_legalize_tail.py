"""The long-tail rules of passes/graph/legalize_tail.py compiled end to end (trnc.compile, the JIT) against torch:
vector norms and what torch builds on them against float64, the structural ops (diagonals, flips, unfold,
narrow_copy) and copysign and heaviside bit for bit against eager (they only move, select or negate values),
and the errors that name the op.

Norm tolerance (fp32): |got - exact| <= 2^-17 |exact|, with `exact` the same function in float64. A norm is a
sum of at most 1000 terms of one sign (|x|^p), whose rounding errors in any summation order (eager's and the
kernel's differ) stay near sqrt(n) 2^-24 <= 2^-19 of the sum in these seeded samples; pow and the root add a few
ulp (runtime/fp32pow.py), and p = 0.5's root squares the sum, doubling its relative error: 2^-17 covers both
with a factor of two to spare. The functions built on norms (cosine similarity, normalize, distances) divide or
subtract such values once more, within the same bound (their operands do not cancel in these samples).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import trnc
from modules import Fn
from trnc.errors import UnsupportedOpError

NORM_RTOL = 2.0 ** -17


def compiled(fn, *xs):
    return trnc.compile(Fn(fn).eval(), xs, cache=False)


def close_to_float64(fn, *xs, rtol=NORM_RTOL):
    got = compiled(fn, *xs)(*xs)
    got = got if isinstance(got, tuple) else (got,)
    exact = fn(*(x.double() for x in xs))
    exact = exact if isinstance(exact, tuple) else (exact,)
    for k, (g, e) in enumerate(zip(got, exact)):
        assert g.dtype == torch.float32 and g.shape == e.shape, k
        bad = (g.double() - e).abs() > rtol * e.abs() + 1e-30
        assert not bad.any(), f"output {k}: got {g[bad][:4].tolist()} exact {e[bad][:4].tolist()}"


def equal_to_eager(fn, *xs):
    got = compiled(fn, *xs)(*xs)
    ref = fn(*xs)
    got, ref = (got, ref) if isinstance(ref, tuple) else ((got,), (ref,))
    for k, (g, r) in enumerate(zip(got, ref)):
        torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"output {k}: {m}")
        if r.dtype.is_floating_point:   # signed zeros too (a NaN's sign is not compared)
            assert torch.equal(g.signbit() | g.isnan(), r.signbit() | r.isnan()), f"output {k}: signs"


ORDS = [2, 1, math.inf, -math.inf, 0, 3, 0.5, -1.5]


@pytest.mark.parametrize("shape, dim, keepdim", [((7,), None, False), ((4, 33, 6), (0, 2), True),
                                                 ((3, 129), -1, False), ((2, 5, 1000), 2, False),
                                                 ((3, 1, 4), 1, True), ((1, 1), None, False)])
def test_vector_norms_match_float64(shape, dim, keepdim):
    torch.manual_seed(1601)
    x = torch.randn(*shape)
    x[x.abs() < 0.05] = 0.0   # zeros: counted by p = 0, inf in |x|^p for p < 0
    close_to_float64(lambda x: tuple(torch.linalg.vector_norm(x, p, dim, keepdim) for p in ORDS), x)


def test_norm_spellings_match_float64():
    """torch.norm, linalg.norm and matrix_norm (Frobenius), renorm and F.normalize reach legalize as vector
    norms; the zeros-only row of normalize divides by eps."""
    torch.manual_seed(1602)
    x = torch.randn(6, 5, 4)
    x[1] = 0.0
    close_to_float64(lambda x: (torch.norm(x), torch.norm(x, p=1, dim=1), torch.linalg.norm(x, dim=(1, 2)),
                                torch.linalg.matrix_norm(x), torch.linalg.norm(x, math.inf, dim=0),
                                F.normalize(x, dim=1), F.normalize(x, p=1, dim=-1),
                                torch.renorm(x, 2, 0, 1.5)), x)


def test_distances_losses_and_trace_match_float64():
    torch.manual_seed(1603)
    a, b, c = torch.randn(8, 33), torch.randn(8, 33), torch.randn(8, 33)
    y = torch.where(torch.rand(8) < 0.5, -1.0, 1.0)
    close_to_float64(lambda a, b, c, y: (F.cosine_similarity(a, b), F.cosine_similarity(a, b, dim=0),
                                         F.pairwise_distance(a, b), F.pairwise_distance(a, b, p=1, keepdim=True),
                                         F.triplet_margin_loss(a, b, c), F.triplet_margin_loss(a, b, c, p=3),
                                         F.cosine_embedding_loss(a, b, y), torch.trace(a)), a, b, c, y)


@pytest.mark.parametrize("p", [2, 1, 0, math.inf, 1.5])
def test_dist_and_cdist_match_float64(p):
    """cdist as the broadcast difference normed (and, for p = 2 past 2^22 difference elements or with compute_mode
    1, torch's matmul form: |x1|^2 + |x2|^2 - 2 x1 x2^T cancels, so its bound is absolute, 2^-17 of the largest
    |x|^2 term, within its square root: 2^-8.5 of max |x|, here 1e-2)."""
    torch.manual_seed(1609)
    x1, x2 = torch.randn(2, 7, 5), torch.randn(9, 5)
    close_to_float64(lambda x1, x2: (torch.dist(x1[0], x2[:7], p), torch.cdist(x1, x2, p)), x1, x2)
    if p == 2:
        fn = lambda x1, x2: torch.cdist(x1, x2, compute_mode="use_mm_for_euclid_dist")   # noqa: E731
        got, exact = compiled(fn, x1, x2)(x1, x2), fn(x1.double(), x2.double())
        assert float((got.double() - exact).abs().max()) <= 1e-2


def test_matmul_helpers_match_float64():
    """addmv, addbmm (the batch summed as part of one contraction) and bilinear (_trilinear's broadcast products
    summed): fp32 sums of n <= 25 products, in any order within n 2^-24 of the sum of the terms' magnitudes (the
    function of |inputs|), bounded here by 2^-18 of it."""
    torch.manual_seed(1610)
    i, m, v = torch.randn(4), torch.randn(4, 6), torch.randn(6)
    c, b1, b2 = torch.randn(3, 5), torch.randn(4, 3, 6), torch.randn(4, 6, 5)
    x, y, w, bias = torch.randn(3, 4), torch.randn(3, 5), torch.randn(6, 4, 5), torch.randn(6)
    fn = lambda i, m, v, c, b1, b2, x, y, w, bias: (   # noqa: E731
        torch.addmv(i, m, v), torch.addmv(i[:1], m, v, beta=0.5, alpha=2.0), torch.addbmm(c, b1, b2),
        torch.addbmm(c[0], b1, b2, beta=0.25, alpha=1.5), F.bilinear(x, y, w, bias), F.bilinear(x, y, w),
        torch.ops.aten._trilinear(x, x, x, [], [], [], []))   # no sumdim: the products, summed over nothing
    xs = (i, m, v, c, b1, b2, x, y, w, bias)
    got, exact = compiled(fn, *xs)(*xs), fn(*(t.double() for t in xs))
    for k, (g, e, size) in enumerate(zip(got, exact, fn(*(t.double().abs() for t in xs)))):
        assert g.shape == e.shape and bool(((g.double() - e).abs() <= 2 ** -18 * size).all()), k


def test_repeat_interleave_by_a_tensor_matches_eager_exactly():
    """repeats from the model's input with a static output_size: the index computed on the device."""
    x, repeats = torch.randn(4, 3), torch.tensor([1, 0, 3, 2])
    equal_to_eager(lambda x, r: (torch.repeat_interleave(x, r, dim=0, output_size=6),
                                 torch.repeat_interleave(r, output_size=6)), x, repeats)


def test_vector_norm_special_values_match_eager():
    """inf and NaN: the inf norm takes a NaN, a sum of squares with an inf is inf; eager computes in fp32 too."""
    x = torch.tensor([[1.0, math.inf, -2.0], [0.0, -0.0, 3.0], [math.nan, 1.0, 0.0]])
    fn = lambda x: tuple(torch.linalg.vector_norm(x, p, dim=1) for p in ORDS)   # noqa: E731
    for g, r in zip(compiled(fn, x)(x), fn(x)):
        torch.testing.assert_close(g, r, equal_nan=True, rtol=1e-6, atol=0)


@pytest.mark.parametrize("shape", [(5, 5), (4, 7, 3), (2, 3, 130)])
def test_diagonals_match_eager_exactly(shape):
    torch.manual_seed(1604)
    x = torch.randn(*shape)
    fn = lambda x: (torch.diagonal(x), torch.diagonal(x, 1), torch.diagonal(x, -2, -1, 0),   # noqa: E731
                    torch.diagonal(x, 0, -1, -2), x[..., 1:, :5].diagonal(1, -1, -2))
    equal_to_eager(fn, x)


def test_diag_trace_and_diagonal_scatter_match_eager_exactly():
    torch.manual_seed(1605)
    x, v, s = torch.randn(6, 4), torch.randn(5), torch.randn(3, 5)
    equal_to_eager(lambda x, v, s: (torch.diag(x), torch.diag(x, -3), torch.diag(v, 1),
                                    torch.diagonal_scatter(x, v[:4]), torch.diagonal_scatter(x, v[:3], 1),
                                    torch.diagonal_scatter(torch.zeros(3, 4, 7), s[:, :3], -1, 1, 2)), x, v, s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_flips_match_eager_exactly(dtype):
    """Floats through a gather, int32 through a cat of one-wide slices; both move values unchanged (-0.0, inf)."""
    torch.manual_seed(1606)
    x = torch.randint(-100, 100, (3, 4, 130)).to(dtype)
    if dtype.is_floating_point:
        x[0, 0, :3] = torch.tensor([-0.0, math.inf, -math.inf])
        fn = lambda x: (torch.flip(x, (0, 2)), torch.fliplr(x), torch.flipud(x), torch.rot90(x, 1, (1, 2)),   # noqa: E731
                        torch.rot90(x, 2, (0, 1)), torch.rot90(x, -1, (2, 0)))
    else:
        fn = lambda x: (torch.flip(x, (0, 1)), torch.rot90(x, 1, (0, 1)), torch.flipud(x))   # noqa: E731
    equal_to_eager(fn, x)


def test_flip_of_a_wide_int_dim_names_the_op():
    x = torch.arange(200, dtype=torch.int32)
    with pytest.raises(UnsupportedOpError, match="aten.flip.default"):
        compiled(lambda x: torch.flip(x, (0,)) + 1, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_unfold_and_narrow_copy_match_eager_exactly(dtype):
    torch.manual_seed(1607)
    x = torch.randint(-100, 100, (3, 100, 5)).to(dtype)
    fn = lambda x: (x.unfold(1, 4, 3), x.unfold(1, 5, 5), x.unfold(2, 2, 1), x.unfold(-1, 5, 7),   # noqa: E731
                    x.unfold(0, 1, 2), torch.narrow_copy(x, 1, 7, 50), torch.narrow_copy(x, -1, -3, 2))
    equal_to_eager(fn, x)


def test_wide_float_unfold_is_a_gather_and_matches_eager():
    torch.manual_seed(1608)
    x = torch.randn(2, 300)
    equal_to_eager(lambda x: x.unfold(1, 70, 3), x)


def test_copysign_and_heaviside_match_eager_exactly():
    """Signed zeros and infinities of `other` (the sign read through 1 / other), NaN in heaviside's input (0)."""
    x = torch.tensor([1.5, -2.0, 0.0, -0.0, math.inf, -3.0, 7.0, math.nan])
    other = torch.tensor([-0.0, 0.0, -1.0, 2.0, -math.inf, math.inf, -1e-40, 5.0])
    values = torch.tensor([0.25, -1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    equal_to_eager(lambda x, o, v: (torch.copysign(x, o), torch.copysign(x, -2.0), torch.copysign(x, 0.0),
                                    torch.heaviside(x, v), torch.heaviside(o, v)), x, other, values)


def test_gather_and_the_losses_on_it_match_eager():
    """gather along any dim moves elements exactly; cross_entropy and nll_loss (class indices, ignore_index,
    label smoothing) and multi_margin_loss reach legalize as gathers and sums of at most 10 terms, within 1e-6."""
    torch.manual_seed(1611)
    x, logits, target = torch.randn(4, 5, 6), torch.randn(8, 10), torch.randint(0, 10, (8,))
    i0, i1, i2 = torch.randint(0, 4, (2, 5, 2)), torch.randint(0, 5, (4, 3, 6)), torch.randint(0, 6, (4, 5, 9))
    equal_to_eager(lambda x, i0, i1, i2: (torch.gather(x, 0, i0), torch.gather(x, 1, i1), torch.gather(x, -1, i2),
                                          torch.gather(x[0, 0], 0, i2[0, 0])), x, i0, i1, i2)
    fn = lambda x, t: (F.cross_entropy(x, t), F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=3),   # noqa: E731
                       F.nll_loss(F.log_softmax(x, 1), t, reduction="none"), F.multi_margin_loss(x, t))
    for g, r in zip(compiled(fn, logits, target)(logits, target), fn(logits, target)):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)


def test_copy_views_signbit_and_search_match_eager_exactly():
    """The _copy forms of views; signbit of signed zeros and infinities; bucketize and searchsorted (counts of
    boundaries, so ties, both sides, a NaN value, n-d rows and a sorter)."""
    torch.manual_seed(1612)
    x = torch.randn(4, 5, 6)
    x[0, 0, :4] = torch.tensor([0.0, -0.0, math.inf, -math.inf])
    b = torch.tensor([1.0, 2.0, 2.0, 3.0])
    v = torch.tensor([math.nan, 0.0, 2.0, 2.5, 5.0, math.inf, -math.inf, 1.0])
    rows, row_values = torch.sort(torch.randn(3, 5)).values, torch.randn(3, 4)
    fn = lambda x, b, v, rows, row_values: (   # noqa: E731
        torch.permute_copy(x, (2, 0, 1)), torch.view_copy(x, (20, 6)), *torch.unbind_copy(x, 1),
        torch.transpose_copy(x, 0, 2), torch.signbit(x), torch.bucketize(v, b), torch.bucketize(v, b, right=True),
        torch.bucketize(v, b, out_int32=True), torch.searchsorted(b, v, side="right"),
        torch.searchsorted(rows, row_values), torch.searchsorted(b[[3, 0, 2, 1]], v, sorter=torch.tensor([1, 3, 2, 0])))
    equal_to_eager(fn, x, b, v, rows, row_values)


def test_prod_and_pdist_match_float64():
    """prod as log2(n) pairwise products (n <= 90 factors of magnitude near 1: each of its log2(n) + 1 roundings
    is 2^-24, far within 2^-17), pdist as the norms of gathered row differences."""
    torch.manual_seed(1613)
    x = 1 + 0.1 * torch.randn(3, 5, 6)
    close_to_float64(lambda x: (torch.prod(x), torch.prod(x, 1), torch.prod(x, -1, keepdim=True),
                                F.pdist(x[0]), F.pdist(x[1], 1), F.pdist(x[2], math.inf)), x)


def test_fmax_and_fmin_skip_nan_operands():
    """A NaN operand gives the other one, two NaNs NaN; integers as max and min. (Of -0.0 and 0.0 the ALU's max
    gives 0.0 where torch's fmax gives its first operand, as for maximum: not compared here.)"""
    a = torch.tensor([math.nan, 1.0, math.nan, -2.0, 2.0, -math.inf])
    b = torch.tensor([1.0, math.nan, math.nan, 0.5, 3.0, 5.0])
    ints = torch.tensor([1, 5, -3], dtype=torch.int32)
    equal_to_eager(lambda a, b, i: (torch.fmax(a, b), torch.fmin(a, b), torch.fmax(a, b[:1]), torch.fmin(i, i.flip(0))),
                   a, b, ints)

