"""schedule on its own: the allocated tile program of a small transformer MLP block, then the engines, queue order
and semaphores the pass chose, checked against conflicts found here byte by byte (numpy address sets) and the
happens-before order of the machine's semantics (isa/races.py order)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from trnc.capture import capture
from trnc.errors import VerifyError
from trnc.isa.ap import Engine, Mem
from trnc.isa.config import DMA_QUEUES, get_target
from trnc.isa.program import Program
from trnc.isa.races import order
from trnc.isa.verify import verify
from trnc.options import Options
from trnc.passes.pipeline import PIPELINE, CompileState
from trnc.runtime import reference

SCHEDULE = next(p for p in PIPELINE if p.name == "schedule")


class MlpBlock(nn.Module):
    """Matmuls on TensorE, gelu on ScalarE, a residual add and a layer norm for VectorE and GpSimdE, many DMAs; the
    softmax reads the hidden activations back from HBM, so there are HBM conflicts to order too."""

    def __init__(self, d: int = 64, h: int = 256):
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(d, h), nn.Linear(h, d), nn.LayerNorm(d)

    def forward(self, x):
        hidden = nn.functional.gelu(self.up(x))
        return self.norm(x + self.down(hidden)), torch.softmax(hidden, -1).sum(0)


@pytest.fixture(scope="module")
def block():
    """(state after schedule, the tile instructions it scheduled, the input, the eager result)."""
    torch.manual_seed(0)   # built before the per-test seeding fixture runs
    model, x = MlpBlock().eval(), torch.randn(128, 64)
    graph, _ = capture(model, (x,))
    state = CompileState(graph, Options(), get_target("trn2"))
    for p in PIPELINE[:[q.name for q in PIPELINE].index("schedule")]:
        state.stats[p.name] = p.run(state)
    tile_instrs = list(state.tiles.instrs)
    state.stats["schedule"] = SCHEDULE.run(state)
    with torch.no_grad():
        return state, tile_instrs, x, model(x)


def scheduled_program(state, instructions=None) -> Program:
    return Program(tuple(state.tiles.tensors), tuple(instructions or state.instructions), state.hw.name)


def accessed_bytes(ap) -> np.ndarray:
    """A key for every byte the AP touches: the memory (HBM: the tensor) in the high bits, then the partition (on
    chip) and the byte."""
    isz = ap.dtype.itemsize
    within = (ap.free_offsets()[:, None] * isz + np.arange(isz)).ravel()
    if ap.mem is Mem.HBM:
        rows = np.arange(ap.partitions) * ap.partition_stride * isz
        return (((8 + ap.tensor) << 48) + ap.offset + rows[:, None] + within).ravel()
    rows = (int(ap.mem) << 48) + ((ap.start_partition + np.arange(ap.partitions)) << 24)
    return (ap.offset + rows[:, None] + within).ravel()


def conflicts(program: Program) -> set[tuple[int, int]]:
    """Pairs (a, b), a listed before b and on another queue, where b touches a byte that a wrote last, or writes
    a byte that a was the last of its queue to read. Every other conflicting pair is ordered through these
    when they are ordered (an earlier access on a's queue precedes a; an earlier writer precedes a's write)."""
    instrs = program.instructions
    accesses = [[(accessed_bytes(ap), write) for _, ap, write in ins.operands()] for ins in instrs]
    space = np.unique(np.concatenate([keys for acc in accesses for keys, _ in acc]))
    queues = sorted({ins.queue_name for ins in instrs})
    last_write = np.full(space.size, -1)
    last_read = {q: np.full(space.size, -1) for q in queues}
    pairs = set()
    for b, acc in enumerate(accesses):
        q = instrs[b].queue_name
        where = [(np.searchsorted(space, keys), write) for keys, write in acc]
        for idx, write in where:
            earlier = [last_write[idx], *(last_read[r][idx] for r in queues if write)]
            pairs.update((int(a), b) for a in np.unique(np.concatenate(earlier))
                         if a >= 0 and instrs[a].queue_name != q)
        for idx, write in where:
            (last_write if write else last_read[q])[idx] = b
    return pairs


@pytest.fixture(scope="module")
def block_conflicts(block):
    return conflicts(scheduled_program(block[0]))


def test_every_cross_queue_conflict_is_ordered_by_semaphores_in_list_order(block, block_conflicts):
    """The listed order is the program's meaning: each conflicting pair on two queues is ordered that way by
    queue order and semaphore waits; the verifier's race check agrees."""
    program = scheduled_program(block[0])
    ordering, problems = order(program)
    assert problems == [] and len(block_conflicts) > 50
    assert [(a, b) for a, b in sorted(block_conflicts) if not ordering.happens_before(a, b)] == []
    verify(program, block[0].hw)


def test_every_wait_is_needed(block, block_conflicts):
    """Waits implied by others are dropped: without any one wait, some conflicting pair is unordered, and the
    verifier reports the race."""
    state = block[0]
    waits = [(i, w) for i, ins in enumerate(state.instructions) for w in ins.waits]
    assert len(waits) == state.stats["schedule"]["waits"] > 0
    for i, dropped in waits:
        mutant = list(state.instructions)
        mutant[i] = mutant[i].replace(waits=tuple(w for w in mutant[i].waits if w != dropped))
        program = scheduled_program(state, mutant)
        ordering, problems = order(program)
        assert problems == []
        assert any(not ordering.happens_before(a, b) for a, b in block_conflicts), (i, dropped)
        with pytest.raises(VerifyError, match="race"):
            verify(program, state.hw)


def test_only_instructions_waited_for_signal(block):
    """Semaphore q counts the completions of queue q's instructions that someone waits for, and no others."""
    state = block[0]
    signallers: dict[int, list[int]] = {}
    for i, ins in enumerate(state.instructions):
        for s in ins.signals:
            signallers.setdefault(s, []).append(i)
    waited = {signallers[s][v - 1] for ins in state.instructions for s, v in ins.waits}
    assert waited == {i for ins_list in signallers.values() for i in ins_list}
    assert len(signallers) == state.stats["schedule"]["semaphores"]
    assert all(len({state.instructions[i].queue_name for i in ins_list}) == 1 for ins_list in signallers.values())


def _unplaced(ins):
    """An instruction with its engine, queue and semaphores taken away: what identifies it in the tile program."""
    return ins.replace(engine=Engine.PE, queue=0, waits=(), signals=())


def allowed_engines(tile_instrs) -> dict:
    """The engines each tile instruction may run on, keyed by the instruction without its placement."""
    allowed: dict = {}
    for t in tile_instrs:
        allowed.setdefault(_unplaced(t.instruction()), set()).update(t.engines)
    return allowed


def test_each_instruction_runs_on_an_engine_its_tile_instruction_allows(block):
    state, tile_instrs, _, _ = block
    allowed = allowed_engines(tile_instrs)
    assert len(state.instructions) == len(tile_instrs)
    for ins in state.instructions:
        assert ins.engine in allowed[_unplaced(ins)], ins
    assert any(len(engines) > 1 for engines in allowed.values())


def test_work_spreads_over_the_engines_and_dma_queues_that_may_run_it(block):
    """The engine that finishes an instruction first: elementwise work that VectorE or GpSimdE may run lands on
    both, the loads that are ready at the start each begin at once on a queue of their own, and the DMAs use every
    queue."""
    state, tile_instrs, _, _ = block
    allowed = allowed_engines(tile_instrs)
    used = Counter(ins.engine for ins in state.instructions if allowed[_unplaced(ins)] == {Engine.DVE, Engine.POOL})
    assert used[Engine.DVE] and used[Engine.POOL] and used.total() >= 4
    leading = []
    for ins in state.instructions:
        if ins.opcode != "dma_copy" or ins.waits:
            break
        leading.append(ins.queue_name)
    assert len(leading) >= 8 and len(set(leading)) == len(leading)
    assert {ins.queue for ins in state.instructions if ins.engine is Engine.DMA} == set(range(DMA_QUEUES))


def test_the_listed_order_computes_the_model(block):
    state, _, x, expected = block
    feed = {state.tiles.inputs[0]: x.numpy(), **state.tiles.constants}
    got = reference.run(scheduled_program(state), feed, hw=state.hw)
    for name, want in zip(state.tiles.outputs, expected):
        assert np.abs(got[name] - want.numpy()).max() <= 1e-4 * np.abs(want.numpy()).max()
