"""fold: nodes of constant inputs become constants computed by the IR interpreter, unless the result would be
much larger than its inputs; and the interpreter rules fold relies on (the machine's read/compute/write
numerics, the attention and gather semantics, const arrays in and out of torch)."""
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trnc import ir
from trnc.errors import TrncError
from trnc.dtypes import array_of, tensor_of
from trnc.interpret import evaluate, run_graph, store
from trnc.isa.dtypes import DType
from trnc.passes.graph.fold import FOLD_MAX_ELEMENTS, FoldConstants

RNG = np.random.default_rng(0)
F32 = DType.FP32


def const(array, dtype=F32):
    return ir.Node("const", (), array.shape, dtype, {"value": np.asarray(array, dtype=dtype.storage)})


def node(op, inputs, shape, dtype=F32, /, **attrs):
    return ir.Node(op, tuple(inputs), shape, dtype, attrs)


def fold(graph):
    stats = FoldConstants().run(SimpleNamespace(graph=graph))
    ir.verify(graph)
    return stats


def test_constant_subgraphs_fold_and_the_rest_stays():
    a, b = const(RNG.standard_normal((2, 3))), const(RNG.standard_normal(3))
    x = node("input", (), (2, 3), index=0)
    add = node("binary", (a, b), (2, 3), op="add")
    exp = node("unary", (add,), (2, 3), func="exp")
    mul = node("binary", (exp, x), (2, 3), op="mul")
    graph = ir.Graph([a, b, x, add, exp, mul], [x], [mul, exp])
    inputs = [torch.randn(2, 3)]
    before = run_graph(graph, inputs)
    assert fold(graph) == {"folded": 2, "pruned": 3}    # add and exp folded; a, b and the folded add pruned
    assert [n.op for n in graph.nodes] == ["input", "const", "binary"]
    assert graph.outputs[1].op == "const" and graph.outputs[1].name == exp.name
    after = run_graph(graph, inputs)
    assert all(torch.equal(p, q) for p, q in zip(before, after))


def test_a_large_expansion_stays_a_node_and_a_large_copy_folds():
    scalar = const(np.array(1.5, dtype=np.float32))
    rows = (FOLD_MAX_ELEMENTS // 1024) + 1
    big = node("expand", (scalar,), (rows, 1024))                  # > 4M elements and > 4x its input: kept
    small = node("expand", (scalar,), (1024, 1024))               # 1M elements: folded
    wide = const(np.zeros((rows, 1024), dtype=np.uint8), DType.UINT8)
    moved = node("permute", (wide,), (1024, rows), DType.UINT8, dims=(1, 0))   # big, but no larger than its input
    graph = ir.Graph([scalar, big, small, wide, moved], [], [big, small, moved])
    assert fold(graph)["folded"] == 2
    assert [o.op for o in graph.outputs] == ["expand", "const", "const"]
    assert graph.outputs[1].attrs["value"].shape == (1024, 1024) and (graph.outputs[1].attrs["value"] == 1.5).all()


def test_folded_bf16_values_are_what_the_machine_writes():
    a = const(np.array([1.0, 3.0, 1.0 / 3.0], dtype=np.float32))
    b = const(np.array([3.0, 3.0, 3.0], dtype=np.float32))
    div = node("binary", (a, b), (3,), DType.BF16, op="div")
    graph = ir.Graph([a, b, div], [], [div])
    fold(graph)
    expected = (np.array([1.0, 3.0, 1.0 / 3.0], np.float32) / np.float32(3.0)).astype(ml_dtypes.bfloat16)
    assert graph.outputs[0].attrs["value"].tobytes() == expected.tobytes()


# -- the interpreter's numerics -----------------------------------------------------------------------------
def test_writes_to_integers_round_half_to_even_saturate_and_zero_nan():
    t = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 300.0, -7.0, float("nan"), float("inf")])
    assert store(t, DType.UINT8).tolist() == [0, 2, 2, 0, 0, 255, 0, 0, 255]
    assert store(t, DType.INT32).tolist() == [0, 2, 2, 0, -2, 300, -7, 0, 2 ** 31 - 1]


def test_int32_reads_round_above_two_to_the_24():
    x = node("input", (), (1,), DType.INT32, index=0)
    copy = node("unary", (x,), (1,), DType.INT32, func="copy")
    graph = ir.Graph([x, copy], [x], [copy])
    (out,) = run_graph(graph, [torch.tensor([2 ** 24 + 1])])
    assert out.item() == 2 ** 24        # fp32 holds 2^24 + 1 as 2^24


def test_comparisons_and_logic_give_zero_or_one():
    a = torch.tensor([0.0, 1.0, 2.0, float("nan")])
    b = torch.tensor([0.0, 2.0, 1.0, float("nan")])
    cases = {"eq": [1, 0, 0, 0], "ne": [0, 1, 1, 1], "lt": [0, 1, 0, 0], "ge": [1, 0, 1, 0],
             "and": [0, 1, 1, 1], "xor": [0, 0, 0, 0]}
    for op, expected in cases.items():
        n = node("binary", (const(np.zeros(4)), const(np.zeros(4))), (4,), DType.UINT8, op=op)
        out = evaluate(n, [a, b])
        assert out.dtype == torch.uint8 and out.tolist() == expected, op


def test_scalar_operands_and_their_order():
    x = torch.tensor([1.0, 2.0, 4.0])
    c = const(np.zeros(3))
    assert evaluate(node("scalar", (c,), (3,), op="sub", value=1.0, reverse=True), [x]).tolist() == [0, -1, -3]
    assert evaluate(node("scalar", (c,), (3,), op="div", value=2.0, reverse=False), [x]).tolist() == [0.5, 1, 2]
    assert evaluate(node("scalar", (c,), (3,), op="max", value=1.5, reverse=False), [x]).tolist() == [1.5, 2, 4]


def test_attention_with_mask_and_causal_matches_torch():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
    mask = torch.randn(4, 6)
    shapes = [const(np.zeros(t.shape)) for t in (q, k, v, mask)]
    att = node("attention", shapes, (2, 3, 4, 5), scale=0.2, causal=False, has_mask=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2)
    torch.testing.assert_close(evaluate(att, [q, k, v, mask]), ref, rtol=1e-5, atol=1e-6)
    causal = node("attention", shapes[:3], (2, 3, 4, 5), scale=0.2, causal=True, has_mask=False)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2)   # top-left aligned for Sq < Sk
    torch.testing.assert_close(evaluate(causal, [q, k, v]), ref, rtol=1e-5, atol=1e-6)


def test_gather_rows_and_layer_norm_flags():
    table, index = torch.randn(5, 3), torch.tensor([[4, 0], [2, 2]], dtype=torch.int32)
    g = node("gather", (const(np.zeros((5, 3))), const(np.zeros((2, 2)), DType.INT32)), (2, 2, 3))
    assert torch.equal(evaluate(g, [table, index]), table[index.long()])
    x, bias = torch.randn(2, 3), torch.randn(3)
    ln = node("layer_norm", (const(np.zeros((2, 3))), const(np.zeros(3))), (2, 3), eps=1e-5, has_weight=False,
              has_bias=True)
    torch.testing.assert_close(evaluate(ln, [x, bias]), F.layer_norm(x, (3,), None, bias, 1e-5))


def test_const_arrays_round_trip_through_torch():
    bf16 = torch.randn(7).to(torch.bfloat16)
    array = array_of(bf16, DType.BF16)
    assert array.dtype == ml_dtypes.bfloat16 and np.array_equal(array.astype(np.float32), bf16.float().numpy())
    assert torch.equal(tensor_of(array, DType.BF16), bf16)
    assert array_of(torch.tensor([True, False]), DType.UINT8).tolist() == [1, 0]
    with pytest.raises(ValueError, match="do not fit int32"):
        array_of(torch.tensor([2 ** 40]), DType.INT32)


def test_the_interpreter_refuses_aten_nodes_and_wrong_inputs():
    x = node("input", (), (2,), index=0)
    aten = node("aten.sort.default", (x,), (2,))
    with pytest.raises(TrncError, match="cannot run op 'aten.sort.default'"):
        run_graph(ir.Graph([x, aten], [x], [aten]), [torch.zeros(2)])
    with pytest.raises(TrncError, match=r"shape \[3\]"):
        run_graph(ir.Graph([x], [x], [x]), [torch.zeros(3)])


def test_a_constant_attention_mask_is_folded_into_one_constant():
    from trnc.capture import capture
    from trnc.passes.graph.legalize import Legalize

    def causal(q):
        mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    q = torch.randn(1, 2, 4, 8)
    graph, _ = capture(_Fn(causal), (q,))
    Legalize().run(SimpleNamespace(graph=graph))
    (att,) = [n for n in graph.nodes if n.op == "attention"]
    assert att.inputs[3].op == "where" and all(i.op == "const" for i in att.inputs[3].inputs)
    assert fold(graph)["folded"] == 1
    (att,) = [n for n in graph.nodes if n.op == "attention"]
    mask = att.inputs[3]
    assert mask.op == "const" and mask.dtype is F32
    assert np.array_equal(mask.attrs["value"], np.where(np.tril(np.ones((4, 4))), 0, -np.inf).astype(np.float32))
    torch.testing.assert_close(run_graph(graph, [q])[0], causal(q), rtol=1e-6, atol=1e-6)


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)
