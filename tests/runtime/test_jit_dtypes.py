"""The JIT against the reference on every legal dtype of every operand: a coverage matrix the verifier derives.

AXES lists, per opcode, the fields whose values must all be tried: each data operand, alone or with the
operands and immediates its legality or conversion depends on (dma_copy and tensor_copy by (src, dst)
pair, tensor_copy with its rounding mode, matmul with double_row, quantize_mx with the scale mode,
activation by function and dst dtype). An axis's candidates are every DType for an operand and every
value for an immediate. Which candidates are legal is not restated here: the verifier says, on
instructions built with those values pinned (tests/strategies.py `valid_instruction(..., pins)`), and
the verdict must not depend on the unpinned fields.

A greedy plan packs one legal value of as many axes as stay legal together into each case; hypothesis
draws each case's seed (which `Rand` expands into operands, access patterns and data), and
tests/runtime/test_jit_ops.py's `check_against_reference` runs the case on both and compares every byte,
printing the assembly and the first differing element on a mismatch. Each opcode's test then asserts that
the instructions that actually ran covered every legal (axis, values) pair.
"""
from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import Rand, valid_instruction
from test_jit_ops import HW, HYPOTHESIS, SEEDS, TARGET, check_against_reference
from test_jit_ops import TENSORS as VALUE_TENSORS
from trnc.isa import ActFunc, DType, Instruction, Program, Rounding, ScaleMode, TensorDecl, TensorKind, opspec
from trnc.isa.dtypes import MATMUL_DTYPES, MX_FORMATS
from trnc.isa.opcodes import TABLE, Kind
from trnc.isa.verify import check

pytestmark = pytest.mark.usefixtures("private_cache")

# The differential tests' tensors plus an e8m0 one, so that HBM e8m0 operands are tried too (the instruction
# builder puts only a pinned operand in an e8m0 tensor).
TENSORS = VALUE_TENSORS + (TensorDecl("t_e8m0", TensorKind.INPUT, DType.E8M0, (64, 128)),)

AXES: dict[str, tuple[tuple[str, ...], ...]] = {
    "dma_copy": (("src", "dst"),),
    "dma_gather": (("dst", "table"), ("index",)),
    "matmul": (("stationary", "moving", "double_row"), ("dst",)),
    "matmul_mx": (("stationary", "moving"), ("stationary_scale",), ("moving_scale",), ("dst",)),
    "transpose": (("src", "dst"),),
    "activation": (("func", "dst"), ("src",), ("scale_ap",), ("bias_ap",), ("accum",)),
    "tensor_tensor": (("dst",), ("in0",), ("in1",), ("op",)),
    "tensor_scalar": (("dst",), ("src",), ("scalar0_ap",), ("scalar1_ap",)),
    "tensor_reduce": (("dst",), ("src",), ("op",)),
    "tensor_copy": (("src", "dst", "rounding"),),
    "memset": (("dst",),),
    "iota": (("dst",),),
    "select": (("dst",), ("pred",), ("on_true",), ("on_false",)),
    "affine_select": (("dst",), ("src",), ("cmp",)),
    "partition_reduce": (("dst",), ("src",), ("op",)),
    "partition_broadcast": (("dst",), ("src",)),
    "quantize_mx": (("src", "dst", "scale_mode"), ("scale",)),
    "random": (("dst",), ("seed",)),
}
# Rules whose violations make pinned values illegal; any other violation is a bug of the instruction builder.
LEGALITY_RULES = frozenset({"dtype", "target", "op"})
JUDGE_SEEDS = (11, 22, 33)   # each verdict is asked on instructions from these seeds, and must agree

Pins = tuple[tuple[str, object], ...]   # (field, value) pairs; an AP field's value is its dtype
Key = tuple[tuple[str, ...], tuple]     # (axis, its values)


def field_value(ins: Instruction, name: str):
    """What an axis records of a field: an operand's dtype (None when absent), else the field's value."""
    value = ins[name]
    if opspec(ins.opcode).field(name).kind is Kind.AP:
        return None if value is None else value.dtype
    return value


def candidates(opcode: str, axis: tuple[str, ...]) -> list[tuple]:
    """Every combination of values of the axis's fields: any DType for an operand, any value of an immediate."""
    def values(name: str) -> list:
        f = opspec(opcode).field(name)
        return list(DType) if f.kind is Kind.AP else list(f.enum) if f.kind is Kind.ENUM else [False, True]
    return list(itertools.product(*map(values, axis)))


def pinned_instruction(opcode: str, pins: Pins, seed: int) -> Instruction:
    """A random instruction with the pinned values (which must have been honoured)."""
    ins = valid_instruction(Rand(seed), opspec(opcode), HW, TENSORS, dict(pins))
    got = tuple((name, field_value(ins, name)) for name, _ in pins)
    assert got == pins, f"the builder did not honour the pins {describe(pins)}: got {describe(got)}"
    return ins


@functools.cache
def accepts(opcode: str, pins: Pins) -> bool:
    """Whether the verifier accepts `pins`: no dtype, target or op violation on instructions built with them."""
    verdicts = set()
    for seed in JUDGE_SEEDS:
        ins = pinned_instruction(opcode, pins, seed)
        rules = {v.rule for v in check(Program(TENSORS, (ins,), TARGET))}
        assert rules <= LEGALITY_RULES, f"{describe(pins)} broke {sorted(rules - LEGALITY_RULES)} (seed {seed})"
        verdicts.add(not rules)
    assert len(verdicts) == 1, f"{opcode} {describe(pins)}: legality depends on unpinned fields; put them in one axis"
    return verdicts.pop()


@functools.cache
def legal_keys(opcode: str) -> frozenset[Key]:
    """Every (axis, values) the verifier accepts, axis by axis, the other fields drawn."""
    return frozenset((axis, combo) for axis in AXES[opcode] for combo in candidates(opcode, axis)
                     if accepts(opcode, tuple(zip(axis, combo))))


@functools.cache
def case_plan(opcode: str) -> tuple[Pins, ...]:
    """Pins of each case: greedily, the next untried legal values of each axis that stay legal together."""
    todo = {axis: [combo for combo in candidates(opcode, axis) if (axis, combo) in legal_keys(opcode)]
            for axis in AXES[opcode]}
    plan = []
    while any(todo.values()):
        pins: Pins = ()
        for axis, combos in todo.items():
            for combo in combos:
                trial = pins + tuple(zip(axis, combo))
                if accepts(opcode, trial):
                    pins = trial
                    combos.remove(combo)
                    break
        plan.append(pins)
    return tuple(plan)


def coverage(ins: Instruction) -> set[Key]:
    """The (axis, values) pairs an instruction exercises."""
    return {(axis, tuple(field_value(ins, name) for name in axis)) for axis in AXES[ins.opcode]}


def describe(pins) -> str:
    """(field, value) pairs as text, e.g. 'src=bf16 dst=fp8_e4m3 rounding=sr'."""
    return " ".join(f"{name}={getattr(v, 'text', v)}" for name, v in pins)


def test_axes_name_every_data_operand_once():
    """Every opcode's operands are in the matrix (a new operand or opcode must be added), each in one axis."""
    assert set(AXES) == {op.name for op in TABLE}
    for op in TABLE:
        fields = [name for axis in AXES[op.name] for name in axis]
        assert len(fields) == len(set(fields)), op.name
        assert {f.name for f in op.aps} <= set(fields), op.name
    for opcode, field in [("activation", "func"), ("tensor_copy", "rounding"), ("matmul", "double_row"),
                          ("quantize_mx", "scale_mode")]:
        assert field in {name for axis in AXES[opcode] for name in axis}


def legal(opcode: str, axis: tuple[str, ...]) -> set[tuple]:
    return {combo for a, combo in legal_keys(opcode) if a == axis}


def test_the_derived_matrix_holds_the_promised_combinations():
    """The derivation is not vacuous: it holds the casts, stochastic rounding to every float, the matmul, MX
    and activation combinations the ISA promises, and the verifier rejects some candidates."""
    values = [d for d in DType if d is not DType.E8M0]
    floats = [d for d in values if d.is_float]
    assert {(s, d) for s in values for d in values} <= legal("dma_copy", ("src", "dst"))
    copies = legal("tensor_copy", ("src", "dst", "rounding"))
    assert {(s, d, Rounding.RNE) for s in values for d in values} <= copies
    assert {(s, d, Rounding.SR) for s in values for d in floats} <= copies
    assert not any(r is Rounding.SR and not d.is_float for _, d, r in copies)
    narrow = MATMUL_DTYPES - {DType.FP32}
    fp8 = {d for d in narrow if d.is_fp8}
    assert ({(DType.FP32, DType.FP32, False)} | {(s, m, False) for s in narrow for m in narrow}
            | {(s, m, True) for s in fp8 for m in fp8}) <= legal("matmul", ("stationary", "moving", "double_row"))
    assert {(s, m) for s in MX_FORMATS for m in MX_FORMATS} <= legal("matmul_mx", ("stationary", "moving"))
    assert ({(s, d, mode) for s in (DType.FP32, DType.BF16, DType.FP16) for d in MX_FORMATS for mode in ScaleMode}
            <= legal("quantize_mx", ("src", "dst", "scale_mode")))
    activations = legal("activation", ("func", "dst"))
    assert {f for f, _ in activations} == set(ActFunc)
    assert DType.E8M0 not in {d for _, d in activations}


@pytest.mark.parametrize("opcode", sorted(AXES))
def test_every_legal_dtype_matches_the_reference(opcode):
    """Every case of the plan, hypothesis drawing each seed; then every legal (axis, values) must have run."""
    plan = case_plan(opcode)
    ran: set[Key] = set()

    @settings(max_examples=1, **HYPOTHESIS)
    @given(st.data())
    def cases(data):
        for index, pins in enumerate(plan):
            # Hypothesis's first example draws 0 everywhere; the case's own offset keeps the cases apart.
            seed = (data.draw(SEEDS, label=describe(pins)) + 1000 * opspec(opcode).code + index) % 2**32
            ins = pinned_instruction(opcode, pins, seed)
            check_against_reference(ins, seed, TENSORS)
            ran.update(coverage(ins))

    cases()
    missing = legal_keys(opcode) - ran
    assert not missing, (f"{len(missing)} legal combinations never ran, e.g. "
                         f"{sorted(describe(zip(axis, values)) for axis, values in missing)[:5]}")
