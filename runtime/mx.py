"""MX (OCP Microscaling v1.0) block quantization and E8M0 scale helpers, integer-exact.

`quantize_mx` is the semantics of the quantize_mx instruction (isa/spec_intro.md, MX) following
../shared/reference/precision.md 7.3: 32 consecutive partitions of one column share an E8M0 scale.
The per-element steps (`amax_fold`, `scale_code`, `quantize_element`, `e8m0_round_up_code`,
`block_factor`) are written once against the backend interface of runtime/ops_numpy.py, so the
llvmlite JIT runs the same sequence; the numpy API binds them to numpy. The E8M0 helpers are
integer-only (precision.md 7.4): library E8M0 casts round half up and disagree with each other on
zero and negatives, so they are never used.
"""
from __future__ import annotations

import numpy as np

from trnc.isa.dtypes import MX_BLOCK, MX_FORMATS, DType
from trnc.isa.enums import ScaleMode
from trnc.runtime.convert import ABS32, E8M0_NAN, e8m0_to_fp32, load, store
from trnc.runtime.ops_numpy import F32, F64, I32, NP, U8, U32

F32_INF_BITS = 0x7F800000


# ---- the algorithms (any backend `o`, one element) ------------------------------------------------------------

def amax_fold(o, acc, x):
    """One step of a block's amax, on fp32 bit patterns with the sign cleared (u32 acc, f32 x; start from 0).

    For finite values their integer order is the value order, and any Inf or NaN makes the amax
    >= 0x7F800000, which `scale_code` turns into scale 0xFF.
    """
    bits = o.and_(o.bitcast(x, U32), o.u32(ABS32))
    return o.select(o.gt(bits, acc), bits, acc)


def e8m0_round_up_code(o, d):
    """The smallest E8M0 code (u8) whose value is >= |d| (f32), 0xFF for NaN, Inf and beyond 2^127.

    fp32 subnormals round up to 2^-127 (code 0) when <= 2^-127 and to code 1 above it (precision.md 7.4).
    """
    u = o.u32
    bits = o.and_(o.bitcast(d, U32), u(ABS32))
    e = o.shr(bits, u(23))
    f = o.and_(bits, u(0x7FFFFF))
    c = o.select(o.eq(e, u(0)), o.widen(o.gt(f, u(0x400000)), U32), o.add(e, o.widen(o.ne(f, u(0)), U32)))
    c = o.select(o.or_(o.eq(e, u(0xFF)), o.gt(c, u(254))), u(E8M0_NAN), c)
    return o.narrow(c, U8)


def scale_code(o, amax, elem: DType, mode: ScaleMode):
    """The E8M0 block scale S (u8) from the block's amax bits (u32, see amax_fold), by precision.md 7.3.

    floor: clamp(exp(amax) - emax, 0, 254); trn_alt: emax - 1 for fp8 elements; rceil:
    e8m0_round_up(fp32(amax * fp32(1/max_elem))). A non-finite amax gives 0xFF.
    """
    fmt = _format(elem)
    mode = ScaleMode(mode)
    if mode is ScaleMode.RCEIL:
        inv_max = float(np.float32(1.0) / np.float32(elem.value.max_finite))
        s = o.widen(e8m0_round_up_code(o, o.mul(o.bitcast(amax, F32), o.f32(inv_max))), U32)
    else:
        emax = fmt.emax - 1 if (mode is ScaleMode.TRN_ALT and elem.is_fp8) else fmt.emax
        e = o.sub(o.bitcast(o.shr(amax, o.u32(23)), I32), o.i32(emax))
        e = o.select(o.lt(e, o.i32(0)), o.i32(0), o.select(o.gt(e, o.i32(254)), o.i32(254), e))
        s = o.bitcast(e, U32)
    s = o.select(o.lt(amax, o.u32(F32_INF_BITS)), s, o.u32(E8M0_NAN))
    return o.narrow(s, U8)


def _pow2_f32(o, k):
    """2^k as fp32 for an i32 k in [-149, 127], exact (subnormal below -126)."""
    i = o.i32
    normal = o.shl(o.bitcast(o.select(o.gt(k, i(-127)), o.add(k, i(127)), i(0)), U32), o.u32(23))
    amt = o.sub(i(-127), k)
    amt = o.select(o.lt(amt, i(0)), i(0), o.select(o.gt(amt, i(31)), i(31), amt))
    sub = o.shr(o.u32(0x00400000), o.bitcast(amt, U32))
    return o.bitcast(o.select(o.ge(k, i(-126)), normal, sub), F32)


def quantize_element(o, x, scale, elem: DType):
    """One element of quantize_mx: fp32 x -> the element code (u8) under the block scale code (u8).

    fp32(x * 2^(127 - S)) is one rounding (exact unless subnormal); in a 0xFF block the factor is
    2^-128, so the elements are defined too (the scale alone makes the block NaN on use). The value
    is clamped to the element's max (NaN passes) and converted RNE.
    """
    _format(elem)
    y = o.mul(x, _pow2_f32(o, o.sub(o.i32(127), o.bitcast(o.widen(scale, U32), I32))))
    lim = o.f32(elem.value.max_finite)
    y = o.select(o.gt(y, lim), lim, o.select(o.lt(y, o.neg(lim)), o.neg(lim), y))
    return store(o, y, elem)


def block_factor(o, s_a, s_b):
    """2^(s_a + s_b - 254) as f64 from two E8M0 codes (u8), exact; NaN where either is 0xFF.

    Each code decodes exactly to fp32 (2^-127 .. 2^127) and the f64 product of two such powers is exact.
    """
    fa = e8m0_to_fp32(o, o.widen(s_a, U32))
    fb = e8m0_to_fp32(o, o.widen(s_b, U32))
    return o.mul(o.widen(fa, F64), o.widen(fb, F64))


def _format(elem: DType):
    fmt = MX_FORMATS.get(elem)
    if fmt is None:
        raise ValueError(f"quantize_mx element type must be one of {', '.join(d.text for d in MX_FORMATS)}, "
                         f"not {elem.text}")
    return fmt


# ---- the numpy API --------------------------------------------------------------------------------------------

def _codes(c: np.ndarray) -> np.ndarray:
    return np.asarray(c).view(np.uint8)


def e8m0_decode(codes: np.ndarray) -> np.ndarray:
    """2^(code - 127) as fp32; code 0 is the subnormal 2^-127 and 0xFF is NaN."""
    return np.array(load(NP, _codes(codes), DType.E8M0), dtype=np.float32)


def e8m0_round_up(d: np.ndarray) -> np.ndarray:
    """The smallest E8M0 code whose value is >= |d| (d >= 0 in use), 0xFF for NaN, Inf and beyond 2^127."""
    return np.array(e8m0_round_up_code(NP, np.asarray(d, dtype=np.float32)), dtype=np.uint8)


def quantize_mx(x: np.ndarray, elem: DType, mode: ScaleMode) -> tuple[np.ndarray, np.ndarray]:
    """Quantize x (P, F) fp32 into MX element codes (P, F) and E8M0 scales (P // 32, F)."""
    _format(elem)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] % MX_BLOCK:
        raise ValueError(f"quantize_mx input must be (P, F) with P a multiple of {MX_BLOCK}, got {x.shape}")
    blocks = x.reshape(x.shape[0] // MX_BLOCK, MX_BLOCK, x.shape[1])
    with np.errstate(all="ignore"):
        amax = np.zeros((blocks.shape[0], blocks.shape[2]), np.uint32)
        for r in range(MX_BLOCK):
            amax = amax_fold(NP, amax, blocks[:, r])
        s = scale_code(NP, amax, elem, mode)
        codes = quantize_element(NP, blocks, s[:, None, :], elem)
    return np.ascontiguousarray(codes).reshape(x.shape).view(elem.storage), np.ascontiguousarray(s)


def scale_pow2_f64(s_a: np.ndarray, s_b: np.ndarray) -> np.ndarray:
    """2^(s_a + s_b - 254) in float64 (exact), NaN where either scale is 0xFF: the factor matmul_mx applies."""
    return np.asarray(block_factor(NP, _codes(s_a), _codes(s_b)), dtype=np.float64)
