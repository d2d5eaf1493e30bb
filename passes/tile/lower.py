"""tile: every kernel of the graph to tile instructions, values between kernels in HBM (a few kept in SBUF).

Inputs, constants and outputs become INPUT, CONST and OUTPUT tensors; each kernel's result gets a
SCRATCH tensor (or the OUTPUT tensor directly when it is a result of the model). Movement nodes
that the strides allow (reshape, permute, expand, slice) become views at no cost; their consumers
read through them. What crosses kernels was decided by the plan pass (passes/graph/plan.py, each kernel's
ir.KernelPlan): a feature-major result gets [N, *batch, M] storage here, and the SBUF tile a kernel
returns for its reader (a kept result, a transposed copy) is registered in the tile program here, so
the reader finds it. The lowering of each kernel kind lives in passes/tile/kernels/.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from trnc import ir
from trnc.errors import TrncError
from trnc.isa.program import TensorKind
from trnc.options import ROUNDINGS
from trnc.passes.graph.kernel_kinds import KINDS
from trnc.passes.tile import kernels
from trnc.passes.tile.kernels.movement import copy_view
from trnc.passes.tile.tiles import HbmView, TileBuilder, TileProgram, contiguous_strides


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


def view_of(node: ir.Node, src: HbmView) -> HbmView | None:
    """The view a movement node gives of its input's view, or None when it needs a copy."""
    a = node.attrs
    if node.op == "reshape":
        return src.reshape(node.shape)
    if node.op == "permute":
        return src.permute(a["dims"])
    if node.op == "expand":
        return src.expand(node.shape)
    if node.op == "slice":
        return src.narrow(a["dim"], a["start"], a["stop"], a.get("step", 1))
    if node.op == "copy":
        return src
    return None


def _inverse(chain: list[ir.Node], end: HbmView) -> HbmView | None:
    """The view of the chain's first input that `end` (a view of the chain's last node) corresponds to."""
    view = end
    for n in reversed(chain):
        if n.op == "permute":
            dims = n.attrs["dims"]
            view = view.permute([dims.index(d) for d in range(len(dims))])
        else:
            view = view.reshape(n.inputs[0].shape)
            if view is None:
                return None
    return view


class _GraphLowering:
    def __init__(self, state):
        self.graph: ir.Graph = state.graph
        self.tp = TileProgram(state.hw, rounding=ROUNDINGS[state.options.rounding], seed=state.options.seed)
        self.views: dict[ir.Node, HbmView] = {}
        self.kb = TileBuilder(self.tp)
        self.output_nodes = {n for n in self.graph.outputs}
        self.owned_outputs: dict[ir.Node, str] = {}
        self.users = self.graph.users()

    def view(self, node: ir.Node) -> HbmView:
        if node not in self.views and node.op == "const":
            value = node.attrs["value"]
            self.views[node] = self.kb.tensor(f"c_{_safe(node.name)}", TensorKind.CONST, node.dtype, node.shape,
                                              value=value.reshape(node.shape))
        return self.views[node]

    def result_tensor(self, node: ir.Node) -> HbmView:
        if node in self.output_nodes and node not in self.owned_outputs:
            name = f"out{self.graph.outputs.index(node)}"
            self.owned_outputs[node] = name
            return self.kb.tensor(name, TensorKind.OUTPUT, node.dtype, node.shape)
        return self.kb.tensor(f"t_{_safe(node.name)}", TensorKind.SCRATCH, node.dtype, node.shape)

    def storage_for(self, node: ir.Node) -> HbmView:
        """Where a kernel writes `node`. When the result only feeds a chain of reshapes and permutes (a
        head split or merge, a model output's view), the tensor takes the chain end's shape and the kernel
        writes through the inverse view: the chain's consumers then read it contiguous, and a model
        output needs no copy."""
        chain = [node]
        while chain[-1] not in self.output_nodes:
            users = self.users[chain[-1]]
            if len(users) != 1 or users[0].op not in ("reshape", "permute") or users[0].dtype != node.dtype:
                break
            chain.append(users[0])
        for end in range(len(chain) - 1, 0, -1):
            probe = HbmView(0, node.dtype, chain[end].shape, contiguous_strides(chain[end].shape))
            back = _inverse(chain[1:end + 1], probe)
            if back is None:
                continue
            storage = self.result_tensor(chain[end])
            view = replace(back, tensor=storage.tensor)
            forward = view
            for n in chain[1:end + 1]:
                forward = view_of(n, forward)
                self.views[n] = forward
            self.views[chain[end]] = storage
            return view
        return self.result_tensor(node)

    def feature_major(self, kernel: ir.Kernel) -> HbmView:
        """Storage [N, *batch, M] for a matmul result [*batch, M, N] the plan stores feature-major."""
        out = kernel.output
        *lead, m, n = out.shape
        storage = self.kb.tensor(f"t_{_safe(out.name)}_t", TensorKind.SCRATCH, out.dtype, (n, *lead, m))
        return storage.permute((*range(1, len(out.shape)), 0))

    def run(self) -> TileProgram:
        for i, n in enumerate(self.graph.inputs):
            name = f"in{i}"
            self.views[n] = self.kb.tensor(name, TensorKind.INPUT, n.dtype, n.shape)
            self.tp.inputs.append(name)
        for k_index, kernel in enumerate(self.graph.kernels):
            if kernel.plan is None:
                raise TrncError(f"kernel k{k_index} ({kernel.kind}) has no plan: run the plan pass before tile")
            self.kb.kernel = f"k{k_index}"
            out = kernel.output
            ins = {n: self.view(n) for n in kernel.inputs}
            if out in self.views:   # a view its producer already wrote through (storage_for)
                continue
            if kernel.kind == "movement" and out.op != "cat":
                src = ins[out.inputs[0]]
                view = view_of(out, src)
                if view is None:   # a reshape the strides do not allow: copy to a contiguous tensor first
                    tmp = self.kb.tensor(f"t_{_safe(out.name)}_c", TensorKind.SCRATCH, src.dtype, src.shape)
                    copy_view(self.kb, src, tmp)
                    view = tmp.reshape(out.shape)
                if out not in self.output_nodes:
                    self.views[out] = view
                    continue
                target = self.result_tensor(out)
                copy_view(self.kb, view, target)
            else:
                target = self.feature_major(kernel) if kernel.plan.feature_major else self.storage_for(out)
                on_chip = kernels.lowering(kernel.kind)(self.kb, kernel, ins, target, kernel.plan)
                if on_chip is not None:   # the hand-over the plan asked for, which the kernel's tiling allowed
                    registry = self.tp.transposed if kernel.plan.transposed else \
                        self.tp.resident if KINDS[kernel.kind].window else self.tp.kept
                    registry[target.tensor] = on_chip
            self.views[out] = target
        self.kb.kernel = "out"
        for i, n in enumerate(self.graph.outputs):
            name = f"out{i}"
            if self.owned_outputs.get(n) != name:
                target = self.kb.tensor(name, TensorKind.OUTPUT, n.dtype, n.shape)
                copy_view(self.kb, self.view(n), target)
            self.tp.outputs.append(name)
        _check_hbm(self.tp)
        return self.tp


def _check_hbm(tp: TileProgram) -> None:
    """A model whose tensors do not fit the target's HBM is an error naming the largest, never a wrong run."""
    total = sum(t.num_bytes for t in tp.tensors)
    if total > tp.hw.hbm_bytes:
        largest = sorted(tp.tensors, key=lambda t: -t.num_bytes)[:3]
        names = ", ".join(f"{t.name} {t.dtype.text}{list(t.shape)} ({t.num_bytes / 2**30:.2f} GiB)" for t in largest)
        raise TrncError(f"the model needs {total / 2**30:.2f} GiB of HBM but {tp.hw.name} has "
                        f"{tp.hw.hbm_bytes / 2**30:.0f} GiB per core; largest tensors: {names}. Use smaller inputs, "
                        "bf16 weights (precision='bf16'), or a target with more HBM")


@dataclass(frozen=True)
class LowerToTiles:
    """Lower every kernel to tile instructions (passes/tile/kernels/) as its plan says; values between kernels live in
    HBM, but for the hand-overs in SBUF the plan asked for and the kernels made."""

    name: str = "tile"

    def run(self, state) -> dict:
        state.tiles = _GraphLowering(state).run()
        return {"tile_instructions": len(state.tiles.instrs), "buffers": len(state.tiles.buffers),
                "hbm_tensors": len(state.tiles.tensors), "kept_on_chip": len(state.tiles.kept),
                "images_on_chip": len(state.tiles.resident),
                "transposed_on_chip": len(state.tiles.transposed)}
