"""tile: every kernel of the graph to tile instructions, values between kernels in HBM (a few kept in SBUF).

Inputs, constants and outputs become INPUT, CONST and OUTPUT tensors; each kernel's result gets a
SCRATCH tensor (or the OUTPUT tensor directly when it is a result of the model). Movement nodes
that the strides allow (reshape, permute, expand, slice) become views at no cost; their consumers
read through them. A matmul result that only matmuls and attentions read, all with its N dim on the
partitions, is stored feature-major ([N, M]; feature_major). A matmul next to a row-wise kernel
streams its rows in 128-row tiles (KernelBuilder.row_tiles), so the two overlap tile by tile. A
feature-major result that only the next kernel's matmul reads, as its contraction operand, stays in
SBUF when it is small enough (keep_on_chip; the FFN1 -> FFN2 value of a transformer), and so do the
rows of a matmul result that only the next kernel, a row-wise one, reads (hands_rows_on_chip; the
out-projection and FFN2 sums before a transformer's layer norms). The lowering of each kernel kind
lives in passes/kernels/.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from trnc import ir
from trnc.errors import TrncError
from trnc.isa.config import PARTITIONS
from trnc.isa.program import TensorKind
from trnc.passes import kernels
from trnc.passes.kernels.movement import copy_view
from trnc.passes.tiles import HbmView, KernelBuilder, TileProgram, contiguous_strides


ROW_WISE = ("layer_norm", "softmax", "log_softmax")   # kernels that work in tiles of 128 rows
KEEP_BYTES = 32 * 1024   # bytes per partition a value kept in SBUF between two kernels may take (of 192 KiB)


def hands_rows_on_chip(graph: ir.Graph, index: int, users: dict) -> bool:
    """Whether kernel `index`, a matmul, may hand its result [*lead, M, N] to the next kernel, a row-wise one
    (a layer norm after a residual add), in SBUF: that kernel is its only reader, as its input x, the rows
    fill whole 128-row tiles, and they take at most KEEP_BYTES per partition. The layout pass then puts
    M (tokens) on the partitions, as the row-wise kernel wants them, and the matmul evacuates each row tile
    into SBUF where the row-wise kernel reads it (no HBM round trip between the two: 3.1 MB of DMA per
    layer norm of BERT-base at sequence 512)."""
    kernels = graph.kernels
    kernel = kernels[index]
    if kernel.kind != "matmul" or index + 1 >= len(kernels) or kernels[index + 1].kind not in ROW_WISE:
        return False
    out, reader, weight = kernel.output, kernels[index + 1].nodes[0], kernel.nodes[0].inputs[1]
    if users[out] != [reader] or reader.inputs[0] is not out or out in graph.outputs or len(out.shape) < 2:
        return False
    if math.prod(weight.shape[:-2]) != 1:   # one b for every batch index, so the rows fold into one M
        return False
    rows = math.prod(out.shape[:-1])
    return rows % PARTITIONS == 0 and rows // PARTITIONS * out.shape[-1] * out.dtype.itemsize <= KEEP_BYTES


def hands_transpose_on_chip(graph: ir.Graph, index: int, users: dict) -> bool:
    """Whether kernel `index`, a layer norm, may also leave its result [*lead, C] transposed in SBUF for the
    next kernel, a matmul that reads it as its `a` operand (C its contraction dim, on the partitions of
    both operands) in its own dtype: the rows fill whole 128-row tiles, C whole 128-partition blocks, and
    the copy takes at most KEEP_BYTES per partition. The layer norm transposes each normalized row tile on
    TensorE and applies its weight and bias as per-partition operands while evacuating; the matmul then
    starts on the first row tile without the HBM round trip (the result is still stored for its other
    readers, such as the residual add after FFN2)."""
    kernels = graph.kernels
    kernel = kernels[index]
    if kernel.kind != "layer_norm" or index + 1 >= len(kernels) or kernels[index + 1].kind != "matmul":
        return False
    out, nxt = kernel.output, kernels[index + 1]
    reader = nxt.nodes[0]
    if reader.inputs[0] is not out or reader.inputs[1] is out or (nxt.compute_dtype or out.dtype) != out.dtype:
        return False
    rows, c = math.prod(out.shape[:-1]), out.shape[-1]
    return rows % PARTITIONS == 0 and c % PARTITIONS == 0 and c // PARTITIONS * rows * out.dtype.itemsize <= KEEP_BYTES


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


class _Lowering:
    def __init__(self, state):
        self.graph: ir.Graph = state.graph
        self.tp = TileProgram(state.hw)
        self.views: dict[ir.Node, HbmView] = {}
        self.kb = KernelBuilder(self.tp)
        self.output_nodes = {n for n in self.graph.outputs}
        self.owned_outputs: dict[ir.Node, str] = {}
        self.users = self.graph.users()
        self.kernel_of = {n: k for k in self.graph.kernels for n in k.nodes}

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

    def next_to_rows(self, kernel: ir.Kernel) -> bool:
        """Whether a kernel that reads the result of `kernel` or produces one of its inputs is row-wise."""
        near = [self.kernel_of[i] for i in kernel.inputs if i in self.kernel_of]
        near += [self.kernel_of[u] for u in self.users[kernel.output]]
        return any(k.kind in ROW_WISE for k in near)

    def keep_on_chip(self, k_index: int) -> bool:
        """Whether kernel k_index's result may stay in SBUF (matmul.py keeps it when its tiling allows): a matmul
        with N on the partitions whose only reader is the next kernel's matmul, as its `a` operand [M, K] (read
        as a^T: K = N on the partitions, as the producer evacuates it), with no batch, N a multiple of 128, the
        consumer computing in the value's dtype, and at most KEEP_BYTES per partition. The value then never
        goes to HBM and back (FFN1 -> FFN2 of BERT-base at sequence 512: 6.3 MB of DMA), and the buffer is
        live only across the two kernels, whose plans leave SBUF room for it."""
        kernel, kernels = self.graph.kernels[k_index], self.graph.kernels
        out = kernel.output
        if kernel.kind != "matmul" or kernel.partition_dim != "n" or k_index + 1 >= len(kernels):
            return False
        nxt, users = kernels[k_index + 1], self.users[out]
        if nxt.kind != "matmul" or users != [nxt.nodes[0]] or out in self.output_nodes or len(out.shape) < 2:
            return False
        *lead, m, n = out.shape
        reader = nxt.nodes[0]
        return (reader.inputs[0] is out and reader.inputs[1] is not out and math.prod(lead) == 1
                and n % PARTITIONS == 0 and (nxt.compute_dtype or out.dtype) == out.dtype
                and n // PARTITIONS * m * out.dtype.itemsize <= KEEP_BYTES)

    def feature_major(self, kernel: ir.Kernel) -> HbmView | None:
        """Storage [N, *batch, M] for a matmul result [*batch, M, N] computed with N on the partitions, when
        every kernel that reads it (through views) is a matmul or an attention, else None.

        Those consumers read it with N on the partitions too (a matmul's contraction operand, an attention's
        Q^T and K^T per head), so with N outermost both the producer's stores and the consumers' loads are
        whole rows of the tensor. The schedule orders HBM accesses by their byte rows (isa/races.py
        footprints): a load of some features then waits only for the stores of those features (the first
        heads of an attention for the first column blocks of Q, K and V), where a transposed access, which
        spans the rows of all the tokens it touches, would wait for every store of its producer."""
        out = kernel.output
        if kernel.kind != "matmul" or kernel.partition_dim != "n" or len(out.shape) < 2:
            return None
        todo = [out]
        while todo:
            node = todo.pop()
            if node in self.output_nodes:
                return None
            for user in self.users[node]:
                kind = self.kernel_of[user].kind if user in self.kernel_of else None
                if kind == "movement" and user.op in ("reshape", "permute", "slice", "expand", "copy"):
                    todo.append(user)
                elif kind not in ("matmul", "attention"):
                    return None
        *lead, m, n = out.shape
        storage = self.kb.tensor(f"t_{_safe(out.name)}_t", TensorKind.SCRATCH, out.dtype, (n, *lead, m))
        return storage.permute((*range(1, len(out.shape)), 0))

    def run(self) -> TileProgram:
        for i, n in enumerate(self.graph.inputs):
            name = f"in{i}"
            self.views[n] = self.kb.tensor(name, TensorKind.INPUT, n.dtype, n.shape)
            self.tp.inputs.append(name)
        for k_index, kernel in enumerate(self.graph.kernels):
            self.kb.kernel = f"k{k_index}"
            self.kb.row_tiles = self.next_to_rows(kernel)
            self.kb.keep_on_chip = self.keep_on_chip(k_index) or (
                kernel.partition_dim == "m" and hands_rows_on_chip(self.graph, k_index, self.users))
            self.kb.transpose_on_chip = hands_transpose_on_chip(self.graph, k_index, self.users)
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
                target = self.feature_major(kernel) or self.storage_for(out)
                kernels.lowering(kernel.kind)(self.kb, kernel, ins, target)
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
class Tile:
    """Lower every kernel to tile instructions (passes/kernels/); values between kernels live in HBM, but for
    a matmul result kept in SBUF for the next matmul."""

    name: str = "tile"

    def run(self, state) -> dict:
        state.tiles = _Lowering(state).run()
        return {"tile_instructions": len(state.tiles.instrs), "buffers": len(state.tiles.buffers),
                "hbm_tensors": len(state.tiles.tensors), "kept_on_chip": len(state.tiles.kept),
                "transposed_on_chip": len(state.tiles.transposed)}
