"""The layout pass on small graphs: each kernel's partition dim by the cost of its candidates, decided once per
kernel signature, with candidates lowered through an explicit plan (the kernel itself is never changed)."""
import numpy as np

import harness
from trnc import ir
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.passes.graph.layout import choose_layouts, estimate

F32 = DType.FP32
HW = get_target("trn2")
RNG = np.random.default_rng(7)


def _linear(m: int, k: int, n: int, bias: bool) -> ir.Kernel:
    x = harness.inp(0, (m, k), F32)
    w = harness.const(RNG.standard_normal((k, n)), F32)
    nodes = [ir.Node("matmul", (x, w), (m, n), F32, {})]
    if bias:
        b = harness.const(RNG.standard_normal(n), F32)
        nodes.append(ir.Node("binary", (nodes[0], b), (m, n), F32, {"op": "add"}))
    return ir.Kernel("matmul", nodes)


def _graph(kernels) -> ir.Graph:
    nodes = [n for k in kernels for n in k.nodes]
    leaves = sorted({i for n in nodes for i in n.inputs if i.op in ("const", "input")}, key=lambda n: n.name)
    return ir.Graph(leaves + nodes, [i for i in leaves if i.op == "input"], [kernels[-1].output], kernels=kernels)


def test_estimating_a_candidate_leaves_the_kernel_as_it_was():
    kernel = _linear(256, 128, 256, bias=True)
    seconds = {dim: estimate(kernel, dim, HW) for dim in ("m", "n")}
    assert kernel.partition_dim is None and kernel.plan is None
    assert all(s > 0 for s in seconds.values())


def test_a_per_feature_bias_puts_features_on_the_partitions():
    """With N on the partitions the bias is a per-partition operand of the evacuation; with M there it is a
    full tile loaded 128 times over: the estimate prefers "n", and the pass takes the cheaper one."""
    kernel = _linear(256, 128, 256, bias=True)
    assert estimate(kernel, "n", HW) < estimate(kernel, "m", HW)
    stats = choose_layouts(_graph([kernel]), HW)
    assert kernel.partition_dim == "n" and stats == {"estimated": 1, "reused": 0}


def test_kernels_of_one_signature_reuse_the_first_decision():
    first, second = _linear(256, 128, 256, bias=True), _linear(256, 128, 256, bias=True)
    other = _linear(256, 128, 384, bias=True)
    stats = choose_layouts(_graph([first, second, other]), HW)
    assert stats == {"estimated": 2, "reused": 1}
    assert first.partition_dim == second.partition_dim


def test_a_chosen_dim_is_kept_and_kernels_without_candidates_are_left_alone():
    chosen = _linear(256, 128, 256, bias=True)
    chosen.partition_dim = "m"
    x = harness.inp(1, (2, 128, 16), F32)
    att = ir.Kernel("attention", [ir.Node("attention", (x, x, x), (2, 128, 16), F32,
                                          {"scale": 0.25, "causal": True, "has_mask": False})])
    stats = choose_layouts(_graph([chosen, att]), HW)
    assert chosen.partition_dim == "m" and att.partition_dim is None and stats["estimated"] == 0


def test_a_single_candidate_is_taken_without_an_estimate():
    x = harness.inp(0, (1, 300), F32)
    relu = ir.Kernel("elementwise", [ir.Node("unary", (x,), (1, 300), F32, {"func": "relu"})])
    stats = choose_layouts(_graph([relu]), HW)
    assert relu.partition_dim == 1 and stats["estimated"] == 0
