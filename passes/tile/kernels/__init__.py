"""Kernel lowerings: one module per kernel family, each turning an ir.Kernel into tile instructions.

A lowering is `lower(kb, kernel, views, out, plan)`: `views` maps each external input node of the
kernel to the HbmView it is read through (strided: permutes, expands and slices are already folded
in), `out` is the contiguous HbmView to write the kernel's output to, `plan` the kernel's
ir.KernelPlan (its partition dim and hand-overs). It returns the SBUF tile of a hand-over the plan
asked for and the kernel made (a kept result, a transposed copy), else None. A module may also
offer `candidates(kernel) -> list` (the partition dims it can use) for the layout pass. Which
module lowers which kind is passes/graph/kernel_kinds.py.
"""
from __future__ import annotations

from types import ModuleType
from typing import Callable

from trnc.passes.graph.kernel_kinds import KINDS


def module(kind: str) -> ModuleType:
    return KINDS[kind].lowering_module()


def lowering(kind: str) -> Callable:
    return module(kind).lower
