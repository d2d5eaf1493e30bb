"""Data types of the machine: storage size, numpy view and numeric family of each.

Every value in SBUF, PSUM and HBM has one of these types. Compute engines read any of them
into fp32, compute in fp32 and convert on write (runtime/convert.py defines each conversion
bit for bit, following ../shared/reference/precision.md).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DTypeInfo:
    code: int          # number in the binary encoding
    itemsize: int      # bytes per element in memory
    storage: np.dtype  # numpy dtype that holds the raw value (ml_dtypes for the small floats)
    kind: str          # "float", "int" or "scale"
    mantissa_bits: int = 0
    exponent_bits: int = 0
    max_finite: float = 0.0


class DType(enum.Enum):
    """Element types. FP4 is stored one element per byte (low nibble), like ml_dtypes."""

    FP32 = DTypeInfo(0, 4, np.dtype(np.float32), "float", 23, 8, float(np.finfo(np.float32).max))
    BF16 = DTypeInfo(1, 2, np.dtype(ml_dtypes.bfloat16), "float", 7, 8, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))
    FP16 = DTypeInfo(2, 2, np.dtype(np.float16), "float", 10, 5, 65504.0)
    FP8_E4M3 = DTypeInfo(3, 1, np.dtype(ml_dtypes.float8_e4m3fn), "float", 3, 4, 448.0)
    FP8_E5M2 = DTypeInfo(4, 1, np.dtype(ml_dtypes.float8_e5m2), "float", 2, 5, 57344.0)
    FP4_E2M1 = DTypeInfo(5, 1, np.dtype(ml_dtypes.float4_e2m1fn), "float", 1, 2, 6.0)
    E8M0 = DTypeInfo(6, 1, np.dtype(ml_dtypes.float8_e8m0fnu), "scale")
    INT8 = DTypeInfo(7, 1, np.dtype(np.int8), "int")
    UINT8 = DTypeInfo(8, 1, np.dtype(np.uint8), "int")
    INT32 = DTypeInfo(9, 4, np.dtype(np.int32), "int")

    def __init__(self, info: DTypeInfo):
        # Plain attributes, not properties over `.value`: the verifier and the runtime read them on
        # every operand, and an enum's value lookup costs a descriptor call each time.
        self.code: int = info.code
        self.itemsize: int = info.itemsize
        self.storage: np.dtype = info.storage
        self.is_float: bool = info.kind == "float"
        self.is_int: bool = info.kind == "int"

    @property
    def is_fp8(self) -> bool:
        return self in (DType.FP8_E4M3, DType.FP8_E5M2)

    @property
    def text(self) -> str:
        """The name used in assembly text and SPEC.md, e.g. 'fp8_e4m3'."""
        return self.name.lower()

    @classmethod
    def from_text(cls, name: str) -> "DType":
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown dtype '{name}'; expected one of {', '.join(d.text for d in cls)}") from None

    @classmethod
    def from_code(cls, code: int) -> "DType":
        for d in cls:
            if d.code == code:
                return d
        raise ValueError(f"unknown dtype code {code}")


@dataclass(frozen=True)
class MXFormat:
    """An OCP MX format: 32 elements of `element` type share one E8M0 scale."""

    name: str
    element: DType
    emax: int  # exponent of the largest power of two of the element type (precision.md 7.3)


MX_BLOCK = 32  # elements per scale, along the partition (contraction) axis (precision.md 1)
MX_FORMATS = {
    DType.FP8_E4M3: MXFormat("mxfp8_e4m3", DType.FP8_E4M3, 8),
    DType.FP8_E5M2: MXFormat("mxfp8_e5m2", DType.FP8_E5M2, 15),
    DType.FP4_E2M1: MXFormat("mxfp4_e2m1", DType.FP4_E2M1, 2),
}

# Families the opcode table and the verifier refer to.
MATMUL_DTYPES = frozenset({DType.FP32, DType.BF16, DType.FP16, DType.FP8_E4M3, DType.FP8_E5M2})
VALUE_DTYPES = frozenset(d for d in DType if d is not DType.E8M0)  # what engines may write by arithmetic
