"""Test harness for passes: a model through the graph passes up to one of them, its graph checked against eager;
and a small legalized graph with chosen kernels, compiled by the tile, allocate, schedule and emit passes, then
run on the numpy reference and the JIT (bit-equal)."""
from __future__ import annotations

import numpy as np
import torch

from trnc import ir
from trnc.capture import capture
from trnc.interpret import run_graph
from trnc.isa.config import get_target
from trnc.passes.tile.allocate import Allocate
from trnc.passes.tile.emit import Emit
from trnc.options import Options
from trnc.passes.pipeline import PIPELINE, CompileState
from trnc.passes.graph.plan import PlanKernels
from trnc.passes.tile.schedule import Schedule
from trnc.passes.tile.lower import LowerToTiles
from trnc.passes.tile.prefetch import Prefetch
from trnc.runtime import reference
from trnc.runtime.jit import executor


def through(last: str, model: torch.nn.Module, *inputs: torch.Tensor, tol: float) -> CompileState:
    """The state after the pipeline's passes up to and including `last`; its graph computes what the model does
    (outputs of eager's dtypes, values within `tol`)."""
    graph, _ = capture(model.eval(), inputs)
    state = CompileState(graph, Options(), get_target("trn2"))
    for p in PIPELINE[:[p.name for p in PIPELINE].index(last) + 1]:
        state.stats[p.name] = p.run(state)
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(run_graph(state.graph, list(inputs)), expected, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    return state


def inp(index: int, shape, dtype) -> ir.Node:
    return ir.Node("input", (), shape, dtype, {"index": index}, name=f"x{index}")


def const(value: np.ndarray, dtype) -> ir.Node:
    return ir.Node("const", (), value.shape, dtype, {"value": value.astype(dtype.storage)})


def compile_kernels(inputs: list[ir.Node], kernels: list[ir.Kernel], outputs: list[ir.Node] | None = None,
                    target: str = "trn2") -> CompileState:
    """Run plan -> tile -> prefetch -> allocate -> schedule -> emit on a graph made of `kernels` (in order)."""
    nodes = [n for k in kernels for n in k.nodes]
    consts = {i for n in nodes for i in n.inputs if i.op == "const"}
    graph = ir.Graph(list(inputs) + sorted(consts, key=lambda n: n.name) + nodes, list(inputs),
                     outputs or [kernels[-1].output], kernels=list(kernels))
    ir.verify(graph)
    state = CompileState(graph, Options(target=target), get_target(target))
    for p in (PlanKernels(), LowerToTiles(), Prefetch(), Allocate(), Schedule(), Emit()):
        state.stats[p.name] = p.run(state)
    return state


def run_both(state: CompileState, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Run the program on the reference and the JIT; require bit-equal outputs (NaN by class); return them."""
    feed = {name: a for name, a in zip(state.tiles.inputs, arrays)}
    feed.update(state.tiles.constants)
    ref = reference.run(state.program, feed, verified=True)
    jit = executor.run(state.program, feed, verified=True)
    outs = []
    for name in state.tiles.outputs:
        a, b = np.atleast_1d(ref[name]), np.atleast_1d(jit[name])
        av, bv = a.view(np.uint8).reshape(a.shape + (-1,)), b.view(np.uint8).reshape(b.shape + (-1,))
        nan = np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32)) if a.dtype.kind == "f" or \
            str(a.dtype) in ("bfloat16",) else np.zeros(a.shape, bool)
        same = np.all(av == bv, axis=-1) | nan
        assert same.all(), f"{name}: JIT and reference differ at {np.argwhere(~same)[:5].tolist()}"
        outs.append(ref[name])
    return outs


def compile_and_run(inputs, kernels, arrays, outputs=None, target="trn2"):
    state = compile_kernels(inputs, kernels, outputs, target)
    return run_both(state, arrays), state


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| in float64 (shapes must match)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    return float(np.abs(got - ref).max() / np.abs(ref).max())
