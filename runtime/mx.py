"""MX (OCP Microscaling v1.0) block quantization and E8M0 scale helpers, integer-exact.

`quantize_mx` is the semantics of the quantize_mx instruction (isa/spec_intro.md, MX) following
../shared/reference/precision.md 7.3: 32 consecutive partitions of one column share an E8M0 scale.
The E8M0 helpers are integer-only (precision.md 7.4): library E8M0 casts round half up and disagree
with each other on zero and negatives, so they are never used. `scale_pow2_f64` is the exact block
scale factor that matmul_mx applies in float64.
"""
from __future__ import annotations

import numpy as np

from trnc.isa.dtypes import MX_BLOCK, MX_FORMATS, DType
from trnc.isa.enums import ScaleMode
from trnc.runtime.convert import E8M0_NAN, U32, bits_f32, e8m0_to_fp32, f32_bits, from_fp32

F32_INF_BITS = U32(0x7F800000)


def e8m0_decode(codes: np.ndarray) -> np.ndarray:
    """2^(code - 127) as fp32; code 0 is the subnormal 2^-127 and 0xFF is NaN."""
    return e8m0_to_fp32(codes)


def e8m0_round_up(d: np.ndarray) -> np.ndarray:
    """The smallest E8M0 code whose value is >= |d| (d >= 0 in use), 0xFF for NaN, Inf and beyond 2^127.

    fp32 subnormals round up to 2^-127 (code 0) when <= 2^-127 and to code 1 above it (precision.md 7.4).
    """
    u = f32_bits(d) & U32(0x7FFFFFFF)
    e = (u >> U32(23)).astype(np.int32)
    f = u & U32(0x7FFFFF)
    c = np.where(e == 0, (f > U32(0x400000)).astype(np.int32), e + (f != 0))
    return np.where((e == 0xFF) | (c > 254), E8M0_NAN, c).astype(np.uint8)


def _pow2_f32(k: np.ndarray) -> np.ndarray:
    """2^k as fp32 for integer k in [-149, 127], exact (subnormal below -126)."""
    k = k.astype(np.int32)
    normal = (np.maximum(k + 127, 0).astype(U32)) << U32(23)
    sub = U32(0x00400000) >> np.clip(-126 - k - 1, 0, 31).astype(U32)
    return bits_f32(np.where(k >= -126, normal, sub))


def quantize_mx(x: np.ndarray, elem: DType, mode: ScaleMode) -> tuple[np.ndarray, np.ndarray]:
    """Quantize x (P, F) fp32 into MX element codes (P, F) and E8M0 scales (P // 32, F).

    amax is taken on the fp32 bit patterns with the sign cleared: for finite values their integer
    order is the value order, and any Inf or NaN makes it >= 0x7F800000, which gives scale 0xFF.
    Elements are x * 2^(127 - S) rounded once to fp32; in a 0xFF block that factor is 2^-128, so the
    elements are defined too (the scale alone makes the block NaN on use).
    """
    fmt = MX_FORMATS.get(elem)
    if fmt is None:
        raise ValueError(f"quantize_mx element type must be one of {', '.join(d.text for d in MX_FORMATS)}, "
                         f"not {elem.text}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    mode = ScaleMode(mode)
    if x.ndim != 2 or x.shape[0] % MX_BLOCK:
        raise ValueError(f"quantize_mx input must be (P, F) with P a multiple of {MX_BLOCK}, got {x.shape}")
    nblk, ncol = x.shape[0] // MX_BLOCK, x.shape[1]
    amax_bits = (f32_bits(x) & U32(0x7FFFFFFF)).reshape(nblk, MX_BLOCK, ncol).max(axis=1)
    finite = amax_bits < F32_INF_BITS
    exp_field = (amax_bits >> U32(23)).astype(np.int32)
    if mode is ScaleMode.RCEIL:
        inv_max = np.float32(1.0) / np.float32(elem.value.max_finite)
        s = e8m0_round_up(bits_f32(amax_bits) * inv_max).astype(np.int32)
    else:
        emax = fmt.emax - 1 if (mode is ScaleMode.TRN_ALT and elem.is_fp8) else fmt.emax
        s = np.clip(exp_field - emax, 0, 254)
    s = np.where(finite, s, E8M0_NAN)
    inv = np.repeat(_pow2_f32(127 - s), MX_BLOCK, axis=0)
    y = x * inv
    lim = np.float32(elem.value.max_finite)
    y = np.where(y > lim, lim, np.where(y < -lim, -lim, y))  # NaN passes through
    return from_fp32(y, elem), s.astype(np.uint8)


def scale_pow2_f64(s_a: np.ndarray, s_b: np.ndarray) -> np.ndarray:
    """2^(s_a + s_b - 254) in float64 (exact), NaN where either scale is 0xFF."""
    sa = np.asarray(s_a).view(np.uint8).astype(np.int64)
    sb = np.asarray(s_b).view(np.uint8).astype(np.int64)
    out = np.ldexp(np.float64(1.0), (sa + sb - 254).astype(np.int32))
    return np.where((sa == E8M0_NAN) | (sb == E8M0_NAN), np.nan, out)
