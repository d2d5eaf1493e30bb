"""Generates isa/SPEC.md from the prose in isa/spec_intro.md and the tables in the code.

Run `python -m trnc.isa.spec` after changing the opcode table, a preset or the prose;
tests/isa/test_spec.py fails while the committed SPEC.md differs from what this produces.
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

from trnc.isa import config, encoding, asm
from trnc.isa.config import TARGETS
from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc, AluOp, ReduceOp, Rounding, ScaleMode
from trnc.isa.opcodes import ENGINE_MEMS, TABLE, E8m0, Kind, Role

HERE = Path(__file__).parent
SPEC_PATH = HERE / "SPEC.md"


def _doc(obj) -> str:
    return " ".join(inspect.getdoc(obj).split()) if inspect.getdoc(obj) else ""


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _presets() -> list[str]:
    names = list(TARGETS)
    rows = [
        ["generation"] + [TARGETS[n].generation for n in names],
        ["partitions"] + [TARGETS[n].partitions for n in names],
        ["SBUF bytes per partition (usable)"] + [TARGETS[n].sbuf_bytes_per_partition for n in names],
        ["PSUM banks x bytes per partition"] + [f"{TARGETS[n].psum_banks} x {TARGETS[n].psum_bank_bytes}"
                                                for n in names],
    ]
    for eng in ("pe", "act", "dve", "pool"):
        rows.append([f"{eng} clock (GHz)"] + [TARGETS[n].clock_hz[eng] / 1e9 for n in names])
    rows += [
        ["DMA queues"] + [config.DMA_QUEUES for _ in names],
        ["DMA bytes/ns per queue"] + [TARGETS[n].dma_queue_bytes_per_ns for n in names],
        ["DMA fixed cost (ns)"] + [TARGETS[n].dma_fixed_ns for n in names],
        ["HBM GB/s per core"] + [TARGETS[n].hbm_bytes_per_s / 1e9 for n in names],
        ["HBM GiB per core"] + [TARGETS[n].hbm_bytes / 2**30 for n in names],
        ["fp8 double-row matmul"] + [TARGETS[n].fp8_double_row for n in names],
        ["MX (matmul_mx, quantize_mx)"] + [TARGETS[n].mx for n in names],
    ]
    for dt, dr, mx, label in ((DType.FP32, False, False, "fp32"), (DType.BF16, False, False, "bf16/fp16/fp8"),
                              (DType.FP8_E4M3, True, False, "fp8 double-row"), (DType.FP8_E4M3, False, True, "MX")):
        rows.append([f"peak TensorE TFLOPS, {label}"] +
                    [round(TARGETS[n].peak_flops(dt, dr, mx) / 1e12, 1)
                     if (not dr or TARGETS[n].fp8_double_row) and (not mx or TARGETS[n].mx) else "-"
                     for n in names])
    return ["## Machine presets", "", "Sources are cited beside each number in `isa/config.py`.", ""] + \
        _table(["", *names], rows)


def _dtypes() -> list[str]:
    rows = [[d.text, d.code, d.itemsize, d.value.kind, d.storage.name] for d in DType]
    return ["## Data types", ""] + _table(["name", "code", "bytes", "kind", "numpy storage"], rows)


def _enums() -> list[str]:
    out = ["## Enumerations", ""]
    for enum_type in (AluOp, ActFunc, ReduceOp, Rounding, ScaleMode):
        out += [f"**{enum_type.__name__}**: " + ", ".join(f"`{m.text}`={m.value}" for m in enum_type), ""]
    return out


def _engines() -> list[str]:
    rows = [[e.text, ", ".join(sorted(m.text for m in mems))] for e, mems in ENGINE_MEMS.items()]
    return ["## Engines", "", "The memories each engine reaches; an opcode's operand may narrow them.", ""] + \
        _table(["engine", "memories"], rows)


def _field_kind(f) -> str:
    if f.kind is Kind.AP:
        return ("out " if f.out else "in ") + ("AP, optional" if f.optional else "AP")
    if f.kind is Kind.ENUM:
        return f"{f.enum.__name__} (default `{f.default.text}`)"
    return f"{f.kind.value} (default `{f.default}`)"


def _field_rules(op, f) -> str:
    """An operand's memories and the table's other rules on it, as a cell of its opcode's field table."""
    if f.kind is not Kind.AP:
        rules = [f"on {e.text}: {', '.join(sorted(v.text for v in values))}" for e, values in f.limits]
        return "; ".join(rules + ([f"when set, needs a target with `{f.needs}`"] if f.needs else []))
    mems = sorted({m.text for e in op.engines for m in op.memories(f, e)})
    rules = [" or ".join(mems)] + ([f.role.value] if f.role is not Role.DATA else [])
    rules += ["one PSUM bank"] * f.one_bank + ([f"e8m0: {f.e8m0.value}"] if f.e8m0 in (E8m0.COPY, E8m0.DECODE) else [])
    return "; ".join(rules)


def _opcodes() -> list[str]:
    out = ["## Opcodes", ""]
    out += _table(["opcode", "code", "engines", "summary"],
                  [[f"`{op.name}`", op.code, ", ".join(e.text for e in op.engines), op.summary] for op in TABLE])
    for op in TABLE:
        out += [f"### `{op.name}` (code {op.code}; {', '.join(e.text for e in op.engines)})", "", op.summary + ".", ""]
        if op.elementwise:
            out += ["Elementwise: the data operands correspond element by element.", ""]
        if op.needs:
            out += [f"Needs a target with `{op.needs}`.", ""]
        out += _table(["field", "kind", "rules", "notes"],
                      [[f"`{f.name}`", _field_kind(f), _field_rules(op, f), f.doc] for f in op.fields])
        out += [f"Semantics: {op.semantics}.", "", f"Cost (`{op.cost.__name__}`): {_doc(op.cost)}", ""]
    return out


def render() -> str:
    parts = [(HERE / "spec_intro.md").read_text().rstrip(), ""]
    parts += _presets() + _engines() + _dtypes() + _enums() + _opcodes()
    parts += ["## Binary encoding", "", inspect.getdoc(encoding).strip(), ""]
    parts += ["## Assembly text", "", inspect.getdoc(asm).strip(), ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    SPEC_PATH.write_text(render())
    print(f"wrote {SPEC_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
