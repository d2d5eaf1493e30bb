"""fuse and precision on small legalized graphs: which nodes share a kernel, and which dtypes values get."""
import numpy as np

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.graph.fuse import fuse
from trnc.passes.graph.precision import apply_precision

F32 = DType.FP32


def _linear_gelu_residual():
    """y = gelu(x @ w + b) + x, then softmax(y)."""
    x = ir.Node("input", (), (8, 16), F32, {"index": 0}, name="x")
    w = ir.Node("const", (), (16, 16), F32, {"value": np.ones((16, 16), np.float32)}, name="w")
    b = ir.Node("const", (), (16,), F32, {"value": np.ones(16, np.float32)}, name="b")
    mm = ir.Node("matmul", (x, w), (8, 16), F32, name="mm")
    add = ir.Node("binary", (mm, b), (8, 16), F32, {"op": "add"}, name="add")
    act = ir.Node("unary", (add,), (8, 16), F32, {"func": "gelu"}, name="act")
    res = ir.Node("binary", (act, x), (8, 16), F32, {"op": "add"}, name="res")
    sm = ir.Node("softmax", (res,), (8, 16), F32, name="sm")
    return ir.Graph([x, w, b, mm, add, act, res, sm], [x], [sm]), (x, w, b, mm, add, act, res, sm)


def test_epilogue_joins_the_matmul_kernel():
    graph, (x, w, b, mm, add, act, res, sm) = _linear_gelu_residual()
    stats = fuse(graph)
    ir.verify(graph)
    assert [k.kind for k in graph.kernels] == ["matmul", "softmax"]
    assert graph.kernels[0].nodes == [mm, add, act, res]
    assert set(graph.kernels[0].inputs) == {x, w, b}
    assert stats["fused_into.matmul"] == 3


def test_a_value_with_two_users_ends_its_kernel():
    graph, (x, w, b, mm, add, act, res, sm) = _linear_gelu_residual()
    graph.outputs.append(add)   # add is now also a model output
    fuse(graph)
    assert graph.kernels[0].nodes == [mm, add]
    assert graph.kernels[1].kind == "elementwise" and graph.kernels[1].nodes == [act, res]


def _tanh_gelu(half_is_output=False):
    """GPT-2's GELU as traced: 0.5 x times 1 + tanh(c (x + 0.044715 x^3)), x a reshape of a matmul's result."""
    x = ir.Node("input", (), (8, 16), F32, {"index": 0}, name="x")
    view = ir.Node("reshape", (x,), (1, 8, 16), F32, name="view")
    half = ir.Node("scalar", (view,), (1, 8, 16), F32, {"op": "mul", "value": 0.5, "reverse": False}, name="half")
    cube = ir.Node("binary", (view, view), (1, 8, 16), F32, {"op": "mul"}, name="cube")
    inner = ir.Node("binary", (view, cube), (1, 8, 16), F32, {"op": "add"}, name="inner")
    tanh = ir.Node("unary", (inner,), (1, 8, 16), F32, {"func": "tanh"}, name="tanh")
    out = ir.Node("binary", (half, tanh), (1, 8, 16), F32, {"op": "mul"}, name="out")
    nodes = [x, view, half, cube, inner, tanh, out]
    return ir.Graph(nodes, [x], [out, half] if half_is_output else [out]), nodes


def test_two_elementwise_chains_that_meet_are_one_kernel():
    """half opens a kernel, cube another (view, a movement kernel, is not fusible); out joins cube's chain and
    half's kernel merges into it, first: one pass that reads view once and writes only out."""
    graph, (x, view, half, cube, inner, tanh, out) = _tanh_gelu()
    stats = fuse(graph)
    ir.verify(graph)
    assert [k.kind for k in graph.kernels] == ["movement", "elementwise"]
    assert graph.kernels[1].nodes == [half, cube, inner, tanh, out] and graph.kernels[1].inputs == [view]
    assert stats["kernel.elementwise"] == 1 and stats["merged_into.elementwise"] == 1


def test_a_chain_whose_end_has_another_user_stays_apart():
    graph, (x, view, half, cube, inner, tanh, out) = _tanh_gelu(half_is_output=True)
    fuse(graph)
    ir.verify(graph)
    assert [k.nodes for k in graph.kernels[1:]] == [[half], [cube, inner, tanh, out]]


def _matmul_then_tanh_gelu(result_is_output=False):
    """y = x @ w, then GPT-2's GELU on y read three times (0.5 y, y * y, y + ...)."""
    x = ir.Node("input", (), (8, 16), F32, {"index": 0}, name="x")
    w = ir.Node("const", (), (16, 16), F32, {"value": np.ones((16, 16), np.float32)}, name="w")
    y = ir.Node("matmul", (x, w), (8, 16), F32, name="y")
    half = ir.Node("scalar", (y,), (8, 16), F32, {"op": "mul", "value": 0.5, "reverse": False}, name="half")
    square = ir.Node("binary", (y, y), (8, 16), F32, {"op": "mul"}, name="square")
    inner = ir.Node("binary", (y, square), (8, 16), F32, {"op": "add"}, name="inner")
    tanh = ir.Node("unary", (inner,), (8, 16), F32, {"func": "tanh"}, name="tanh")
    out = ir.Node("binary", (half, tanh), (8, 16), F32, {"op": "mul"}, name="out")
    nodes = [x, w, y, half, square, inner, tanh, out]
    return ir.Graph(nodes, [x], [out, y] if result_is_output else [out]), nodes


def test_an_elementwise_kernel_that_alone_reads_a_result_joins_its_kernel():
    """No node may join y's kernel alone (y has four readers); the kernel of all of them joins it whole."""
    graph, (x, w, y, half, square, inner, tanh, out) = _matmul_then_tanh_gelu()
    stats = fuse(graph)
    ir.verify(graph)
    assert [k.kind for k in graph.kernels] == ["matmul"]
    assert graph.kernels[0].nodes == [y, half, square, inner, tanh, out] and graph.kernels[0].inputs == [x, w]
    assert stats["joined.matmul"] == 1 and stats["kernel.elementwise"] == 0


def test_a_square_of_a_matmul_result_is_its_epilogue():
    """y * y reads y twice: one node, but two reads, so it could not join alone."""
    x = ir.Node("input", (), (8, 16), F32, {"index": 0}, name="x")
    w = ir.Node("const", (), (16, 16), F32, {"value": np.ones((16, 16), np.float32)}, name="w")
    y = ir.Node("matmul", (x, w), (8, 16), F32, name="y")
    square = ir.Node("binary", (y, y), (8, 16), F32, {"op": "mul"}, name="square")
    graph = ir.Graph([x, w, y, square], [x], [square])
    fuse(graph)
    assert [k.nodes for k in graph.kernels] == [[y, square]]


def test_a_result_read_outside_the_kernel_keeps_its_kernel_apart():
    graph, (x, w, y, half, square, inner, tanh, out) = _matmul_then_tanh_gelu(result_is_output=True)
    fuse(graph)
    ir.verify(graph)
    assert [k.nodes for k in graph.kernels] == [[y], [half, square, inner, tanh, out]]


def test_matmult_narrows_only_matmul_operands():
    graph, (x, w, b, mm, add, act, res, sm) = _linear_gelu_residual()
    fuse(graph)
    stats = apply_precision(graph, DType.BF16, "matmult")
    assert graph.kernels[0].compute_dtype is DType.BF16
    assert w.dtype is DType.BF16 and w.attrs["value"].dtype == DType.BF16.storage
    assert b.dtype is F32 and act.dtype is F32 and sm.dtype is F32   # bias, activations, output stay fp32
    assert stats["consts_narrowed"] == 1


def test_all_narrows_intermediates_but_not_outputs():
    graph, (x, w, b, mm, add, act, res, sm) = _linear_gelu_residual()
    fuse(graph)
    apply_precision(graph, DType.BF16, "all")
    assert res.dtype is DType.BF16 and b.dtype is DType.BF16
    assert sm.dtype is F32 and x.dtype is F32


def test_fp32_changes_nothing():
    graph, nodes = _linear_gelu_residual()
    fuse(graph)
    apply_precision(graph, F32, "all")
    assert all(n.dtype is F32 for n in nodes)
    assert graph.kernels[0].compute_dtype is F32
