"""MX matmuls emulated on a target without matmul_mx and quantize_mx (trn1, trn2), when Options.emulate asks:
the same quantization written in the instructions those targets have, and a bf16 matmul of the dequantized
operands, so the products are MX's at bf16 speed.

The weight is quantized now (runtime/mx.py quantize_mx) and dequantized back, to bf16: an element of at most
4 significant bits times a power of two is exact in bf16. The activation x [..., M, K] is quantized on the
device in blocks of 32 along K, as quantize_mx specifies (precision.md 7.3):

    amax   = max |x| over the block                         (a reduce)
    E      = floor(log2 amax), exact: e0 = floor(log2 amax) from ScalarE's log2 (within an ulp, so e0 is
             off by at most one next to a power of two), corrected by two compares with exp2(e0), which is
             exact at integers
    S      = clamp(E + 127 - emax, 0, 254)                  (floor; trn_alt takes emax - 1 for fp8 elements)
           = clamp(ceil(log2 d) + 127, 0, 254), d = fp32(amax * fp32(1 / max_elem))          (rceil)
    q      = elem(clamp(x * 2^(127 - S), -max_elem, max_elem))     (one fp32 rounding, then RNE)
    x_mx   = q * 2^(S - 127), in bf16

A zero block gives E = -inf and S = 0, as the integer rule gives. What differs from matmul_mx: the products
are summed in fp32 in K order rather than per block of 32 and then scaled (both within the fp32 accumulation
bound of the exact product), a dequantized value with bits below bf16's smallest subnormal 2^-133 is
rounded (a block amax under 2^-116 in e4m3, 2^-102 in e5m2), and a block holding Inf or NaN gives NaN only
where the elements do, not in the whole block (matmul_mx's scale 0xFF).
"""
from __future__ import annotations

import numpy as np

from trnc import ir
from trnc.isa.dtypes import MX_BLOCK, MX_FORMATS, DType
from trnc.isa.enums import ScaleMode
from trnc.runtime.convert import from_fp32, to_fp32
from trnc.runtime.mx import e8m0_decode, quantize_mx


class _Nodes:
    """Builds the emulation's fp32 nodes, each tagged with the matmul's source line and module."""

    def __init__(self, mm: ir.Node):
        self.mm, self.new = mm, []

    def add(self, kind: str, inputs, shape, dtype: DType = DType.FP32, /, **attrs) -> ir.Node:
        n = ir.Node(kind, tuple(inputs), tuple(shape), dtype, attrs, source=self.mm.source, module=self.mm.module)
        self.new.append(n)
        return n

    def unary(self, x: ir.Node, func: str) -> ir.Node:
        return self.add("unary", (x,), x.shape, func=func)

    def binary(self, op: str, a: ir.Node, b: ir.Node) -> ir.Node:
        return self.add("binary", (a, b), np.broadcast_shapes(a.shape, b.shape), op=op)

    def scalar(self, x: ir.Node, op: str, value: float, reverse: bool = False) -> ir.Node:
        return self.add("scalar", (x,), x.shape, op=op, value=float(value), reverse=reverse)

    def floor_log2(self, a: ir.Node) -> ir.Node:
        """floor(log2 a) for a >= 0, exact (-inf at 0)."""
        e0 = self.unary(self.unary(a, "log2"), "floor")
        p = self.unary(e0, "exp2")
        up = self.binary("ge", a, self.scalar(p, "mul", 2.0))
        down = self.binary("lt", a, p)
        return self.binary("sub", self.binary("add", e0, up), down)

    def scale(self, amax: ir.Node, elem: DType, mode: ScaleMode) -> ir.Node:
        """The block scale S (the E8M0 code, as an fp32 integer) of quantize_mx's rule `mode`."""
        if mode is ScaleMode.RCEIL:
            d = self.scalar(amax, "mul", float(np.float32(1.0) / np.float32(elem.value.max_finite)))
            e = self.floor_log2(d)
            above = self.binary("gt", d, self.unary(e, "exp2"))      # d not a power of two: round up
            s = self.scalar(self.binary("add", e, above), "add", 127.0)
        else:
            emax = MX_FORMATS[elem].emax - (mode is ScaleMode.TRN_ALT and elem.is_fp8)
            s = self.scalar(self.floor_log2(amax), "add", 127.0 - emax)
        return self.scalar(self.scalar(s, "max", 0.0), "min", 254.0)


def dequantized_weight(w: np.ndarray, elem: DType, mode: ScaleMode) -> np.ndarray:
    """w [K, N] quantized along K by quantize_mx and dequantized, as fp32 (exact: element times power of two)."""
    codes, scales = quantize_mx(w, elem, mode)
    values = to_fp32(codes, elem).reshape(w.shape)
    return values * np.repeat(e8m0_decode(scales), MX_BLOCK, axis=0)


def emulated_mx_matmul(mm: ir.Node, w_value: np.ndarray, elem: DType, mode: ScaleMode) -> list[ir.Node]:
    """The nodes of `mm` (one quantize.mx_takes takes) as an emulated MX matmul (constants first, the last is its
    result); w_value: its weight in fp32."""
    x, w = mm.inputs
    w_mx = ir.Node("const", (), w.shape, DType.BF16,
                   {"value": from_fp32(dequantized_weight(w_value, elem, mode), DType.BF16)},
                   name=f"{w.name}.mx_emulated", source=w.source)
    b = _Nodes(mm)
    *lead, k = x.shape
    blocks = b.add("reshape", (x,), (*lead, k // MX_BLOCK, MX_BLOCK), x.dtype)
    amax = b.add("reduce", (blocks,), (*lead, k // MX_BLOCK, 1), op="max", axes=(len(lead) + 1,), keepdim=True,
                 abs=True)
    s = b.scale(amax, elem, mode)
    up = b.unary(b.scalar(s, "sub", 127.0, reverse=True), "exp2")       # 2^(127 - S)
    down = b.unary(b.scalar(s, "sub", 127.0), "exp2")                   # 2^(S - 127)
    limit = elem.value.max_finite
    y = b.scalar(b.scalar(b.binary("mul", blocks, up), "min", limit), "max", -limit)
    q = b.add("cast", (y,), y.shape, elem)
    x_mx = b.add("cast", (b.binary("mul", q, down),), y.shape, DType.BF16)
    product = b.add("matmul", (b.add("reshape", (x_mx,), x.shape, DType.BF16), w_mx), mm.shape)
    tail = [] if mm.dtype is DType.FP32 else [b.add("cast", (product,), mm.shape, mm.dtype)]
    return [w_mx, *b.new, *tail]
