"""torch dtypes and machine dtypes: the maps between them and the bit-exact bridges between torch and numpy.

Capture maps every tensor it meets to a machine dtype; the IR's const nodes keep numpy arrays of the
machine's storage types; the interpreter, fold and legalize compute on them with torch, and a compiled
model takes torch tensors in and gives torch tensors back. numpy has no bf16 or fp8 that torch can read,
so those cross as raw bits of the same width. Part of the IR layer: passes read it, never capture.
"""
from __future__ import annotations

import numpy as np
import torch

from trnc.errors import TrncError, UnsupportedOpError
from trnc.isa.dtypes import DType

# torch dtype -> machine dtype; the machine has no 64-bit types, so int64 indices are int32 (the API casts
# inputs at call time); float64 holds only constants (legalize computes what depends on them alone with torch,
# in float64, and stores the result in fp32): a value computed from inputs in float64 is refused, since the
# machine would compute it in fp32; bool is uint8 0/1
DTYPES = {
    torch.float32: DType.FP32, torch.bfloat16: DType.BF16, torch.float16: DType.FP16, torch.float64: DType.FP32,
    torch.int64: DType.INT32, torch.int32: DType.INT32, torch.int16: DType.INT32, torch.bool: DType.UINT8,
    torch.int8: DType.INT8, torch.uint8: DType.UINT8,
    torch.float8_e4m3fn: DType.FP8_E4M3, torch.float8_e5m2: DType.FP8_E5M2,
}
# the machine dtypes a model's inputs and outputs can have: those of the torch dtypes above
EXCHANGED_DTYPES = frozenset(DTYPES.values())
# machine dtype -> the torch dtype that holds its values exactly
TORCH_DTYPES = {
    DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
    DType.FP8_E4M3: torch.float8_e4m3fn, DType.FP8_E5M2: torch.float8_e5m2,
    DType.INT8: torch.int8, DType.UINT8: torch.uint8, DType.INT32: torch.int32,
}
# dtypes numpy cannot hand to torch directly: moved as raw bits of the same width
_BITS = {DType.BF16: (np.int16, torch.int16), DType.FP8_E4M3: (np.uint8, torch.uint8),
         DType.FP8_E5M2: (np.uint8, torch.uint8)}
# dtypes torch has no one-element-per-byte type for (fp4 e2m1, E8M0 scales): their tensors hold the uint8 codes
CODES_ONLY = frozenset({DType.FP4_E2M1, DType.E8M0})
INT_RANGES = {DType.INT8: (-128, 127), DType.UINT8: (0, 255), DType.INT32: (-(2 ** 31), 2 ** 31 - 1)}


def machine_dtype(dtype: torch.dtype, where: str = "") -> DType:
    """The machine dtype of a model's torch dtype; `where` names the tensor in the error."""
    if dtype not in DTYPES:
        raise UnsupportedOpError(f"tensors of {dtype} are not supported{where}; trnc handles "
                                 f"{', '.join(sorted(str(d) for d in DTYPES))}")
    return DTYPES[dtype]


def torch_dtype(dtype: DType) -> torch.dtype:
    if dtype not in TORCH_DTYPES:
        raise TrncError(f"torch has no type for {dtype.text}; trnc exchanges "
                        f"{', '.join(d.text for d in TORCH_DTYPES)} with torch")
    return TORCH_DTYPES[dtype]


def numpy_of(t: torch.Tensor, dtype: DType) -> np.ndarray:
    """`t` converted to `dtype`, as a numpy array of dtype.storage (sharing t's memory when no conversion
    or copy is needed)."""
    t = t.detach().to("cpu").to(torch_dtype(dtype)).contiguous()
    if dtype in _BITS:
        return t.view(_BITS[dtype][1]).numpy().view(dtype.storage)
    return t.numpy()


def array_of(t: torch.Tensor, dtype: DType) -> np.ndarray:
    """`t`'s values as a numpy array of dtype.storage (what a const node keeps).

    Integer values must fit `dtype` (ValueError otherwise): an int64 index table that does not fit
    int32 cannot be narrowed silently.
    """
    if dtype.is_int and t.numel() and not t.dtype.is_floating_point:
        low, high = INT_RANGES[dtype]
        if int(t.min()) < low or int(t.max()) > high:
            raise ValueError(f"values in [{int(t.min())}, {int(t.max())}] do not fit {dtype.text}")
    return numpy_of(t, dtype)


def tensor_of(value: np.ndarray, dtype: DType) -> torch.Tensor:
    """The torch tensor of an array of dtype.storage (a const node's value, a program's output); a copy, so
    nothing written to the tensor reaches the array. np.ascontiguousarray makes a 0-d array 1-d."""
    value = np.ascontiguousarray(value, dtype=dtype.storage)
    if dtype in _BITS:
        return torch.from_numpy(value.view(_BITS[dtype][0]).copy()).view(torch_dtype(dtype))
    if dtype in CODES_ONLY:
        return torch.from_numpy(value.view(np.uint8).copy())
    return torch.from_numpy(value.copy())
