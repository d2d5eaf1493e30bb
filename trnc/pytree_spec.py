"""Pytree specs in artifacts: the checks that let trnc/artifact.py hand a spec from a file to torch safely.

torch.utils._pytree serializes a model's input and output structure (tuples, dicts, namedtuples,
registered classes) as JSON, but its `treespec_loads` imports modules the JSON names (enum contexts,
a defaultdict's factory), which is code execution on load. The artifact loader checks every node
here first: bounded size, only node types registered in this process whose deserializer runs no code.
"""
from __future__ import annotations

import json

SPEC_PROTOCOL = 1           # torch.utils._pytree's serialization protocol the specs use
MAX_SPEC_DEPTH = 32         # nesting of a pytree spec (a model's output structure is shallow)
MAX_SPEC_NODES = 100_000


class SpecError(Exception):
    """A serialized pytree spec that is malformed or would run code when torch loads it."""


class Unregistered(SpecError):
    """A pytree spec names a node type this process has not registered: not malformed, only unknown here."""

    def __init__(self, kind: str):
        super().__init__(f"pytree node type {kind} is not registered")
        self.kind = kind


def check_spec_nodes(value) -> None:
    """A serialized pytree spec whose every node type deserializes without importing anything.

    Raises SpecError on a malformed spec and Unregistered when a node type is not registered in this process
    (e.g. a Hugging Face ModelOutput when transformers is not imported). torch is imported here, not at the
    top, so that reading an artifact's header does not import it.
    """
    import torch.utils._pytree as pytree
    if not (isinstance(value, list) and len(value) == 2 and value[0] == SPEC_PROTOCOL and type(value[0]) is int):
        raise SpecError(f"a pytree spec is [{SPEC_PROTOCOL}, node]")
    stack, count = [(value[1], 0)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_SPEC_DEPTH or count > MAX_SPEC_NODES:
            raise SpecError(f"a pytree spec nests deeper than {MAX_SPEC_DEPTH} or has over {MAX_SPEC_NODES} nodes")
        if not (isinstance(node, dict) and set(node) == {"type", "context", "children_spec"}
                and isinstance(node["children_spec"], list)):
            raise SpecError("a pytree spec node is an object with keys type, context and children_spec (a list)")
        kind, context, children = node["type"], node["context"], node["children_spec"]
        if kind is None:
            if context is not None or children:
                raise SpecError("a pytree spec leaf has a context or children")
            continue
        if not isinstance(kind, str):
            raise SpecError("a pytree spec node's type is a string or null")
        python_type = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(kind)
        if python_type is None:
            raise Unregistered(kind)
        custom = pytree.SUPPORTED_SERIALIZED_TYPES[python_type].from_dumpable_context
        if custom is not None and kind != "collections.namedtuple":   # namedtuple's only looks a class up by name
            raise SpecError(f"a pytree spec node of type {kind} would run its deserializer; trnc does not load those")
        if not isinstance(context, str):
            raise SpecError(f"a pytree spec node of type {kind} has a context that is not a string")
        stack.extend((child, depth + 1) for child in children)
        if custom is not None:
            if context not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
                raise Unregistered(context)
            continue
        try:
            normalized = json.dumps(json.loads(context))   # escapes resolved, so the enum marker cannot hide
        except (ValueError, RecursionError):
            raise SpecError(f"a pytree spec node of type {kind} has a context that is not JSON") from None
        if "__enum__" in normalized:
            raise SpecError("a pytree spec context names an enum; loading it would import a module")
