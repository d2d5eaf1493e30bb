"""The JIT loader's shape key (isa/operand_table.py instruction_forms): instructions share a kernel exactly when
their opcode, static fields and, per present operand, field, AP but for its place and repeats of an earlier
operand agree. A key that merged two shapes would run one instruction with another's kernel."""
from __future__ import annotations

import random

import numpy as np
import pytest

from trnc.isa import AP, ActFunc, AluOp, DType, Engine, Instruction, Mem
from trnc.isa.operand_table import build
from trnc.runtime.jit.kernels import FieldColumns
from trnc.isa import rows

F32, BF16 = DType.FP32, DType.BF16


def _pool(rng: random.Random) -> list[AP]:
    """A few APs, several equal but for their place, some equal in value but separate objects."""
    forms = [(Mem.SBUF, F32, 32, ((1, 64),)), (Mem.SBUF, BF16, 32, ((1, 64),)), (Mem.SBUF, F32, 32, ((2, 32),))]
    aps = []
    for mem, dtype, parts, dims in forms:
        for _ in range(3):
            aps.append(AP(mem, dtype, parts, dims, rng.choice((0, 256, 512)), rng.choice((0, 32))))
    return aps + [AP(a.mem, a.dtype, a.partitions, a.dims, a.offset, a.start_partition) for a in aps[:5]]


def _instruction(rng: random.Random, pool: list[AP]) -> Instruction:
    pick = lambda: rng.choice(pool)   # noqa: E731
    kind = rng.randrange(3)
    if kind == 0:
        dst = pick()
        return Instruction.make("tensor_tensor", Engine.DVE, dst=dst, in0=rng.choice((dst, pick())), in1=pick(),
                                op=AluOp.ADD)
    if kind == 1:   # optional operands present or absent: the same count of operands in other fields
        present = rng.choice(((), ("scalar0_ap",), ("scalar1_ap",), ("scalar0_ap", "scalar1_ap")))
        return Instruction.make("tensor_scalar", Engine.DVE, dst=pick(), src=pick(), **{f: pick() for f in present})
    return Instruction.make("activation", Engine.ACT, dst=pick(), src=pick(),
                            **({"bias_ap": pick()} if rng.random() < 0.5 else {}))


def _defining_key(ins: Instruction) -> tuple:
    operands = list(ins.operands())
    aps = [ap for _, ap, _ in operands]
    return (ins.opcode,
            tuple((name, ap.mem, ap.dtype, ap.partitions, ap.dims, ap.partition_stride) for name, ap, _ in operands),
            tuple(next(j for j, other in enumerate(aps) if other == ap) for ap in aps))


@pytest.mark.parametrize("seed", range(3))
def test_instructions_share_a_shape_exactly_when_their_defining_keys_agree(seed):
    rng = random.Random(seed)
    pool = _pool(rng)
    instructions = [_instruction(rng, pool) for _ in range(2000)]
    ids = build(instructions).instruction_forms.tolist()
    by_key: dict[tuple, set[int]] = {}
    by_id: dict[tuple, set[tuple]] = {}
    for ins, shape in zip(instructions, ids):
        key = _defining_key(ins)
        by_key.setdefault(key, set()).add(shape)
        by_id.setdefault((ins.opcode, shape), set()).add(key)
    assert all(len(keys) == 1 for keys in by_id.values())      # one id never covers two keys (no merge)
    assert all(len(shapes) == 1 for shapes in by_key.values())  # one key always gets one id (kernels are reused)
    assert len(by_key) < len(instructions) / 3                  # the pool makes shapes repeat


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_field_columns_round_immediates_as_numpy_rounds_a_python_float():
    """FieldColumns.f32 (the dynamic word of an F32 field, over all instructions at once) is the bits of
    np.float32(value), the reference's rounding, on every kind of double: NaN payloads, -0.0, ties, subnormals,
    overflow; and the memset fill (FieldColumns.double) is the value itself."""
    rng = np.random.default_rng(21)
    doubles = np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-45, 40, 200),
                              np.array([0.0, -0.0, np.inf, -np.inf, 1e39, -1e39, 1.4e-45, 7e-46, 2 ** -149 * 1.5,
                                        1 + 2 ** -24, 1 + 3 * 2 ** -24])])
    nans = (np.array([0x7FF8000000000001, 0xFFF0000000000F00, 0x7FF4000020000000], dtype=np.uint64)
            .view(np.float64))
    values = [float(v) for v in np.concatenate([doubles, nans])]
    instructions = [Instruction.make("activation", Engine.ACT, dst=AP(Mem.SBUF, F32, 1, ((1, 1),)),
                                     src=AP(Mem.SBUF, F32, 1, ((1, 1),)), func=ActFunc.EXP, scale=v, bias=-v)
                    for v in values]
    words = np.array([np.frombuffer(rows.parts(ins.rows)[2], dtype=np.int64) for ins in instructions])
    fields = FieldColumns("activation", words, lambda name: None)
    expected = [int(np.array([v], dtype=np.float32).view(np.uint32)[0]) for v in values]
    assert fields.f32("scale").tolist() == expected
    assert np.array_equal(fields.double("scale").view(np.uint64), np.array(values).view(np.uint64))
    assert fields.f32("bias").tolist() == [int(np.array([-v], dtype=np.float32).view(np.uint32)[0]) for v in values]
