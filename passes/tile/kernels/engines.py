"""Engine choice for kernel instructions (tile stage): every engine the opcode allows, minus those that cannot
run this instance, so the scheduler (passes/tile/schedule.py) may pick whichever finishes first and never an
illegal one. GpSimdE cannot reach PSUM (a matmul result being evacuated), and ScalarE's tensor_scalar only
adds and multiplies; the opcode table (isa/opcodes.py) holds both rules, read from there. `write` is the one
conversion that honours the program's rounding (stochastic rounding, Options.rounding). A DMA rounds to nearest
even, so the DMAs that convert go through `write` when the program rounds stochastically: `load` and `store`
for one DMA, `landing` and `rounded` for a tile assembled from several; `rounds` is the one test.
"""
from __future__ import annotations

from typing import Callable

from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding
from trnc.isa.opcodes import opspec
from trnc.passes.tile.tiles import TileBuilder, Tile, TileInstr

FP32 = DType.FP32


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


def rounds(kb: TileBuilder, dst: DType, src: DType) -> bool:
    """Whether converting `src` values to `dst` must go through `write` in this program: dst rounds
    stochastically and some src values do not fit it (an fp8 in bf16 or fp16 is exact)."""
    return stochastic(kb, dst) and src != dst and not (src.is_float and src.itemsize < dst.itemsize)


def load(kb: TileBuilder, dst: Tile, src, move: Callable | None = None) -> None:
    """dst = src (an AP) converted to dst's dtype by `move(dst, src)` (default kb.dma). When the conversion
    rounds stochastically, src lands in an fp32 tile of dst's partitions (the DMA's own conversion goes
    through fp32, so this one is exact) and `write` rounds it into dst; dst's start partition must then be
    one a compute engine may start at."""
    move = move or kb.dma
    if not rounds(kb, dst.dtype, src.dtype):
        move(dst, src)
        return
    first = dst.start_partition
    stage = kb.sbuf("sr_load", FP32, first + dst.partitions, dst.shape[1:]).narrow(0, first, dst.partitions)
    move(stage, src)
    write(kb, dst, stage)


def store(kb: TileBuilder, dst, src: Tile, move: Callable | None = None) -> None:
    """dst (an AP) = the tile src converted to dst's dtype by `move(dst, src)` (default kb.dma); when the
    conversion rounds stochastically, `write` rounds src into a tile of dst's dtype first, which moves as it is."""
    move = move or kb.dma
    if not rounds(kb, dst.dtype, src.dtype):
        move(dst, src)
        return
    first = src.start_partition
    narrow = kb.sbuf("sr_store", dst.dtype, first + src.partitions, src.shape[1:]).narrow(0, first, src.partitions)
    write(kb, narrow, src)
    move(dst, narrow)


def landing(kb: TileBuilder, dtype: DType, src: DType) -> DType:
    """The dtype a tile meant to hold `src` values in `dtype` is assembled in, by several DMAs or copies: dtype,
    or fp32 when the conversion rounds stochastically (`rounded` then writes the tile in dtype)."""
    return FP32 if rounds(kb, dtype, src) else dtype


def rounded(kb: TileBuilder, tile: Tile, dtype: DType) -> Tile:
    """`tile` when it is in `dtype`, else a new tile of dtype that `write` fills from it (see `landing`)."""
    if tile.dtype == dtype:
        return tile
    out = kb.sbuf(tile.buffer.name.rsplit(".", 1)[-1], dtype, tile.partitions, tile.shape[1:])
    write(kb, out, tile)
    return out
