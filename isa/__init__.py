"""trnc.isa: the machine. Memories, engines, dtypes, the opcode table, programs, encoding, verifier, cost.

Pipeline position: passes/emit produces an isa.Program; runtime/ executes it.
"""
from trnc.isa.ap import AP, Engine, Mem
from trnc.isa.config import DEFAULT_TARGET, TARGETS, HwConfig, get_target
from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc, AluOp, ReduceOp, Rounding, ScaleMode
from trnc.isa.opcodes import TABLE, OpSpec, opspec
from trnc.isa.program import Instruction, Program, TensorDecl, TensorKind

__all__ = ["AP", "Engine", "Mem", "DEFAULT_TARGET", "TARGETS", "HwConfig", "get_target", "DType", "ActFunc",
           "AluOp", "ReduceOp", "Rounding", "ScaleMode", "TABLE", "OpSpec", "opspec", "Instruction", "Program",
           "TensorDecl", "TensorKind"]
