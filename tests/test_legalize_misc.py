"""The odds and ends of passes/graph/legalize_misc.py compiled end to end (trnc.compile, the JIT) against eager
torch or float64, and the refusals that name the op.

Tolerances (fp32): batch norm's outputs within 2^-18 of the largest |output| (absolute; fp32 statistics over at
most 60 values, each output a few roundings of x - mean times a scale: a few ulp of the scale, and eager's
summation order differs); the running statistics exactly what they were (inference) or within 2^-20 relative of
eager (one multiply-add of a mean or variance computed with a different summation order). embedding_renorm's
rows within 2^-21 relative of eager (a norm of <= 8 terms, one division and one product: a few ulp). The chunked
linear cross entropy within 2^-18 of the largest loss, against float64 (16-term dot products, a log-sum-exp over
11 classes and a weighted sum of 9 rows: a few ulp of the largest term each).
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


def outputs_of(fn, *xs):
    got, ref = compiled(fn, *xs)(*xs), fn(*xs)
    return (got, ref) if isinstance(ref, (tuple, list)) else ((got,), (ref,))


# -- batch norm's functional forms -------------------------------------------------------------------------
def _bn_inputs(shape, seed):
    torch.manual_seed(seed)
    c = shape[1]
    return torch.randn(*shape) * 3 + 1, torch.randn(c), torch.rand(c) + 0.1, torch.randn(c), torch.randn(c)


@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 2, 3, 4), (3, 1), (1, 2, 7)])
def test_functional_batch_norm_inference_returns_running_stats_unchanged(shape):
    x, rm, rv, w, b = _bn_inputs(shape, 2101)
    def fn(x, rm, rv, w, b):
        return torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, False, 0.3, 1e-5)
    got, ref = outputs_of(fn, x, rm, rv, w, b)
    assert [g.shape for g in got] == [r.shape for r in ref] and ref[1].shape == (0,) and ref[2].shape == (0,)
    assert (got[0] - ref[0]).abs().max() <= 2.0 ** -18 * ref[0].abs().max()
    assert torch.equal(got[3], rm) and torch.equal(got[4], rv)


def test_functional_batch_norm_inference_of_an_empty_batch():
    x, rm, rv, w, b = _bn_inputs((0, 3, 4), 2112)

    def fn(x, rm, rv):
        return torch.ops.aten._native_batch_norm_legit_functional(x, None, None, rm, rv, False, 0.1, 1e-5)

    got, ref = outputs_of(fn, x, rm, rv)
    assert all(g.shape == r.shape for g, r in zip(got, ref)) and torch.equal(got[3], rm) and torch.equal(got[4], rv)


@pytest.mark.parametrize("shape, momentum", [((4, 3, 5), 0.3), ((2, 2, 3, 4), -1.0), ((3, 1), 0.0), ((5, 4), 1.5)])
def test_batch_norm_with_update_matches_eager(shape, momentum):
    x, rm, rv, w, b = _bn_inputs(shape, 2102)
    def fn(x, rm, rv, w, b):
        return torch.ops.aten._batch_norm_with_update_functional(x, w, b, rm, rv, momentum, 1e-5)
    got, ref = outputs_of(fn, x, rm, rv, w, b)
    assert [(g.shape, g.dtype) for g in got] == [(r.shape, r.dtype) for r in ref]
    assert ref[3].shape == (0,) and ref[3].dtype == torch.uint8
    assert (got[0] - ref[0]).abs().max() <= 2.0 ** -18 * ref[0].abs().max()
    for k in (1, 2, 4, 5):   # save_mean, save_invstd, the new running mean and variance
        assert ((got[k] - ref[k]).abs() <= 2.0 ** -20 * ref[k].abs() + 1e-7).all(), k



# -- embedding with max_norm -------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, math.inf])
def test_embedding_renorm_matches_eager(p):
    torch.manual_seed(2104)
    w = torch.randn(10, 8) * 1.5
    idx = torch.tensor([[1, 3, 3], [9, 0, 1]])
    w[0] = w[0] / w[0].norm(p) * 0.5   # row 0 is read but below max_norm: unchanged
    def fn(w, i):
        return torch.ops.aten.embedding_renorm(w, i, 1.5, p)
    (got,), (ref,) = outputs_of(fn, w, idx)
    assert ((got - ref).abs() <= 2.0 ** -21 * ref.abs()).all()
    unread = [2, 4, 5, 6, 7, 8]
    assert torch.equal(got[unread], w[unread]) and torch.equal(got[0], w[0])
    assert not torch.equal(got[3], w[3])   # read and scaled


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_embedding_renorm_of_low_precision_weights_is_bit_exact(dtype):
    """eager rounds the norm and the scale to the weight's dtype; so does the rule: bit for bit."""
    torch.manual_seed(2111)
    w, idx = (torch.randn(300, 16) * 0.5).to(dtype), torch.randint(0, 300, (200,))
    (got,), (ref,) = outputs_of(lambda w, i: torch.ops.aten.embedding_renorm(w, i, 1.0, 2.0), w, idx)
    assert torch.equal(got, ref)


def test_embedding_with_max_norm_through_torch_compile_mutates_the_weight():
    torch.manual_seed(2105)
    w = torch.randn(6, 4) * 2
    idx = torch.tensor([5, 2, 2])
    ref_w = w.clone()
    ref = torch.nn.functional.embedding(idx, ref_w, max_norm=1.0)
    fn = torch.compile(lambda i, w: torch.nn.functional.embedding(i, w, max_norm=1.0), backend="trnc")
    got = fn(idx, w)
    torch.testing.assert_close(got, ref, rtol=2.0 ** -21, atol=0)
    torch.testing.assert_close(w, ref_w, rtol=2.0 ** -21, atol=0)



# -- chunked linear cross entropy --------------------------------------------------------------------------
def _lce(reduction, **kw):
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=3, allow_retain_graph=True)
    return lambda x, lw, t, *p: F.linear_cross_entropy(x, lw, t, reduction=reduction, options=options,
                                                       **dict(zip(kw.get("names", ()), p)), **kw.get("extra", {}))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("names, extra", [((), {}), (("linear_bias", "weight"), {}),
                                          (("weight",), {"ignore_index": 2})])
def test_chunked_linear_cross_entropy_matches_float64(reduction, names, extra):
    """The chunked custom op against the reference path (linear, then cross_entropy) in float64; ignored rows
    (the default -100, or a class number) weigh 0."""
    torch.manual_seed(2106)
    x, lw, b, w = torch.randn(9, 16), torch.randn(11, 16), torch.randn(11), torch.rand(11) + 0.5
    t = torch.randint(0, 11, (9,))
    t[4] = extra.get("ignore_index", -100)
    params = [{"linear_bias": b, "weight": w}[k] for k in names]
    fn = _lce(reduction, names=names, extra=extra)
    got = compiled(fn, x, lw, t, *params)(x, lw, t, *params)
    exact = F.linear_cross_entropy(x.double(), lw.double(), t, reduction=reduction, **extra,
                                   **{k: p.double() for k, p in zip(names, params)})
    assert got.dtype == torch.float32 and got.shape == exact.shape
    assert ((got.double() - exact).abs() <= 2.0 ** -18 * exact.abs().max()).all()   # a sum of 16 products, exp, log


def test_chunked_linear_cross_entropy_of_ignored_rows_only_is_nan():
    torch.manual_seed(2107)
    x, lw, t = torch.randn(4, 5), torch.randn(6, 5), torch.full((4,), -100)
    fn = _lce("mean")
    assert compiled(fn, x, lw, t)(x, lw, t).isnan() and fn(x, lw, t).isnan()
    assert compiled(_lce("sum"), x, lw, t)(x, lw, t) == 0


# -- antialiased bilinear resize ---------------------------------------------------------------------------
AA_CASES = [((10, 20), (3, 3), False, None), ((10, 20), None, False, (1.7, 0.9)), ((10, 20), None, True, (0.8, 1.0)),
            ((7, 5), (16, 2), True, None), ((1, 9), (1, 4), False, None), ((33, 6), (5, 6), False, None)]


@pytest.mark.parametrize("size, out, align, scale", AA_CASES)
def test_antialiased_bilinear_resize_matches_eager(size, out, align, scale):
    """Each output is a convex combination of inputs (triangle filter weights >= 0, summing to 1): within 2^-21
    of the largest |input| of float64 (a few ulp: the weights' rounding to fp32 and the two fp32 passes; measured
    2^-23.6 where eager's own fp32 kernel is 2^-19.6 off, so eager is compared at 2^-18)."""
    torch.manual_seed(2108)
    x = torch.randn(2, 3, *size)

    def fn(x):
        return F.interpolate(x, size=out, scale_factor=scale, mode="bilinear", align_corners=align, antialias=True)

    (got,), (ref,) = outputs_of(fn, x)
    exact = fn(x.double())
    assert got.shape == ref.shape and (got - exact).abs().max() <= 2.0 ** -21 * x.abs().max()
    assert (got - ref).abs().max() <= 2.0 ** -18 * x.abs().max()


def test_antialiased_resize_to_one_column_with_height_resized_is_refused():
    x = torch.randn(1, 2, 6, 4)
    with pytest.raises(UnsupportedOpError, match="aten._upsample_bilinear2d_aa"):
        compiled(lambda x: F.interpolate(x, size=(3, 1), mode="bilinear", antialias=True), x)


# -- ldexp -------------------------------------------------------------------------------------------------
def _bitwise_equal(got, ref):
    assert got.dtype == ref.dtype and got.shape == ref.shape
    same = (got == ref) | (got.isnan() & ref.isnan())
    assert same.all(), f"got {got[~same][:4].tolist()} eager {ref[~same][:4].tolist()}"
    assert torch.equal(got.signbit() | got.isnan(), ref.signbit() | ref.isnan())


@pytest.mark.parametrize("x_dtype, other_dtype", [(torch.float32, torch.int64), (torch.float32, torch.int32),
                                                   (torch.float32, torch.float32), (torch.bfloat16, torch.int64),
                                                   (torch.float16, torch.int64)])
def test_ldexp_is_bit_exact_with_overflow_and_underflow(x_dtype, other_dtype):
    """Exponents from -330 to 329 (integer ones: eager's exact product rounded once, finite past 2^128 and
    subnormal below 2^-149; float ones: 2^e in fp32 first, inf and 0 there): bit for bit, with 0, inf, NaN,
    subnormal and huge x, and the 2^-150 tie."""
    torch.manual_seed(2109)
    x = torch.cat([torch.randn(1000) * 3, torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -3e38,
                                                         2.0 ** -126, 1.0, 1.5, 3.0])]).to(x_dtype)
    other = torch.cat([torch.randint(-330, 330, (1000,)),
                       torch.tensor([300, -300, -1, 200, -200, 1, 127, -150, -150, -150, -150])]).to(other_dtype)
    (got,), (ref,) = outputs_of(torch.ldexp, x, other)
    _bitwise_equal(got, ref)


def test_ldexp_of_fractional_exponents_and_mixed_dtypes():
    """A fractional exponent: 2^e within 2 ulp (the machine's pow), the product one more rounding: 2^-21
    relative. bf16 x with integer e promotes to fp32 (exact); integer x and e give fp32."""
    torch.manual_seed(2110)
    x, e = torch.randn(64), torch.rand(64) * 40 - 20
    (got,), (ref,) = outputs_of(torch.ldexp, x, e)
    assert ((got - ref).abs() <= 2.0 ** -21 * ref.abs()).all()
    xb, ei, xi = torch.randn(16).bfloat16(), torch.randint(-20, 20, (16,)), torch.randint(-99, 99, (16,))
    for args in ((xb, ei), (xi, ei)):
        (got,), (ref,) = outputs_of(torch.ldexp, *args)
        _bitwise_equal(got, ref)


# -- linspace and logspace with tensor bounds --------------------------------------------------------------
BOUNDS = [(-2.0, 4.3), (1000.0, -7.5), (0.1, 0.2)]


@pytest.mark.parametrize("steps", [2, 17, 1000])
def test_linspace_of_tensor_bounds_matches_eager(steps):
    """Eager's fp32 formula; its vectorized path rounds start + step * i0 + step * j instead of start + step * i,
    so values may differ from eager's by an ulp or so of max(|start|, |end|): 2^-22 of it. The ends are exact."""
    for s, e in BOUNDS:
        start, end = torch.tensor(s), torch.tensor(e)
        for fn, args in (((lambda a, b: torch.linspace(a, b, steps)), (start, end)),
                         ((lambda a: torch.linspace(a, 3, steps)), (start,)),
                         ((lambda b: torch.linspace(-1.5, b, steps)), (end,))):
            (got,), (ref,) = outputs_of(fn, *args)
            assert got.dtype == ref.dtype == torch.float32 and got.shape == (steps,)
            assert (got - ref).abs().max() <= 2.0 ** -22 * ref.abs().max()
            assert got[0] == ref[0] and got[-1] == ref[-1]


def test_linspace_of_integer_tensor_bounds_one_step_and_refused_float64():
    start, end = torch.tensor(-3), torch.tensor(50)
    (got,), (ref,) = outputs_of(lambda a, b: torch.linspace(a, b, 50), start, end)
    assert (got - ref).abs().max() <= 2.0 ** -22 * 50
    (got,), (ref,) = outputs_of(lambda a, b: torch.linspace(a, b, 1), torch.tensor(2.5), end)
    assert torch.equal(got, ref)
    with pytest.raises(UnsupportedOpError, match="aten.linspace.Tensor_Tensor"):
        compiled(lambda a, b: torch.linspace(a, b, 5, dtype=torch.float64), start, end)


@pytest.mark.parametrize("base", [10.0, 2.0, 1.1, 5.0])
def test_logspace_of_tensor_bounds_matches_float64(base):
    """base^x of the fp32 exponents x (the linspace above): within 3 ulp of float64's base^x (the machine's pow
    and the factor (base / fp32(base))^x; measured 2.2), and of eager within that plus |x ln base| times the
    exponents' ulp difference (2^-22 of the largest bound)."""
    for s, e in [(-2.0, 4.3), (-3.0, 30.0), (10.0, -7.5)]:
        start, end = torch.tensor(s), torch.tensor(e)
        (got,), (ref,) = outputs_of(lambda a, b: torch.logspace(a, b, 50, base), start, end)
        (x,), _ = outputs_of(lambda a, b: torch.linspace(a, b, 50), start, end)
        exact = torch.pow(torch.tensor(base, dtype=torch.float64), x.double())
        assert ((got.double() - exact).abs() <= 3 * 2.0 ** -24 * exact).all()
        slack = 3 * 2.0 ** -24 + math.log(base) * 2.0 ** -22 * max(abs(s), abs(e))
        assert ((got - ref).abs() <= slack * ref.abs()).all()


def test_logspace_with_a_nonpositive_base_is_refused():
    with pytest.raises(UnsupportedOpError, match="aten.logspace.Tensor_Tensor"):
        compiled(lambda a, b: torch.logspace(a, b, 5, -2.0), torch.tensor(1.0), torch.tensor(3.0))
