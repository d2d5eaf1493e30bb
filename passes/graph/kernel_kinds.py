"""The kernel kinds: one row per kind of fused kernel, the only place the kinds are listed.

Fuse opens a kernel of a kind for each node whose op its row lists, and the passes after it ask the
row what they need: the module of passes/tile/kernels/ that lowers it (layout, tile), whether it works
in tiles of 128 rows over the last axis (plan hands such kernels their rows in SBUF), whether it
contracts on TensorE (precision narrows its compute dtype; plan stores what only contractions read
feature-major), whether elementwise nodes may fuse into it (its result is still on chip, in a PSUM
evacuation or an elementwise pass), and the MACs the model asks of it (the compute side of the
roofline), and whether it is a window over images with channels on the partitions (plan keeps such images in
SBUF between window kernels). A new kind of kernel is a row here and a module in passes/tile/kernels/.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from trnc import ir


def _matmul_macs(mm: ir.Node) -> int:
    """[*batch, M, N] outputs, K products each."""
    return math.prod(mm.shape) * mm.inputs[0].shape[-1]


def _conv_macs(conv: ir.Node) -> int:
    """Per output element, C_in / groups x KH x KW products (the weight is [C_in / groups, KH, KW, C_out])."""
    return math.prod(conv.shape) * math.prod(conv.inputs[1].shape[:3])


def _attention_macs(att: ir.Node) -> int:
    """Per query row, Sk scores of D products and Dv outputs of Sk products, as eager computes them."""
    q, key, v = (i.shape for i in att.inputs[:3])
    return math.prod(q[:-1]) * key[-2] * (q[-1] + v[-1])


@dataclass(frozen=True)
class KernelKind:
    name: str
    ops: frozenset[str]     # the IR ops a kernel of this kind starts with
    module: str             # its lowering, trnc.passes.tile.kernels.<module>: lower(kb, kernel, views, out, plan)
    row_wise: bool = False     # over the last axis, in tiles of 128 rows
    contraction: bool = False  # a contraction on TensorE (matmul, attention)
    fusible: bool = False      # elementwise nodes that read its result may join it
    macs: Callable[[ir.Node], int] | None = None   # MACs of its first node, for contractions
    window: bool = False       # a window over [N, C, H, W] with channels on the partitions (conv, pool)
    prefetch: bool = False     # its weight loads move ahead of the kernels before it (passes/tile/prefetch.py)

    def lowering_module(self) -> ModuleType:
        return importlib.import_module(f"trnc.passes.tile.kernels.{self.module}")


KINDS = {k.name: k for k in (
    KernelKind("elementwise", ir.OPS_ELEMENTWISE, "elementwise", fusible=True),
    KernelKind("reduce", ir.OPS_REDUCE, "reduce", fusible=True),
    KernelKind("softmax", frozenset({"softmax"}), "rowwise", row_wise=True),
    KernelKind("log_softmax", frozenset({"log_softmax"}), "rowwise", row_wise=True),
    KernelKind("layer_norm", frozenset({"layer_norm"}), "rowwise", row_wise=True),
    KernelKind("rms_norm", frozenset({"rms_norm"}), "rowwise", row_wise=True),
    KernelKind("matmul", frozenset({"matmul"}), "matmul", contraction=True, fusible=True, macs=_matmul_macs),
    KernelKind("matmul_mx", frozenset({"matmul_mx"}), "matmul_mx", contraction=True, fusible=True, macs=_matmul_macs),
    KernelKind("attention", frozenset({"attention"}), "attention", contraction=True, macs=_attention_macs),
    KernelKind("conv", frozenset({"conv"}), "conv", contraction=True, fusible=True, macs=_conv_macs, window=True,
               prefetch=True),
    KernelKind("pool", frozenset({"pool"}), "window", fusible=True, window=True),
    KernelKind("gather", ir.OPS_GATHER, "movement"),
    KernelKind("random", ir.OPS_RANDOM, "random"),
    KernelKind("movement", ir.OPS_MOVEMENT, "movement"),
)}
KIND_OF_OP = {op: kind.name for kind in KINDS.values() for op in kind.ops}   # fuse: the kind a node opens


def kernel_macs(kernel: ir.Kernel) -> int:
    """MACs the model asks of `kernel`: its matmul or attention as eager computes them, 0 for other kinds (no
    extra work of a kernel's tiling counts, unlike the executed MACs of the performance model)."""
    macs = KINDS[kernel.kind].macs
    return macs(kernel.nodes[0]) if macs else 0
