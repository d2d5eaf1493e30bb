"""trnc: a tensor compiler from PyTorch to a NeuronCore-like ISA, and its CPU runtime.

Pipeline order: trnc.capture -> trnc.ir -> trnc.passes -> trnc.isa -> trnc.runtime.
`trnc.compile(model, example_inputs, ...)`, `trnc.load(path)` and `trnc.numerics_report(...)` are imported on
first use, so
`import trnc` (and the CLI) does not pay for importing torch.
"""
from trnc.errors import TrncError
from trnc.version import __version__

__all__ = ["TrncError", "__version__", "compile", "load", "CompiledModel", "numerics_report"]


def __getattr__(name: str):
    if name in ("compile", "load", "CompiledModel"):
        from trnc import api
        return getattr(api, name)
    if name == "numerics_report":
        from trnc.numerics import numerics_report
        return numerics_report
    raise AttributeError(f"module 'trnc' has no attribute {name!r}")
