"""quantize: the low-bit matmuls of precision="fp8" (each operand scaled per tensor into the fp8 range) and of
"mxfp8" and "mxfp4" (OCP MX blocks of 32 along K).

A matmul with a constant operand (a linear layer's weight) takes both operands in fp8 (fp8_format: OCP e4m3fn,
saturating, or e5m2) and gives back fp32, as torchao's tensorwise float8 does (precision.md 3):

    scale(t) = FP8_MAX / max(amax(t), AMAX_FLOOR)        t_q = fp8(t * scale(t)), saturating
    y = (a_q @ w_q) / scale(a) * (1 / scale(w))

The weight is quantized now, at compile time. The activation's scale is its amax computed on the device at run
time (fp8_scaling="dynamic": a max reduction of |a|, a scalar, the matmul's third input), or fixed now from the
example inputs ("static", the matmul's attribute), the IR interpreter computing the activation. The matmul
quantizes the activation itself (attrs quantize: its dtype, which operand, the static scale): its kernel
multiplies and casts each k-tile as it loads (passes/tile/kernels/matmul.py), so a_q never goes through HBM
and the quantization overlaps TensorE rather than running as a kernel before it. The rescale is an epilogue of
the matmul, applied to the fp32 sum as PSUM is evacuated. Attention's two matmuls, convolutions and matmuls of
two activations stay in bf16 (the precision pass: auto_cast narrows them to bf16); so do the values
auto_cast="all" narrows.

MX: a matmul x @ w whose weight w [K, N] is a constant and K a multiple of 32 becomes one `matmul_mx` node (x,
w's elements, w's E8M0 scales): the weight quantized now along K (runtime/mx.py quantize_mx, the mx_scale
rule), the activation quantized on the device by quantize_mx as the kernel loads its K-tiles
(passes/tile/kernels/matmul_mx.py), and matmul_mx multiplying the two with both blocks' scales. A target
without MX (emulate=True) gets the same quantization in its own instructions and a bf16 matmul
(passes/graph/emulate_mx.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trnc import ir
from trnc.interpret import evaluate_graph
from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.isa.enums import ScaleMode
from trnc.isa.config import TARGETS
from trnc.options import MX_SCALES
from trnc.passes.graph.emulate_mx import emulated_mx_matmul
from trnc.runtime.convert import from_fp32, to_fp32
from trnc.runtime.mx import quantize_mx

AMAX_FLOOR = 1e-12   # an all-zero tensor gets a finite scale (torchao's clamp)


def _fp32(node: ir.Node) -> np.ndarray:
    return to_fp32(node.attrs["value"], node.dtype).reshape(node.shape)


def _const(value: np.ndarray, dtype: DType, like: ir.Node, name: str) -> ir.Node:
    return ir.Node("const", (), value.shape, dtype, {"value": from_fp32(value, dtype).reshape(value.shape)},
                   name=name, source=like.source)


def _scale(amax: float, fp8: DType) -> np.float32:
    """FP8_MAX / max(amax, AMAX_FLOOR), in float64 then fp32, as torchao computes it."""
    return np.float32(fp8.value.max_finite / max(float(amax), AMAX_FLOOR))


class _Quantizer:
    def __init__(self, graph: ir.Graph, fp8: DType, values: dict | None):
        self.graph, self.fp8, self.values = graph, fp8, values
        self.new: list[ir.Node] = []

    def node(self, kind: str, inputs, shape, dtype: DType, at: ir.Node, /, **attrs) -> ir.Node:
        n = ir.Node(kind, tuple(inputs), tuple(shape), dtype, attrs, source=at.source, module=at.module)
        self.new.append(n)
        return n

    def weight(self, w: ir.Node) -> tuple[ir.Node, np.float32]:
        value = _fp32(w)
        scale = _scale(np.abs(value).max(initial=0.0), self.fp8)
        return _const(value * scale, self.fp8, w, f"{w.name}.fp8"), scale

    def activation_scale(self, a: ir.Node, mm: ir.Node) -> ir.Node | np.float32:
        """The activation's scale: a number (static) or a 0-d node computed on the device (dynamic)."""
        if self.values is not None:
            return _scale(self.values[a].abs().max().item() if a.numel else 0.0, self.fp8)
        amax = self.node("reduce", (a,), (), DType.FP32, mm, op="max", axes=tuple(range(len(a.shape))),
                         keepdim=False, abs=True)
        floor = self.node("scalar", (amax,), (), DType.FP32, mm, op="max", value=AMAX_FLOOR, reverse=False)
        return self.node("scalar", (floor,), (), DType.FP32, mm, op="div", value=self.fp8.value.max_finite,
                         reverse=True)

    def matmul(self, mm: ir.Node) -> ir.Node | None:
        """The fp8 form of `mm` (its result node), or None when it is not a weight's matmul. The activation
        stays as it is: the matmul quantizes it as its kernel loads it (attrs quantize), so a_q never goes
        through HBM and the multiply and cast run while TensorE works on earlier k-tiles."""
        a, b = mm.inputs
        if not (a.dtype.is_float and b.dtype.is_float) or (a.op == "const") == (b.op == "const"):
            return None
        (act, weight), left = ((a, b), False) if b.op == "const" else ((b, a), True)
        w_q, w_scale = self.weight(weight)
        a_scale = self.activation_scale(act, mm)
        operands = (w_q, act) if left else (act, w_q)
        quantize = {"dtype": self.fp8.text, "operand": int(left)}
        if isinstance(a_scale, ir.Node):
            product = self.node("matmul", (*operands, a_scale), mm.shape, DType.FP32, mm, quantize=quantize)
            # both steps are the evacuation's: a per-partition divide, a multiply
            divided = self.node("binary", (product, a_scale), mm.shape, DType.FP32, mm, op="div")
            result = self.node("scalar", (divided,), mm.shape, DType.FP32, mm, op="mul", value=float(1 / w_scale),
                               reverse=False)
        else:
            product = self.node("matmul", operands, mm.shape, DType.FP32, mm,
                                quantize={**quantize, "scale": float(a_scale)})
            inverse = float(1 / (np.float64(a_scale) * np.float64(w_scale)))
            result = self.node("scalar", (product,), mm.shape, DType.FP32, mm, op="mul", value=inverse, reverse=False)
        return result if mm.dtype is DType.FP32 else self.node("cast", (result,), mm.shape, mm.dtype, mm)


def mx_takes(mm: ir.Node) -> bool:
    """Whether MX (or its emulation) can take matmul `mm`: its weight a constant [K, N] right operand with K a
    multiple of 32, its left operand a float activation."""
    x, w = mm.inputs
    return w.op == "const" and len(w.shape) == 2 and w.shape[0] % MX_BLOCK == 0 and x.dtype.is_float \
        and x.op != "const"


def mx_matmul(mm: ir.Node, w_value: np.ndarray, elem: DType, mode: ScaleMode) -> list[ir.Node]:
    """The nodes of `mm` (mx_takes) as an MX matmul (the last is its result); w_value: its weight in fp32."""
    x, w = mm.inputs
    codes, scales = quantize_mx(w_value, elem, mode)
    elems = ir.Node("const", (), w.shape, elem, {"value": codes}, name=f"{w.name}.mx", source=w.source)
    scale = ir.Node("const", (), scales.shape, DType.E8M0, {"value": scales.view(DType.E8M0.storage)},
                    name=f"{w.name}.mx_scale", source=w.source)
    product = ir.Node("matmul_mx", (x, elems, scale), mm.shape, DType.FP32,
                      {"elem": elem.text, "scale_mode": mode.text}, source=mm.source, module=mm.module)
    tail = [] if mm.dtype is DType.FP32 else [ir.Node("cast", (product,), mm.shape, mm.dtype, source=mm.source)]
    return [elems, scale, product, *tail]


def quantize(graph: ir.Graph, fp8: DType, example_inputs, kept=lambda module: None) -> dict:
    """Rewrite every weight's matmul of `graph` to fp8, but those `kept` (Options.kept_dtype) names a dtype for and
    `keep_fp32` ones (a sum legalize writes as a matmul by a 0/1 constant);
    example_inputs: the graph's inputs for static scales, or None for dynamic ones."""
    values = evaluate_graph(graph, list(example_inputs)) if example_inputs is not None else None
    q = _Quantizer(graph, fp8, values)
    replaced: dict[ir.Node, ir.Node] = {}
    nodes: list[ir.Node] = []
    for n in graph.nodes:
        n.inputs = tuple(replaced.get(i, i) for i in n.inputs)
        result = q.matmul(n) if n.op == "matmul" and kept(n.module) is None and not n.attrs.get("keep_fp32") else None
        if result is None:
            nodes.append(n)
            continue
        consts = [i for i in q.new if i.op == "const"]
        nodes[:0] = consts                # constants first, as capture lays them out
        nodes.extend(i for i in q.new if i.op != "const")
        replaced[n] = result
        q.new = []
    graph.nodes = nodes
    graph.outputs = [replaced.get(o, o) for o in graph.outputs]
    quantized = len(replaced)
    graph.prune()
    return {"fp8_matmuls": quantized}


def quantize_mx_matmuls(graph: ir.Graph, elem: DType, mode: ScaleMode, kept=lambda module: None,
                        emulate: bool = False) -> dict:
    """Rewrite every weight's matmul of `graph` that MX can take to a matmul_mx (mx_matmul), or to its emulation
    (emulated_mx_matmul) on a target without MX, but those `kept` names a dtype for."""
    rewrite = emulated_mx_matmul if emulate else mx_matmul
    replaced: dict[ir.Node, ir.Node] = {}
    nodes: list[ir.Node] = []
    for n in graph.nodes:
        n.inputs = tuple(replaced.get(i, i) for i in n.inputs)
        if n.op != "matmul" or kept(n.module) is not None or n.attrs.get("keep_fp32") or not mx_takes(n):
            nodes.append(n)
            continue
        new = rewrite(n, _fp32(n.inputs[1]), elem, mode)
        nodes[:0] = [i for i in new if i.op == "const"]      # constants first, as capture lays them out
        nodes.extend(i for i in new if i.op != "const")
        replaced[n] = new[-1]
    graph.nodes = nodes
    graph.outputs = [replaced.get(o, o) for o in graph.outputs]
    graph.prune()
    return {"mx_emulated_matmuls" if emulate else "mx_matmuls": len(replaced)}


@dataclass(frozen=True)
class Quantize:
    """fp8: every matmul with a weight to fp8 operands scaled per tensor, rescaled in its epilogue; mxfp8 and
    mxfp4: to matmul_mx with the weight quantized now."""

    name: str = "quantize"

    def run(self, state) -> dict:
        options = state.options
        if options.auto_cast == "none":
            return {}
        if options.mx_dtype is not None:
            return quantize_mx_matmuls(state.graph, options.mx_dtype, MX_SCALES[options.mx_scale],
                                       options.kept_dtype, emulate=not TARGETS[options.target].mx)
        if options.fp8_dtype is None:
            return {}
        inputs = None
        if options.fp8_scaling == "static":
            inputs = [torch.as_tensor(x) for x in state.example_inputs]
        return quantize(state.graph, options.fp8_dtype, inputs, options.kept_dtype)

