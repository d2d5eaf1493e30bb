"""precision: the storage dtype of every value and the operand dtype of every matmul (neuronx-cc's auto_cast).

`auto_cast`: "none" keeps the model's dtypes; "matmult" gives matmul and attention operands the
low-precision type (`precision`, e.g. bf16) and stores the constant weights that only feed them
in it (half the HBM bytes); "all" also stores every floating intermediate value in it. Softmax,
norms and reductions always accumulate in fp32 (the engines compute in fp32; only storage
narrows), and the model's inputs and outputs keep their dtypes. trnc/options.py checks the values.
"""
from __future__ import annotations

from dataclasses import dataclass

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.runtime.convert import from_fp32, to_fp32

CONTRACT_KINDS = ("matmul", "attention")


def apply_precision(graph: ir.Graph, low: DType, auto_cast: str) -> dict:
    narrow = auto_cast != "none" and low is not DType.FP32
    contract_operands: set[ir.Node] = set()
    for k in graph.kernels:
        first = k.nodes[0]
        k.compute_dtype = low if (narrow and k.kind in CONTRACT_KINDS) else (
            first.inputs[0].dtype if k.kind in CONTRACT_KINDS else None)
        if k.kind in CONTRACT_KINDS:
            contract_operands.update(first.inputs[:3])
    stats = {"consts_narrowed": 0, "values_narrowed": 0}
    if not narrow:
        return stats
    users = graph.users()
    keep = set(graph.outputs) | set(graph.inputs)
    for out in graph.outputs:   # the views an output is made of keep its dtype, so no kernel re-reads to widen
        n = out
        while n.op in ir.OPS_MOVEMENT and n.op != "cat" and len(users[n.inputs[0]]) == 1:
            n = n.inputs[0]
            keep.add(n)
    kernel_nodes = {n for k in graph.kernels for n in k.nodes}
    for n in graph.nodes:
        if n in keep or not n.dtype.is_float or n.dtype is low:
            continue
        if n.op == "const":
            only_contract = all(u in kernel_nodes and u.op in ("matmul", "attention") for u in users[n])
            if auto_cast == "all" or (only_contract and n in contract_operands):
                value = n.attrs["value"]
                n.attrs["value"] = from_fp32(to_fp32(value, n.dtype), low).reshape(value.shape)
                n.dtype = low
                stats["consts_narrowed"] += 1
        elif auto_cast == "all" and n.op != "input":
            n.dtype = low
            stats["values_narrowed"] += 1
    return stats


@dataclass(frozen=True)
class Precision:
    """Storage and operand dtypes from the precision and auto_cast options."""

    name: str = "precision"

    def run(self, state) -> dict:
        return apply_precision(state.graph, state.options.low_dtype, state.options.auto_cast)
