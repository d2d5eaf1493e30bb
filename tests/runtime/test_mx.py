"""MX quantization of runtime/mx.py: the precision.md 7.3 golden cases and a float64 re-derivation per block."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from trnc.isa.dtypes import DType
from trnc.isa.enums import ScaleMode
from trnc.runtime.convert import bits_equal_or_both_nan, to_fp32
from trnc.runtime.mx import e8m0_decode, e8m0_round_up, quantize_mx, scale_pow2_f64

ELEMS = [DType.FP8_E4M3, DType.FP8_E5M2, DType.FP4_E2M1]
MAXE = {DType.FP8_E4M3: 448.0, DType.FP8_E5M2: 57344.0, DType.FP4_E2M1: 6.0}
EMAX = {DType.FP8_E4M3: 8, DType.FP8_E5M2: 15, DType.FP4_E2M1: 2}  # OCP MX v1.0: largest power of two


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def block(value, others=None) -> np.ndarray:
    """One 32-row block (one column) of `value`, with row 1.. replaced by `others`."""
    x = np.full((32, 1), value, dtype=np.float32)
    if others is not None:
        x[1:1 + len(others), 0] = others
    return x


def q1(x, elem, mode):
    codes, scales = quantize_mx(x, elem, mode)
    return int(scales[0, 0]), codes.view(np.uint8)[:, 0]


@pytest.mark.parametrize("value,mode,scale,data", [
    (480.0, ScaleMode.FLOOR, 0x7F, 0x7E),            # 480 / 2 = 240 -> 1.875 * 2^7 clamps to 448
    (480.0, ScaleMode.RCEIL, 0x80, 0x77),            # 480 / 4 = 120 = 0x77
    (float(np.finfo(np.float32).max), ScaleMode.FLOOR, 0xF6, 0x7E),
    (float(np.finfo(np.float32).max), ScaleMode.RCEIL, 0xF7, 0x78),
    (float(f32(0x43FFFFFF)), ScaleMode.FLOOR, 0x7F, 0x7E),
    (0.0, ScaleMode.FLOOR, 0x00, 0x00),
    (0.0, ScaleMode.RCEIL, 0x00, 0x00),
])
def test_torchao_golden_cases_e4m3(value, mode, scale, data):
    s, codes = q1(block(value), DType.FP8_E4M3, mode)
    assert s == scale
    assert np.all(codes == data)


@pytest.mark.parametrize("mode", [ScaleMode.FLOOR, ScaleMode.RCEIL])
def test_one_block_with_an_fp32_subnormal(mode):
    """1.0 everywhere but one subnormal: scale 2^-8 (0x77), 1.0 -> 256 = 0x78, the subnormal -> +-0."""
    for sub in (f32(0x00000001), f32(0x807FFFFF)):
        s, codes = q1(block(1.0, sub.reshape(1)), DType.FP8_E4M3, mode)
        assert s == 0x77
        assert codes[0] == 0x78 and codes[1] == (0x80 if np.signbit(sub) else 0x00)


@pytest.mark.parametrize("elem", ELEMS, ids=lambda d: d.text)
@pytest.mark.parametrize("mode", list(ScaleMode), ids=lambda m: m.text)
def test_non_finite_blocks_get_scale_ff(elem, mode):
    for bad in (np.inf, -np.inf, np.nan):
        x = np.concatenate([block(1.0, [bad]), block(2.0)], axis=1)
        codes, scales = quantize_mx(x, elem, mode)
        assert scales[0].tolist() == [0xFF, int(scales[0, 1])] and scales[0, 1] != 0xFF
        got = to_fp32(codes[1, :1], elem)[0]
        if np.isnan(bad):
            assert (np.isnan(got) if elem is not DType.FP4_E2M1 else codes.view(np.uint8)[1, 0] == 0)
        else:
            assert got == math.copysign(MAXE[elem], bad)


@pytest.mark.parametrize("elem", [DType.FP8_E4M3, DType.FP8_E5M2], ids=lambda d: d.text)
def test_trn_alt_doubles_the_scale_for_fp8_and_equals_floor_for_fp4(elem):
    x = random_blocks(np.random.default_rng(1), 64, 8)
    _, s_floor = quantize_mx(x, elem, ScaleMode.FLOOR)
    _, s_alt = quantize_mx(x, elem, ScaleMode.TRN_ALT)
    inner = (s_floor > 0) & (s_floor < 254)
    assert inner.sum() > 100
    assert np.array_equal(s_alt[inner].astype(int), s_floor[inner].astype(int) + 1)
    _, s4f = quantize_mx(x, DType.FP4_E2M1, ScaleMode.FLOOR)
    _, s4a = quantize_mx(x, DType.FP4_E2M1, ScaleMode.TRN_ALT)
    assert np.array_equal(s4f, s4a)


@pytest.mark.parametrize("elem", ELEMS, ids=lambda d: d.text)
def test_rceil_never_saturates(elem):
    x = random_blocks(np.random.default_rng(2), 64, 16)
    _, s = quantize_mx(x, elem, ScaleMode.RCEIL)
    scaled = np.abs(x.astype(np.float64)) * np.repeat(np.exp2(127.0 - s.astype(np.float64)), 32, axis=0)
    finite = np.repeat(s != 0xFF, 32, axis=0)
    assert np.all(scaled[finite] <= MAXE[elem])
    _, s_floor = quantize_mx(x, elem, ScaleMode.FLOOR)
    scaled_floor = np.abs(x.astype(np.float64)) * np.repeat(np.exp2(127.0 - s_floor.astype(np.float64)), 32, axis=0)
    assert np.any(scaled_floor[finite] > MAXE[elem]), "the data must exercise saturation under FLOOR"


# ---- randomized check against a float64 re-derivation ----------------------------------------------------------

def random_blocks(rng: np.random.Generator, nblocks: int, cols: int) -> np.ndarray:
    """Blocks of several kinds, each a whole 32-row block: scaled randn, bf16-valued (ties), amax at or just
    below powers of two and at the element mantissa limits, fp32 subnormals, zeros, huge, random bits, Inf/NaN."""
    shape = (32, cols)
    kinds = []
    for b in range(nblocks):
        k = b % 9
        if k == 0:
            v = rng.standard_normal(shape) * np.exp2(rng.uniform(-60, 60, (1, cols)))
        elif k == 1:
            v = rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64) * 4.0
        elif k == 2:
            v = rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(-20, 20)
            v[0] = rng.choice([1 - 2.0 ** -24, 1.0, 1.75, 1.75 + 2.0 ** -22, 1.5, 1.5 + 2.0 ** -23, 1.875], cols)
            v[0] *= 2.0 ** rng.integers(-20, 20)
        elif k == 3:
            v = f32(rng.integers(0, 0x800000, shape)).astype(np.float64) * rng.choice([-1, 1], shape)
        elif k == 4:
            v = np.zeros(shape) * rng.choice([-1, 1], shape)
        elif k == 5:
            v = rng.uniform(-1, 1, shape) * 3.4e38
        elif k == 6:
            with np.errstate(invalid="ignore"):  # widening a signalling NaN raises the invalid flag
                v = f32(rng.integers(0, 2 ** 32, shape, dtype=np.uint64)).astype(np.float64)
        elif k == 7:
            v = rng.standard_normal(shape)
            v[rng.integers(0, 32), :] = rng.choice([np.inf, -np.inf, np.nan], cols)
        else:
            v = rng.standard_normal(shape) * 2.0 ** -130  # fp32 subnormal and tiny normal mix
        kinds.append(v)
    with np.errstate(over="ignore"):
        return np.concatenate(kinds, axis=0).astype(np.float32)


def ref_scale(amax: float, elem: DType, mode: ScaleMode) -> int:
    """The scale from math.frexp in float64 (amax is an fp32 value)."""
    if not math.isfinite(amax):
        return 0xFF
    if mode is ScaleMode.RCEIL:
        d = float(np.float32(amax * float(np.float32(1.0) / np.float32(MAXE[elem]))))  # one fp32 rounding
        if d == 0:
            return 0
        m, e = math.frexp(d)
        s = e - 1 + 127 if m == 0.5 else e + 127  # smallest power of two >= d
        return 0xFF if s > 254 else max(s, 0)
    if amax == 0:
        return 0
    emax = EMAX[elem] - (1 if mode is ScaleMode.TRN_ALT and elem.is_fp8 else 0)
    return min(max(math.frexp(amax)[1] - 1 + 127 - emax, 0), 254)


def ref_quantize(x: np.ndarray, elem: DType, mode: ScaleMode):
    scales = np.zeros((x.shape[0] // 32, x.shape[1]), np.uint8)
    codes = np.zeros(x.shape, elem.storage)
    for b in range(scales.shape[0]):
        for c in range(x.shape[1]):
            col = x[32 * b:32 * b + 32, c].astype(np.float64)
            a = np.abs(col)
            amax = math.nan if np.isnan(a).any() else float(a.max())
            s = ref_scale(amax, elem, mode)
            scales[b, c] = s
            y = (col * 2.0 ** (127 - s)).astype(np.float32)  # exact in float64, one rounding to fp32
            y = np.clip(y, -MAXE[elem], MAXE[elem])
            with np.errstate(invalid="ignore"):
                q = y.astype(elem.storage)
            if elem is DType.FP4_E2M1:
                q[np.isnan(y)] = np.zeros(1, elem.storage)  # the spec: NaN -> +0; the scale carries it
            codes[32 * b:32 * b + 32, c] = q
    return codes, scales


@pytest.mark.parametrize("elem", ELEMS, ids=lambda d: d.text)
@pytest.mark.parametrize("mode", list(ScaleMode), ids=lambda m: m.text)
def test_quantize_mx_matches_a_float64_rederivation(elem, mode):
    x = random_blocks(np.random.default_rng(10 * elem.code + mode.value), 54, 12)
    codes, scales = quantize_mx(x, elem, mode)
    want_codes, want_scales = ref_quantize(x, elem, mode)
    assert scales.dtype == np.uint8 and scales.shape == (x.shape[0] // 32, x.shape[1])
    assert codes.dtype == elem.storage and codes.shape == x.shape
    assert np.array_equal(scales, want_scales)
    assert bits_equal_or_both_nan(codes, want_codes, elem).all()


def test_e8m0_round_up_against_frexp():
    rng = np.random.default_rng(3)
    u = np.concatenate([rng.integers(0, 0x7F800000, 30_000), np.arange(0, 64), 0x00400000 + np.arange(-3, 4),
                        [0x7F000000, 0x7F000001, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x00800000, 0x00800001]])
    d = f32(u)
    got = e8m0_round_up(d)
    assert got.dtype == np.uint8
    want = []
    for v in d.astype(np.float64).tolist():
        if not math.isfinite(v):
            want.append(0xFF)
            continue
        s = 0
        while s < 255 and math.ldexp(1.0, s - 127) < v:
            s += 1
        want.append(s)
    assert got.tolist() == want


def test_e8m0_decode_and_scale_product():
    codes = np.arange(256, dtype=np.uint8)
    dec = e8m0_decode(codes)
    assert dec.dtype == np.float32 and np.isnan(dec[255]) and dec.view(np.uint32)[0] == 0x00400000
    assert [float(v) for v in dec[:255]] == [math.ldexp(1.0, c - 127) for c in range(255)]
    sa, sb = np.meshgrid(codes, codes)
    prod = scale_pow2_f64(sa, sb)
    assert prod.dtype == np.float64
    nan = (sa == 255) | (sb == 255)
    assert np.isnan(prod[nan]).all()
    want = np.array([math.ldexp(1.0, int(a) + int(b) - 254) for a, b in zip(sa[~nan], sb[~nan])])
    assert np.array_equal(prod[~nan], want)


def test_quantize_mx_rejects_bad_shapes_and_element_types():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mx(np.zeros((48, 2), np.float32), DType.FP8_E4M3, ScaleMode.FLOOR)
    with pytest.raises(ValueError, match="bf16"):
        quantize_mx(np.zeros((32, 2), np.float32), DType.BF16, ScaleMode.FLOOR)
