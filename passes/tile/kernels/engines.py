"""Engine choice for kernel instructions (tile stage): every engine the opcode allows, minus those that cannot
run this instance, so the scheduler (passes/tile/schedule.py) may pick whichever finishes first and never an
illegal one. GpSimdE cannot reach PSUM (a matmul result being evacuated), and ScalarE's tensor_scalar only
adds and multiplies; the opcode table (isa/opcodes.py) holds both rules, read from there.
"""
from __future__ import annotations

from trnc.isa.opcodes import opspec
from trnc.passes.tile.tiles import TileBuilder, Tile, TileInstr


def allowed(opcode: str, fields: dict) -> tuple:
    """The engines of `opcode` that can run an instruction with these fields."""
    mems = {name: v.buffer.mem for name, v in fields.items() if isinstance(v, Tile)}
    return opspec(opcode).engines_for(mems, fields)


def emit(kb: TileBuilder, opcode: str, **fields) -> TileInstr:
    """kb.emit with the engines this instance may use (the table's default set when all of them can)."""
    engines = allowed(opcode, fields)
    return kb.emit(opcode, None if engines == opspec(opcode).engines else engines, **fields)
