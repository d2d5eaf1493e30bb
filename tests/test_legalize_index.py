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
from trnc.errors import UnsupportedOpError

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


# -- cumsum -------------------------------------------------------------------------------------------------
def cumsum_bound(x: torch.Tensor, ref: torch.Tensor, dim: int, unit: float = U) -> torch.Tensor:
    """How far an fp32 cumsum may be from eager's. Eager's CPU kernel sums in float64 and rounds each output
    once (<= u |eager_i|); the machine sums the i + 1 terms of output i in fp32 (the matmul accumulates in fp32,
    adding exact zeros for the terms past i), so i roundings: <= gamma(i) sum_{k<=i} |x_k|, gamma(i) = i u /
    (1 - i u), in any order of summation (Higham, Accuracy and Stability of Numerical Algorithms, 4.2).
    `unit`: the output's unit roundoff (2^-8 for bf16 outputs)."""
    terms = torch.arange(1, x.shape[dim] + 1, dtype=torch.float64) - 1
    terms = terms.reshape([-1 if d == dim % x.dim() else 1 for d in range(x.dim())])
    gamma = terms * U / (1 - terms * U)
    magnitude = x.double().abs().cumsum(dim)
    return gamma * magnitude + unit * ref.double().abs()


def wide(*shape, seed: int) -> torch.Tensor:
    """Normal values scaled by 10^-3 .. 10^3 (so partial sums cancel and round) of both signs."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 10.0 ** torch.empty(*shape).uniform_(-3, 3, generator=g)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dim", (-1, 0))
def test_cumsum_within_its_accumulation_bound(size, dim):
    x = wide(size, 9, seed=size).movedim(0, dim).contiguous()
    ref = x.cumsum(dim)
    got = run(lambda t: t.cumsum(dim), x)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert bool(((got.double() - ref.double()).abs() <= cumsum_bound(x, ref, dim)).all())


def test_cumsum_of_a_middle_axis_and_of_bf16():
    x = wide(3, 200, 5, seed=11)
    ref = x.cumsum(1)
    assert bool(((run(lambda t: t.cumsum(-2), x).double() - ref.double()).abs() <= cumsum_bound(x, ref, 1)).all())
    b = x.to(torch.bfloat16)
    ref = b.cumsum(1)   # eager sums in fp32 and rounds to bf16; the two fp32 sums differ by their bounds
    got = run(lambda t: t.cumsum(1), b)
    assert got.dtype == torch.bfloat16
    assert bool(((got.double() - ref.double()).abs() <= 2 * cumsum_bound(b, ref, 1, 2.0 ** -8)).all())


def test_cumsum_keeps_eager_infinities_and_nans():
    """A product by the triangle's zeros would be NaN for an infinite x: the counts of +-inf decide instead."""
    x = wide(6, 140, seed=5)
    x[0, 3], x[1, 4], x[2, 5] = math.inf, -math.inf, math.nan
    x[3, 7], x[3, 90] = math.inf, -math.inf      # inf, then NaN from inf - inf on
    x[4, 0], x[4, 139] = -math.inf, -math.inf
    x[5, 10], x[5, 11] = math.inf, math.inf
    ref = x.cumsum(1)
    got = run(lambda t: t.cumsum(1), x)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.isinf(), ref.isinf())
    finite = ref.isfinite()
    assert torch.equal(got[~finite & ~ref.isnan()], ref[~finite & ~ref.isnan()])
    assert bool(((got - ref).double().abs()[finite] <= cumsum_bound(x.nan_to_num(0, 0, 0), ref, 1)[finite]).all())


@pytest.mark.parametrize("size", (129, 513))
def test_integer_cumsum_of_a_mask_is_exact(size):
    """RoBERTa's position ids: the cumsum of `input_ids.ne(pad).int()` (int64 in torch, int32 here), exact in
    fp32 as every partial sum of 0/1 values stays below 2^24; bool and int8 inputs alike."""
    g = torch.Generator().manual_seed(size)
    ids = torch.randint(0, 4, (3, size), generator=g)
    fns = (lambda t: torch.cumsum(t.ne(1).int(), dim=1), lambda t: (t > 1).cumsum(0),
           lambda t: t.to(torch.int8).cumsum(-1, dtype=torch.int32))
    for fn in fns:
        assert_same(run(fn, ids), fn(ids))


def test_integer_cumsum_without_a_bound_is_refused():
    """An int32 input may hold values whose partial sums pass 2^24: the machine's fp32 adds would round them."""
    ids = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    with pytest.raises(UnsupportedOpError, match=r"aten\.cumsum\.default of an integer tensor .*2\^24"):
        run(lambda t: t.cumsum(1), ids)


def test_cumsum_stays_fp32_under_auto_cast():
    """precision bf16 and fp8 narrow matmuls, but not the cumsum's: eager's cumsum of fp32 values is fp32."""
    x = wide(4, 300, seed=2) + 1000
    ref = x.cumsum(-1)
    for precision in ("bf16", "fp8"):
        got = run(lambda t: t.cumsum(-1), x, precision=precision)
        assert bool(((got.double() - ref.double()).abs() <= cumsum_bound(x, ref, 1)).all())


# -- cummax, cummin, cumprod -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_cummax_and_cummin_match_eager_exactly(size):
    """Ties go to the later index (torch compares with >= and <=), a NaN once seen is the value and the latest
    NaN its index, infinities and all-equal rows as eager."""
    x = tricky(8, size, seed=size + 1)
    fn = lambda t: (torch.cummax(t, -1), torch.cummin(t, 1), torch.cummax(t, 0))  # noqa: E731
    assert_same(run(fn, x), fn(x))


def test_cummax_of_integers_and_of_a_middle_axis():
    g = torch.Generator().manual_seed(4)
    i = torch.randint(-4, 4, (3, 130, 2), generator=g, dtype=torch.int32)
    fn = lambda t: (torch.cummin(t, 1), torch.cummax(t, -2))  # noqa: E731
    assert_same(run(fn, i), fn(i))


@pytest.mark.parametrize("size", (1, 128, 129, 513))
def test_cumprod_within_its_rounding_bound(size):
    """Output i is a product of i + 1 terms: i fp32 multiplications in a tree order, each off by at most u
    relative, so within gamma(i) of the exact product, which eager rounds once (u)."""
    g = torch.Generator().manual_seed(size)
    x = torch.empty(6, size).uniform_(0.8, 1.25, generator=g) * torch.where(torch.rand(6, size, generator=g) < 0.5,
                                                                             -1.0, 1.0)
    ref = x.cumprod(1)
    got = run(lambda t: t.cumprod(-1), x)
    i = torch.arange(size, dtype=torch.float64)
    gamma = i * U / (1 - i * U)
    assert bool(((got.double() - ref.double()).abs() <= (gamma * (1 + U) + U) * ref.double().abs()).all())


def test_cumprod_keeps_eager_zeros_infinities_and_nans():
    x = torch.tensor([[2.0, 0.0, math.inf, 3.0], [math.inf, -2.0, 0.5, 0.0], [1.0, math.nan, 2.0, 0.0],
                      [-0.0, 4.0, -1.0, 2.0]])
    assert_same(run(lambda t: t.cumprod(1), x), x.cumprod(1))


# Per combine of logcumsumexp, max(a, b) + log(1 + exp(min - max)) in fp32: the final add rounds (u |r|), and
# log(1 + t) is off by u from rounding 1 + t plus log's and exp's own few ulp of values at most log 2 and 1 (with
# min - max's rounding, under 8 u in all); the combine is 1-Lipschitz, so errors add along an output's chain of
# ceil(log2 n) combines. The partials lie within [max x, max x + log n] of their terms.
LOGCUMSUMEXP_ABS_ULPS = 8


@pytest.mark.parametrize("size", (1, 128, 129, 513))
def test_logcumsumexp_within_its_bound(size):
    x = wide(4, size, seed=size + 5).clamp(-80, 80)
    x[0, :size // 2] = -math.inf
    if size > 3:
        x[1, 3], x[2, 2] = math.inf, math.nan
    ref = torch.logcumsumexp(x, 1)
    got = run(lambda t: torch.logcumsumexp(t, -1), x)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got[ref.isinf()], ref[ref.isinf()])
    finite = ref.isfinite()
    depth = max(1, math.ceil(math.log2(size)))
    magnitude = x[x.isfinite()].abs().max() + math.log(size)
    bound = depth * U * (magnitude + LOGCUMSUMEXP_ABS_ULPS)
    assert float((got - ref)[finite].abs().max()) <= bound


def roberta_position_ids(input_ids, padding_idx: int = 1, past_key_values_length: int = 0):
    """transformers' create_position_ids_from_input_ids (RoBERTa, XLM-R, ...), as Hugging Face writes it."""
    mask = input_ids.ne(padding_idx).int()
    incremental_indices = (torch.cumsum(mask, dim=1).type_as(mask) + past_key_values_length) * mask
    return incremental_indices.long() + padding_idx


def test_roberta_position_ids_are_exact_on_the_device():
    """The integer cumsum, add and multiply carry bounds (cumsum of 0/1 over n: n; + 0; * a 0/1 mask; + 1) that
    keep them within 2^24, so fp32 computes them exactly and no op falls back."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 50, (2, 513), generator=g)
    ids[1, 300:] = 1
    assert_same(run(roberta_position_ids, ids), roberta_position_ids(ids))
    fn = lambda t: roberta_position_ids(t, 1, 7)  # noqa: E731
    assert_same(run(fn, ids), fn(ids))


def test_integer_arithmetic_without_a_bound_is_still_refused():
    ids = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    with pytest.raises(UnsupportedOpError, match="integer scalar 'add'"):
        run(lambda t: t + 1, ids)


def test_indices_stay_exact_when_auto_cast_narrows_every_value():
    """auto_cast="all" stores fp32 intermediates in bf16, whose integers are exact only up to 256: the index chains
    (iota, selects, the scan's slices, folded constants among them) keep fp32."""
    x = torch.zeros(3, 513)
    x[0, 511], x[1, 257], x[2, 300] = 1.0, 1.0, 1.0
    fn = lambda t: ((t * 2).argmax(-1), torch.cummax(t * 2, 1), torch.max(t * 2, 1))  # noqa: E731
    assert_same(run(fn, x, precision="bf16", auto_cast="all"), fn(x))
    mask = torch.ones(2, 600, dtype=torch.int64)
    assert_same(run(roberta_position_ids, mask, precision="bf16", auto_cast="all"), roberta_position_ids(mask))


def test_a_long_cumsum_adds_in_log_steps_within_the_same_bound():
    """Past legalize_index.TRIANGLE_MAX terms the log steps cost less than the matmul: the sum goes in log2(n)
    steps, a tree of fp32 adds (gamma(i) holds for any order), infinities and NaNs as eager's, integer masks exact."""
    size = 2049
    x = wide(2, size, seed=3)
    x[1, 100], x[1, 2000] = math.inf, -math.inf
    ref = x.cumsum(1)
    got = run(lambda t: t.cumsum(-1), x)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got[ref.isinf()], ref[ref.isinf()])
    assert bool(((got.double() - ref.double()).abs() <= cumsum_bound(x, ref, 1))[0].all())
    ids = torch.randint(0, 3, (2, size), generator=torch.Generator().manual_seed(3))
    assert_same(run(roberta_position_ids, ids), roberta_position_ids(ids))


def test_arg_reductions_of_fp32_values_under_auto_cast_all_find_an_element():
    """auto_cast="all" narrowed the max to bf16, which then equalled no fp32 element, and argmax gave the axis
    size (fuzz seed 92000180: argmax of [0.6236, -1.344] was 2). The max stays as x holds it: values that differ
    in fp32 but round to one bf16 value are told apart, as eager tells them."""
    x = torch.tensor([[1.0, 1.001, -2.0, 0.6236], [-1.344, -1.3441, 3.0, 3.001]])
    for fn in (lambda t: torch.argmax(t, dim=1), lambda t: torch.argmin(t, 1), lambda t: torch.max(t, 1),
               lambda t: torch.argmax(t[0, :2])):
        assert_same(run(fn, x, precision="bf16", auto_cast="all"), fn(x))


@pytest.mark.parametrize("size", [2, 700])   # the triangle matmul, and the log-step scan past TRIANGLE_MAX
def test_scans_keep_their_intermediates_fp32_under_auto_cast_all(size):
    """One torch op rounds once: under auto_cast="all" only a scan's result is bf16. Its selects and partial sums
    were narrowed, rounding the inputs first: the bf16 cumsum of two fp32 inputs was off by both roundings (fuzz
    seed 93000010). Here every prefix cancels to 1e-3 * k, which rounding 1.001 to bf16 (1.0) would wipe out."""
    x = torch.tensor([1.001, -1.0]).repeat(size // 2)
    checks = {"cumsum": (lambda t: torch.cumsum(t, 0), U * size),
              "cumprod": (lambda t: torch.cumprod(t, 0), U * size),
              "logcumsumexp": (lambda t: torch.logcumsumexp(t, 0), U * 4 * math.log2(size) + U),
              "cummax": (lambda t: torch.cummax(t, 0).values, 0.0)}
    for name, (fn, fp32_error) in checks.items():
        got, ref = run(fn, x, precision="bf16", auto_cast="all"), fn(x.double()).float()
        bound = (2.0 ** -8 + fp32_error) * ref.abs() + (fp32_error * x.abs().sum() if name == "cumsum" else 0)
        assert ((got - ref).abs() <= bound).all(), name


def test_an_integer_cumsum_past_256_stays_exact_under_auto_cast_all():
    """The cast of an int cumsum's operand to fp32 was narrowed to bf16 (exact_index stopped at the prefix-sum
    matmul, marked already): the cumsum of the argsort indices of 600 elements was off by 24."""
    x = torch.randn(2, 600, generator=torch.Generator().manual_seed(1706))
    fn = lambda t: torch.cumsum(t.argsort(dim=1), dim=1)  # noqa: E731
    assert_same(run(fn, x, precision="bf16", auto_cast="all"), fn(x))
