"""torchvision beside torch's CPU build: the one place that makes `import torchvision` work for tests and benchmarks.

torchvision 0.28.0 on PyPI is built against torch's CUDA build. Under the CPU build its C++ operators do not load,
and the import then fails with "operator torchvision::nms does not exist": its Python registers fake kernels for
nms and qnms whatever loaded. The models are plain Python and need neither op, so when the import fails so, the
two schemas are defined (without kernels; calling them fails) and the import is tried again. Where the C++
operators load, the first import succeeds and nothing is defined.
"""
from __future__ import annotations

import importlib
import sys

import torch

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library: list = []


def torchvision():
    """The torchvision module."""
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as e:
        if "torchvision::nms does not exist" not in str(e) or _library:
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]     # the failed import's half-initialized modules
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    _library.append(library)      # the definitions live as long as the library object
    return importlib.import_module("torchvision")
