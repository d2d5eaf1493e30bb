"""Kernel lowerings: one module per kernel family, each turning an ir.Kernel into tile instructions.

A lowering is `lower(kb, kernel, views, out)`: `views` maps each external input node of the kernel
to the HbmView it is read through (strided: permutes, expands and slices are already folded in),
`out` is the contiguous HbmView to write the kernel's output to. A module may also offer
`candidates(kernel) -> list` (the layouts it can use, for kernel.partition_dim) for the layout pass.
"""
from __future__ import annotations

import importlib
from typing import Callable

# kernel kind -> module under trnc.passes.kernels
MODULES = {
    "elementwise": "elementwise",
    "reduce": "reduce",
    "softmax": "rowwise",
    "log_softmax": "rowwise",
    "layer_norm": "rowwise",
    "matmul": "matmul",
    "attention": "attention",
    "gather": "movement",
    "movement": "movement",
}


def module(kind: str):
    return importlib.import_module(f"trnc.passes.kernels.{MODULES[kind]}")


def lowering(kind: str) -> Callable:
    return module(kind).lower
