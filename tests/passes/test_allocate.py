"""allocate on its own: the tile program of a small model (the passes before allocate), then the addresses it
hands out, checked against liveness computed here from the instructions, not from the pass."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch import nn

from trnc.capture import capture
from trnc.errors import TrncError
from trnc.isa.ap import Mem
from trnc.isa.config import get_target
from trnc.passes.tile.allocate import RING_SLACK, SBUF_ALIGN
from trnc.options import Options
from trnc.passes.pipeline import PIPELINE, CompileState
from trnc.passes.tile.tiles import Buffer

ALLOCATE = next(p for p in PIPELINE if p.name == "allocate")


class NormMlp(nn.Module):
    """Matmuls (PSUM accumulators), a layer norm and a softmax (SBUF rows), a second output."""

    def __init__(self, k: int = 64, h: int = 256, n: int = 32):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(k, h), nn.LayerNorm(h), nn.Linear(h, n)

    def forward(self, x):
        return self.down(torch.softmax(self.norm(self.up(x)), -1)), x * 2


def tiled(model: nn.Module, *inputs: torch.Tensor) -> CompileState:
    """The state after the tile pass: a tile program whose buffers have no address yet."""
    graph, _ = capture(model.eval(), inputs)
    state = CompileState(graph, Options(), get_target("trn2"))
    for p in PIPELINE[:[q.name for q in PIPELINE].index("allocate")]:
        state.stats[p.name] = p.run(state)
    return state


def live_ranges(state: CompileState) -> dict[Buffer, tuple[int, int]]:
    """First and last index of the tile instructions that touch each buffer."""
    life: dict[Buffer, tuple[int, int]] = {}
    for i, ins in enumerate(state.tiles.instrs):
        for value in ins.fields.values():
            buf = getattr(value, "buffer", None)
            if isinstance(buf, Buffer):
                life[buf] = (life.get(buf, (i, i))[0], i)
    return life


def aligned(buf: Buffer, hw) -> int:
    step = SBUF_ALIGN if buf.mem is Mem.SBUF else hw.psum_bank_bytes
    return -(-buf.nbytes // step) * step


def capacity(mem: Mem, hw) -> int:
    return hw.sbuf_bytes_per_partition if mem is Mem.SBUF else hw.psum_bytes_per_partition


def overlapping_live_pairs(state: CompileState) -> list[tuple[str, str]]:
    life = live_ranges(state)
    bufs = sorted(life, key=lambda b: life[b])
    pairs = []
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if life[b][0] > life[a][1]:
                break
            if a.mem is b.mem and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes:
                pairs.append((a.name, b.name))
    return pairs


@pytest.fixture(scope="module")
def norm_mlp() -> CompileState:
    torch.manual_seed(0)   # built before the per-test seeding fixture runs
    return tiled(NormMlp(), torch.randn(256, 64))


def test_every_buffer_gets_an_aligned_address_inside_its_memory(norm_mlp):
    stats = ALLOCATE.run(norm_mlp)
    hw = norm_mlp.hw
    touched = live_ranges(norm_mlp)
    assert stats["buffers"] == len(touched) > 0
    assert {b.mem for b in touched} == {Mem.SBUF, Mem.PSUM}
    for buf in touched:
        assert buf.offset is not None and buf.offset >= 0
        assert buf.offset + buf.nbytes <= capacity(buf.mem, hw), buf
        assert buf.offset % (SBUF_ALIGN if buf.mem is Mem.SBUF else hw.psum_bank_bytes) == 0, buf


def test_no_two_live_buffers_share_a_byte(norm_mlp):
    ALLOCATE.run(norm_mlp)
    assert overlapping_live_pairs(norm_mlp) == []


def test_live_psum_buffers_never_share_a_bank(norm_mlp):
    """The one-bank rule: an accumulation group owns its bank(s), so no two live PSUM buffers touch one bank."""
    ALLOCATE.run(norm_mlp)
    life = live_ranges(norm_mlp)
    bank = norm_mlp.hw.psum_bank_bytes
    psum = [b for b in life if b.mem is Mem.PSUM]
    assert psum
    for i, a in enumerate(psum):
        banks_a = set(range(a.offset // bank, (a.offset + a.nbytes - 1) // bank + 1))
        assert a.nbytes <= bank or a.nbytes % bank == 0, a
        for b in psum[i + 1:]:
            if life[a][0] <= life[b][1] and life[b][0] <= life[a][1]:
                banks_b = set(range(b.offset // bank, (b.offset + b.nbytes - 1) // bank + 1))
                assert not banks_a & banks_b, (a, b)


def test_reported_peaks_are_the_largest_live_footprint(norm_mlp):
    """Peak bytes (all 128 partitions) are the most that buffers live at one instruction take, padding included."""
    stats = ALLOCATE.run(norm_mlp)
    life, hw = live_ranges(norm_mlp), norm_mlp.hw
    for mem, key in ((Mem.SBUF, "sbuf_peak_bytes"), (Mem.PSUM, "psum_peak_bytes")):
        per_instruction = [sum(aligned(b, hw) for b, (lo, hi) in life.items() if b.mem is mem and lo <= i <= hi)
                           for i in range(len(norm_mlp.tiles.instrs))]
        assert stats[key] == 128 * max(per_instruction) > 0
        assert stats[key] <= 128 * capacity(mem, hw)


def test_freed_space_is_reused_late_within_a_ring():
    """Next-fit round a ring of RING_SLACK times the peak: the buffers until the cursor first comes round take
    distinct addresses, even where lifetimes would allow sharing (the next user of an address then does not wait
    for the last), and every buffer lies within the ring (the program touches few bytes of SBUF)."""
    state = tiled(NormMlp(), torch.randn(256, 64))
    peak = ALLOCATE.run(state)["sbuf_peak_bytes"] // 128
    life, hw = live_ranges(state), state.hw
    ring = RING_SLACK * peak
    sbuf = sorted((b for b in life if b.mem is Mem.SBUF), key=lambda b: life[b][0])
    assert sum(aligned(b, hw) for b in sbuf) > ring   # the cursor comes round
    assert all(b.offset + b.nbytes <= ring for b in sbuf)
    ends = itertools.accumulate(aligned(b, hw) for b in sbuf)   # where each would end with no reuse
    first_round = [b for b, end in zip(sbuf, ends) if end <= ring]
    assert any(life[a][1] < life[b][0] for a in first_round for b in first_round)   # could have shared an address
    spans = sorted((b.offset, b.offset + b.nbytes) for b in first_round)
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))


def test_a_small_sbuf_is_wrapped_round_and_still_never_double_booked():
    """With an SBUF just big enough, the cursor comes round and addresses are reused, never while live."""
    state = tiled(NormMlp(k=128, h=512, n=128), torch.randn(512, 128))
    roomy = ALLOCATE.run(state)
    peak = roomy["sbuf_peak_bytes"] // 128
    state.tiles.hw = dataclasses.replace(state.hw, sbuf_bytes_per_partition=peak + peak // 4)
    tight = ALLOCATE.run(state)
    life = live_ranges(state)
    sbuf = [b for b in life if b.mem is Mem.SBUF]
    assert sum(aligned(b, state.tiles.hw) for b in sbuf) > state.tiles.hw.sbuf_bytes_per_partition   # must reuse
    assert all(b.offset + b.nbytes <= state.tiles.hw.sbuf_bytes_per_partition for b in sbuf)
    assert overlapping_live_pairs(state) == []
    assert tight["sbuf_peak_bytes"] == roomy["sbuf_peak_bytes"]   # the peak is the program's, not the memory's


def test_a_working_set_larger_than_sbuf_is_an_error_naming_the_live_buffers(norm_mlp):
    peak = ALLOCATE.run(norm_mlp)["sbuf_peak_bytes"] // 128
    norm_mlp.tiles.hw = dataclasses.replace(norm_mlp.hw, sbuf_bytes_per_partition=peak // 2)
    try:
        with pytest.raises(TrncError, match=r"SBUF is full: buffer \S+ needs \d+ bytes per partition .* in use by "
                                             r"\S+ \(\d+ B\).* too large for trn2"):
            ALLOCATE.run(norm_mlp)
    finally:
        norm_mlp.tiles.hw = norm_mlp.hw
