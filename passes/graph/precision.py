"""precision: the storage dtype of every value and the operand dtype of every matmul (neuronx-cc's auto_cast).

`auto_cast`: "none" keeps the model's dtypes; "matmult" gives matmul and attention operands the
low-precision type (`precision`, e.g. bf16) and stores the constant weights that only feed them
in it (half the HBM bytes); "all" also stores every floating intermediate value in it. Softmax,
norms and reductions always accumulate in fp32 (the engines compute in fp32; only storage
narrows), and the model's inputs and outputs keep their dtypes, as do nodes marked `keep_fp32` (the
partial sums of a matmul legalize writes as outer products, which TensorE would keep in PSUM, and the
fp32 intermediates of ops legalize decomposes, which torch never rounds); fp8 values (the quantize pass's, a
model's own casts) keep their type, and a matmul of fp8 operands computes in it. A matmul whose nn.Module
keep_precision names keeps that dtype, and its constant operands are not narrowed; so does a `keep_fp32` matmul.
trnc/options.py checks the values.
"""
from __future__ import annotations

from dataclasses import dataclass

from trnc import ir
from trnc.isa.dtypes import MX_FORMATS, DType
from trnc.passes.graph.kernel_kinds import KINDS
from trnc.runtime.convert import from_fp32, to_fp32

CONTRACT_KINDS = frozenset(k.name for k in KINDS.values() if k.contraction)   # matmul, attention


def apply_precision(graph: ir.Graph, low: DType, auto_cast: str, kept=lambda module: None,
                    attention: DType | None = None) -> dict:
    """`kept`: the dtype a node's nn.Module keeps its matmuls in (Options.kept_dtype), or None; `attention`: the
    dtype of attention kernels' matmuls (Options.attention_dtype), or None to follow auto_cast."""
    narrow = auto_cast != "none" and low is not DType.FP32
    contract_operands: set[ir.Node] = set()
    for k in graph.kernels:
        first = k.nodes[0]
        # passes/graph/quantize.py: fp8 operands, or an MX matmul, whose kernel quantizes its input as it loads
        quantized = k.kind in CONTRACT_KINDS and (first.inputs[0].dtype in MX_FORMATS or first.op == "matmul_mx"
                                                  or "quantize" in first.attrs)
        k.compute_dtype = low if (narrow and k.kind in CONTRACT_KINDS and not quantized) else (
            _operand_dtype(first) if k.kind in CONTRACT_KINDS else None)
        if k.kind in CONTRACT_KINDS and not quantized and kept(first.module) is not None:
            k.compute_dtype = kept(first.module)
        elif k.kind == "attention" and attention is not None:
            k.compute_dtype = attention
        elif first.attrs.get("keep_fp32") and first.inputs:   # a sum legalize writes as a matmul (cumsum) keeps
            k.compute_dtype = first.inputs[0].dtype            # eager's dtype (a random draw reads nothing)
        elif k.kind in CONTRACT_KINDS:
            contract_operands.update(first.inputs[:3])
    stats = {"consts_narrowed": 0, "values_narrowed": 0}
    if not narrow:
        return stats
    _round_outer_product_operands(graph, low)
    users = graph.users()
    keep = set(graph.outputs) | set(graph.inputs)
    for out in graph.outputs:   # the views an output is made of keep its dtype, so no kernel re-reads to widen
        n = out
        while n.op in ir.OPS_MOVEMENT and n.op != "cat" and len(users[n.inputs[0]]) == 1:
            n = n.inputs[0]
            keep.add(n)
    kernel_nodes = {n for k in graph.kernels for n in k.nodes}
    for n in graph.nodes:
        if n in keep or not n.dtype.is_float or n.dtype is low or n.dtype in MX_FORMATS or n.attrs.get("keep_fp32"):
            continue
        if n.op == "const":
            only_contract = all(u in kernel_nodes and u.op in ir.OPS_CONTRACT for u in users[n])
            if auto_cast == "all" or (only_contract and n in contract_operands):
                value = n.attrs["value"]
                n.attrs["value"] = from_fp32(to_fp32(value, n.dtype), low).reshape(value.shape)
                n.dtype = low
                stats["consts_narrowed"] += 1
        elif auto_cast == "all" and n.op != "input":
            n.dtype = low
            stats["values_narrowed"] += 1
    return stats


def _operand_dtype(first: ir.Node) -> DType:
    """The dtype a contraction kernel's operands enter TensorE in: the one its matmul quantizes to, else its
    first operand's."""
    q = first.attrs.get("quantize")
    return DType.from_text(q["dtype"]) if q is not None else first.inputs[0].dtype


def _round_outer_product_operands(graph: ir.Graph, low: DType) -> None:
    """A tiny matmul that legalize wrote as outer products (its `outer_product` nodes) gets its operands rounded
    to `low` by a cast in the product's kernel, as TensorE's operands are: an operand's own label says nothing,
    since a view of a model input that keeps fp32 is labelled `low` under auto_cast="all" but reads fp32."""
    for k in graph.kernels:
        for n in [n for n in k.nodes if n.attrs.get("outer_product")]:
            casts = [ir.Node("cast", (i,), i.shape, low, source=n.source) for i in n.inputs]
            graph.nodes[graph.nodes.index(n):graph.nodes.index(n)] = casts
            k.nodes[k.nodes.index(n):k.nodes.index(n)] = casts
            n.inputs = tuple(casts)


@dataclass(frozen=True)
class Precision:
    """Storage and operand dtypes from the precision and auto_cast options."""

    name: str = "precision"

    def run(self, state) -> dict:
        return apply_precision(state.graph, state.options.low_dtype, state.options.auto_cast,
                               state.options.kept_dtype, state.options.attention_dtype)
