"""The package's layering (ARCHITECTURE.md): no module imports a layer above its own, and no import circles.

Every module of the package is parsed (not imported), and every import counts, those inside functions
too: a function-level import that only postpones a circle is still a circle. Imports under
`if TYPE_CHECKING:` never run and do not count. `from trnc import flags` is an edge to trnc.flags;
importing a package's own name (`import trnc`) is an edge to its __init__.
"""
import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"trnc": "trnc", "isa": "trnc.isa", "passes": "trnc.passes", "runtime": "trnc.runtime"}
# lowest first; a module belongs to the layer of the longest prefix that names it
LAYERS = (
    ("base", ("trnc.errors", "trnc.flags", "trnc.log", "trnc.progress", "trnc.pytree_spec", "trnc.version")),
    # options reads the target presets of isa/config.py, so it sits beside them
    ("isa", ("trnc.isa", "trnc.options")),
    ("runtime", ("trnc.runtime",)),
    ("ir", ("trnc.ir", "trnc.interpret", "trnc.dtypes")),
    ("passes", ("trnc.passes",)),
    ("capture", ("trnc.capture",)),
    # the package's own __init__ hands out trnc.compile and trnc.load
    ("api", ("trnc", "trnc.api", "trnc.artifact", "trnc.compile_cache")),
    ("backend", ("trnc.backend", "trnc.partition")),
    ("cli", ("trnc.cli",)),
)


def modules() -> dict[str, Path]:
    """Module name -> file, for every .py file of the package's folders."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def layer_of(module: str) -> int:
    best, layer = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), i
    assert layer is not None, f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}"
    return layer


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:`, which only type checkers import."""
    for node in ast.iter_child_nodes(tree):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its source (functions included)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[:len(name.split(".")) - node.level + is_package]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in known else source)
    return {m for m in out if m in known and m != name}


def import_graph() -> nx.DiGraph:
    found = modules()
    graph = nx.DiGraph()
    for name, path in found.items():
        graph.add_node(name)
        graph.add_edges_from((name, m) for m in imports(name, path, set(found)))
    return graph


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                    for a, b in import_graph().edges if layer_of(b) > layer_of(a))
    assert upward == []


def test_no_import_circles():
    circles = sorted(" -> ".join([*c, c[0]]) for c in nx.simple_cycles(import_graph()))
    assert circles == []


def test_the_graph_sees_imports_inside_functions():
    edges = import_graph().edges
    assert ("trnc.api", "trnc.capture") in edges
    assert ("trnc.capture", "trnc.passes.graph.legalize_rules") in edges   # imported inside _legalizes_as_is
