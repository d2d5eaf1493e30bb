"""Style gates of STYLE.md that a machine can check: ruff clean, and no module over 600 code lines."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("trnc", "isa", "passes", "runtime")
CODE_LINE_BUDGET = 600


def code_lines(path: Path) -> int:
    """Lines that are neither blank, comments nor docstrings."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node) is not None:
            first = node.body[0]
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if i not in docstrings and line.strip() and not line.strip().startswith("#"))


def test_modules_stay_within_the_line_budget():
    over = {str(p.relative_to(ROOT)): n for folder in PACKAGE_FOLDERS for p in (ROOT / folder).rglob("*.py")
            if (n := code_lines(p)) > CODE_LINE_BUDGET}
    assert over == {}, f"split these modules by responsibility: {over}"


def test_ruff_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
