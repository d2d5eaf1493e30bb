"""emit on its own: the scheduled instructions of a small two-input, two-output model, then the Program emit
builds: verified, its tensors in signature order and declared once, and still computing the model."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from trnc.capture import capture
from trnc.errors import VerifyError
from trnc.isa.ap import Mem
from trnc.isa.config import get_target
from trnc.isa.program import TensorKind
from trnc.isa.verify import verify
from trnc.options import Options
from trnc.passes.pipeline import PIPELINE, CompileState
from trnc.runtime import reference

EMIT = next(p for p in PIPELINE if p.name == "emit")


class SideOutput(nn.Module):
    """out1 (the side projection) is computed first, so tile declares it before out0; the layer norm's input
    and result stay in SBUF (the result as the transposed copy down reads), so their HBM tensors are declared
    but never touched."""

    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(64, 128), nn.LayerNorm(128), nn.Linear(128, 128)
        self.side = nn.Linear(32, 128)

    def forward(self, x, y):
        side = self.side(y)
        return self.down(self.norm(self.up(x))) + side, side


@pytest.fixture(scope="module")
def scheduled():
    """(state after schedule, the inputs, the eager results)."""
    torch.manual_seed(0)   # built before the per-test seeding fixture runs
    model, inputs = SideOutput().eval(), (torch.randn(128, 64), torch.randn(128, 32))
    graph, _ = capture(model, inputs)
    state = CompileState(graph, Options(), get_target("trn2"))
    for p in PIPELINE[:[q.name for q in PIPELINE].index("emit")]:
        state.stats[p.name] = p.run(state)
    with torch.no_grad():
        return state, inputs, model(*inputs)


def declared(program, kind: TensorKind) -> list[str]:
    return [t.name for t in program.tensors if t.kind is kind]


def run_program(state, inputs) -> list[np.ndarray]:
    """The program's outputs, in its OUTPUT order, for `inputs` bound in its INPUT order."""
    feed = dict(zip(declared(state.program, TensorKind.INPUT), (x.numpy() for x in inputs)))
    feed.update(state.tiles.constants)
    got = reference.run(state.program, feed, hw=state.hw)
    return [got[name] for name in declared(state.program, TensorKind.OUTPUT)]


def assert_like_eager(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert np.abs(g - e.numpy()).max() <= 1e-4 * np.abs(e.numpy()).max()


def test_the_program_verifies_and_computes_the_model(scheduled):
    state, inputs, expected = scheduled
    stats = EMIT.run(state)
    verify(state.program, state.hw)
    assert stats["instructions"] == len(state.program.instructions) == len(state.instructions)
    assert_like_eager(run_program(state, inputs), expected)


def test_inputs_and_outputs_are_declared_in_signature_order(scheduled):
    state = scheduled[0]
    assert declared(state.tiles, TensorKind.OUTPUT) == ["out1", "out0"]   # the order tile met them
    EMIT.run(state)
    assert declared(state.program, TensorKind.INPUT) == state.tiles.inputs == ["in0", "in1"]
    assert declared(state.program, TensorKind.OUTPUT) == state.tiles.outputs == ["out0", "out1"]


def test_a_reversed_signature_reorders_the_declarations_and_renumbers_the_operands(scheduled):
    state, (x, y), (out, side) = scheduled
    tiles = dataclasses.replace(state.tiles, inputs=["in1", "in0"], outputs=["out1", "out0"])
    reversed_state = dataclasses.replace(state, tiles=tiles)
    EMIT.run(reversed_state)
    assert declared(reversed_state.program, TensorKind.INPUT) == ["in1", "in0"]
    assert declared(reversed_state.program, TensorKind.OUTPUT) == ["out1", "out0"]
    assert_like_eager(run_program(reversed_state, (y, x)), (side, out))


def test_each_tensor_is_declared_once_and_untouched_scratch_is_dropped(scheduled):
    state = scheduled[0]
    stats = EMIT.run(state)
    names = [t.name for t in state.program.tensors]
    assert len(names) == len(set(names)) == stats["tensors"]
    touched = {ap.tensor for ins in state.program.instructions for _, ap, _ in ins.operands() if ap.mem is Mem.HBM}
    scratch = [i for i, t in enumerate(state.program.tensors) if t.kind is TensorKind.SCRATCH]
    assert set(scratch) <= touched
    untouched = [t.name for t in state.tiles.tensors if t.kind is TensorKind.SCRATCH and t.name not in names]
    assert stats["unused_scratch_dropped"] == len(untouched) == 2
    assert set(names) | set(untouched) == {t.name for t in state.tiles.tensors}


def test_a_schedule_with_a_missing_semaphore_wait_is_refused(scheduled):
    state = scheduled[0]
    i = next(i for i, ins in enumerate(state.instructions) if ins.waits)
    mutant = list(state.instructions)
    mutant[i] = mutant[i].replace(waits=mutant[i].waits[1:])
    with pytest.raises(VerifyError, match="race"):
        EMIT.run(dataclasses.replace(state, instructions=mutant))


def test_a_signature_naming_an_undeclared_output_is_refused(scheduled):
    state = scheduled[0]
    tiles = dataclasses.replace(state.tiles, outputs=["out0", "out2"])
    with pytest.raises(ValueError, match=r"output tensors \['out1', 'out0'\] are not the signature"):
        EMIT.run(dataclasses.replace(state, tiles=tiles))


def test_a_scratch_tensor_read_but_never_written_is_refused():
    """A reader that missed a hand-over would read an HBM tensor its producer, keeping the value on chip, never
    stored: garbage that no other check sees, so emit refuses it."""
    model = nn.Sequential(nn.Linear(64, 128), nn.Softmax(-1), nn.Linear(128, 32)).eval()
    graph, _ = capture(model, (torch.randn(128, 64),))
    state = CompileState(graph, Options(), get_target("trn2"))
    for p in PIPELINE[:[q.name for q in PIPELINE].index("emit")]:
        p.run(state)
    scratch = {i for i, t in enumerate(state.tiles.tensors) if t.kind is TensorKind.SCRATCH}

    def hbm(ins, write):
        return {ap.tensor for _, ap, w in ins.operands() if ap.mem is Mem.HBM and w == write}
    read = set().union(*(hbm(ins, False) for ins in state.instructions)) & scratch
    assert read, "the softmax's result goes through HBM"
    victim = min(read)
    mutant = [ins for ins in state.instructions if victim not in hbm(ins, True)]
    assert len(mutant) < len(state.instructions)
    with pytest.raises(VerifyError, match=f"read but never written: {state.tiles.tensors[victim].name}"):
        EMIT.run(dataclasses.replace(state, instructions=mutant))
