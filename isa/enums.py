"""Enumerated instruction fields: ALU ops, activation functions, reductions, rounding and MX scale modes.

The numeric values are the binary encoding; the lower-case names are the assembly text.
"""
from __future__ import annotations

import enum


class TextEnum(enum.IntEnum):
    @property
    def text(self) -> str:
        return self.name.lower()

    @classmethod
    def from_text(cls, name: str):
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown {cls.__name__} '{name}'; expected one of "
                             f"{', '.join(m.text for m in cls)}") from None


class AluOp(TextEnum):
    """Binary operations of VectorE/GpSimdE (and ScalarE's tensor_scalar), computed in fp32."""

    BYPASS = 0  # a (the second operand is ignored): "no second op" in tensor_scalar
    ADD = 1
    SUB = 2
    MUL = 3
    DIV = 4
    MAX = 5
    MIN = 6
    POW = 7
    EQ = 8
    NE = 9
    LT = 10
    LE = 11
    GT = 12
    GE = 13
    AND = 14  # logical: (a != 0) and (b != 0) -> 1.0 / 0.0
    OR = 15
    XOR = 16
    ATAN2 = 17      # atan2(a, b): the angle of the point (b, a)
    FMOD = 18       # C's fmodf: a - trunc(a / b) b, exact
    REMAINDER = 19  # torch.remainder: fmod(a, b), plus b where that is nonzero and of the other sign than b
    HYPOT = 20
    LOGADDEXP = 21  # log(e^a + e^b)


COMPARISONS = frozenset({AluOp.EQ, AluOp.NE, AluOp.LT, AluOp.LE, AluOp.GT, AluOp.GE})


class ActFunc(TextEnum):
    """ScalarE functions f in f(x*scale + bias)."""

    COPY = 0
    RELU = 1
    GELU = 2        # erf form: 0.5 x (1 + erf(x / sqrt 2))
    GELU_TANH = 3   # tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    SILU = 4
    SIGMOID = 5
    TANH = 6
    EXP = 7
    LOG = 8
    SQRT = 9
    RSQRT = 10
    RECIPROCAL = 11
    SQUARE = 12
    ABS = 13
    SIN = 14
    COS = 15
    TAN = 16
    ASIN = 17
    ACOS = 18
    ATAN = 19
    SINH = 20
    COSH = 21
    ASINH = 22
    ACOSH = 23
    ATANH = 24
    ERF = 25
    ERFC = 26
    EXP2 = 27
    LOG2 = 28
    LOG10 = 29
    FLOOR = 30
    CEIL = 31
    TRUNC = 32
    RINT = 33       # round to nearest integer, ties to even
    SIGN = 34       # 1, -1, or +0 for +-0 and NaN
    ERFINV = 35
    ERFCX = 36      # e^(x^2) erfc(x)
    I0E = 37        # e^-|x| I0(x), the exponentially scaled modified Bessel function of order 0
    I1E = 38        # e^-|x| I1(x), order 1
    LGAMMA = 39     # log |Gamma(x)|
    DIGAMMA = 40    # d/dx log Gamma(x)


class ReduceOp(TextEnum):
    SUM = 0
    MAX = 1
    MIN = 2


class Rounding(TextEnum):
    RNE = 0  # round to nearest, ties to even
    SR = 1   # stochastic rounding from a counter-based generator seeded by the instruction


class ScaleMode(TextEnum):
    """How quantize_mx picks the E8M0 block scale (precision.md 7.3)."""

    FLOOR = 0    # OCP MX v1.0 6.3: floor(log2 amax) - emax
    TRN_ALT = 1  # AWS quantize_mx: twice the OCP scale for fp8 elements
    RCEIL = 2    # round amax / max_elem up to a power of two
