"""The quantize pass (passes/graph/quantize.py): a weight's matmul becomes fp8 operands, per-tensor scales and
a rescale; matmuls of two activations and integer ones stay; static scales come from the example inputs."""
from __future__ import annotations

import numpy as np
import torch

from trnc import ir
from trnc.dtypes import tensor_of
from trnc.isa.dtypes import DType
from trnc.passes.graph.quantize import quantize

F32, E4M3 = DType.FP32, DType.FP8_E4M3
RNG = np.random.default_rng(3)


def _graph():
    x = ir.Node("input", (), (8, 32), F32, {"index": 0}, name="x")
    y = ir.Node("input", (), (32, 4), F32, {"index": 1}, name="y")
    w = ir.Node("const", (), (32, 16), F32, {"value": RNG.standard_normal((32, 16)).astype(np.float32)}, name="w")
    linear = ir.Node("matmul", (x, w), (8, 16), F32, name="linear")
    both = ir.Node("matmul", (x, y), (8, 4), F32, name="both")
    return ir.Graph([x, y, w, linear, both], [x, y], [linear, both]), w


def test_a_weights_matmul_gets_fp8_operands_and_a_rescale():
    graph, w = _graph()
    assert quantize(graph, E4M3, None) == {"fp8_matmuls": 1}
    ir.verify(graph)
    matmuls = [n for n in graph.nodes if n.op == "matmul"]
    fp8 = [m for m in matmuls if "quantize" in m.attrs]
    assert len(matmuls) == 2 and len(fp8) == 1                       # the activations' matmul stays
    act, weight, a_scale = fp8[0].inputs
    # the activation enters as it is, quantized by the matmul's kernel with the run-time scale
    assert act.name == "x" and fp8[0].attrs["quantize"] == {"dtype": "fp8_e4m3", "operand": 0}
    assert a_scale.shape == () and weight.op == "const" and weight.dtype is E4M3
    scale = np.float32(448.0 / np.abs(w.attrs["value"]).max())
    assert np.array_equal(tensor_of(weight.attrs["value"], E4M3).reshape(32, 16).float().numpy(),
                          torch.from_numpy(w.attrs["value"] * scale).to(torch.float8_e4m3fn).float().numpy())
    rescale = graph.outputs[0]       # the epilogue: / scale(a), * 1 / scale(w)
    assert rescale.op == "scalar" and rescale.inputs[0].op == "binary" and rescale.inputs[0].inputs[0] is fp8[0]
    assert rescale.inputs[0].inputs[1] is a_scale
    (amax,) = [n for n in graph.nodes if n.op == "reduce"]     # the activation's amax, on the device
    assert amax.attrs["abs"] and amax.attrs["op"] == "max" and amax.inputs[0].name == "x"


def test_static_scales_come_from_the_example_inputs():
    graph, _ = _graph()
    x = torch.randn(8, 32) * 3
    quantize(graph, E4M3, [x, torch.randn(32, 4)])
    ir.verify(graph)
    assert not [n for n in graph.nodes if n.op in ("reduce", "cast")]
    (mm,) = [n for n in graph.nodes if "quantize" in n.attrs]
    assert len(mm.inputs) == 2 and np.isclose(mm.attrs["quantize"]["scale"], 448.0 / x.abs().max().item())


def test_integer_and_activation_only_matmuls_are_left_alone():
    i = ir.Node("input", (), (4, 4), DType.INT32, {"index": 0}, name="i")
    c = ir.Node("const", (), (4, 4), DType.INT32, {"value": np.ones((4, 4), np.int32)}, name="c")
    mm = ir.Node("matmul", (i, c), (4, 4), DType.INT32, name="mm")
    graph = ir.Graph([i, c, mm], [i], [mm])
    assert quantize(graph, E4M3, None) == {"fp8_matmuls": 0}
    assert graph.outputs == [mm]


def test_mx_quantizes_the_weight_along_k_and_leaves_the_activation_to_the_kernel():
    from trnc.isa.enums import ScaleMode
    from trnc.passes.graph.quantize import quantize_mx_matmuls
    from trnc.runtime.mx import quantize_mx
    graph, w = _graph()
    assert quantize_mx_matmuls(graph, DType.FP4_E2M1, ScaleMode.RCEIL) == {"mx_matmuls": 1}
    ir.verify(graph)
    (mx,) = [n for n in graph.nodes if n.op == "matmul_mx"]
    x, elems, scales = mx.inputs
    assert x.op == "input" and mx.attrs == {"elem": "fp4_e2m1", "scale_mode": "rceil"}
    codes, expect = quantize_mx(w.attrs["value"], DType.FP4_E2M1, ScaleMode.RCEIL)
    assert elems.shape == (32, 16) and scales.shape == (1, 16)
    assert np.array_equal(elems.attrs["value"].view(np.uint8), codes.view(np.uint8))
    assert np.array_equal(scales.attrs["value"].view(np.uint8), expect)
