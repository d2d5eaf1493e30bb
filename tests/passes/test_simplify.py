"""simplify and merge-matmuls on small graphs: the rewrites happen and the graph's meaning does not change."""
import copy

import numpy as np
import torch

from trnc import ir
from trnc.interpret import run_graph
from trnc.isa.dtypes import DType
from trnc.passes.graph.fuse import fuse
from trnc.passes.graph.merge_matmuls import merge_matmuls
from trnc.passes.graph.simplify import simplify

F32 = DType.FP32
RNG = np.random.default_rng(0)


def _const(shape, name):
    return ir.Node("const", (), shape, F32, {"value": RNG.standard_normal(shape).astype(np.float32)}, name=name)


def _linear_residual():
    """x [2, 8, 16] -> reshape [16, 16] -> matmul -> + bias -> reshape [2, 8, 16] -> + x -> gelu."""
    x = ir.Node("input", (), (2, 8, 16), F32, {"index": 0}, name="x")
    w, b = _const((16, 16), "w"), _const((16,), "b")
    flat = ir.Node("reshape", (x,), (16, 16), F32, name="flat")
    mm = ir.Node("matmul", (flat, w), (16, 16), F32, name="mm")
    add = ir.Node("binary", (mm, b), (16, 16), F32, {"op": "add"}, name="bias")
    back = ir.Node("reshape", (add,), (2, 8, 16), F32, name="back")
    res = ir.Node("binary", (back, x), (2, 8, 16), F32, {"op": "add"}, name="res")
    act = ir.Node("unary", (res,), (2, 8, 16), F32, {"func": "gelu"}, name="act")
    return ir.Graph([x, w, b, flat, mm, add, back, res, act], [x], [act])


def _same_meaning(before, after, shapes):
    """Equal up to fp32 summation order (torch's matmul blocks a wider product differently)."""
    args = [torch.randn(s) for s in shapes]
    for a, b in zip(run_graph(before, args), run_graph(after, args)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_reshape_sinks_so_the_residual_and_activation_fuse_into_the_matmul():
    graph = _linear_residual()
    before = copy.deepcopy(graph)
    stats = simplify(graph)
    ir.verify(graph)
    assert stats["reshapes_sunk"] == 2
    _same_meaning(before, graph, [(2, 8, 16)])
    fuse(graph)
    matmul = next(k for k in graph.kernels if k.kind == "matmul")
    assert [n.op for n in matmul.nodes] == ["matmul", "binary", "binary", "unary"]
    assert graph.outputs[0].op == "reshape"


def test_a_view_with_several_readers_sinks_below_all_of_them():
    """GPT-2's GELU reads the view of the c_fc result four times: every reader computes on the result itself,
    the view goes, and one view of the GELU's end remains (y4 reads y2 and the view: both come from [16, 16])."""
    x = ir.Node("input", (), (16, 16), F32, {"index": 0}, name="x")
    view = ir.Node("reshape", (x,), (2, 8, 16), F32, name="view")
    y1 = ir.Node("scalar", (view,), (2, 8, 16), F32, {"op": "mul", "value": 0.5, "reverse": False}, name="y1")
    y2 = ir.Node("binary", (view, view), (2, 8, 16), F32, {"op": "mul"}, name="y2")
    y3 = ir.Node("binary", (y2, view), (2, 8, 16), F32, {"op": "add"}, name="y3")
    y4 = ir.Node("binary", (y1, y3), (2, 8, 16), F32, {"op": "mul"}, name="y4")
    graph = ir.Graph([x, view, y1, y2, y3, y4], [x], [y4])
    before = copy.deepcopy(graph)
    simplify(graph)
    ir.verify(graph)
    _same_meaning(before, graph, [(16, 16)])
    assert [n.op for n in graph.nodes if n.op == "reshape"] == ["reshape"] and graph.outputs[0].op == "reshape"
    assert all(n.shape == (16, 16) for n in graph.nodes if n.op != "reshape")


def test_a_view_with_a_reader_that_cannot_take_it_stays():
    """One reader is a softmax (not elementwise): the view stays for every reader, so x keeps one reader."""
    x = ir.Node("input", (), (16, 16), F32, {"index": 0}, name="x")
    view = ir.Node("reshape", (x,), (2, 8, 16), F32, name="view")
    y1 = ir.Node("scalar", (view,), (2, 8, 16), F32, {"op": "mul", "value": 0.5, "reverse": False}, name="y1")
    sm = ir.Node("softmax", (view,), (2, 8, 16), F32, name="sm")
    out = ir.Node("binary", (y1, sm), (2, 8, 16), F32, {"op": "add"}, name="out")
    graph = ir.Graph([x, view, y1, sm, out], [x], [out])
    stats = simplify(graph)
    assert stats["reshapes_sunk"] == 0 and y1.inputs == (view,) and sm.inputs == (view,)


def test_a_view_to_a_scalar_with_several_readers_stays():
    """A reshape of [1] to () has no last dim to keep (linear_cross_entropy's OpInfo sample raised IndexError)."""
    x = ir.Node("input", (), (1,), F32, {"index": 0}, name="x")
    view = ir.Node("reshape", (x,), (), F32, name="view")
    y1 = ir.Node("scalar", (view,), (), F32, {"op": "mul", "value": 0.5, "reverse": False}, name="y1")
    y2 = ir.Node("unary", (view,), (), F32, {"func": "exp"}, name="y2")
    out = ir.Node("binary", (y1, y2), (), F32, {"op": "add"}, name="out")
    graph = ir.Graph([x, view, y1, y2, out], [x], [out])
    assert simplify(graph)["reshapes_sunk"] == 0 and y1.inputs == (view,)


def test_cse_merges_identical_views():
    x = ir.Node("input", (), (4, 6), F32, {"index": 0}, name="x")
    v1 = ir.Node("reshape", (x,), (24,), F32)
    v2 = ir.Node("reshape", (x,), (24,), F32)
    out = ir.Node("binary", (v1, v2), (24,), F32, {"op": "mul"})
    graph = ir.Graph([x, v1, v2, out], [x], [out])
    assert simplify(graph)["cse"] == 1
    assert out.inputs[0] is out.inputs[1]


def test_sibling_matmuls_merge_with_their_biases():
    x = ir.Node("input", (), (8, 16), F32, {"index": 0}, name="x")
    nodes, outs = [x], []
    for i, n in enumerate((16, 8, 24)):
        w, b = _const((16, n), f"w{i}"), _const((n,), f"b{i}")
        mm = ir.Node("matmul", (x, w), (8, n), F32)
        add = ir.Node("binary", (mm, b), (8, n), F32, {"op": "add"})
        nodes += [w, b, mm, add]
        outs.append(ir.Node("unary", (add,), (8, n), F32, {"func": "relu"}))
    graph = ir.Graph(nodes + outs, [x], outs)
    before = copy.deepcopy(graph)
    assert merge_matmuls(graph)["matmuls_merged"] == 3
    ir.verify(graph)
    matmuls = [n for n in graph.nodes if n.op == "matmul"]
    assert len(matmuls) == 1 and matmuls[0].shape == (8, 48)
    assert sum(n.op == "slice" for n in graph.nodes) == 3
    _same_meaning(before, graph, [(8, 16)])


def test_matmuls_of_different_inputs_stay_apart():
    x = ir.Node("input", (), (8, 16), F32, {"index": 0}, name="x")
    y = ir.Node("input", (), (8, 16), F32, {"index": 1}, name="y")
    w0, w1 = _const((16, 4), "w0"), _const((16, 4), "w1")
    a, b = ir.Node("matmul", (x, w0), (8, 4), F32), ir.Node("matmul", (y, w1), (8, 4), F32)
    graph = ir.Graph([x, y, w0, w1, a, b], [x, y], [a, b])
    assert merge_matmuls(graph)["matmuls_merged"] == 0
