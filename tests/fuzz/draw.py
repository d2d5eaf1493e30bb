"""Seeded tensors of the fuzz programs: their inputs and parameters, drawn alike by the fuzzer and by its reproducers.

repro.py copies this module's source into every reproducer, so a reproducer rebuilds exactly the tensors the
fuzzer ran without importing the fuzzer; it therefore imports torch alone.

Kinds of values. "normal": a scaled standard normal, the generic float. "grid": multiples of 1/8 in [-4, 4],
exact in bfloat16 and float16, so exact ops on them (views, max, abs, where) and comparisons of them stay exact
in every precision and their ties are real ties rather than rounding accidents. "positive": uniform in
[0.5, 2], for denominators and the bases of pow. "index": int64 in [0, high), embedding indices. "mask": bool
with the first entry of every last-axis row True, so an attention mask never hides a whole row of keys.
"""
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int64": torch.int64,
          "bool": torch.bool}


def draw(shape, dtype: str, kind: str, seed: int, scale: float = 1.0, high: int = 0) -> torch.Tensor:
    """The tensor of `kind` for `seed`, of `shape` and of dtype name `dtype`."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if kind == "index":
        return torch.randint(0, high, shape, generator=g)
    if kind == "mask":
        mask = torch.rand(shape, generator=g) < 0.7
        if mask.dim():
            mask[..., 0] = True
        return mask
    if kind == "grid":
        values = torch.randint(-32, 33, shape, generator=g).double() / 8
    elif kind == "positive":
        values = 0.5 + 1.5 * torch.rand(shape, generator=g, dtype=torch.float64)
    else:
        values = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    return values.to(DTYPES[dtype])
