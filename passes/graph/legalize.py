"""legalize: Core ATen nodes (from trnc/capture.py) to the trnc op set of ir.py, the first graph pass.

Each aten node is rewritten by its rule in `pm_legalize` (passes/graph/legalize_rules.py), keyed by the
aten op name; a rule reads the node's arguments bound by name to the op's schema (torch.fx's
normalize_function, which calls the schema's `self` `input`) and builds trnc
nodes with the Rewriter's helpers, which skip no-ops (a reshape to the same shape, a cast to the
same dtype) so views and copies that change nothing cost nothing. An aten node whose tensor
inputs are all constants is computed now with torch itself (exactly as eager would: masks, position
ids, rotary cos/sin tables), unless its result would be much larger than its inputs and a rule exists.
Multi-output ops give a list of values, `getitem` nodes pick one; an output trnc cannot compute
(flash attention's logsumexp) is an Unusable that fails only when used. Every error names the aten op
and the user's source line.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.fx.operator_schemas import normalize_function

from trnc import ir
from trnc.dtypes import DTYPES, array_of, tensor_of, torch_dtype
from trnc.errors import TrncError, UnsupportedOpError
from trnc.ir import TensorArg
from trnc.isa.dtypes import DType
from trnc.passes.graph.fold import too_big_to_fold
from trnc.passes.graph.legalize_rules import pm_legalize
from trnc.passes.graph.legalize_table import COMPARE_OPS, LAYOUT_OPS, Unusable

CSE_CONST_ELEMENTS = 1024   # consts up to this size are shared by value
# creation ops whose values are undefined: lowered to zeros by their rule, never computed with torch; and the ops
# that read storage, which torch would read from the constant's contiguous copy, not the parameter's layout
_NO_EVAL = frozenset({"aten.empty.memory_format", "aten.empty_like.default", "aten.new_empty.default",
                      "aten.empty_strided.default", "aten.empty_permuted.default"}) | LAYOUT_OPS


@functools.lru_cache(maxsize=None)
def overload(op: str) -> torch._ops.OpOverload:
    """torch.ops.aten.<name>.<overload> from 'aten.<name>.<overload>'."""
    namespace, name, overload_name = op.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload_name)


class Rewriter:
    """Builds the legalized node list; `value` maps each original node to its value (node, list or None)."""

    def __init__(self):
        self.nodes: list[ir.Node] = []
        self.value: dict[ir.Node, Any] = {}
        self.exact: dict[ir.Node, torch.Tensor] = {}   # const -> torch value in the op's own dtype (int64, float64)
        self.lossy: set[ir.Node] = set()               # consts whose int64 values did not fit int32
        self.current: ir.Node | None = None
        self.arg_dtypes: list[torch.dtype] = []        # torch dtype of each input of the current node
        self.arg_values: list = []                     # and its value
        self.created: list[ir.Node] = []
        self.seen: dict[tuple, ir.Node] = {}
        self.streams = 0                               # random nodes made so far: the next one's stream

    # -- errors ------------------------------------------------------------------------------------------
    def fail(self, what: str) -> NoReturn:
        n = self.current
        raise UnsupportedOpError(f"{n.op} {what}{n.where()}")

    # -- nodes ------------------------------------------------------------------------------------------
    def emit(self, op: str, inputs, shape, dtype: DType, /, **attrs) -> ir.Node:
        """A new node, or the equal node built before (same op, inputs, shape, dtype and attrs), so repeated
        views of one tensor and the per-layer copies of a mask exist once."""
        key = (op, tuple(id(i) for i in inputs), tuple(shape), dtype, repr(sorted(attrs.items())))
        return self._node(key, op, inputs, shape, dtype, attrs)

    def _node(self, key, op: str, inputs, shape, dtype: DType, attrs: dict) -> ir.Node:
        if key is not None and key in self.seen:
            return self.seen[key]
        n = self.current
        node = ir.Node(op, tuple(inputs), tuple(shape), dtype, attrs, f"{n.name}.{len(self.created) + 1}", n.source,
                       n.module)
        self.nodes.append(node)
        self.created.append(node)
        if key is not None:
            self.seen[key] = node
        return node

    def const(self, value: torch.Tensor, dtype: DType) -> ir.Node:
        """A const node of `value` stored as `dtype` (small ones shared by exact value). int64 values outside
        int32 are kept exact for later constant evaluation and fail only if the constant survives legalize.
        The value is kept contiguous: a view of it evaluated later must not see an expand's zero strides (the
        constant shared by value may come from an expand, and its copy from a clone)."""
        value = value.contiguous()
        try:
            array = array_of(value, dtype)
            lossy = False
        except ValueError:
            array = array_of(value.clamp(-(2 ** 31), 2 ** 31 - 1), dtype)
            lossy = True
        key = None
        if value.numel() <= CSE_CONST_ELEMENTS:
            flat = torch.empty(value.numel(), dtype=value.dtype).copy_(value.reshape(-1))   # stride 1 (not 0)
            raw = flat.view(torch.uint8).numpy().tobytes()
            key = ("const", dtype, value.dtype, tuple(value.shape), raw)
        node = self._node(key, "const", (), value.shape, dtype, {"value": array})
        self.exact.setdefault(node, value)
        if lossy:
            self.lossy.add(node)
        return node

    def random(self, shape) -> ir.Node:
        """Uniform draws in (0, 1) (fp32) in a stream of their own: never shared with an equal-looking node, and
        kept fp32 by the precision pass (a narrower dtype would round draws to 1)."""
        self.streams += 1
        return self._node(None, "random", (), shape, DType.FP32, {"stream": self.streams, "keep_fp32": True})

    def scalar_const(self, value, dtype: DType) -> ir.Node:
        kind = torch.float64 if isinstance(value, float) else torch.int64
        return self.const(torch.tensor(value, dtype=kind), dtype)

    def filled(self, value, shape, dtype: DType) -> ir.Node:
        """A tensor of one value: a 0-d constant, expanded (a free view)."""
        return self.expand(self.scalar_const(value, dtype), shape)

    def torch_value(self, node: ir.Node, dtype: torch.dtype) -> torch.Tensor:
        """A const node's value as a torch tensor of `dtype` (exact when legalize computed it)."""
        if node in self.exact:
            return self.exact[node].to(dtype)
        return tensor_of(node.attrs["value"], node.dtype).reshape(node.shape).to(dtype)

    def _dtype(self, dtype: DType | None) -> DType:
        return dtype or self.current.dtype

    def unary(self, x: ir.Node, func: str, dtype: DType | None = None) -> ir.Node:
        return self.emit("unary", (x,), x.shape, self._dtype(dtype), func=func)

    def binary(self, op: str, a: ir.Node, b: ir.Node, dtype: DType | None = None, **extra) -> ir.Node:
        shape = tuple(torch.broadcast_shapes(a.shape, b.shape))
        dtype = DType.UINT8 if op in COMPARE_OPS else self._dtype(dtype)
        return self.emit("binary", (a, b), shape, dtype, op=op, **extra)

    def scalar(self, x: ir.Node, op: str, value, reverse: bool = False, dtype: DType | None = None,
               **extra) -> ir.Node:
        dtype = DType.UINT8 if op in COMPARE_OPS else self._dtype(dtype)
        return self.emit("scalar", (x,), x.shape, dtype, op=op, value=float(value), reverse=bool(reverse), **extra)

    def arith(self, op: str, a, b, dtype: DType | None = None) -> ir.Node:
        """a op b where either operand may be a Python number (then a `scalar` node)."""
        if isinstance(a, ir.Node) and isinstance(b, ir.Node):
            return self.binary(op, a, b, dtype)
        if isinstance(a, ir.Node):
            return self.scalar(a, op, b, dtype=dtype)
        return self.scalar(b, op, a, reverse=True, dtype=dtype)

    def where(self, cond: ir.Node, a: ir.Node, b: ir.Node, dtype: DType | None = None) -> ir.Node:
        shape = tuple(torch.broadcast_shapes(cond.shape, a.shape, b.shape))
        return self.emit("where", (cond, a, b), shape, self._dtype(dtype))

    def in_common_dtype(self, *operands) -> list:
        """The operands of a binary op as torch computes it: TensorIterator first converts every input to the
        op's common dtype (torch.result_type: a 0-d tensor or a Python number counts only when of a higher
        category), so a wider float operand (a 0-d fp32 tensor, a Python float, a float64 constant beside a
        bf16 tensor) is rounded to it before the op, which compares or computes on the rounded value."""
        probes = [v if not isinstance(v, ir.Node) else
                  torch.empty((1,) * len(v.shape), dtype=self.torch_dtype(v)) for v in operands]
        common = torch.result_type(*probes)
        if not common.is_floating_point:
            return list(operands)
        rounded = []
        for v in operands:
            if isinstance(v, ir.Node):
                wider = v.dtype.is_float and torch.promote_types(self.torch_dtype(v), common) != common
                rounded.append(self.cast(v, DTYPES[common]) if wider else v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                rounded.append(torch.tensor(v, dtype=torch.float64).to(common).item())
            else:
                rounded.append(v)
        return rounded

    def torch_dtype(self, v: ir.Node) -> torch.dtype:
        """The torch dtype of an input of the current node (its IR dtype may be narrower: int64 held as int32)."""
        for value, dtype in zip(self.arg_values, self.arg_dtypes):
            if value is v and dtype is not None:
                return dtype
        return torch_dtype(v.dtype)

    def cast(self, x: ir.Node, dtype: DType) -> ir.Node:
        return x if x.dtype is dtype else self.emit("cast", (x,), x.shape, dtype)

    def reduce(self, x: ir.Node, op: str, axes, keepdim: bool, dtype: DType | None = None) -> ir.Node:
        """`op` over `axes`; over an empty axis, the reduction's identity (0 for a sum, as torch gives)."""
        axes = tuple(sorted(set(axes)))
        if not axes:
            return self.cast(x, self._dtype(dtype))
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape) if keepdim or d not in axes)
        dtype = self._dtype(dtype)
        if any(x.shape[d] == 0 for d in axes):
            info = None if dtype.is_float else np.iinfo(dtype.storage)
            lowest, highest = (-math.inf, math.inf) if info is None else (int(info.min), int(info.max))
            return self.filled({"sum": 0, "max": lowest, "min": highest}[op], shape, dtype)
        return self.emit("reduce", (x,), shape, dtype, op=op, axes=axes, keepdim=bool(keepdim))

    def reshape(self, x: ir.Node, shape) -> ir.Node:
        shape = tuple(shape)
        if x.op == "reshape":   # a reshape of a reshape is one reshape
            x = x.inputs[0]
        return x if x.shape == shape else self.emit("reshape", (x,), shape, x.dtype)

    def permute(self, x: ir.Node, dims) -> ir.Node:
        dims = tuple(dims)
        if x.op == "permute":   # a permute of a permute is one permute
            dims, x = tuple(x.attrs["dims"][d] for d in dims), x.inputs[0]
        if dims == tuple(range(len(dims))):
            return x
        return self.emit("permute", (x,), tuple(x.shape[d] for d in dims), x.dtype, dims=dims)

    def expand(self, x: ir.Node, shape) -> ir.Node:
        shape = tuple(shape)
        return x if x.shape == shape else self.emit("expand", (x,), shape, x.dtype)

    def slice(self, x: ir.Node, dim: int, start: int, stop: int, step: int = 1) -> ir.Node:
        size = x.shape[dim]
        if (start, stop, step) == (0, size, 1):
            return x
        count = max(0, -(-(stop - start) // step))
        shape = x.shape[:dim] + (count,) + x.shape[dim + 1:]
        return self.emit("slice", (x,), shape, x.dtype, dim=dim, start=start, stop=stop, step=step)

    def cat(self, xs: list[ir.Node], dim: int, dtype: DType) -> ir.Node:
        xs = [self.cast(x, dtype) for x in xs]
        if len(xs) == 1:
            return xs[0]
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        return self.emit("cat", xs, shape, dtype, dim=dim)


def bind(node: ir.Node, values: list) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in, tensors replaced by their legalized values.

    torch.fx's normalize_function binds them; it names the schema's `self` argument `input`, as torch's Python
    functions do."""
    bound = normalize_function(overload(node.op), tuple(node.attrs["args"]), node.attrs["kwargs"],
                               normalize_to_only_use_kwargs=True)
    if bound is None:
        raise TrncError(f"internal error: the arguments of {node.op} do not fit its schema{node.where()}")
    return pytree.tree_map(lambda x: values[x.index] if isinstance(x, TensorArg) else x, bound.kwargs)


def _evaluate(rw: Rewriter, node: ir.Node, values: list[ir.Node]):
    """The value of an aten node of constant inputs, computed with torch in the op's own dtypes."""
    def tensor(x):
        return rw.torch_value(values[x.index], x.dtype) if isinstance(x, TensorArg) else x

    result = overload(node.op)(*pytree.tree_map(tensor, node.attrs["args"]),
                               **pytree.tree_map(tensor, node.attrs["kwargs"]))
    if isinstance(result, torch.Tensor):
        return rw.const(result, node.dtype)
    if isinstance(result, (tuple, list)):
        return [rw.const(r, dtype) for r, (_, dtype) in zip(result, node.attrs["outputs"])]
    return None


def _constant_evaluable(node: ir.Node, values: list, rules) -> bool:
    if node.op in _NO_EVAL or torch.Tag.nondeterministic_seeded in overload(node.op).tags:
        return False
    if not all(isinstance(v, ir.Node) and v.op == "const" for v in values):
        return False
    return node.op not in rules or not too_big_to_fold(node.numel, [v.numel for v in values])


def _getitem(rw: Rewriter, node: ir.Node):
    parent = node.inputs[0]
    picked = rw.value[parent][node.attrs["index"]]
    if isinstance(picked, Unusable):
        raise UnsupportedOpError(f"{parent.op} output {node.attrs['index']} ({picked.what}) is not supported; trnc "
                                 f"computes only its first output{parent.where()}")
    return picked


def _result_name(node: ir.Node, values: list, result: ir.Node) -> str:
    """The aten node's name; a constant computed from one parameter is named after it ('fc_weight.permute')."""
    params = [v for v in values if isinstance(v, ir.Node) and v.op == "const" and not v.source]
    if result.op == "const" and len(values) == 1 and params:
        return f"{params[0].name}.{node.op.split('.')[1]}"
    return node.name


def _legalize_node(rw: Rewriter, node: ir.Node, rules, counts: Counter):
    if node.op in ir.OPS_SOURCE:
        rw.nodes.append(node)
        return node
    if node.op == "getitem":
        return _getitem(rw, node)
    values = [rw.value[i] for i in node.inputs]
    if not ir.is_torch_op(node.op):   # already a trnc op
        node.inputs = tuple(values)
        rw.nodes.append(node)
        return node
    rw.current, rw.created = node, []
    rw.arg_dtypes, rw.arg_values = [None] * len(values), values
    for a in pytree.tree_leaves((node.attrs["args"], node.attrs["kwargs"])):
        if isinstance(a, TensorArg):
            rw.arg_dtypes[a.index] = a.dtype
    if "outputs" not in node.attrs and 0 in node.shape:   # an empty result has no value to compute
        counts["empty"] += 1
        result = rw.filled(0, node.shape, node.dtype)
    elif _constant_evaluable(node, values, rules):
        counts["constant"] += 1
        result = _evaluate(rw, node, values)
    elif node.op in rules:
        counts[node.op] += 1
        result = rules[node.op](rw, node, bind(node, values))
    else:
        raise UnsupportedOpError(f"{node.op} is not supported{node.where()}")
    if node.attrs.get("float64") and any(v.op != "const" for v in pytree.tree_leaves(result) if isinstance(v, ir.Node)):
        raise UnsupportedOpError(f"{node.op} computes a float64 value from the model's inputs{node.where()}: the "
                                 "machine has no 64-bit floats and would compute it in fp32; compute in float32")
    if isinstance(result, ir.Node) and result in rw.created:
        result.name = _result_name(node, values, result)
    return result


def legalize_graph(graph: ir.Graph, rules) -> dict:
    rw = Rewriter()
    counts: Counter = Counter(dead=graph.prune())   # unused getitems of multi-output ops, asserts
    for node in graph.nodes:
        rw.value[node] = _legalize_node(rw, node, rules, counts)
    outputs = []
    for o in graph.outputs:
        value = rw.value[o]
        if not isinstance(value, ir.Node):
            raise UnsupportedOpError(f"output {o.name} ({o.op}) has no tensor value{o.where()}")
        outputs.append(value)
    graph.nodes, graph.outputs = rw.nodes, outputs
    counts["pruned"] = graph.prune()
    kept = set(graph.nodes)
    for c in rw.lossy:
        if c in kept:
            raise UnsupportedOpError(f"a constant of {c.name}{c.where()} holds int64 values outside the int32 range; "
                                     "the machine has no 64-bit integers")
    return dict(counts)


@dataclass(frozen=True)
class Legalize:
    """Rewrite every aten node into trnc ops (rules: passes/graph/legalize_rules.py) and drop what no output uses."""

    name: str = "legalize"

    def run(self, state) -> dict:
        return legalize_graph(state.graph, pm_legalize)

