"""Engine choice for kernel instructions (tile stage): every engine the opcode allows, minus those that cannot
run this instance, so the scheduler (passes/schedule.py) may pick whichever finishes first and never an
illegal one. GpSimdE cannot reach PSUM (a matmul result being evacuated), and ScalarE's tensor_scalar only
adds and multiplies; isa/verify.py holds both rules, read from there.
"""
from __future__ import annotations

from trnc.isa.ap import Engine
from trnc.isa.enums import AluOp
from trnc.isa.opcodes import opspec
from trnc.isa.verify import ACT_SCALAR_OPS, ENGINE_MEMS
from trnc.passes.tiles import KernelBuilder, Tile, TileInstr


def allowed(opcode: str, fields: dict) -> tuple:
    """The engines of `opcode` that can run an instruction with these fields."""
    mems = {v.buffer.mem for v in fields.values() if isinstance(v, Tile)}
    engines = [e for e in opspec(opcode).engines if mems <= ENGINE_MEMS[e]]
    if opcode == "tensor_scalar" and not {fields.get("op0", AluOp.BYPASS), fields.get("op1", AluOp.BYPASS)} \
            <= ACT_SCALAR_OPS:
        engines = [e for e in engines if e is not Engine.ACT]
    return tuple(engines)


def emit(kb: KernelBuilder, opcode: str, **fields) -> TileInstr:
    """kb.emit with the engines this instance may use (the table's default set when all of them can)."""
    engines = allowed(opcode, fields)
    return kb.emit(opcode, None if engines == opspec(opcode).engines else engines, **fields)
