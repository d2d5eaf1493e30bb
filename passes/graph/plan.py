"""plan: every decision that crosses kernels, made once from the graph and fixed on each kernel (ir.KernelPlan).

Layout chooses each kernel's partition dim by the kernel's own cost; what a kernel does for its
neighbours is decided here, before tile, so the tile pass and the kernel lowerings only read it:

- rows hand-over (keep, partition_dim "m"): a matmul whose result only the next kernel, a row-wise
  one, reads as its x (the out-projection and FFN2 sums before a transformer's layer norms) evacuates
  each 128-row tile into SBUF, where the row-wise kernel reads it, when the rows fill whole 128-row
  tiles and take at most KEEP_BYTES per partition. Tokens then go on the partitions whatever layout
  chose: the HBM round trip saved (3.1 MB per layer norm of BERT-base at sequence 512) outweighs a
  per-feature bias becoming a full tile.
- features kept (keep, partition_dim "n"): a matmul result whose only reader is the next matmul, as
  its contraction operand, stays in SBUF feature-major when it fits (FFN1 -> FFN2: 6.3 MB of DMA at
  sequence 512); the buffer is live only across the two kernels, whose blockings leave room for it.
  Features go on the partitions whatever layout chose (GPT-2's FFN1 costs the same either way alone).
- the kernel a hand-over goes to is the next one past reshapes that only add or drop leading unit dims
  (ir.hand_over_reader): GPT-2's linears view their input as [tokens, features] and their result back.
- transposed hand-over: a layer norm (or RMS norm) read by the next matmul as its `a` operand also leaves that
  matmul its transpose in SBUF (C on the partitions of both operands); the HBM copy is still stored
  for the other readers, and only then (keep: the matmul is the only reader, as in a pre-norm layer).
- feature-major stores: a matmul result with N on the partitions that only matmuls and attentions
  read (through views) is stored [N, *batch, M], so stores and loads are whole rows (lower.py).
- row tiles: a matmul next to a row-wise kernel streams its rows in 128-row tiles, so the two
  overlap tile by tile (matmul_plan.make_plan).
- images kept (keep, a window kernel): a convolution's or pooling's result [N, C, H, W] that only window
  kernels read, as their input or in their epilogue (a residual), stays in SBUF with channels on the
  partitions from its producer to its last reader, when every kernel in between is a window kernel and the
  images kept at once take at most KEEP_IMAGE_BYTES per partition. A CNN's activations then stay on chip from
  layer to layer (ResNet-50 at batch 1 moves 51 MB of weights through HBM and had 64 MB of activation reads and
  writes besides); its readers take the image's bands as views of the tile, or copy them into a padded band.

A kernel may still decline a hand-over its tiling cannot make (matmul.py, rowwise.py); its reader then
reads HBM. The IR verifier checks that every hand-over has the reader it is made for.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from trnc import ir
from trnc.isa.config import PARTITIONS
from trnc.passes.graph.kernel_kinds import KINDS

KEEP_BYTES = 32 * 1024   # bytes per partition a value kept in SBUF between two kernels may take (of 192 KiB)
KEEP_IMAGE_BYTES = 48 * 1024   # bytes per partition of the images window kernels keep in SBUF at once
VIEW_OPS = ("reshape", "permute", "slice", "expand", "copy")   # movement nodes tile turns into views


def hands_rows_on_chip(graph: ir.Graph, index: int, users: dict) -> bool:
    """Whether kernel `index`, a matmul, may hand its result [*lead, M, N] to the next kernel, a row-wise one,
    in SBUF: that kernel is its only reader, as its input x, one b serves every batch index (the rows fold
    into one M), the rows fill whole 128-row tiles, and they take at most KEEP_BYTES per partition."""
    kernels = graph.kernels
    kernel = kernels[index]
    at, out = ir.hand_over_reader(graph, index, users)
    if kernel.kind != "matmul" or at is None or not KINDS[kernels[at].kind].row_wise:
        return False
    reader, weight = kernels[at].nodes[0], kernel.nodes[0].inputs[1]
    if users[out] != [reader] or reader.inputs[0] is not out or out in graph.outputs or len(out.shape) < 2:
        return False
    if math.prod(weight.shape[:-2]) != 1:
        return False
    rows = math.prod(out.shape[:-1])
    return rows % PARTITIONS == 0 and rows // PARTITIONS * out.shape[-1] * out.dtype.itemsize <= KEEP_BYTES


def keeps_features_on_chip(graph: ir.Graph, index: int, users: dict) -> bool:
    """Whether kernel `index`, a matmul, may leave its result [M, N] with N on the partitions in SBUF for the
    next kernel's matmul, its only reader, as its `a` operand (read as a^T: K = N on the partitions, as the
    producer evacuates it): no batch, N a multiple of 128, the reader computing in the value's dtype, and at
    most KEEP_BYTES per partition."""
    kernels = graph.kernels
    kernel = kernels[index]
    at, out = ir.hand_over_reader(graph, index, users)
    if kernel.kind != "matmul" or at is None:
        return False
    nxt = kernels[at]
    if nxt.kind != "matmul" or users[out] != [nxt.nodes[0]] or out in graph.outputs or len(out.shape) < 2:
        return False
    *lead, m, n = out.shape
    reader = nxt.nodes[0]
    return (reader.inputs[0] is out and reader.inputs[1] is not out and math.prod(lead) == 1
            and n % PARTITIONS == 0 and (nxt.compute_dtype or out.dtype) == out.dtype
            and n // PARTITIONS * m * out.dtype.itemsize <= KEEP_BYTES)


def hands_transpose_on_chip(graph: ir.Graph, index: int, users: dict) -> bool:
    """Whether kernel `index`, a layer or RMS norm, may also leave its result [*lead, C] transposed in SBUF for the
    next kernel, a matmul that reads it as its `a` operand in its own dtype: the rows fill whole 128-row
    tiles, C whole 128-partition blocks, and the copy takes at most KEEP_BYTES per partition."""
    kernels = graph.kernels
    at, out = ir.hand_over_reader(graph, index, users)
    if kernels[index].nodes[0].op not in ir.OPS_NORM or at is None or kernels[at].kind != "matmul":
        return False
    nxt = kernels[at]
    reader = nxt.nodes[0]
    if reader.inputs[0] is not out or reader.inputs[1] is out or (nxt.compute_dtype or out.dtype) != out.dtype:
        return False
    rows, c = math.prod(out.shape[:-1]), out.shape[-1]
    return rows % PARTITIONS == 0 and c % PARTITIONS == 0 and c // PARTITIONS * rows * out.dtype.itemsize <= KEEP_BYTES


def only_reader(graph: ir.Graph, index: int, users: dict) -> bool:
    """Whether the kernel a hand-over of kernel `index` goes to is the only reader of its result."""
    at, value = ir.hand_over_reader(graph, index, users)
    return at is not None and value not in graph.outputs and users[value] == [graph.kernels[at].nodes[0]]


def stores_feature_major(graph: ir.Graph, kernel: ir.Kernel, partition_dim, users: dict, kernel_of: dict) -> bool:
    """Whether a matmul result [*batch, M, N] computed with N on the partitions is stored [N, *batch, M]: every
    kernel that reads it (through views) is a contraction (a matmul, an attention), which reads it with N on
    the partitions too. With N outermost both the producer's stores and the consumers' loads are whole rows
    of the tensor, and the schedule, which orders HBM accesses by their byte rows (isa/races.py footprints),
    lets a load of some features wait only for the stores of those features."""
    out = kernel.output
    if kernel.kind != "matmul" or partition_dim != "n" or len(out.shape) < 2:
        return False
    todo = [out]
    while todo:
        node = todo.pop()
        if node in graph.outputs:
            return False
        for user in users[node]:
            kind = kernel_of[user].kind if user in kernel_of else None
            if kind == "movement" and user.op in VIEW_OPS:
                todo.append(user)
            elif kind is None or not KINDS[kind].contraction:
                return False
    return True


def image_bytes(image: ir.Node) -> int:
    """Bytes per partition of an image [N, C, H, W] with channel c on partition c % 128, in block c // 128."""
    batch, channels, height, width = image.shape
    return math.ceil(channels / PARTITIONS) * batch * height * width * image.dtype.itemsize


def keeps_image_on_chip(graph: ir.Graph, index: int, users: dict, kernel_of: dict, live: list) -> bool:
    """Whether kernel `index`, a window kernel, may keep its image in SBUF for its readers (see the module
    docstring); `live` lists (last reader's kernel index, bytes) of the images kept by earlier kernels."""
    kernel = graph.kernels[index]
    out = kernel.output
    if not KINDS[kernel.kind].window or out in graph.outputs or not users[out]:
        return False
    if not all(u in kernel_of and ir.reads_image(kernel_of[u], u, out) for u in users[out]):
        return False
    position = {id(k): i for i, k in enumerate(graph.kernels)}
    last = max(position[id(kernel_of[u])] for u in users[out])
    if not all(KINDS[k.kind].window for k in graph.kernels[index:last + 1]):
        return False
    held = sum(size for end, size in live if end >= index)
    if held + image_bytes(out) > KEEP_IMAGE_BYTES:
        return False
    live.append((last, image_bytes(out)))
    return True


def _unit_view(node: ir.Node, kernel_of: dict) -> bool:
    """Whether `node` is a reshape kernel that only adds or drops leading unit dims (a view of the same matrix)."""
    return node in kernel_of and kernel_of[node].kind == "movement" and node.op == "reshape" \
        and ir.same_matrix(node.shape, node.inputs[0].shape)


def next_to_rows(kernel: ir.Kernel, users: dict, kernel_of: dict) -> bool:
    """Whether a kernel that reads the result of `kernel` or produces one of its inputs, past unit-dim views, is
    row-wise."""
    near, sources, results = [], list(kernel.inputs), [kernel.output]
    while sources:
        node = sources.pop()
        if _unit_view(node, kernel_of):
            sources.append(node.inputs[0])
        elif node in kernel_of:
            near.append(kernel_of[node])
    while results:
        for user in users[results.pop()]:
            if _unit_view(user, kernel_of):
                results.append(user)
            else:
                near.append(kernel_of[user])
    return any(KINDS[k.kind].row_wise for k in near)


def plan_kernels(graph: ir.Graph) -> Counter:
    """Set every kernel's plan; count the hand-overs."""
    users = graph.users()
    kernel_of = {n: k for k in graph.kernels for n in k.nodes}
    stats: Counter = Counter()
    live_images: list = []
    for index, kernel in enumerate(graph.kernels):
        rows = hands_rows_on_chip(graph, index, users)
        features = not rows and keeps_features_on_chip(graph, index, users)
        partition_dim = "m" if rows else "n" if features else kernel.partition_dim
        image = keeps_image_on_chip(graph, index, users, kernel_of, live_images)
        transposed = hands_transpose_on_chip(graph, index, users)
        plan = ir.KernelPlan(
            partition_dim=partition_dim,
            row_tiles=kernel.kind == "matmul" and next_to_rows(kernel, users, kernel_of),
            keep=rows or features or image or (transposed and only_reader(graph, index, users)),
            transposed=transposed,
            feature_major=stores_feature_major(graph, kernel, partition_dim, users, kernel_of))
        kernel.plan = plan
        stats.update({"rows_on_chip": rows, "features_on_chip": features, "images_on_chip": image,
                      "transposed_on_chip": plan.transposed,
                      "feature_major": plan.feature_major, "row_tiles": plan.row_tiles})
    return stats


@dataclass(frozen=True)
class PlanKernels:
    """Fix what crosses kernels (hand-overs in SBUF, orientation, row tiling, feature-major stores) on each kernel."""

    name: str = "plan"

    def run(self, state) -> dict:
        return dict(plan_kernels(state.graph))
