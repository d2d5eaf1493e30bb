"""The opcode rows carry every operand rule (memories, roles, one PSUM bank, e8m0 placement, engine limits, target
features), and the verifier reads them there: changing a row changes what verifies."""
from dataclasses import fields, replace

import pytest

from trnc.isa import TABLE, AluOp, DType, Engine, HwConfig, Mem
from trnc.isa import opcodes
from trnc.isa.opcodes import ENGINE_MEMS, E8m0, Kind, Role
from trnc.isa.verify import check, spec_shape

from test_verify import broken, op, ps, sb, with_fields


@pytest.mark.parametrize("spec", TABLE, ids=lambda s: s.name)
def test_every_row_states_its_operand_rules(spec):
    assert spec.name in spec_shape, "every row needs its shape rule in isa/verify.py"
    for f in spec.fields:
        if f.kind is not Kind.AP:
            assert (f.role, f.mems, f.one_bank, f.e8m0) == (Role.DATA, None, False, E8m0.NEVER), f.name
            assert all(e in spec.engines and f.kind is Kind.ENUM for e, _ in f.limits), f.name
            continue
        assert f.limits == (), f.name
        assert all(spec.memories(f, e) for e in spec.engines), f"{f.name} has no memory on some engine"
        assert not f.one_bank or Mem.PSUM in f.mems, f.name
        assert (f.role is Role.MX_SCALE) == (f.e8m0 is E8m0.SCALE), f.name
    if spec.elementwise:
        assert any(f.role is Role.DATA for f in spec.aps)
    features = {f.name for f in fields(HwConfig) if f.type in (bool, "bool")}
    assert {spec.needs, *(f.needs for f in spec.fields)} <= features | {""}
    assert all(f.kind is Kind.BOOL for f in spec.fields if f.needs)


def test_engine_memories_cover_every_engine():
    assert set(ENGINE_MEMS) == set(Engine)


def _with_row(monkeypatch, opcode: str, **changes):
    """Replace one row for the duration of a test."""
    monkeypatch.setitem(opcodes.BY_NAME, opcode, replace(opcodes.BY_NAME[opcode], **changes))


def _with_field(monkeypatch, opcode: str, name: str, **changes):
    """Replace one field of one row for the duration of a test."""
    spec = opcodes.BY_NAME[opcode]
    changed = tuple(replace(f, **changes) if f.name == name else f for f in spec.fields)
    _with_row(monkeypatch, opcode, fields=changed)


def _rules(ins) -> set[str]:
    return {v.rule for v in check(broken(ins))}


def test_verifier_reads_operand_memories_from_the_row(monkeypatch):
    ins = op("tensor_tensor")
    assert "memory" not in _rules(ins)
    _with_field(monkeypatch, "tensor_tensor", "in1", mems=frozenset({Mem.PSUM}))
    assert "memory" in _rules(ins)


def test_verifier_reads_the_one_bank_rule_from_the_row(monkeypatch):
    ins = with_fields(op("matmul"), dst=ps(64, off=2048 - 128))
    assert "psum-bank" in _rules(ins)
    _with_field(monkeypatch, "matmul", "dst", one_bank=False)
    assert "psum-bank" not in _rules(ins)


def test_verifier_reads_e8m0_placement_from_the_row(monkeypatch):
    ins = with_fields(op("tensor_tensor"), in1=sb(64, off=3200, dt=DType.E8M0))
    assert "dtype" in _rules(ins)
    _with_field(monkeypatch, "tensor_tensor", "in1", e8m0=E8m0.DECODE)
    assert "dtype" not in _rules(ins)


def test_verifier_reads_engine_limits_from_the_row(monkeypatch):
    ins = with_fields(op("tensor_scalar"), op0=AluOp.SUB)
    assert ins.engine is Engine.ACT and "op" in _rules(ins)
    _with_field(monkeypatch, "tensor_scalar", "op0", limits=())
    assert "op" not in _rules(ins)


def test_verifier_reads_roles_from_the_row(monkeypatch):
    ins = with_fields(op("activation"), bias_ap=sb(64, [(1, 2)], off=9000))
    assert "shape" in _rules(ins)
    _with_field(monkeypatch, "activation", "bias_ap", role=Role.DATA)
    assert "shape" in _rules(ins)   # now a data operand: [64, 2] does not match dst's [64, 64] either
    _with_field(monkeypatch, "activation", "bias_ap", role=Role.MX_SCALE)
    assert "shape" not in _rules(ins)


def test_verifier_reads_target_features_from_the_row(monkeypatch):
    mx, double_row = op("matmul_mx"), op("matmul", 1)
    assert "target" in {v.rule for v in check(broken(mx, "trn2"))}
    assert "target" in {v.rule for v in check(broken(double_row, "trn1"))}
    _with_row(monkeypatch, "matmul_mx", needs="")
    _with_field(monkeypatch, "matmul", "double_row", needs="")
    assert "target" not in {v.rule for v in check(broken(mx, "trn2"))}
    assert "target" not in {v.rule for v in check(broken(double_row, "trn1"))}


def test_engines_for_drops_engines_that_cannot_run_the_instance():
    spec = opcodes.opspec("tensor_scalar")
    assert spec.engines_for({"dst": Mem.SBUF, "src": Mem.SBUF}, {"op0": AluOp.MUL}) == spec.engines
    assert Engine.ACT not in spec.engines_for({}, {"op0": AluOp.MUL, "op1": AluOp.SUB})
    assert Engine.POOL not in spec.engines_for({"src": Mem.PSUM}, {})
