"""precision="mxfp8" and "mxfp4" on trn3, and emulated on trn2: the options, a weight's matmul against the product
of its dequantized MX operands, the emulation's quantization bit for bit, the SQNR of precision.md's table, the JIT
against the reference interpreter, and what stays bf16."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import trnc
from trnc.errors import TrncError
from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.options import MX_SCALES, Options
from trnc.runtime.convert import to_fp32
from trnc.runtime.mx import e8m0_decode, quantize_mx
from test_precision_fp8 import MatMul

ELEM = {"mxfp8": DType.FP8_E4M3, "mxfp4": DType.FP4_E2M1}


def dequantized(t: np.ndarray, elem: DType, mode: str) -> np.ndarray:
    """t [K, X] quantized along K as runtime/mx.py specifies (precision.md 7.3), back in float64 (7.5)."""
    codes, scales = quantize_mx(t.astype(np.float32), elem, MX_SCALES[mode])
    values = to_fp32(codes, elem).astype(np.float64).reshape(t.shape)
    return values * np.repeat(e8m0_decode(scales).astype(np.float64), MX_BLOCK, axis=0)


def sqnr(ref, got) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    return 10 * math.log10((ref ** 2).sum() / ((got - ref) ** 2).sum())


def test_mx_needs_trn3_or_emulation():
    with pytest.raises(TrncError, match="precision='mxfp4' needs MX matmuls and quantize_mx, which target 'trn2' lacks"
                                        ".*pass emulate=True"):
        Options("mxfp4", target="trn2")
    assert Options("mxfp4", target="trn1", emulate=True).mx_dtype is DType.FP4_E2M1
    assert Options("mxfp8", target="trn3", fp8_format="e5m2").mx_dtype is DType.FP8_E5M2
    with pytest.raises(TrncError, match="mx_scale='ceil' is not allowed"):
        Options("mxfp8", target="trn3", mx_scale="ceil")


@pytest.mark.parametrize("precision", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("target", ["trn3", "trn2"])
def test_a_weights_matmul_is_the_product_of_its_dequantized_operands(precision, mode, target):
    """Within the fp32 accumulation bound: each block's sum of 32 exact products and the sum over blocks (trn3),
    or the sum of the products in K order (trn2's emulation), K 2^-24 sum |a w| of the dequantized operands
    (Higham 4.2), against the float64 product."""
    a, w = torch.randn(3, 40, 256), torch.randn(256, 96) * 0.1
    compiled = trnc.compile(MatMul(w), (a,), precision=precision, target=target, emulate=target == "trn2",
                            mx_scale=mode, cache=False)
    got = compiled(a).double().numpy().reshape(120, 96)
    elem = ELEM[precision]
    a_d = dequantized(a.reshape(120, 256).numpy().T, elem, mode).T
    w_d = dequantized(w.numpy(), elem, mode)
    exact, magnitude = a_d @ w_d, np.abs(a_d) @ np.abs(w_d)
    assert np.all(np.abs(got - exact) <= 256 * 2.0 ** -24 * magnitude)
    assert torch.equal(compiled(a), compiled.run_reference(a))


@pytest.mark.parametrize("precision, fmt, mode, expected_db, target", [
    ("mxfp8", "e4m3", "floor", 27.7, "trn3"), ("mxfp8", "e4m3", "rceil", 28.5, "trn3"),
    ("mxfp8", "e5m2", "floor", 22.4, "trn3"), ("mxfp4", "e4m3", "floor", 15.9, "trn3"),
    ("mxfp4", "e4m3", "rceil", 15.8, "trn3"), ("mxfp8", "e4m3", "floor", 27.7, "trn2"),
    ("mxfp4", "e4m3", "floor", 15.9, "trn2")])
def test_a_gaussian_matmul_has_the_sqnr_of_precision_md(precision, fmt, mode, expected_db, target):
    """256x4096x256 against float64, precision.md 6's table; on trn2 emulated."""
    a, w = torch.randn(256, 4096), torch.randn(4096, 256)
    got = trnc.compile(MatMul(w), (a,), precision=precision, target=target, emulate=target == "trn2", fp8_format=fmt,
                       mx_scale=mode, cache=False)(a)
    assert abs(sqnr(a.double() @ w.double(), got) - expected_db) <= 1.0


def test_a_weight_whose_k_is_not_a_multiple_of_32_stays_bf16():
    a, w = torch.randn(16, 40), torch.randn(40, 24)
    compiled = trnc.compile(MatMul(w), (a,), precision="mxfp8", target="trn3", cache=False)
    opcodes = {i.opcode for i in compiled.program.instructions}
    assert "matmul_mx" not in opcodes and "matmul" in opcodes
    assert sqnr(a.double() @ w.double(), compiled(a)) > 45      # bf16 operands


def edge_rows(k: int, exponents=range(-100, 100, 7)) -> torch.Tensor:
    """Rows of k values whose block amax is a power of two 2^e, the fp32 just below it, and 1.5 and 1.75 times it
    (the others Gaussian below it, some of them elements' subnormals), a zero row, a zero block."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for e in exponents:
        p = np.float32(2.0 ** e)
        for amax in (p, np.nextafter(p, np.float32(0)), p * np.float32(1.5), p * np.float32(1.75)):
            row = torch.randn(k, generator=g) * float(amax) / 4
            row[5::MX_BLOCK] = float(amax)
            rows.append(row)
    a = torch.stack(rows)
    a[0], a[1, :MX_BLOCK] = 0, 0
    return a


@pytest.mark.parametrize("precision, fmt", [("mxfp8", "e4m3"), ("mxfp8", "e5m2"), ("mxfp4", "e4m3")])
@pytest.mark.parametrize("mode", ["floor", "rceil", "trn_alt"])
def test_the_emulation_quantizes_activations_as_quantize_mx(precision, fmt, mode):
    """Bit for bit on the edge cases: an identity weight (exact in every format) returns the dequantized activation."""
    a = edge_rows(128)
    compiled = trnc.compile(MatMul(torch.eye(128)), (a,), precision=precision, target="trn2", emulate=True,
                            fp8_format=fmt, mx_scale=mode, cache=False)
    elem = DType.FP4_E2M1 if precision == "mxfp4" else Options(precision, target="trn3", fp8_format=fmt).mx_dtype
    want = dequantized(a.numpy().T, elem, mode).T.astype(np.float32)
    assert np.array_equal(compiled(a).numpy(), want)
    opcodes = {i.opcode for i in compiled.program.instructions}
    assert "matmul" in opcodes and not opcodes & {"matmul_mx", "quantize_mx"}


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_the_emulation_quantizes_subnormal_amaxes_as_quantize_mx_in_mxfp4(mode):
    """fp32 subnormal and tiny amaxes (e2m1's dequantized values stay within bf16's subnormals)."""
    a = edge_rows(64, range(-149, -110))
    compiled = trnc.compile(MatMul(torch.eye(64)), (a,), precision="mxfp4", target="trn2", emulate=True,
                            mx_scale=mode, cache=False)
    want = dequantized(a.numpy().T, DType.FP4_E2M1, mode).T.astype(np.float32)
    assert np.array_equal(compiled(a).numpy(), want)
