"""Conversions of runtime/convert.py, bit-exact against ml_dtypes, numpy and torch (NaN compared by class)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding
from trnc.runtime.convert import bits_equal_or_both_nan, from_fp32, sr_rand, to_fp32

SMALL = [DType.BF16, DType.FP16, DType.FP8_E4M3, DType.FP8_E5M2, DType.FP4_E2M1]
CODE = {1: np.uint8, 2: np.uint16}
TORCH = {DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
         DType.FP8_E4M3: torch.float8_e4m3fn, DType.FP8_E5M2: torch.float8_e5m2}
OVERFLOW_PROBES = [464.0, 465.0, 448.0, 449.0, 480.0, 57344.0, 61439.0, 61440.0, 65504.0, 65519.0, 65520.0,
                   6.0, 5.0, 5.0001, 7.0, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25, 2.0 ** -10, 3 * 2.0 ** -11,
                   3.3895314e38, 3.4028235e38, 2.0 ** -149, 2.0 ** -126, 2.0 ** -127]


def all_codes(d: DType) -> np.ndarray:
    n = 16 if d is DType.FP4_E2M1 else 1 << (8 * d.itemsize)
    return np.arange(n, dtype=CODE[d.itemsize])


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def boundary_values(d: DType) -> np.ndarray:
    """Every finite value of d, the midpoints between neighbours (the ties), one fp32 ulp either side of
    both, the overflow probes and the fp32 specials, with both signs."""
    vals = positive_grid(d)
    top = vals[-1] + (vals[-1] - vals[-2]) / 2  # the overflow threshold is a tie too
    mids = np.append((vals[1:] + vals[:-1]) / 2, top)
    pts = np.concatenate([vals, mids]).astype(np.float32)  # all exact in fp32
    near = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    specials = np.array(OVERFLOW_PROBES + [0.0, np.inf, np.nan], dtype=np.float32)
    fp32_sub = f32([1, 2, 3, 0x7FFFFF, 0x400000, 0x400001, 0x3FFFFF, 0x800000, 0x7F7FFFFF])
    out = np.concatenate([near, specials, fp32_sub])
    return np.concatenate([out, -out])


def random_fp32(n: int, seed: int = 0) -> np.ndarray:
    return f32(np.random.default_rng(seed).integers(0, 2 ** 32, size=n, dtype=np.uint64))


def oracle_ml(x: np.ndarray, d: DType) -> np.ndarray:
    """ml_dtypes / numpy casts with the spec's policy applied around them: e4m3 clamps first, fp4 NaN is +0."""
    if d is DType.FP8_E4M3:
        x = np.clip(x, -448, 448)
    with np.errstate(invalid="ignore", over="ignore"):
        out = x.astype(d.storage)
    if d is DType.FP4_E2M1:
        out = np.where(np.isnan(x), np.zeros(1, d.storage), out)
    return out


def assert_same(got: np.ndarray, want: np.ndarray, d: DType, x: np.ndarray) -> None:
    ok = bits_equal_or_both_nan(got, want, d)
    if not ok.all():
        i = np.flatnonzero(~ok.ravel())[:5]
        gx = got.ravel()[i].view(CODE[d.itemsize])
        wx = np.asarray(want).ravel()[i].view(CODE[d.itemsize])
        raise AssertionError(f"{d.text}: {(~ok).sum()} mismatches, e.g. x={x.ravel()[i]} got={gx} want={wx}")


@pytest.mark.parametrize("d", SMALL, ids=lambda d: d.text)
def test_every_pattern_widens_like_ml_dtypes_and_round_trips(d):
    codes = all_codes(d)
    got = to_fp32(codes.view(d.storage), d)
    want = codes.view(d.storage).astype(np.float32)
    assert got.dtype == np.float32
    assert_same(got, want, DType.FP32, codes)
    assert np.array_equal(to_fp32(codes.view(np.uint8), d).view(np.uint32), got.view(np.uint32)), "byte input"
    back = from_fp32(got, d).view(codes.dtype)
    finite_or_inf = ~np.isnan(got)
    assert np.array_equal(back[finite_or_inf], codes[finite_or_inf])
    assert bits_equal_or_both_nan(back, codes.view(d.storage), d).all()


@pytest.mark.parametrize("d", SMALL, ids=lambda d: d.text)
def test_from_fp32_matches_ml_dtypes(d):
    x = np.concatenate([random_fp32(2_000_000), boundary_values(d)])
    assert_same(from_fp32(x, d), oracle_ml(x, d), d, x)


@pytest.mark.parametrize("d", list(TORCH), ids=lambda d: d.text)
def test_from_fp32_matches_torch(d):
    x = np.concatenate([random_fp32(1_000_000, seed=1), boundary_values(d)])
    want = torch.from_numpy(x).to(TORCH[d]).view(torch.uint8 if d.itemsize == 1 else torch.int16).numpy()
    assert_same(from_fp32(x, d), want.view(d.storage), d, x)


def test_bf16_exhaustive_over_two_binades_and_the_subnormals():
    """All 2^23 patterns of [1, 2), of the top binade (overflow to Inf) and of the fp32 subnormals."""
    for start in (0x3F800000, 0x7F000000, 0x80000000):
        x = f32(np.arange(start, start + (1 << 23), dtype=np.uint64))
        assert_same(from_fp32(x, DType.BF16), x.astype(ml_dtypes.bfloat16), DType.BF16, x)


@pytest.mark.parametrize("d", SMALL + [DType.INT8, DType.INT32], ids=lambda d: d.text)
def test_any_shape_converts_elementwise(d):
    x = np.linspace(-300, 300, 48).astype(np.float32).reshape(6, 8)[:, ::2]
    flat = from_fp32(x.ravel(), d)
    assert from_fp32(x, d).shape == (6, 4) and from_fp32(x[2, 3], d).shape == ()
    assert np.array_equal(from_fp32(x, d).ravel(), flat) and from_fp32(x[2, 3], d) == flat[11]
    assert np.array_equal(to_fp32(flat.reshape(6, 4)[:, ::2], d), to_fp32(flat, d).reshape(6, 4)[:, ::2])


def test_named_overflow_and_tie_vectors():
    """precision.md 7.2 test vectors, written out by value."""
    cases = {
        DType.FP8_E4M3: [(464, 448), (465, 448), (np.inf, 448), (-np.inf, -448), (2.0 ** -10, 0),
                         (3 * 2.0 ** -11, 2.0 ** -9)],
        DType.FP8_E5M2: [(61439, 57344), (61440, np.inf), (-61440, -np.inf)],
        DType.FP16: [(65519, 65504), (65520, np.inf)],
        DType.FP4_E2M1: [(0.25, 0), (0.75, 1), (1.25, 1), (1.75, 2), (2.5, 2), (3.5, 4), (5, 4), (5.0001, 6), (7, 6),
                         (np.inf, 6), (-np.inf, -6)],
        DType.BF16: [(f32(0x7F7F8000)[()], np.inf), (f32(0x7F7F7FFF)[()], f32(0x7F7F0000)[()])],
    }
    for d, pairs in cases.items():
        x = np.array([p[0] for p in pairs], dtype=np.float32)
        got = to_fp32(from_fp32(x, d), d)
        assert np.array_equal(got, np.array([p[1] for p in pairs], dtype=np.float32)), d


def test_nan_codes_keep_sign_and_fp4_nan_is_plus_zero():
    x = f32([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF])
    expect = {DType.BF16: [0x7FC0, 0xFFC0], DType.FP16: [0x7E00, 0xFE00], DType.FP8_E4M3: [0x7F, 0xFF],
              DType.FP8_E5M2: [0x7F, 0xFF], DType.FP4_E2M1: [0x0, 0x0]}
    for d, (pos, neg) in expect.items():
        got = from_fp32(x, d).view(CODE[d.itemsize])
        assert got.tolist() == [pos, neg, pos, neg], d


@pytest.mark.parametrize("d", [DType.INT8, DType.UINT8, DType.INT32], ids=lambda d: d.text)
def test_int_writes_round_half_even_saturate_and_zero_nan(d):
    lo, hi = {DType.INT8: (-128, 127), DType.UINT8: (0, 255), DType.INT32: (-2 ** 31, 2 ** 31 - 1)}[d]
    halves = np.arange(-300, 300, dtype=np.float64) + 0.5
    x = np.concatenate([halves, [0.0, -0.0, 1e-45, -0.49999997, 0.49999997, 127.5, 128.5, -128.5, -129.5, 255.5, 256.5,
                                 2.0 ** 31, -2.0 ** 31, 2147483520.0, -2147483904.0, 3e38, -3e38, np.inf, -np.inf,
                                 np.nan]]).astype(np.float32)
    x = np.concatenate([x, np.random.default_rng(2).normal(0, 2.0 ** 20, 10_000).astype(np.float32)])
    with np.errstate(invalid="ignore"):
        want = np.clip(np.nan_to_num(np.rint(x.astype(np.float64)), nan=0.0), lo, hi).astype(np.int64)
    got = from_fp32(x, d)
    assert got.dtype == d.storage
    assert np.array_equal(got.astype(np.int64), want)


def test_int_reads_round_to_nearest_even():
    big = np.array([2 ** 24 + 1, 2 ** 24 + 3, 2 ** 31 - 1, -2 ** 31, -(2 ** 24) - 1, 33554435, 7], dtype=np.int32)
    got = to_fp32(big, DType.INT32)
    assert np.array_equal(got, big.astype(np.float64).astype(np.float32))  # exact in float64, one rounding
    assert got[0] == 2 ** 24 and got[1] == 2 ** 24 + 4 and got[5] == 33554436
    assert np.array_equal(to_fp32(np.arange(256, dtype=np.uint8), DType.UINT8), np.arange(256, dtype=np.float32))
    i8 = np.arange(-128, 128).astype(np.int8)
    assert np.array_equal(to_fp32(i8.view(np.uint8), DType.INT8), np.arange(-128, 128, dtype=np.float32))


def test_e8m0_reads():
    codes = np.arange(256, dtype=np.uint8)
    got = to_fp32(codes, DType.E8M0)
    assert got.view(np.uint32)[0] == 0x00400000
    assert np.isnan(got[255])
    assert all(got[c] == math.ldexp(1.0, c - 127) for c in range(255))


def test_misuse_raises():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="e8m0"):
        from_fp32(x, DType.E8M0)
    with pytest.raises(ValueError, match="int8"):
        from_fp32(x, DType.INT8, rounding=Rounding.SR, rand=np.zeros(4, np.uint32))
    with pytest.raises(ValueError, match="rand"):
        from_fp32(x, DType.BF16, rounding=Rounding.SR)


def test_bits_equal_or_both_nan_compares_nan_by_class():
    a = np.array([0x7F, 0xFF, 0x7E, 0x00], np.uint8).view(ml_dtypes.float8_e4m3fn)
    b = np.array([0xFF, 0x7F, 0x7E, 0x80], np.uint8).view(ml_dtypes.float8_e4m3fn)
    assert bits_equal_or_both_nan(a, b, DType.FP8_E4M3).tolist() == [True, True, True, False]
    c = np.array([0x7C, 0x7D, 0x7F], np.uint8).view(ml_dtypes.float8_e5m2)
    d = np.array([0x7D, 0x7E, 0xFE], np.uint8).view(ml_dtypes.float8_e5m2)
    assert bits_equal_or_both_nan(c, d, DType.FP8_E5M2).tolist() == [False, True, True]


# ---- stochastic rounding --------------------------------------------------------------------------------------

def spec_rand(seed: int, p: int, e: int) -> int:
    """The spec's R(S, p, e), written with Python integers."""
    h = (seed * 0x9E3779B1 + p * 0x85EBCA77 + e * 0xC2B2AE3D) % 2 ** 32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) % 2 ** 32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) % 2 ** 32
    return h ^ (h >> 16)


def test_sr_rand_is_the_spec_hash():
    got = sr_rand(12345, 7, 33)
    assert got.dtype == np.uint32 and got.shape == (7, 33)
    for p in range(7):
        for e in range(33):
            assert int(got[p, e]) == spec_rand(12345, p, e)
    assert int(sr_rand(2 ** 32 - 1, 128, 600)[127, 599]) == spec_rand(2 ** 32 - 1, 127, 599)


def positive_grid(d: DType) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        vals = np.abs(all_codes(d).view(d.storage).astype(np.float64))
    return np.unique(vals[np.isfinite(vals)])


def neighbours(x: np.ndarray, d: DType) -> tuple[np.ndarray, np.ndarray]:
    """The representable magnitudes just at/below and at/above |x| (|x| within range)."""
    grid = positive_grid(d)
    a = np.abs(x.astype(np.float64))
    below = grid[np.searchsorted(grid, a, side="right") - 1]
    above = grid[np.minimum(np.searchsorted(grid, a, side="left"), grid.size - 1)]
    return below, above


def sr_sample(d: DType, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = positive_grid(d)[-1]
    mag = np.exp2(rng.uniform(np.log2(top) - 40, np.log2(top), n))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)


@pytest.mark.parametrize("d", SMALL, ids=lambda d: d.text)
def test_sr_gives_a_neighbour_and_extreme_r_truncate_or_round_away(d):
    x = sr_sample(d, 50_000, 3)
    below, above = neighbours(x, d)

    def sr(r):
        return np.abs(to_fp32(from_fp32(x, d, rounding=Rounding.SR, rand=r), d).astype(np.float64))

    got = sr(sr_rand(7, 1, x.size)[0])
    assert np.all((got == below) | (got == above))
    assert np.array_equal(sr(np.zeros(x.size, np.uint32)), below)
    # R = 2^32 - 1 rounds away from zero unless the part below the ulp is under 2^-32 ulp (r = 0 then)
    frac = (np.abs(x.astype(np.float64)) - below) / np.where(above > below, above - below, 1.0)
    assert np.array_equal(sr(np.full(x.size, 2 ** 32 - 1, np.uint32)), np.where(frac >= 2.0 ** -32, above, below))
    assert np.array_equal(np.signbit(to_fp32(from_fp32(x, d, rounding=Rounding.SR, rand=np.uint32(5)), d)),
                          np.signbit(x))


@pytest.mark.parametrize("d", SMALL, ids=lambda d: d.text)
def test_sr_matches_the_spec_formula_written_with_integers(d):
    """M, E, q, sh, t, r from the spec text, in Python integers, for values across the range (subnormals too)."""
    m = {DType.BF16: 7, DType.FP16: 10, DType.FP8_E4M3: 3, DType.FP8_E5M2: 2, DType.FP4_E2M1: 1}[d]
    emin = {DType.BF16: -126, DType.FP16: -14, DType.FP8_E4M3: -6, DType.FP8_E5M2: -14, DType.FP4_E2M1: 0}[d]
    x = np.concatenate([sr_sample(d, 1500, 4), f32([1, 0x12345, 0x7FFFFF, 0x800001])])
    rand = sr_rand(99, 1, x.size)[0]
    got = to_fp32(from_fp32(x, d, rounding=Rounding.SR, rand=rand), d)
    for xi, ri, gi in zip(x.tolist(), rand.tolist(), got.tolist()):
        bits = int(np.float32(xi).view(np.uint32)) & 0x7FFFFFFF
        ef, frac = bits >> 23, bits & 0x7FFFFF
        big_m, e = (frac | 1 << 23, ef - 150) if ef else (frac, -149)
        q = max(big_m.bit_length() - 1 + e, emin) - m
        sh = q - e
        t = min(sh, 32)
        r = (big_m % 2 ** sh) >> (sh - t)
        n = (big_m >> sh) + ((r + ri % 2 ** t) >> t)
        assert abs(gi) == math.ldexp(n, q) and math.copysign(1, gi) == math.copysign(1, xi), (d, xi, ri)


@pytest.mark.parametrize("d", SMALL, ids=lambda d: d.text)
def test_sr_keeps_representable_values_and_is_deterministic(d):
    vals = to_fp32(all_codes(d).view(d.storage), d)
    vals = vals[~np.isnan(vals)]
    r = sr_rand(1, 1, vals.size)[0]
    out = from_fp32(vals, d, rounding=Rounding.SR, rand=r)
    assert np.array_equal(to_fp32(out, d), vals)
    x = sr_sample(d, 10_000, 5)
    a = from_fp32(x, d, rounding=Rounding.SR, rand=sr_rand(42, 1, x.size)[0])
    b = from_fp32(x, d, rounding=Rounding.SR, rand=sr_rand(42, 1, x.size)[0])
    c = from_fp32(x, d, rounding=Rounding.SR, rand=sr_rand(43, 1, x.size)[0])
    assert np.array_equal(a.view(CODE[d.itemsize]), b.view(CODE[d.itemsize]))
    assert not np.array_equal(a.view(CODE[d.itemsize]), c.view(CODE[d.itemsize]))


@pytest.mark.parametrize("d", SMALL, ids=lambda d: d.text)
def test_sr_is_unbiased(d):
    """N = 128 x 512 draws of R (one seed, all (p, e)) per value: the mean lies within 6 sigma of x, with
    sigma = ulp sqrt(f (1 - f) / N) the standard error of a Bernoulli choice between the neighbours."""
    big_n = 128 * 512
    rand = sr_rand(2024, 128, 512).ravel()
    grid = positive_grid(d)
    lo = grid[len(grid) // 2]
    hi = grid[len(grid) // 2 + 1]
    for frac in (0.01, 0.25, 0.5, 0.7, 0.97):
        x = np.float32(lo + frac * (hi - lo))
        f = (float(x) - lo) / (hi - lo)
        got = to_fp32(from_fp32(np.full(big_n, x), d, rounding=Rounding.SR, rand=rand), d).astype(np.float64)
        sigma = (hi - lo) * math.sqrt(f * (1 - f) / big_n)
        assert abs(got.mean() - float(x)) <= 6 * sigma, (d, frac)


def test_sr_overflow_follows_the_dtype_rule():
    x = np.array([57000.0, 60000.0, 460.0, 5.9, 65510.0], np.float32)
    r = np.full(5, 2 ** 32 - 1, np.uint32)
    assert to_fp32(from_fp32(x[:2], DType.FP8_E5M2, rounding=Rounding.SR, rand=r[:2]), DType.FP8_E5M2)[1] == np.inf
    assert to_fp32(from_fp32(x[2:3], DType.FP8_E4M3, rounding=Rounding.SR, rand=r[:1]), DType.FP8_E4M3)[0] == 448
    assert to_fp32(from_fp32(x[3:4], DType.FP4_E2M1, rounding=Rounding.SR, rand=r[:1]), DType.FP4_E2M1)[0] == 6
    assert to_fp32(from_fp32(x[4:5], DType.FP16, rounding=Rounding.SR, rand=r[:1]), DType.FP16)[0] == np.inf
