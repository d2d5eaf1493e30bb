"""trnc/options.py: one set of allowed values and defaults, one validation, seen the same way by every entry point."""
import pytest

from trnc.errors import TrncError
from trnc.isa.config import DEFAULT_TARGET, TARGETS
from trnc.isa.dtypes import DType
from trnc.options import AUTO_CAST, OPTION_NAMES, PRECISIONS, Options


def test_defaults_follow_the_precision_and_the_default_target():
    assert Options() == Options("fp32", "none", DEFAULT_TARGET)
    assert Options("bf16").auto_cast == "matmult"
    assert Options("bf16", "all", "trn1").low_dtype is DType.BF16
    assert OPTION_NAMES == ("precision", "auto_cast", "target", "fp8_format", "fp8_scaling", "mx_scale", "emulate",
                            "keep_precision", "rounding", "seed", "attention_precision")


@pytest.mark.parametrize("values,message", [
    ({"precision": "fp64"}, "precision='fp64' is not allowed; choose one of 'fp32', 'bf16', 'fp16', 'fp8', 'mxfp8', "
                            "'mxfp4'"),
    ({"auto_cast": "most"}, "auto_cast='most' is not allowed; choose one of None, 'none', 'matmult', 'all'"),
    ({"target": "trn9"}, "target='trn9' is not allowed; choose one of 'trn1', 'trn2', 'trn3'"),
    ({"precision": 16}, "precision=16 is not allowed"),
])
def test_a_value_outside_the_allowed_ones_names_the_option_and_the_choices(values, message):
    with pytest.raises(TrncError, match=message):
        Options(**values)


def test_the_allowed_values_are_the_tables_every_entry_point_reads():
    assert set(PRECISIONS) == {"fp32", "bf16", "fp16", "fp8", "mxfp8", "mxfp4"}
    assert AUTO_CAST == ("none", "matmult", "all")
    for precision in PRECISIONS:
        for auto_cast in AUTO_CAST:
            for target in TARGETS:
                if precision.startswith("mx") and not TARGETS[target].mx:
                    continue
                assert Options(precision, auto_cast, target, emulate=True).target == target


def test_trnc_compile_checks_before_capturing():
    import trnc
    with pytest.raises(TrncError, match="precision='fp4' is not allowed"):
        trnc.compile(object(), (), precision="fp4")
