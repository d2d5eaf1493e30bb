"""The user's compile options: the allowed values, the defaults and the one validation of each.

trnc.compile, the torch.compile backend, the CLI and the artifact loader all build an Options, so a
value is checked, and a default chosen, in one place. It reads the machine presets of isa/config.py
and sits beside them, below every pass that reads the options.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from trnc.errors import TrncError
from trnc.isa.config import DEFAULT_TARGET, TARGETS
from trnc.isa.dtypes import DType

# the low-precision type auto_cast casts to, by its option value
PRECISIONS = {"fp32": DType.FP32, "bf16": DType.BF16}
# what auto_cast casts (neuronx-cc's --auto-cast): nothing, matmul and attention operands, every value
AUTO_CAST = ("none", "matmult", "all")


def _check(name: str, value, allowed) -> None:
    if not (isinstance(value, str) and value in allowed):
        raise TrncError(f"{name}={value!r} is not allowed; choose one of {', '.join(repr(v) for v in allowed)}")


@dataclass(frozen=True)
class Options:
    """What the user chose; validated on construction. auto_cast None takes the precision's default:
    "none" for fp32 (nothing to cast to), "matmult" otherwise."""

    precision: str = "fp32"
    auto_cast: str | None = None
    target: str = DEFAULT_TARGET

    def __post_init__(self):
        _check("precision", self.precision, tuple(PRECISIONS))
        if self.auto_cast is None:
            object.__setattr__(self, "auto_cast", "none" if self.precision == "fp32" else "matmult")
        else:
            _check("auto_cast", self.auto_cast, (None, *AUTO_CAST))
        _check("target", self.target, tuple(TARGETS))

    @property
    def low_dtype(self) -> DType:
        return PRECISIONS[self.precision]


OPTION_NAMES = tuple(f.name for f in fields(Options))
