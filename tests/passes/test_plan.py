"""The plan pass on small graphs: which results stay in SBUF for the next kernel, transposed hand-overs,
orientation, row tiles and feature-major stores; the IR verifier's checks of a plan; the printer."""
from dataclasses import replace

import numpy as np
import pytest

import harness
from trnc import ir
from trnc.errors import VerifyError
from trnc.isa.dtypes import DType
from trnc.passes.graph.plan import KEEP_BYTES, plan_kernels

F32, BF16 = DType.FP32, DType.BF16
RNG = np.random.default_rng(3)


def _weight(k: int, n: int, dtype=F32) -> ir.Node:
    return harness.const(RNG.standard_normal((k, n)), dtype)


def _graph(inputs, kernels, outputs=None) -> ir.Graph:
    nodes = [n for k in kernels for n in k.nodes]
    consts = sorted({i for n in nodes for i in n.inputs if i.op == "const"}, key=lambda n: n.name)
    return ir.Graph(inputs + consts + nodes, inputs, outputs or [kernels[-1].output], kernels=kernels)


def _planned(inputs, kernels, outputs=None) -> tuple[ir.Graph, dict]:
    graph = _graph(inputs, kernels, outputs)
    stats = plan_kernels(graph)
    ir.verify(graph)
    return graph, stats


def _matmul_then(reader_op: str, m: int, n: int, pdim="n"):
    """x [m, 64] @ w [64, n], then a row-wise kernel over it."""
    x = harness.inp(0, (m, 64), F32)
    mm = ir.Node("matmul", (x, _weight(64, n)), (m, n), F32, {})
    row = ir.Node(reader_op, (mm,), (m, n), F32, {})
    return [x], [ir.Kernel("matmul", [mm], partition_dim=pdim), ir.Kernel(reader_op, [row])]


def test_rows_for_a_softmax_stay_in_sbuf_with_tokens_on_the_partitions():
    graph, stats = _planned(*_matmul_then("softmax", 256, 96))
    mm, sm = graph.kernels
    assert mm.plan == ir.KernelPlan("m", row_tiles=True, keep=True) and mm.partition_dim == "n"
    assert sm.plan == ir.KernelPlan(None) and stats["rows_on_chip"] == 1


@pytest.mark.parametrize("m, n, why", [(200, 96, "ragged rows"), (128 * 12, 768, "over KEEP_BYTES")])
def test_rows_that_do_not_fill_tiles_or_do_not_fit_go_through_hbm(m, n, why):
    assert (m // 128 * n * 4 > KEEP_BYTES) == (why == "over KEEP_BYTES")
    graph, stats = _planned(*_matmul_then("layer_norm", m, n))
    mm = graph.kernels[0]
    assert not mm.plan.keep and mm.plan.partition_dim == "n" and mm.plan.row_tiles and stats["rows_on_chip"] == 0


def test_no_hand_over_of_a_model_output_or_a_value_with_another_reader():
    inputs, kernels = _matmul_then("softmax", 256, 96)
    mm = kernels[0].output
    graph, _ = _planned(inputs, kernels, outputs=[kernels[1].output, mm])
    assert not graph.kernels[0].plan.keep
    inputs, kernels = _matmul_then("softmax", 256, 96)
    mm = kernels[0].output
    other = ir.Node("unary", (mm,), mm.shape, F32, {"func": "exp"})
    graph, _ = _planned(inputs, kernels + [ir.Kernel("elementwise", [other])])
    assert not graph.kernels[0].plan.keep


def _two_matmuls(h: int, compute=None, as_weight=False):
    x = harness.inp(0, (256, 64), F32)
    mid = ir.Node("matmul", (x, _weight(64, h)), (256, h), F32, {})
    out = ir.Node("matmul", (_weight(32, 256), mid), (32, h), F32, {}) if as_weight else \
        ir.Node("matmul", (mid, _weight(h, 32)), (256, 32), F32, {})
    return [x], [ir.Kernel("matmul", [mid], partition_dim="n"),
                 ir.Kernel("matmul", [out], partition_dim="n", compute_dtype=compute)]


def test_features_for_the_next_matmul_stay_in_sbuf_feature_major():
    graph, stats = _planned(*_two_matmuls(256))
    first, second = graph.kernels
    assert first.plan == ir.KernelPlan("n", keep=True, feature_major=True)
    assert not second.plan.keep and not second.plan.feature_major   # a model output is stored as is
    assert stats["features_on_chip"] == 1 and stats["feature_major"] == 1


def test_features_go_on_the_partitions_for_the_hand_over_whatever_layout_chose():
    """GPT-2's FFN1 costs the same with tokens or features on the partitions; layout keeps the first (m), the
    plan takes n for the hand-over."""
    inputs, kernels = _two_matmuls(256)
    kernels[0].partition_dim = "m"
    graph, stats = _planned(inputs, kernels)
    assert graph.kernels[0].partition_dim == "m" and stats["features_on_chip"] == 1
    assert graph.kernels[0].plan == ir.KernelPlan("n", keep=True, feature_major=True)


@pytest.mark.parametrize("case", ["ragged N", "other dtype", "read as b"])
def test_features_go_through_hbm_when_the_next_matmul_cannot_take_them_from_sbuf(case):
    inputs, kernels = _two_matmuls(192 if case == "ragged N" else 256, BF16 if case == "other dtype" else None,
                                   as_weight=case == "read as b")
    graph, _ = _planned(inputs, kernels)
    plan = graph.kernels[0].plan
    assert not plan.keep
    assert plan.feature_major   # still read by a matmul, N on the partitions


def test_a_result_any_non_contraction_reads_is_not_feature_major():
    inputs, kernels = _two_matmuls(256)
    mid = kernels[0].output
    act = ir.Node("unary", (mid,), mid.shape, F32, {"func": "relu"})
    graph, _ = _planned(inputs, kernels + [ir.Kernel("elementwise", [act])], outputs=[kernels[1].output, act])
    assert not graph.kernels[0].plan.feature_major and not graph.kernels[0].plan.keep


def test_feature_major_through_a_view_to_an_attention():
    """A projection read through a reshape and permute by an attention (Q, K and V per head)."""
    x = harness.inp(0, (128, 64), F32)
    qkv = ir.Node("matmul", (x, _weight(64, 64)), (128, 64), F32, {})
    heads = ir.Node("reshape", (qkv,), (128, 4, 16), F32, {})
    q = ir.Node("permute", (heads,), (4, 128, 16), F32, {"dims": (1, 0, 2)})
    att = ir.Node("attention", (q, q, q), (4, 128, 16), F32, {"scale": 0.25, "causal": False, "has_mask": False})
    kernels = [ir.Kernel("matmul", [qkv], partition_dim="n"), ir.Kernel("movement", [heads]),
               ir.Kernel("movement", [q]), ir.Kernel("attention", [att])]
    graph, _ = _planned([x], kernels)
    assert graph.kernels[0].plan == ir.KernelPlan("n", feature_major=True)


def _norm_then_matmul(rows: int, c: int, compute=None):
    x = harness.inp(0, (rows, c), F32)
    ln = ir.Node("layer_norm", (x,), (rows, c), F32, {"eps": 1e-5, "has_weight": False, "has_bias": False})
    mm = ir.Node("matmul", (ln, _weight(c, 64)), (rows, 64), F32, {})
    return [x], [ir.Kernel("layer_norm", [ln]), ir.Kernel("matmul", [mm], partition_dim="n", compute_dtype=compute)]


@pytest.mark.parametrize("rows, c, compute, transposed", [(256, 128, None, True), (200, 128, None, False),
                                                          (256, 96, None, False), (256, 128, BF16, False)])
def test_a_layer_norm_hands_the_next_matmul_its_transpose(rows, c, compute, transposed):
    graph, stats = _planned(*_norm_then_matmul(rows, c, compute))
    ln, mm = graph.kernels
    assert ln.plan.transposed == transposed and stats["transposed_on_chip"] == transposed
    assert ln.plan.keep == transposed   # the matmul is its only reader: the transpose is all it leaves
    assert mm.plan.row_tiles and not ln.plan.row_tiles   # row tiles are a matmul's decision only


def test_a_layer_norm_read_by_another_kernel_too_still_stores_its_result():
    inputs, kernels = _norm_then_matmul(256, 128)
    ln = kernels[0].output
    other = ir.Node("unary", (ln,), ln.shape, F32, {"func": "exp"})
    graph, _ = _planned(inputs, kernels + [ir.Kernel("elementwise", [other])], outputs=[kernels[1].output, other])
    assert graph.kernels[0].plan.transposed and not graph.kernels[0].plan.keep


def _viewed(node: ir.Node, shape: tuple[int, ...]) -> tuple[ir.Node, ir.Kernel]:
    view = ir.Node("reshape", (node,), shape, node.dtype, {})
    return view, ir.Kernel("movement", [view])


def test_hand_overs_go_past_views_that_only_add_or_drop_leading_unit_dims():
    """GPT-2's linears: layer norm [1, 256, 128] -> view [256, 128] -> FFN1 -> FFN2 -> view [1, 256, 128] -> layer
    norm. Each hand-over goes to the kernel after the view, which reads the same matrix."""
    x = harness.inp(0, (1, 256, 128), F32)
    ln1 = ir.Node("layer_norm", (x,), x.shape, F32, {"eps": 1e-5, "has_weight": False, "has_bias": False})
    flat, flat_k = _viewed(ln1, (256, 128))
    up = ir.Node("matmul", (flat, _weight(128, 256)), (256, 256), F32, {})
    down = ir.Node("matmul", (up, _weight(256, 128)), (256, 128), F32, {})
    back, back_k = _viewed(down, (1, 256, 128))
    ln2 = ir.Node("layer_norm", (back,), back.shape, F32, {"eps": 1e-5, "has_weight": False, "has_bias": False})
    kernels = [ir.Kernel("layer_norm", [ln1]), flat_k, ir.Kernel("matmul", [up], partition_dim="m"),
               ir.Kernel("matmul", [down], partition_dim="n"), back_k, ir.Kernel("layer_norm", [ln2])]
    graph, stats = _planned([x], kernels)
    assert ir.hand_over_reader(graph, 0, graph.users()) == (2, flat)
    assert ir.hand_over_reader(graph, 3, graph.users()) == (5, back)
    plans = [k.plan for k in graph.kernels]
    assert plans[0] == ir.KernelPlan(None, keep=True, transposed=True)
    assert plans[2] == ir.KernelPlan("n", row_tiles=True, keep=True, feature_major=True)
    assert plans[3] == ir.KernelPlan("m", row_tiles=True, keep=True)
    assert stats["transposed_on_chip"] == stats["features_on_chip"] == stats["rows_on_chip"] == 1


def test_no_hand_over_past_a_view_that_regroups_rows():
    """[256, 128] -> [2, 128, 128] is a batch of two matrices, not the matrix a kept tile holds."""
    x = harness.inp(0, (256, 64), F32)
    mm = ir.Node("matmul", (x, _weight(64, 128)), (256, 128), F32, {})
    view, view_k = _viewed(mm, (2, 128, 128))
    row = ir.Node("softmax", (view,), view.shape, F32, {})
    graph, _ = _planned([x], [ir.Kernel("matmul", [mm], partition_dim="n"), view_k, ir.Kernel("softmax", [row])])
    assert ir.hand_over_reader(graph, 0, graph.users()) == (1, mm)
    assert graph.kernels[0].plan == ir.KernelPlan("n")


def test_the_verifier_rejects_plans_without_their_reader():
    inputs, kernels = _matmul_then("softmax", 256, 96)
    graph, _ = _planned(inputs, kernels)
    mm, sm = graph.kernels
    graph.outputs.append(mm.output)        # the kept rows are now a model output: they must be stored
    with pytest.raises(VerifyError, match="keeps in SBUF a result the next kernel alone does not read"):
        ir.verify(graph)
    graph.outputs.pop()
    sm.plan = replace(sm.plan, partition_dim=0)
    with pytest.raises(VerifyError, match="differs from layout's None without a matmul's hand-over"):
        ir.verify(graph)
    sm.plan = replace(sm.plan, partition_dim=None, transposed=True)
    with pytest.raises(VerifyError, match="transposed hand-over from a kernel other than a norm"):
        ir.verify(graph)
    sm.plan = None
    with pytest.raises(VerifyError, match="k1 has no plan while others have one"):
        ir.verify(graph)


def test_the_printer_shows_each_kernels_dtype_partition_dim_and_plan():
    graph, _ = _planned(*_norm_then_matmul(256, 128, F32))
    text = graph.text()
    assert "k0 layer_norm: compute -, partition_dim None, plan partition_dim=None keep transposed" in text
    assert "k1 matmul: compute fp32, partition_dim n, plan partition_dim=n row_tiles" in text
