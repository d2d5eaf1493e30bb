"""Capture, the first step of the pipeline: a PyTorch model and example inputs to an ir.Graph of aten ops.

An nn.Module goes through `torch.export.export(strict=False)`, then, unless legalize already has a
rule for every op that depends on a user input, `run_decompositions` with the trnc table: the core
ATen decompositions minus the ops trnc lowers whole (softmax, layer norm, gelu, silu,
scaled_dot_product_attention, ...), so legalize sees `attention` instead of its math. A
torch.fx.GraphModule (what aot_autograd hands a torch.compile backend) is re-traced with the same
table, every placeholder being a user input. Each fx call becomes one `aten.*` node whose `attrs`
keep the call's `args`/`kwargs` with every tensor replaced by a TensorArg (its position in
`node.inputs` and its torch dtype), so legalize rules read scalars and lists as torch wrote them.
Parameters, buffers and lifted constants become `const` nodes; tensor user inputs become `input`
nodes in flattened call order. CaptureInfo keeps what the API needs to call and to answer like the model.
"""
from __future__ import annotations

import contextlib
import functools
import io
import operator
import os
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.proxy_tensor import make_fx

from trnc import ir
from trnc.dtypes import array_of, machine_dtype
from trnc.errors import TrncError, UnsupportedOpError
from trnc.ir import TensorArg
from trnc.isa.dtypes import DType
from trnc.log import get_logger
from trnc.passes.graph.legalize_rules import pm_whole
from trnc.passes.graph.legalize_table import LAYOUT_OPS, lowered

# ops trnc lowers whole (a fused trnc op exists; legalize's rule table marks them), every overload: kept out of
# the core decomposition table
KEEP_WHOLE = tuple(sorted({op.rsplit(".", 1)[0] + "." for op in pm_whole}))
# torch decompositions that give wrong values (checked against the ops' own kernels), kept out of the table so
# the op stays whole: unsupported by trnc, so an error naming it or an eager fallback, never a wrong answer.
# Each names the torch functions that reach it, as a dynamo graph calls them: aot_autograd applies some
# decompositions through the Python dispatcher whatever its table says, so the backend runs such graphs in eager.
WRONG_DECOMPOSITIONS = {
    # counts the masked-out target slots after a -1 as copies of class 0 (torch 2.13, _decomp/decompositions.py)
    "aten.multilabel_margin_loss_forward.": ("multilabel_margin_loss", "multilabel_margin_loss_forward"),
}
# torch decompositions missing from export's core table for overloads export emits (torch 2.13): the vec forms
# of the upsampling ops, kept whole as core ops, which legalize has no rule for. Inductor's table spells them in
# index arithmetic that trnc lowers, as the backend already sees them.
EXTRA_DECOMPOSITIONS = ("aten.upsample_nearest2d.vec", "aten.upsample_bilinear2d.vec",
                        "aten.upsample_bilinear2d.default")
EXPORT_HINT = ("trnc needs a model torch.export can trace: remove data-dependent Python control flow (an `if` or "
               "loop on tensor values, .item(), .tolist()), return tensors (or tuples, lists, dicts of them; no "
               "cache objects: pass use_cache=False to Hugging Face models), or pass example inputs of the shapes "
               "you will call it with")


@dataclass
class CaptureInfo:
    """What calling the compiled model needs: how to flatten its arguments and rebuild its result.

    `in_spec` is the pytree spec of `(args, kwargs)`; of its flattened leaves, those at `input_leaves`
    are the graph's inputs in order (the others are Python values fixed at capture). `out_spec` rebuilds
    the model's output (tensor, tuple, dict, Hugging Face ModelOutput) from the graph's outputs.
    `input_layouts` (None unless the graph reads storage: as_strided) holds the (strides, storage offset) of each
    input that op's argument derives from, as captured (None for the others); a call with other layouts is
    refused, as eager's as_strided would read other elements.
    """

    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    input_leaves: tuple[int, ...]
    input_dtypes: tuple[torch.dtype, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[torch.dtype, ...]
    input_layouts: tuple | None = None


def decomposition_table() -> dict:
    """The core ATen decompositions minus the ops trnc lowers whole and those torch gets wrong (also for
    aot_autograd backends); a new dict."""
    return dict(_table())


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    """Built once per process: materializing torch's table costs a fifth of a second."""
    table = torch.export.default_decompositions()
    table.update({op: fn for op, fn in torch._decomp.decomposition_table.items() if str(op) in EXTRA_DECOMPOSITIONS})
    for op in list(table.keys()):
        if str(op).startswith(KEEP_WHOLE + tuple(WRONG_DECOMPOSITIONS)):
            table.pop(op)
    return dict(table.items())


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_of(stack_trace: str | None) -> str:
    """'file.py:N: code' from the innermost frame of an fx stack trace that is not inside torch (the user's
    line that called F.linear rather than F.linear's own line), else the innermost frame, or ''."""
    lines = (stack_trace or "").splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+)', line)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            frames.append((m.group(1), f"{os.path.basename(m.group(1))}:{m.group(2)}: {code}"))
    outside = [text for path, text in frames if not path.startswith(_TORCH_DIR)]
    return (outside or [text for _, text in frames] or [""])[-1]


def module_of(stack) -> str:
    """The innermost nn.Module path of an fx node's nn_module_stack: torch.export's "blocks.0.fc" as it is, a
    dynamo graph's "L['self'].blocks[0].fc" in the same form; "" without one."""
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"\[(?:'([^']*)'|(\d+))\]", lambda m: "." + (m.group(1) or m.group(2)), path).lstrip(".")


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _static_shape(val, where: str) -> tuple[int, ...]:
    if not all(isinstance(s, int) for s in val.shape):
        raise TrncError(f"a tensor of symbolic shape {list(val.shape)}{where}: trnc compiles static shapes; "
                        "capture without dynamic_shapes and call with the example shapes")
    return tuple(val.shape)


def layout_of(val) -> tuple | None:
    """A tensor's strides (0 along dims of size 1, which address nothing) and storage offset, None when unknown (no
    tensor value, symbolic strides)."""
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return tuple(int(s) if n > 1 else 0 for s, n in zip(val.stride(), val.shape)), int(val.storage_offset())
    except (TypeError, RuntimeError):
        return None


def _fixed_layout(fx_node: torch.fx.Node) -> bool:
    """Whether the node's value is a fresh tensor with at most one dim above 1: of an op whose result is no alias
    (no alias annotation in its schema, and not _unsafe_view, which shares its input's storage unannotated)."""
    val, target = fx_node.meta.get("val"), fx_node.target
    return (isinstance(val, torch.Tensor) and isinstance(target, torch._ops.OpOverload)
            and all(r.alias_info is None for r in target._schema.returns)
            and target.overloadpacket is not torch.ops.aten._unsafe_view and sum(n > 1 for n in val.shape) <= 1)


class _Importer:
    """Turns one fx graph into ir nodes; `values` maps each fx node to its ir node."""

    def __init__(self):
        self.nodes: list[ir.Node] = []
        self.values: dict[torch.fx.Node, ir.Node] = {}
        self.inputs: list[ir.Node] = []
        self.input_dtypes: list[torch.dtype] = []
        self.input_layouts: list = []
        self.layout_inputs: set[int] = set()   # inputs a LAYOUT_OPS node's arguments derive from
        self.input_of: dict[torch.fx.Node, int] = {}

    def add(self, node: ir.Node, fx_node: torch.fx.Node) -> None:
        self.nodes.append(node)
        self.values[fx_node] = node

    def input(self, fx_node: torch.fx.Node) -> None:
        val = fx_node.meta["val"]
        if val.dtype == torch.float64:
            raise UnsupportedOpError(f"input {fx_node.name} is float64: the machine has no 64-bit floats and would "
                                     "compute in fp32; pass float32 inputs (and a float32 model)")
        node = ir.Node("input", (), _static_shape(val, ""), machine_dtype(val.dtype, f" (input {fx_node.name})"),
                       {"index": len(self.inputs)}, name=_sanitize(fx_node.name))
        self.inputs.append(node)
        self.input_dtypes.append(val.dtype)
        self.input_layouts.append(layout_of(val))
        self.input_of[fx_node] = len(self.inputs) - 1
        self.add(node, fx_node)

    def const(self, fx_node: torch.fx.Node, name: str, value: torch.Tensor) -> None:
        dtype = machine_dtype(value.dtype, f" (constant {name})")
        try:
            array = array_of(value, dtype)
        except ValueError as e:
            raise TrncError(f"constant {name}: {e}; the machine has no 64-bit integers") from None
        self.add(ir.Node("const", (), tuple(value.shape), dtype, {"value": array}, name=_sanitize(name)), fx_node)

    def call(self, fx_node: torch.fx.Node) -> None:
        source = source_of(fx_node.meta.get("stack_trace"))
        where = f" (at {source})" if source else ""
        target = fx_node.target
        if target is operator.getitem:
            parent = self.values[fx_node.args[0]]
            shape, dtype = parent.attrs["outputs"][fx_node.args[1]]
            node = ir.Node("getitem", (parent,), shape, dtype, {"index": fx_node.args[1]}, _sanitize(fx_node.name),
                           source)
            self.add(node, fx_node)
            return
        if not lowered(target):
            raise UnsupportedOpError(f"{getattr(target, '__name__', target)} is not supported{where}: trnc compiles "
                                     "aten operators (and the custom operators it has a rule for)")
        inputs: list[ir.Node] = []

        def placeholder(a):
            if isinstance(a, torch.fx.Node):
                inputs.append(self.values[a])
                return TensorArg(len(inputs) - 1, a.meta["val"].dtype)
            return a

        args = pytree.tree_map(placeholder, fx_node.args)
        kwargs = pytree.tree_map(placeholder, fx_node.kwargs)
        attrs: dict[str, Any] = {"args": args, "kwargs": kwargs}
        if str(target) in LAYOUT_OPS:   # ops that read storage: each tensor input's (strides, storage offset)
            self._depends_on_layouts(fx_node)
            attrs["layouts"] = [layout_of(a.meta.get("val")) for a in pytree.tree_leaves((fx_node.args, fx_node.kwargs))
                                if isinstance(a, torch.fx.Node)]
        val = fx_node.meta.get("val")
        if isinstance(val, (tuple, list)):
            attrs["outputs"] = [(_static_shape(v, where), machine_dtype(v.dtype, where)) if isinstance(v, torch.Tensor)
                                else ((), DType.FP32) for v in val]
            shape, dtype = (), attrs["outputs"][0][1]
        elif isinstance(val, torch.Tensor):
            shape, dtype = _static_shape(val, where), machine_dtype(val.dtype, where)
        else:   # no tensor result (asserts): legalize drops it
            shape, dtype = (), DType.FP32
        if any(isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in pytree.tree_leaves(val)):
            attrs["float64"] = True   # legalize refuses it unless it computes it as a constant
        self.add(ir.Node(str(target), tuple(inputs), shape, dtype, attrs, _sanitize(fx_node.name), source,
                         module_of(fx_node.meta.get("nn_module_stack"))), fx_node)

    def _depends_on_layouts(self, fx_node: torch.fx.Node) -> None:
        """Mark the inputs `fx_node` derives from: their layouts decide its arguments' (calls must keep them). A
        fresh tensor (not a view) with at most one dim above 1 has one layout whatever its inputs' (dense, at
        offset 0), so the walk stops there: a pooled [1, C, 1, 1] read by as_strided depends on no input's."""
        stack, seen = list(fx_node.all_input_nodes), set()
        while stack:
            a = stack.pop()
            if a not in seen:
                seen.add(a)
                if a in self.input_of:
                    self.layout_inputs.add(self.input_of[a])
                elif not _fixed_layout(a):
                    stack.extend(a.all_input_nodes)

    def outputs(self, output_node: torch.fx.Node) -> tuple[list[ir.Node], tuple[torch.dtype, ...]]:
        """The output nodes and their torch dtypes."""
        leaves = pytree.tree_leaves(output_node.args[0])
        for i, a in enumerate(leaves):
            if not isinstance(a, torch.fx.Node) or not isinstance(a.meta.get("val"), torch.Tensor):
                raise TrncError(f"output {i} of the model is {a!r}, not a tensor; trnc returns tensors only "
                                "(in tensors, tuples, lists or dicts)")
        return [self.values[a] for a in leaves], tuple(a.meta["val"].dtype for a in leaves)


def _user_frame(error: Exception) -> str:
    """' at model.py:12: code' for the innermost frame of the traceback outside torch and trnc, or ''."""
    trnc_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith((_TORCH_DIR, trnc_dir))]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {os.path.basename(f.filename)}:{f.lineno}: {(f.line or '').strip()}"


def _export(model: torch.nn.Module, args: tuple, kwargs: dict, decompose: bool | None):
    # On a failed trace torch prints the partial graph to stderr; the TrncError below sums it up, so it is
    # held back and logged at debug level. Whatever the model itself prints passes on once the trace succeeds.
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            ep = torch.export.export(model, args, kwargs, strict=False)
        sys.stderr.write(held.getvalue())
    except Exception as e:  # torch raises many types; the user needs its reason, their line and our hint
        get_logger(__name__).debug("torch.export printed:\n%s", held.getvalue())
        reason = "\n  ".join([line for line in str(e).strip().splitlines() if line.strip()][:5])
        raise TrncError(f"torch.export could not trace the model{_user_frame(e)}: {type(e).__name__}: {reason}\n"
                        f"{EXPORT_HINT}") from e
    if decompose is None and _legalizes_as_is(ep):
        return ep
    return ep.run_decompositions(decomposition_table())


def _legalizes_as_is(ep) -> bool:
    """Whether every op that depends on a user input already has a legalize rule, so the exported graph can
    skip `run_decompositions` (a second full trace, most of the capture time of a large model). Ops on
    parameters and buffers alone are computed at legalize time whatever they are."""
    from trnc.passes.graph.legalize_rules import pm_legalize
    user = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    dynamic: set = set()
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            if n.name in user:
                dynamic.add(n)
            continue
        if n.op != "call_function" or not any(i in dynamic for i in n.all_input_nodes):
            continue
        dynamic.add(n)
        if n.target is not operator.getitem and str(n.target) not in pm_legalize:
            return False
    return True


def _capture_module(model, args, kwargs, decompose) -> tuple[ir.Graph, CaptureInfo]:
    ep = _export(model, args, kwargs, decompose)
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs}
    bad = [s for s in sig.output_specs if s.kind != OutputKind.USER_OUTPUT]
    if bad:
        raise TrncError(f"the model writes {', '.join(str(s.target) for s in bad)} during forward; trnc compiles "
                        "pure functions: call model.eval() and do not mutate buffers in forward")
    imp = _Importer()
    leaves: list[int] = []
    user_position = 0
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            spec = specs[n.name]
            if spec.kind == InputKind.USER_INPUT:
                if isinstance(n.meta.get("val"), torch.Tensor):
                    imp.input(n)
                    leaves.append(user_position)
                user_position += 1
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                value = ep.state_dict.get(spec.target)
                if value is None:
                    value = ep.constants[spec.target]
                imp.const(n, spec.target, value)
            else:
                raise TrncError(f"model input {n.name} of kind {spec.kind.name} is not supported; trnc takes "
                                "tensors, parameters, buffers and constants")
        elif n.op == "call_function":
            imp.call(n)
        elif n.op == "output":
            outputs, output_dtypes = imp.outputs(n)
    info = _info(ep.call_spec.in_spec, ep.call_spec.out_spec, tuple(leaves), imp, output_dtypes)
    return ir.Graph(imp.nodes, imp.inputs, outputs), info


def _capture_graph_module(gm: torch.fx.GraphModule, args: tuple) -> tuple[ir.Graph, CaptureInfo]:
    """Re-trace an fx graph with the trnc table; fx.Interpreter plus preserve_node_meta keeps the user's lines."""
    if any(not isinstance(a, torch.Tensor) for a in args):
        raise TrncError("a GraphModule is captured with tensor example inputs only (what aot_autograd passes)")
    with fx_traceback.preserve_node_meta():
        traced = make_fx(lambda *xs: torch.fx.Interpreter(gm).run(*xs), decomposition_table=decomposition_table(),
                         tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
    imp = _Importer()
    for n in traced.graph.nodes:
        if n.op == "placeholder":
            imp.input(n)
        elif n.op == "get_attr":   # tensors the graph module holds (its parameters, lifted constants)
            imp.const(n, n.target, operator.attrgetter(n.target)(traced))
        elif n.op == "call_function":
            imp.call(n)
        elif n.op == "output":
            outputs, output_dtypes = imp.outputs(n)
            out_spec = pytree.tree_flatten(n.args[0])[1]
    in_spec = pytree.tree_flatten((tuple(args), {}))[1]
    info = _info(in_spec, out_spec, tuple(range(len(args))), imp, output_dtypes)
    return ir.Graph(imp.nodes, imp.inputs, outputs), info


def _info(in_spec, out_spec, leaves, imp: _Importer, output_dtypes) -> CaptureInfo:
    return CaptureInfo(in_spec=in_spec, out_spec=out_spec, input_leaves=leaves, input_dtypes=tuple(imp.input_dtypes),
                       input_shapes=tuple(n.shape for n in imp.inputs), output_dtypes=output_dtypes,
                       input_layouts=_layouts(imp))


def _layouts(imp: _Importer) -> tuple | None:
    """The captured layouts of the inputs an op that reads storage depends on (None for the others), or None."""
    if not imp.layout_inputs:
        return None
    return tuple(v if i in imp.layout_inputs else None for i, v in enumerate(imp.input_layouts))


def capture(model, example_inputs, example_kwargs=None, *, decompose: bool | None = None
            ) -> tuple[ir.Graph, CaptureInfo]:
    """The ir.Graph of aten nodes that `model(*example_inputs, **example_kwargs)` runs, and its CaptureInfo.

    `decompose`: True always applies the trnc decomposition table (Core ATen); None (default) skips it
    when legalize has a rule for every input-dependent op of the exported graph.

    `model` is an nn.Module (exported as it is: eval mode is the caller's business) or a
    torch.fx.GraphModule whose placeholders are all inputs (a torch.compile backend's graph; tensors the
    module holds become constants).
    """
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    kwargs = dict(example_kwargs or {})
    if isinstance(model, torch.fx.GraphModule):
        if kwargs:
            raise TrncError("a GraphModule takes positional example inputs only")
        return _capture_graph_module(model, args)
    if not isinstance(model, torch.nn.Module):
        raise TrncError(f"capture takes a torch.nn.Module or torch.fx.GraphModule, got {type(model).__name__}")
    return _capture_module(model, args, kwargs, decompose)
