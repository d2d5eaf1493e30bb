"""isa/SPEC.md is generated from the opcode table; it must match the code, and the table must stay the one source."""
import re
from pathlib import Path

from trnc.isa import spec
from trnc.isa.opcodes import TABLE

ROOT = Path(__file__).resolve().parents[2]


def test_spec_md_matches_the_code():
    assert spec.SPEC_PATH.read_text() == spec.render(), "isa/SPEC.md is stale: run `python -m trnc.isa.spec`"


def test_spec_md_lists_every_opcode_with_its_code_and_engines():
    text = spec.SPEC_PATH.read_text()
    for op in TABLE:
        engines = ", ".join(e.text for e in op.engines)
        assert f"### `{op.name}` (code {op.code}; {engines})" in text


def test_opcode_codes_and_names_are_unique():
    assert len({op.code for op in TABLE}) == len(TABLE)
    assert len({op.name for op in TABLE}) == len(TABLE)


def test_no_opcode_numbers_outside_isa():
    """Only isa/ may map opcode numbers; everything else names opcodes (STYLE rule 4)."""
    pattern = re.compile(r"BY_CODE|\.code\s*==|opcode\s*==\s*\d")
    offenders = [str(p.relative_to(ROOT)) for folder in ("trnc", "passes", "runtime")
                 for p in (ROOT / folder).rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
