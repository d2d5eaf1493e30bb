"""emit: the scheduled instructions and HBM tensors as an isa.Program, verified before anything runs it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trnc.isa.ap import AP, Mem
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind
from trnc.isa.verify import verify


@dataclass(frozen=True)
class Emit:
    """Build the isa.Program and run the machine's verifier on it (bounds, dtypes, races, deadlock)."""

    name: str = "emit"

    def run(self, state) -> dict:
        tiles = state.tiles
        tensors, instructions = drop_unused_scratch(tuple(tiles.tensors), tuple(state.instructions))
        state.program = Program(tensors, instructions, tiles.hw.name)
        verify(state.program, tiles.hw)
        return {"instructions": len(instructions), "tensors": len(tensors),
                "unused_scratch_dropped": len(tiles.tensors) - len(tensors)}


def drop_unused_scratch(tensors: tuple[TensorDecl, ...], instructions: tuple[Instruction, ...]
                        ) -> tuple[tuple[TensorDecl, ...], tuple[Instruction, ...]]:
    """The program's tensors without the scratch tensors no instruction touches (a value tile.py kept in
    SBUF keeps its HBM declaration until here), and the instructions with their HBM indices renumbered."""
    used = {ap.tensor for ins in instructions for _, ap, _ in ins.operands() if ap.mem is Mem.HBM}
    keep = [i for i, t in enumerate(tensors) if t.kind is not TensorKind.SCRATCH or i in used]
    if len(keep) == len(tensors):
        return tensors, instructions
    index = {old: new for new, old in enumerate(keep)}

    def renumber(ins: Instruction) -> Instruction:
        if not any(isinstance(v, AP) and v.mem is Mem.HBM for _, v in ins.args):
            return ins
        return ins.replace(args=tuple((k, dataclasses.replace(v, tensor=index[v.tensor])
                                       if isinstance(v, AP) and v.mem is Mem.HBM else v) for k, v in ins.args))
    return tuple(tensors[i] for i in keep), tuple(renumber(ins) for ins in instructions)
