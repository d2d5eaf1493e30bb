"""docs/coverage.md's Core ATen section (tests/core_aten.py): each op's status from the sweep's evidence."""
from types import SimpleNamespace

from core_aten import core_aten_ops, core_aten_rows


def _result(device_ops=(), fallback_ops=(), reasons=()):
    return SimpleNamespace(device_ops=list(device_ops), fallback_ops=list(fallback_ops), fallback_reasons=list(reasons))


def test_each_core_op_is_judged_by_the_samples_then_by_what_trnc_has():
    ops = core_aten_ops()
    assert "aten.add.Tensor" in ops and "aten.sort.default" in ops and len(ops) > 150
    results = [_result(["aten.add.Tensor", "aten.sort.default"]),
               _result(["aten.add.Tensor"], ["aten.sort.default", "aten.topk.default"],
                       ["aten.sort.default of 9 keys is refused", "aten.topk.default: k > 8"]),
               _result(["aten.mul.Tensor"], ["aten.add.Tensor", "aten.div.Tensor"],
                       ["aten.div.Tensor: its region failed", "float64 values computed from inputs"]),
               _result([], ["aten.exp.default", "aten.log.default"], ["int32 %sub", "int32 %sub"])]
    rows = {op: (status, why) for op, status, why in core_aten_rows(results)}
    assert len(rows) == len(ops)
    assert rows["aten.add.Tensor"] == ("on device", "2 samples")
    assert rows["aten.sort.default"] == ("partly", "on device in 1 sample; in eager in 1 sample: aten.sort.default of "
                                                    "9 keys is refused")
    assert rows["aten.topk.default"] == ("fallback", "1 sample: aten.topk.default: k > 8")
    assert rows["aten.div.Tensor"] == ("fallback", "1 sample: float64 values computed from inputs")
    assert rows["aten.mul.Tensor"] == ("on device", "1 sample")   # in eager only beside div, whose region failed
    assert rows["aten.exp.default"][0] == "has a rule"   # in eager only with its whole region
    assert rows["aten.convolution_backward.default"][0] == "not applicable"
    assert rows["aten._fft_r2c.default"] == ("fallback", "no legalize rule")
