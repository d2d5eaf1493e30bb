"""Engine choice for kernel instructions (tile stage): every engine the opcode allows, minus those that cannot
run this instance, so the scheduler (passes/tile/schedule.py) may pick whichever finishes first and never an
illegal one. GpSimdE cannot reach PSUM (a matmul result being evacuated), and ScalarE's tensor_scalar only
adds and multiplies; the opcode table (isa/opcodes.py) holds both rules, read from there. `write` is the one
conversion that honours the program's rounding (stochastic rounding, Options.rounding).
"""
from __future__ import annotations

from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding
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


# the dtypes stochastic rounding applies to (Options.rounding): the narrow floats values are stored in
STOCHASTIC_DTYPES = frozenset({DType.BF16, DType.FP16, DType.FP8_E4M3, DType.FP8_E5M2})


def stochastic(kb: TileBuilder, dtype: DType) -> bool:
    """Whether a value written in `dtype` rounds stochastically in this program."""
    return kb.program.rounding is Rounding.SR and dtype in STOCHASTIC_DTYPES


def write(kb: TileBuilder, dst: Tile, src: Tile) -> TileInstr:
    """dst = src converted to dst's dtype: tensor_copy, rounding stochastically where the program asks for it
    and dst is a narrow float, each such instruction with a seed of its own."""
    if stochastic(kb, dst.dtype):
        return emit(kb, "tensor_copy", dst=dst, src=src, rounding=Rounding.SR, seed=kb.program.next_seed())
    return emit(kb, "tensor_copy", dst=dst, src=src)
