"""merge-matmuls on its own: small models captured and run through the graph passes up to merge-matmuls, then
what was merged, what was shared and what was left apart, and the merged graph's meaning against eager torch."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from trnc.passes.pipeline import CompileState

from harness import through


class Projections(nn.Module):
    """Attention's query, key and value projections of one input (of widths 16, 16, 24)."""

    def __init__(self, bias: tuple[bool, bool, bool] = (True, True, True)):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(32, n, bias=b) for n, b in zip((16, 16, 24), bias))

    def forward(self, x):
        return torch.softmax(self.q(x) @ self.k(x).T, -1) @ self.v(x)


class SharedLayers(Projections):
    """Two layers with the same projections (ALBERT shares its layers' weights)."""

    def forward(self, x):
        return super().forward(super().forward(x)[:, :16].repeat(1, 2))


def merged(model: nn.Module, *inputs: torch.Tensor) -> CompileState:
    """The state after merge-matmuls; its graph computes what the model does (checked here)."""
    return through("merge-matmuls", model, *inputs, tol=1e-5)


def matmuls(state: CompileState) -> list:
    return [n for n in state.graph.nodes if n.op == "matmul" and n.inputs[1].op == "const"]


def test_query_key_value_of_one_input_become_one_matmul_with_one_bias():
    model = Projections()
    state = merged(model, torch.randn(8, 32))
    assert state.stats["merge-matmuls"]["matmuls_merged"] == 3
    (mm,) = matmuls(state)
    assert mm.inputs[0].op == "input" and mm.shape == (8, 56)
    weights = [model.q.weight, model.k.weight, model.v.weight]
    np.testing.assert_array_equal(mm.inputs[1].attrs["value"], torch.cat(weights).T.detach().numpy())
    (add,) = [n for n in state.graph.nodes if n.op == "binary" and mm in n.inputs]
    bias = next(i for i in add.inputs if i.op == "const")
    np.testing.assert_array_equal(bias.attrs["value"], torch.cat([model.q.bias, model.k.bias, model.v.bias]).detach())
    slices = sorted((n.attrs["start"], n.attrs["stop"]) for n in state.graph.nodes if n.op == "slice"
                    and n.inputs[0] is add)
    assert slices == [(0, 16), (16, 32), (32, 56)]


def test_layers_that_share_their_weights_share_the_merged_constants():
    state = merged(SharedLayers(), torch.randn(8, 32))
    assert state.stats["merge-matmuls"]["matmuls_merged"] == 6
    first, second = matmuls(state)
    assert first.inputs[0] is not second.inputs[0]
    assert first.inputs[1] is second.inputs[1]
    biases = [next(i for i in user.inputs if i.op == "const") for user in state.graph.nodes
              if user.op == "binary" and (first in user.inputs or second in user.inputs)]
    assert len(biases) == 2 and biases[0] is biases[1]


def test_matmuls_of_different_inputs_stay_apart():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 16), nn.Linear(32, 16)

        def forward(self, x, y):
            return self.a(x) * self.b(y)

    state = merged(TwoInputs(), torch.randn(8, 32), torch.randn(8, 32))
    assert state.stats["merge-matmuls"]["matmuls_merged"] == 0
    assert sorted(m.inputs[0].name for m in matmuls(state)) == ["x", "y"]


def test_siblings_merge_with_their_biases_or_without_any():
    """q and v add biases and merge, their biases concatenated into one add on the merged matmul; k, the only one
    without, stays alone. Merging all three left q's and v's biases as adds after the merged matmul, after the
    rounding of its result (to bf16 at auto_cast="all": tests/test_wrong_answers.py, the fuzzer's seed 202000381)."""
    state = merged(Projections(bias=(True, False, True)), torch.randn(8, 32))
    assert sorted(m.shape[-1] for m in matmuls(state)) == [16, 40]
    (mm,) = [m for m in matmuls(state) if m.shape[-1] == 40]
    (add,) = [n for n in state.graph.nodes if mm in n.inputs]
    assert add.op == "binary" and add.attrs["op"] == "add" and add.shape == (8, 40)


def test_a_sibling_that_is_a_model_output_stays_apart():
    """A matmul the model returns keeps its own node (the output is that node); its siblings still merge."""
    class ReturnsQuery(Projections):
        def forward(self, x):
            return self.q(x), self.k(x) * 2, self.v(x) * 3

    state = merged(ReturnsQuery(bias=(False, False, False)), torch.randn(8, 32))
    assert state.stats["merge-matmuls"]["matmuls_merged"] == 2
    assert sorted(m.shape[-1] for m in matmuls(state)) == [16, 40]
    assert state.graph.outputs[0].op == "matmul"


class GatedMLP(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), beside a third projection of x that merges with neither."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(32, 48, bias=False), nn.Linear(32, 48, bias=False), nn.Linear(48, 32)
        self.side, self.other = nn.Linear(32, 16, bias=False), nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x)), self.side(x) + 1.0, self.other(x).exp()


def test_siblings_whose_results_meet_in_an_elementwise_node_stay_apart():
    """gate and up meet in the product: apart, each one's epilogue takes its part of it (merged, the wide result
    went to HBM and came back through slices). side and other meet nowhere and still merge."""
    state = merged(GatedMLP(), torch.randn(8, 32))
    assert state.stats["merge-matmuls"]["matmuls_merged"] == 2
    assert sorted(m.shape for m in matmuls(state)) == [(8, 32), (8, 32), (8, 48), (8, 48)]
