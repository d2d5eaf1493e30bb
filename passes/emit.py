"""emit: the scheduled instructions and HBM tensors as an isa.Program, verified before anything runs it."""
from __future__ import annotations

from dataclasses import dataclass

from trnc.isa.program import Program
from trnc.isa.verify import verify


@dataclass(frozen=True)
class Emit:
    """Build the isa.Program and run the machine's verifier on it (bounds, dtypes, races, deadlock)."""

    name: str = "emit"

    def run(self, state) -> dict:
        tiles = state.tiles
        state.program = Program(tuple(tiles.tensors), tuple(state.instructions), tiles.hw.name)
        verify(state.program, tiles.hw)
        return {"instructions": len(state.program.instructions), "tensors": len(tiles.tensors)}
