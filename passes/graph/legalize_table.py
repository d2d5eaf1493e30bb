"""legalize's rule table: `rule` registers a rule for aten ops in `pm_legalize`; the rule modules
(passes/graph/legalize_rules.py and the ones it imports) fill it. Shared by them: the axis helpers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

COMPARE_OPS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor"})
pm_legalize: dict[str, Callable] = {}
# The ops whose rule lowers them whole, to one fused trnc op, where torch's core decompositions would spell them
# out in smaller ops: capture keeps every overload of these out of its decomposition table.
pm_whole: set[str] = set()


@dataclass(frozen=True)
class Unusable:
    """An output of a multi-output op that trnc does not compute; using it is an error."""

    what: str


def rule(*ops: str, whole: bool = False):
    def register(fn):
        for op in ops:
            pm_legalize[op] = fn
        if whole:
            pm_whole.update(ops)
        return fn
    return register


def dim_of(d: int, rank: int) -> int:
    return d + max(rank, 1) if d < 0 else d


def dims_of(dims, rank: int) -> tuple[int, ...]:
    """Normalized reduction axes; None or [] means every axis (torch's convention). A 0-d tensor has none: torch
    takes dim 0 or -1 of it as the tensor itself, so reducing over it is the identity."""
    if rank == 0:
        return ()
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return tuple(range(rank))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return tuple(sorted({dim_of(d, rank) for d in dims}))
