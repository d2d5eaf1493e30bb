"""The pass manager: pass order, timing, IR printing after a pass (option and TRNC_PRINT_AFTER), errors."""
import io

import pytest
import torch
from torch import nn

from trnc import flags
from trnc.capture import capture
from trnc.errors import TrncError
from trnc.isa.config import get_target
from trnc.passes import pipeline
from trnc.options import Options
from trnc.passes.pipeline import CompileState, run_pipeline


def _state():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    graph, _ = capture(model, (torch.randn(4, 16),))
    return CompileState(graph, Options(), get_target("trn2"))


def test_passes_run_in_the_documented_order_and_are_timed():
    state = _state()
    times = run_pipeline(state)
    assert list(times) == list(pipeline.PASS_NAMES)
    assert pipeline.PASS_NAMES == ("legalize", "fold", "simplify", "merge-matmuls", "fuse", "precision", "layout",
                                   "plan", "tile", "allocate", "schedule", "emit")
    assert state.program is not None and len(state.program.instructions) > 0
    with open("docs/layout.md") as f:   # docs/layout.md lists the passes in pipeline order
        text = f.read()
    positions = [text.index(f"`{name}`") for name in pipeline.PASS_NAMES]
    assert positions == sorted(positions)


def test_print_after_option_and_environment():
    out = io.StringIO()
    run_pipeline(_state(), print_after=["fuse"], out=out)
    text = out.getvalue()
    assert "after fuse" in text and "matmul" in text and "[k0:matmul]" in text
    out = io.StringIO()
    with flags.override(TRNC_PRINT_AFTER="tile,emit"):
        run_pipeline(_state(), out=out)
    text = out.getvalue()
    assert "after tile" in text and "after emit" in text and "after fuse" not in text
    assert "dma_copy" in text   # the tile program and the assembly list instructions


def test_unknown_pass_name_is_an_error():
    with pytest.raises(TrncError, match="unknown pass name.*'tiel'"):
        run_pipeline(_state(), print_after=["tiel"])


def test_a_model_too_large_for_hbm_names_its_tensors():
    from trnc.isa.config import TARGETS
    from trnc.passes.tile import LowerToTiles

    state = _state()
    for p in pipeline.PIPELINE[:pipeline.PASS_NAMES.index("tile")]:
        p.run(state)
    small = TARGETS["trn2"].__class__(**{**vars(TARGETS["trn2"]), "hbm_bytes": 4096})
    state.hw = small
    with pytest.raises(TrncError, match=r"needs .* GiB of HBM .* largest tensors: .*\["):
        LowerToTiles().run(state)
