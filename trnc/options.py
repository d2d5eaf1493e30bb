"""The user's compile options: the allowed values, the defaults and the one validation of each.

trnc.compile, the torch.compile backend, the CLI and the artifact loader all build an Options, so a
value is checked, and a default chosen, in one place. It reads the machine presets of isa/config.py
and sits beside them, below every pass that reads the options.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, fields

from trnc.errors import TrncError
from trnc.isa.config import DEFAULT_TARGET, TARGETS
from trnc.isa.dtypes import DType
from trnc.isa.enums import Rounding, ScaleMode

# the low-precision type auto_cast casts to, by its option value; fp8 is the matmul operands' type only (scaled
# per tensor: passes/graph/quantize.py), and values auto_cast="all" narrows are bf16 then
PRECISIONS = {"fp32": DType.FP32, "bf16": DType.BF16, "fp16": DType.FP16, "fp8": DType.FP8_E4M3,
              "mxfp8": DType.FP8_E4M3, "mxfp4": DType.FP4_E2M1}
FP8_FORMATS = {"e4m3": DType.FP8_E4M3, "e5m2": DType.FP8_E5M2}   # OCP e4m3fn (saturating) or e5m2
# the E8M0 block scale rule of MX quantization (precision.md 7.3): OCP v1.0's floor, its round-up, AWS's
MX_SCALES = {"floor": ScaleMode.FLOOR, "rceil": ScaleMode.RCEIL, "trn_alt": ScaleMode.TRN_ALT}
LOW_BIT = ("fp8", "mxfp8", "mxfp4")   # the precisions whose matmul operands are scaled (passes/graph/quantize.py)
# how an fp8 matmul's activation scale is found: its amax on the device at run time, or on the example inputs
FP8_SCALING = ("dynamic", "static")
# what auto_cast casts (neuronx-cc's --auto-cast): nothing, matmul and attention operands, every value
AUTO_CAST = ("none", "matmult", "all")
# what keep_precision may keep a layer's matmuls in
KEPT_PRECISIONS = ("fp32", "bf16", "fp16")
# how the engines round the values they write in bf16, fp16 or fp8 (passes/tile/kernels/engines.py write)
ROUNDINGS = {"nearest": Rounding.RNE, "stochastic": Rounding.SR}
# what attention's two matmuls compute in: "auto" follows auto_cast (bf16 under the scaled precisions)
ATTENTION_PRECISIONS = ("auto", *KEPT_PRECISIONS)


def _check(name: str, value, allowed) -> None:
    if not (isinstance(value, str) and value in allowed):
        raise TrncError(f"{name}={value!r} is not allowed; choose one of {', '.join(repr(v) for v in allowed)}")


@dataclass(frozen=True)
class Options:
    """What the user chose; validated on construction. auto_cast None takes the precision's default:
    "none" for fp32 (nothing to cast to), "matmult" otherwise. fp8 needs a target with fp8 double-row matmuls,
    mxfp8 and mxfp4 one with MX matmuls, unless `emulate` asks for them at bf16 speed. keep_precision maps glob
    patterns over nn.Module paths to the precision those layers' matmuls keep (fp32, bf16, fp16): the scaled
    formats leave them alone, and their operands are in that dtype. rounding="stochastic" rounds the values the
    engines write in bf16, fp16 or fp8 stochastically, from `seed` (passes/tile/kernels/engines.py write).
    attention_precision sets the dtype of attention's two matmuls (fp32, bf16, fp16); "auto" lets them follow
    auto_cast, as every other matmul."""

    precision: str = "fp32"
    auto_cast: str | None = None
    target: str = DEFAULT_TARGET
    fp8_format: str = "e4m3"
    fp8_scaling: str = "dynamic"
    mx_scale: str = "floor"
    emulate: bool = False
    keep_precision: dict = field(default_factory=dict)
    rounding: str = "nearest"
    seed: int = 0
    attention_precision: str = "auto"

    def __post_init__(self):
        _check("precision", self.precision, tuple(PRECISIONS))
        if self.auto_cast is None:
            object.__setattr__(self, "auto_cast", "none" if self.precision == "fp32" else "matmult")
        else:
            _check("auto_cast", self.auto_cast, (None, *AUTO_CAST))
        _check("target", self.target, tuple(TARGETS))
        _check("fp8_format", self.fp8_format, tuple(FP8_FORMATS))
        _check("fp8_scaling", self.fp8_scaling, FP8_SCALING)
        _check("mx_scale", self.mx_scale, tuple(MX_SCALES))
        if not isinstance(self.emulate, bool):
            raise TrncError(f"emulate={self.emulate!r} is not allowed; choose one of True, False")
        if not isinstance(self.keep_precision, dict) or not all(isinstance(k, str) for k in self.keep_precision):
            raise TrncError(f"keep_precision={self.keep_precision!r} is not allowed; give a dict of module-path glob "
                            "patterns to precisions, e.g. {'lm_head': 'bf16', '*.attn.*': 'bf16'}")
        for pattern, kept in self.keep_precision.items():
            _check(f"keep_precision[{pattern!r}]", kept, KEPT_PRECISIONS)
        _check("rounding", self.rounding, tuple(ROUNDINGS))
        _check("attention_precision", self.attention_precision, ATTENTION_PRECISIONS)
        if type(self.seed) is not int or not 0 <= self.seed < 2 ** 32:
            raise TrncError(f"seed={self.seed!r} is not allowed; give an int in [0, 2^32)")
        if self.precision in ("mxfp8", "mxfp4") and not TARGETS[self.target].mx and not self.emulate:
            having = ", ".join(repr(t) for t, hw in TARGETS.items() if hw.mx)
            raise TrncError(f"precision={self.precision!r} needs MX matmuls and quantize_mx, which target "
                            f"{self.target!r} lacks; choose a target that has them ({having}) or pass "
                            "emulate=True to emulate them at bf16 speed")
        if self.precision == "fp8" and not TARGETS[self.target].fp8_double_row and not self.emulate:
            having = ", ".join(repr(t) for t, hw in TARGETS.items() if hw.fp8_double_row)
            raise TrncError(f"precision='fp8' needs fp8 double-row matmuls, which target {self.target!r} lacks; "
                            f"choose a target that has them ({having}) or pass emulate=True to run fp8 at bf16 "
                            "speed")

    @property
    def low_dtype(self) -> DType:
        """The storage dtype auto_cast narrows values to ("all"), and the matmul operands' but for the scaled
        precisions (fp8, mxfp8, mxfp4), whose other values are bf16."""
        return DType.BF16 if self.precision in LOW_BIT else PRECISIONS[self.precision]

    def kept_dtype(self, module: str) -> DType | None:
        """The dtype keep_precision keeps the matmuls of nn.Module path `module` in: the first pattern that
        matches (fnmatch globs over the dotted path), or None."""
        for pattern, kept in self.keep_precision.items():
            if module and fnmatch.fnmatchcase(module, pattern):
                return PRECISIONS[kept]
        return None

    @property
    def attention_dtype(self) -> DType | None:
        """The dtype attention_precision names for attention's matmuls, or None ("auto")."""
        return None if self.attention_precision == "auto" else PRECISIONS[self.attention_precision]

    @property
    def fp8_dtype(self) -> DType | None:
        """The matmul operands' fp8 dtype, or None when the precision is not fp8."""
        return FP8_FORMATS[self.fp8_format] if self.precision == "fp8" else None

    @property
    def mx_dtype(self) -> DType | None:
        """The MX element dtype of the matmul operands (mxfp8: fp8_format's; mxfp4: e2m1), or None."""
        if self.precision == "mxfp8":
            return FP8_FORMATS[self.fp8_format]
        return DType.FP4_E2M1 if self.precision == "mxfp4" else None


OPTION_NAMES = tuple(f.name for f in fields(Options))
