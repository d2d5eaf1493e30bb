"""emit: the scheduled instructions and HBM tensors as an isa.Program, verified before anything runs it.

A Program's signature is its INPUT tensors in declaration order (the call's arguments) and its OUTPUT
tensors in declaration order (the results). Tile declares tensors as kernels need them, so emit lays the
declarations out in the tile program's call and result order (`TileProgram.inputs`, `.outputs`) and
renumbers every HBM operand to match.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trnc.errors import VerifyError
from trnc.isa.ap import AP, Mem
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind
from trnc.isa.verify import verify


@dataclass(frozen=True)
class Emit:
    """Build the isa.Program and run the machine's verifier on it (bounds, dtypes, races, deadlock)."""

    name: str = "emit"

    def run(self, state) -> dict:
        tiles = state.tiles
        tensors, instructions = lay_out_tensors(tuple(tiles.tensors), tuple(state.instructions), tiles.inputs,
                                                tiles.outputs)
        state.program = Program(tensors, instructions, tiles.hw.name)
        verify(state.program, tiles.hw)
        return {"instructions": len(instructions), "tensors": len(tensors),
                "unused_scratch_dropped": len(tiles.tensors) - len(tensors)}


def lay_out_tensors(tensors: tuple[TensorDecl, ...], instructions: tuple[Instruction, ...], inputs: list[str],
                    outputs: list[str]) -> tuple[tuple[TensorDecl, ...], tuple[Instruction, ...]]:
    """The program's tensors in signature order: the INPUT declarations in the order of `inputs`, the OUTPUT
    ones in the order of `outputs`, each kind filling the positions its declarations held; the scratch tensors
    no instruction touches (a value lower.py kept in SBUF keeps its HBM declaration until here) dropped; and the
    instructions with their HBM indices renumbered. A scratch tensor read but never written is an error."""
    used, written = set(), set()
    for ins in instructions:
        for _, ap, is_write in ins.operands():
            if ap.mem is Mem.HBM:
                used.add(ap.tensor)
                if is_write:
                    written.add(ap.tensor)
    unwritten = [tensors[i].name for i in sorted(used - written) if tensors[i].kind is TensorKind.SCRATCH]
    if unwritten:   # a hand-over a reader did not take (its producer stored nothing): garbage, never a run
        raise VerifyError(f"scratch tensors read but never written: {', '.join(unwritten)}")
    keep = [i for i, t in enumerate(tensors) if t.kind is not TensorKind.SCRATCH or i in used]
    index_of = {t.name: i for i, t in enumerate(tensors)}
    for kind, names in ((TensorKind.INPUT, inputs), (TensorKind.OUTPUT, outputs)):
        slots = [k for k, i in enumerate(keep) if tensors[i].kind is kind]
        if sorted(tensors[keep[k]].name for k in slots) != sorted(names):
            raise ValueError(f"{kind.text} tensors {[tensors[keep[k]].name for k in slots]} are not the "
                             f"signature {names}")
        for k, name in zip(slots, names):
            keep[k] = index_of[name]
    if keep == list(range(len(tensors))):
        return tensors, instructions
    index = {old: new for new, old in enumerate(keep)}

    def renumber(ins: Instruction) -> Instruction:
        if not any(isinstance(v, AP) and v.mem is Mem.HBM for _, v in ins.args):
            return ins
        return ins.replace(args=tuple((k, dataclasses.replace(v, tensor=index[v.tensor])
                                       if isinstance(v, AP) and v.mem is Mem.HBM else v) for k, v in ins.args))
    return tuple(tensors[i] for i in keep), tuple(renumber(ins) for ins in instructions)
