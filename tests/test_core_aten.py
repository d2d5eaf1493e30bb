"""docs/coverage.md's Core ATen section (tests/core_aten.py): each op's status from the sweep's evidence."""
from types import SimpleNamespace

from core_aten import core_aten_ops, core_aten_rows


def _result(device_ops=(), fallback_ops=(), detail=""):
    return SimpleNamespace(device_ops=list(device_ops), fallback_ops=list(fallback_ops), detail=detail)


def test_each_core_op_is_judged_by_the_samples_then_by_what_trnc_has():
    ops = core_aten_ops()
    assert "aten.add.Tensor" in ops and "aten.sort.default" in ops and len(ops) > 150
    results = [_result(["aten.add.Tensor", "aten.sort.default"]),
               _result(["aten.add.Tensor"], ["aten.sort.default", "aten.topk.default"],
                       "aten.sort.default: stable sort of 9 keys is refused; aten.topk.default: k too large")]
    rows = {op: (status, why) for op, status, why in core_aten_rows(results)}
    assert len(rows) == len(ops)
    assert rows["aten.add.Tensor"] == ("on device", "2 samples")
    assert rows["aten.sort.default"] == ("partly", "on device in 1 sample; in eager in 1 sample: stable sort of 9 "
                                                    "keys is refused")
    assert rows["aten.topk.default"] == ("fallback", "1 sample: k too large")
    assert rows["aten.mul.Tensor"][0] == "has a rule"
    assert rows["aten.convolution_backward.default"][0] == "not applicable"
    assert rows["aten._fft_r2c.default"] == ("fallback", "no legalize rule")
