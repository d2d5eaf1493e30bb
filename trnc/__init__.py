"""trnc: a tensor compiler from PyTorch to a NeuronCore-like ISA, and its CPU runtime.

Pipeline order: trnc.capture -> trnc.ir -> trnc.passes -> trnc.isa -> trnc.runtime.
"""
from trnc.errors import TrncError

__version__ = "0.1.0"
__all__ = ["TrncError", "__version__"]
