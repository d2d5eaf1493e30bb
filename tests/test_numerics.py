"""trnc.numerics_report: rows for the layers that change numerics, each fed fp32 inputs, and the output's SQNR."""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import trnc
from trnc.errors import TrncError


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 64)

    def forward(self, x):
        return self.down(torch.relu(self.norm(self.up(x))))


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block(), Block())

    def forward(self, x):
        return self.blocks(x)


def test_each_layer_is_measured_on_fp32_inputs():
    """Teacher forcing: the last linear's SQNR is a lone fp8 linear's (about 28 dB), while the output, after six
    fp8 linears, carries all of their errors."""
    torch.manual_seed(0)
    report = trnc.numerics_report(Deep(), (torch.randn(64, 64),), precision="fp8")
    names = [row.name for row in report.layers]
    assert names == [f"blocks.{b}.{layer}" for b in range(3) for layer in ("up", "norm", "down")]
    ops = {row.name.rsplit(".", 1)[1]: (row.op, row.dtype) for row in report.layers}
    assert ops == {"up": ("linear", "fp8"), "norm": ("layer_norm", "fp32"), "down": ("linear", "fp8")}
    linears = [row.sqnr_db for row in report.layers if row.op == "linear"]
    assert all(25 < s < 32 for s in linears)
    assert report.output_sqnr_db < min(linears)
    for row in report.layers:
        assert math.isclose(row.rel_l2, 10 ** (-row.sqnr_db / 20), rel_tol=1e-6) and row.max_abs_err > 0
    assert [r["name"] for r in json.loads(json.dumps(report.to_dict()))["layers"]] == names
    assert "output SQNR" in report.table() and "blocks.2.down" in report.table()


def test_fp32_loses_nothing_but_rounding():
    torch.manual_seed(0)
    report = trnc.numerics_report(Block(), (torch.randn(16, 64),), precision="fp32")
    assert report.output_sqnr_db > 110 and all(row.sqnr_db > 110 for row in report.layers)


def test_a_model_without_layers_to_measure_is_an_error():
    with pytest.raises(TrncError, match="has no layer the numerics report measures"):
        trnc.numerics_report(nn.ReLU(), (torch.randn(4),), precision="bf16")
