"""The tensor IR between capture and tiling: a graph of typed nodes, printable and verified.

One Node is one operation producing one tensor (shape, dtype). Capture imports Core ATen nodes as
`aten.*` ops with their arguments in `attrs`; legalize rewrites them into the trnc op set below,
which every later pass understands. The op families are named sets (OPS_*), the only place
families are listed. Fuse groups nodes into Kernels; precision, layout and tile annotate them.
networkx serves the graph algorithms (order, users, fusion groups).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

from trnc.errors import VerifyError
from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.isa.enums import ActFunc, AluOp

if TYPE_CHECKING:
    import torch

# -- the trnc op set (after legalize) --------------------------------------------------------------
OPS_SOURCE = frozenset({"input", "const"})
# unary functions: ScalarE's (isa ActFunc), named as in assembly, plus the IR-only ones, which the kernels
# lower to other instructions: neg is a tensor_scalar multiply by -1
UNARY_IR_ONLY = frozenset({"neg"})
UNARY_FUNCS = frozenset(f.text for f in ActFunc) | UNARY_IR_ONLY
# binary ops: the ALU's (isa AluOp) but bypass, which is tensor_scalar's "no second op", not an operation;
# both operands broadcast (numpy rules) to the node's shape
BINARY_OPS = frozenset(op.text for op in AluOp if op is not AluOp.BYPASS)
OPS_ELEMENTWISE = frozenset({"unary", "binary", "scalar", "where", "cast"})
OPS_REDUCE = frozenset({"reduce"})                       # attrs op (sum/max/min), axes, keepdim
OPS_NORM = frozenset({"layer_norm", "rms_norm"})                  # normalize rows over the last axis
OPS_ROWWISE = frozenset({"softmax", "log_softmax"}) | OPS_NORM     # over the last axis
OPS_CONTRACT = frozenset({"matmul", "attention", "conv", "matmul_mx"})
# sliding windows over [N, C, H, W] (attrs: docs/ir.md; output size: window_out_size)
OPS_WINDOW = frozenset({"conv", "pool"})
OPS_GATHER = frozenset({"gather"})                       # table [V, D], index int32 [...] -> [..., D]
# uniform draws in (0, 1), fp32, no inputs; attrs stream (distinct per node): element i (row-major) is the
# draw of counter i in that stream under the run's seed (isa opcode `random`)
OPS_RANDOM = frozenset({"random"})
# movement: views when the strides allow it, else one DMA copy (never through the host)
OPS_MOVEMENT = frozenset({"reshape", "permute", "expand", "slice", "cat", "copy"})
TRNC_OPS = (OPS_SOURCE | OPS_ELEMENTWISE | OPS_REDUCE | OPS_ROWWISE | OPS_CONTRACT | OPS_WINDOW | OPS_GATHER
            | OPS_RANDOM | OPS_MOVEMENT)

_names = itertools.count()


def window_out_size(size: int, kernel: int, stride: int, pad: tuple[int, int], dilation: int = 1,
                    input_dilation: int = 1) -> int:
    """Outputs of a sliding window along one dim: `size` inputs placed `input_dilation` apart between `pad` =
    (before, after) fill elements, windows of `kernel` taps `dilation` apart, every `stride`-th start."""
    span = pad[0] + (size - 1) * input_dilation + 1 + pad[1]
    return (span - dilation * (kernel - 1) - 1) // stride + 1


@dataclass(frozen=True)
class TensorArg:
    """A tensor operand inside an aten node's args (capture puts it there, legalize reads it): its position in
    node.inputs and its torch dtype."""

    index: int
    dtype: torch.dtype


@dataclass(eq=False)
class Node:
    """One operation and the tensor it produces.

    `source` is the user's line ("model.py:12: return self.fc(x)") from the fx node's stack trace,
    so every error about a node can name where it came from; `module` its nn.Module path, which per-layer
    precision overrides (Options.keep_precision) match.
    """

    op: str
    inputs: tuple["Node", ...]
    shape: tuple[int, ...]
    dtype: DType
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    source: str = ""
    module: str = ""     # the nn.Module path it came from ("encoder.layer.0.attention.self.query"), "" if unknown

    def __post_init__(self):
        self.inputs = tuple(self.inputs)
        self.shape = tuple(int(s) for s in self.shape)
        if not self.name:
            self.name = f"v{next(_names)}"

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def where(self) -> str:
        """' (at model.py:12: ...)' for error messages, or '' when the source is unknown."""
        return f" (at {self.source})" if self.source else ""

    def __repr__(self) -> str:
        return f"<{self.op} %{self.name} {self.dtype.text}{list(self.shape)}>"


@dataclass(frozen=True)
class KernelPlan:
    """What passes/graph/plan.py decided about a kernel from its neighbours, fixed before tile: the tile pass and the
    kernel lowerings only read it, so no choice that spans two kernels is made while lowering one of them."""

    partition_dim: Any = None    # the output dim on the partitions: layout's, or "m" for a rows hand-over
    row_tiles: bool = False      # a neighbour is row-wise: a matmul works in tiles of 128 rows beside it
    keep: bool = False           # the result may stay in SBUF for the next kernel instead of going to HBM (a
                                 # window kernel's image: for every window kernel that reads it, reads_image;
                                 # a norm's: only as the transposed copy)
    transposed: bool = False     # a norm also leaves the next matmul its result's transpose in SBUF
    feature_major: bool = False  # a matmul result [*batch, M, N] is stored as [N, *batch, M]

    def text(self) -> str:
        flags = [name for name in ("row_tiles", "keep", "transposed", "feature_major") if getattr(self, name)]
        return " ".join([f"partition_dim={self.partition_dim}"] + flags)


@dataclass(eq=False)
class Kernel:
    """A fusion group: nodes computed together on chip, reading `inputs` from HBM, writing `output`.

    kind: a row of passes/graph/kernel_kinds.py. Precision sets `compute_dtype`; layout sets `partition_dim`
    (the output dim on the 128 partitions by the kernel's own cost; for matmul 'm' or 'n'); plan sets
    `plan`, which tile reads.
    """

    kind: str
    nodes: list[Node]
    compute_dtype: DType | None = None
    partition_dim: Any = None
    plan: KernelPlan | None = None

    @property
    def output(self) -> Node:
        return self.nodes[-1]

    @property
    def inputs(self) -> list[Node]:
        inside = set(self.nodes)
        seen: dict[Node, None] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i not in inside:
                    seen.setdefault(i)
        return list(seen)


@dataclass(eq=False)
class Graph:
    """Nodes in topological order; `inputs` are the user inputs in call order, `outputs` the flat results."""

    nodes: list[Node]
    inputs: list[Node]
    outputs: list[Node]
    kernels: list[Kernel] | None = None   # set by fuse

    def users(self) -> dict[Node, list[Node]]:
        users: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                users.setdefault(i, []).append(n)
        return users

    def to_networkx(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(self.nodes)
        g.add_edges_from((i, n) for n in self.nodes for i in n.inputs)
        return g

    def prune(self) -> int:
        """Drop nodes no output depends on and restore topological order; returns the number dropped."""
        g = self.to_networkx()
        live = set(self.outputs) | set(self.inputs)
        for out in self.outputs:
            live |= nx.ancestors(g, out)
        kept = [n for n in nx.lexicographical_topological_sort(g.subgraph(live), key=_order_key(self.nodes))]
        dropped = len(self.nodes) - len(kept)
        self.nodes = kept
        return dropped

    def text(self) -> str:
        return format_graph(self)


def _order_key(nodes: list[Node]):
    position = {n: i for i, n in enumerate(nodes)}
    return lambda n: position.get(n, len(position))


def _attr_text(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array{list(value.shape)}"
    if isinstance(value, DType):
        return value.text
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_node(n: Node) -> str:
    attrs = {k: v for k, v in n.attrs.items() if k != "value" or not isinstance(v, np.ndarray)}
    if "value" in n.attrs and isinstance(n.attrs["value"], np.ndarray):
        attrs["value"] = n.attrs["value"]
    args = ", ".join(f"%{i.name}" for i in n.inputs)
    attr_text = " {" + ", ".join(f"{k}={_attr_text(v)}" for k, v in attrs.items()) + "}" if attrs else ""
    where = f"  # {n.source}" if n.source else ""
    return f"%{n.name}: {n.dtype.text}{list(n.shape)} = {n.op}({args}){attr_text}{where}"


def format_graph(graph: Graph) -> str:
    """Readable text: one node per line, kernels marked when fuse has run, then the outputs."""
    kernel_of = {}
    for k_index, k in enumerate(graph.kernels or []):
        for n in k.nodes:
            kernel_of[n] = f"k{k_index}:{k.kind}"
    lines = [f"graph({', '.join('%' + i.name for i in graph.inputs)}) {{"]
    for n in graph.nodes:
        mark = f"[{kernel_of[n]}] " if n in kernel_of else ""
        lines.append(f"  {mark}{format_node(n)}")
    lines.append(f"  return ({', '.join('%' + o.name for o in graph.outputs)})")
    lines += [f"  {format_kernel(k_index, k)}" for k_index, k in enumerate(graph.kernels or [])]
    lines.append("}")
    return "\n".join(lines)


def format_kernel(k_index: int, k: Kernel) -> str:
    """'k3 matmul: compute bf16, partition_dim n, plan partition_dim=n keep': what precision, layout and plan
    decided about the kernel."""
    dtype = k.compute_dtype.text if k.compute_dtype else "-"
    plan = f", plan {k.plan.text()}" if k.plan else ""
    return f"k{k_index} {k.kind}: compute {dtype}, partition_dim {k.partition_dim}{plan}"


# -- verifier ---------------------------------------------------------------------------------------

def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def is_torch_op(op: str) -> bool:
    """A capture-level op, which legalize rewrites: torch's 'namespace.name.overload' (aten's, or a custom op's);
    trnc's op names have no dot."""
    return "." in op


def _check_node(n: Node, legalized: bool) -> str | None:
    """The broken rule of `n` as text, or None."""
    if is_torch_op(n.op) or n.op == "getitem":
        return f"capture-level op {n.op} remains after legalize" if legalized else None
    if n.op not in TRNC_OPS:
        return f"unknown op '{n.op}'"
    ins = [i.shape for i in n.inputs]
    a = n.attrs
    if n.op == "unary" and a.get("func") not in UNARY_FUNCS:
        return f"unary func {a.get('func')!r} is not one of {sorted(UNARY_FUNCS)}"
    if n.op in ("binary", "scalar") and a.get("op") not in BINARY_OPS:
        return f"binary op {a.get('op')!r} is not one of {sorted(BINARY_OPS)}"
    if n.op in ("binary", "where") and _broadcast(*ins) != n.shape:
        return f"operand shapes {ins} do not broadcast to {list(n.shape)}"
    if n.op in ("unary", "scalar", "cast", "softmax", "log_softmax", "copy") and ins[0] != n.shape:
        return f"shape {list(n.shape)} differs from its operand's {list(ins[0])}"
    if n.op == "matmul":
        (sa, sb), scale = ins[:2], ins[2:]
        q = a.get("quantize")
        if len(ins) != 2 + (q is not None and "scale" not in q) or (scale and scale[0] != ()):
            return "matmul takes two operands, and a 0-d scale when it quantizes one at run time (attribute quantize)"
        if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
            return f"matmul of {list(sa)} and {list(sb)}: contraction sizes differ"
        batch = _broadcast(sa[:-2], sb[:-2])
        if batch is None or n.shape != (*batch, sa[-2], sb[-1]):
            return f"matmul of {list(sa)} and {list(sb)} cannot give {list(n.shape)}"
    if n.op in OPS_WINDOW:
        return _check_window(n, ins)
    if n.op == "matmul_mx":
        (sa, sw, ss) = ins
        if len(sa) < 2 or len(sw) != 2 or sa[-1] != sw[0] or sw[0] % MX_BLOCK or ss != (sw[0] // MX_BLOCK, sw[1]) \
                or n.shape != (*sa[:-1], sw[1]):
            return f"matmul_mx of {list(sa)} by {list(sw)} with scales {list(ss)} cannot give {list(n.shape)}"
    if n.op == "reshape" and n.numel != n.inputs[0].numel:
        return f"reshape of {n.inputs[0].numel} elements to {list(n.shape)}"
    if n.op == "permute" and tuple(ins[0][d] for d in a["dims"]) != n.shape:
        return f"permute {a['dims']} of {list(ins[0])} is not {list(n.shape)}"
    if n.op == "expand" and _broadcast(ins[0], n.shape) != n.shape:
        return f"{list(ins[0])} does not expand to {list(n.shape)}"
    if n.op == "reduce" and a.get("op") not in ("sum", "max", "min"):
        return f"reduce op {a.get('op')!r} is not sum, max or min"
    if n.op in OPS_NORM and ins[0] != n.shape:
        return f"{n.op} output {list(n.shape)} differs from its input {list(ins[0])}"
    if n.op == "random" and (ins or n.dtype is not DType.FP32 or not isinstance(a.get("stream"), int)):
        return "random takes no operands, is fp32 and has an int attribute stream"
    if n.op == "const" and not isinstance(a.get("value"), np.ndarray):
        return "const without an array value"
    return None


def _check_window(n: Node, ins: list[tuple[int, ...]]) -> str | None:
    a, x = n.attrs, ins[0]
    if len(x) != 4 or len(n.shape) != 4:
        return f"{n.op} of {list(x)} to {list(n.shape)}: input and output must be [N, C, H, W]"
    if n.op == "conv":
        cin_g, kh, kw, cout = ins[1]
        kernel, channels = (kh, kw), (cout, x[1] // a["groups"])
        if x[1] % a["groups"] or cout % a["groups"] or cin_g != x[1] // a["groups"]:
            return f"conv of {list(x)} with weight {list(ins[1])} in {a['groups']} groups: channels do not divide"
    else:
        kernel, channels = a["kernel"], (x[1], None)
        if a.get("op") not in ("max", "sum"):
            return f"pool op {a.get('op')!r} is not max or sum"
    pads, lhs = a["padding"], a.get("input_dilation", (1, 1))
    if min(pads) < 0 or min(a["stride"]) < 1 or min(a["dilation"]) < 1 or min(lhs) < 1:
        return f"{n.op} with padding {pads}, stride {a['stride']}, dilation {a['dilation']}: out of range"
    sizes = tuple(window_out_size(x[2 + d], kernel[d], a["stride"][d], pads[2 * d:2 * d + 2], a["dilation"][d],
                                  lhs[d]) for d in (0, 1))
    if n.shape != (x[0], channels[0], *sizes):
        return f"{n.op} of {list(x)} gives [{x[0]}, {channels[0]}, {sizes[0]}, {sizes[1]}], not {list(n.shape)}"
    return None


def verify(graph: Graph, *, legalized: bool = True) -> None:
    """Check every node's rule and that inputs come before users; raise VerifyError naming the node."""
    seen: set[Node] = set()
    for n in graph.nodes:
        for i in n.inputs:
            if i not in seen:
                raise VerifyError(f"%{n.name} ({n.op}) uses %{i.name} before it is defined{n.where()}")
        problem = _check_node(n, legalized)
        if problem:
            raise VerifyError(f"%{n.name} = {n.op}: {problem}{n.where()}\n  {format_node(n)}")
        seen.add(n)
    for o in graph.outputs:
        if o not in seen:
            raise VerifyError(f"output %{o.name} is not a node of the graph")
    if graph.kernels is not None:
        grouped = [n for k in graph.kernels for n in k.nodes]
        if len(grouped) != len(set(grouped)):
            raise VerifyError("a node belongs to two kernels")
        _verify_plans(graph)


def _verify_plans(graph: Graph) -> None:
    """Once plan has run, every kernel has a plan and each hand-over has the reader it is made for: a result
    kept in SBUF and never stored must be read by the next kernel alone, or a reader gets a stale HBM tensor."""
    planned = [k.plan is not None for k in graph.kernels]
    if not any(planned):
        return
    if not all(planned):
        raise VerifyError(f"kernel k{planned.index(False)} has no plan while others have one")
    users = graph.users()
    for index, k in enumerate(graph.kernels):
        problem = _check_plan(graph, index, users)
        if problem:
            raise VerifyError(f"kernel k{index} ({k.kind}) plan {k.plan.text()}: {problem}{k.output.where()}")


def reads_image(kernel: Kernel, user: Node, image: Node) -> bool:
    """Whether `user`, a node of `kernel`, can read the image [N, C, H, W] `image` from SBUF, where a window kernel
    keeps it (passes/graph/plan.py): as the input x of a window kernel's first node, or as an operand of the same
    shape in its epilogue."""
    first = kernel.nodes[0]
    if first.op not in OPS_WINDOW or len(image.shape) != 4:
        return False
    if user is first:
        return first.inputs[0] is image and image not in first.inputs[1:]
    return user.shape == image.shape


def same_matrix(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether shapes a and b are one matrix, with or without leading unit dims ([1, 256, 512] and [256, 512])."""
    return len(a) >= 2 and len(b) >= 2 and a[-2:] == b[-2:] and all(d == 1 for d in a[:-2] + b[:-2])


def hand_over_reader(graph: Graph, index: int, users: dict) -> tuple[int | None, Node]:
    """The kernel a hand-over of kernel `index`'s result goes to, and the value that kernel reads: the next kernel,
    past reshapes that only add or drop leading unit dims of the result (GPT-2's `x.view(-1, x.size(-1))` around
    each linear), each the one reader of the value before it; (None, result) at the end of the graph."""
    kernels = graph.kernels
    value, at = kernels[index].output, index + 1
    while at < len(kernels) and kernels[at].kind == "movement" and value not in graph.outputs:
        view = kernels[at].output
        if view.op != "reshape" or view.inputs[0] is not value or users[value] != [view] \
                or not same_matrix(value.shape, view.shape):
            break
        value, at = view, at + 1
    return (at if at < len(kernels) else None), value


def _check_plan(graph: Graph, index: int, users: dict) -> str | None:
    """The broken rule of kernel `index`'s plan as text, or None."""
    kernel, plan = graph.kernels[index], graph.kernels[index].plan
    out, op = kernel.output, kernel.nodes[0].op
    at, value = hand_over_reader(graph, index, users)
    reader = graph.kernels[at].nodes[0] if at is not None else None
    first_operand = reader is not None and reader.inputs[:1] == (value,) and value not in reader.inputs[1:]
    if plan.partition_dim != kernel.partition_dim and not (plan.keep and op == "matmul"):
        return f"partition_dim differs from layout's {kernel.partition_dim!r} without a matmul's hand-over"
    if plan.keep and op in OPS_WINDOW:
        kernel_of = {n: k for k in graph.kernels for n in k.nodes}
        if out in graph.outputs or not all(u in kernel_of and reads_image(kernel_of[u], u, out) for u in users[out]):
            return "keeps in SBUF an image that a kernel other than a window kernel's input or epilogue reads"
    elif plan.keep:
        wanted = "m" if reader is not None and reader.op in OPS_ROWWISE else "n"
        if (op != "matmul" and op not in OPS_NORM) or not first_operand or users[value] != [reader] \
                or value in graph.outputs:
            return "keeps in SBUF a result the next kernel alone does not read as its first operand"
        if op in OPS_NORM and not plan.transposed:
            return "keeps a norm's result in SBUF without a transposed hand-over"
        if op == "matmul" and (plan.partition_dim != wanted or reader.op not in OPS_ROWWISE | {"matmul"}):
            return f"keeps a result for a {reader.op} with partition_dim {plan.partition_dim!r}"
    if plan.transposed and (op not in OPS_NORM or not first_operand or reader.op != "matmul"):
        return "a transposed hand-over from a kernel other than a norm read by the next matmul"
    if plan.feature_major and (op != "matmul" or plan.partition_dim != "n" or out in graph.outputs):
        return "a feature-major store of a result that is not an inner matmul result with N on the partitions"
    return None
