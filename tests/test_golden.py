"""The golden programs (tests/golden/): the compiler generates the same assembly and modeled figures as the files
hold. A failure shows the first differences; rewrite the files (`python -m tests.golden`) only for a change made
on purpose, and say why in the commit with the figures before and after."""
import difflib

import pytest

from golden import GOLDENS, assembly, figures, read

SHOWN_LINES = 80


def _diff(want: str, got: str) -> str:
    lines = difflib.unified_diff(want.splitlines(), got.splitlines(), "golden", "compiled", lineterm="", n=2)
    shown = [line for _, line in zip(range(SHOWN_LINES), lines)]
    return "\n".join(shown)


@pytest.mark.parametrize("golden", [pytest.param(g, id=g.name, marks=[pytest.mark.slow] if g.slow else [])
                                    for g in GOLDENS])
def test_the_compiler_generates_the_golden_program(golden):
    want_asm, want_figures = read(golden)
    compiled = golden.compile()
    got_asm, got_figures = assembly(compiled), figures(compiled)
    assert got_figures == want_figures, "modeled figures changed:\n" + "\n".join(
        f"  {k}: {want_figures.get(k)} -> {got_figures.get(k)}" for k in sorted(set(want_figures) | set(got_figures))
        if want_figures.get(k) != got_figures.get(k))
    assert got_asm == want_asm, f"generated code changed (first {SHOWN_LINES} diff lines):\n{_diff(want_asm, got_asm)}"
