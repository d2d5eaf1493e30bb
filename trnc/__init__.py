"""trnc: a tensor compiler from PyTorch to a NeuronCore-like ISA, and its CPU runtime.

Pipeline order: trnc.capture -> trnc.ir -> trnc.passes -> trnc.isa -> trnc.runtime.
`trnc.compile(model, example_inputs, ...)` and `trnc.load(path)` are imported on first use, so
`import trnc` (and the CLI) does not pay for importing torch.
"""
from trnc.errors import TrncError
from trnc.version import __version__

__all__ = ["TrncError", "__version__", "compile", "load", "CompiledModel"]


def __getattr__(name: str):
    if name in ("compile", "load", "CompiledModel"):
        from trnc import api
        return getattr(api, name)
    raise AttributeError(f"module 'trnc' has no attribute {name!r}")
