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


@pytest.mark.parametrize("case", ["ragged N", "other dtype", "read as b", "m on the partitions"])
def test_features_go_through_hbm_when_the_next_matmul_cannot_take_them_from_sbuf(case):
    inputs, kernels = _two_matmuls(192 if case == "ragged N" else 256, BF16 if case == "other dtype" else None,
                                   as_weight=case == "read as b")
    if case == "m on the partitions":
        kernels[0].partition_dim = "m"
    graph, _ = _planned(inputs, kernels)
    plan = graph.kernels[0].plan
    assert not plan.keep
    assert plan.feature_major == (case != "m on the partitions")   # still read by a matmul, N on the partitions


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
    assert mm.plan.row_tiles and not ln.plan.row_tiles   # row tiles are a matmul's decision only


def test_the_verifier_rejects_plans_without_their_reader():
    inputs, kernels = _matmul_then("softmax", 256, 96)
    graph, _ = _planned(inputs, kernels)
    mm, sm = graph.kernels
    graph.outputs.append(mm.output)        # the kept rows are now a model output: they must be stored
    with pytest.raises(VerifyError, match="keeps in SBUF a result the next kernel alone does not read"):
        ir.verify(graph)
    graph.outputs.pop()
    sm.plan = replace(sm.plan, partition_dim=0)
    with pytest.raises(VerifyError, match="differs from layout's None without a rows hand-over"):
        ir.verify(graph)
    sm.plan = replace(sm.plan, partition_dim=None, transposed=True)
    with pytest.raises(VerifyError, match="transposed hand-over from a kernel other than a layer norm"):
        ir.verify(graph)
    sm.plan = None
    with pytest.raises(VerifyError, match="k1 has no plan while others have one"):
        ir.verify(graph)


def test_the_printer_shows_each_kernels_dtype_partition_dim_and_plan():
    graph, _ = _planned(*_norm_then_matmul(256, 128, F32))
    text = graph.text()
    assert "k0 layer_norm: compute -, partition_dim None, plan partition_dim=None transposed" in text
    assert "k1 matmul: compute fp32, partition_dim n, plan partition_dim=n row_tiles" in text
