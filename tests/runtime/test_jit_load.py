"""The JIT loader's shape key (isa/operand_table.py instruction_forms): instructions share a kernel exactly when
their opcode, static fields and, per present operand, field, AP but for its place and repeats of an earlier
operand agree. A key that merged two shapes would run one instruction with another's kernel."""
from __future__ import annotations

import random

import pytest

from trnc.isa import AP, AluOp, DType, Engine, Instruction, Mem
from trnc.isa.operand_table import build

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
