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
