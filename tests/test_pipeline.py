"""The pass manager: pass order, timing, IR printing after a pass (option and TRNC_PRINT_AFTER), errors."""
import io

import pytest
import torch
from torch import nn

from trnc import flags
from trnc.capture import capture
from trnc.errors import TrncError, VerifyError
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
    assert pipeline.PASS_NAMES == ("legalize", "fold", "simplify", "recognize", "merge-matmuls", "quantize", "fuse", "precision", "layout",
                                   "plan", "tile", "prefetch", "allocate", "schedule", "emit")
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
    from trnc.passes.tile.lower import LowerToTiles

    state = _state()
    for p in pipeline.PIPELINE[:pipeline.PASS_NAMES.index("tile")]:
        p.run(state)
    small = TARGETS["trn2"].__class__(**{**vars(TARGETS["trn2"]), "hbm_bytes": 4096})
    state.hw = small
    with pytest.raises(TrncError, match=r"needs .* GiB of HBM .* largest tensors: .*\["):
        LowerToTiles().run(state)


class Recorder(pipeline.Hook):
    def __init__(self, log, tag):
        self.log, self.tag = log, tag

    def before(self, name, state):
        self.log.append((self.tag, "before", name, state.level))

    def after(self, name, state):
        self.log.append((self.tag, "after", name, state.level))


def test_hooks_run_around_every_pass_and_nest():
    log = []
    times = run_pipeline(_state(), hooks=(Recorder(log, "outer"), Recorder(log, "inner")))
    names = list(pipeline.PASS_NAMES)
    assert [e[2] for e in log if e[:2] == ("outer", "before")] == names == list(times)
    first = log[:4]
    assert [e[:3] for e in first] == [("outer", "before", names[0]), ("inner", "before", names[0]),
                                      ("inner", "after", names[0]), ("outer", "after", names[0])]
    levels = {e[2]: e[3] for e in log if e[1] == "after"}
    assert levels["legalize"] == "graph" and levels["tile"] == "tiles" and levels["emit"] == "program"


def test_the_verifier_of_the_level_runs_after_each_pass_and_names_the_pass(monkeypatch):
    seen = []
    monkeypatch.setitem(pipeline.VERIFIERS, "tiles", lambda state: seen.append(state.level))
    run_pipeline(_state())
    assert seen and len(seen) == pipeline.PASS_NAMES.index("emit") - pipeline.PASS_NAMES.index("tile")

    def broken(state):
        raise VerifyError("a rule")
    monkeypatch.setitem(pipeline.VERIFIERS, "tiles", broken)
    with pytest.raises(VerifyError, match="a rule\n  \\(in pass 'tile'\\)"):
        run_pipeline(_state())
    run_pipeline(_state(), verify=False)


def test_pass_progress_shows_each_pass():
    class Line:
        total, steps = 0, []

        def begin(self, name):
            self.steps.append(name)

        def end(self):
            pass
    line = Line()
    hook = pipeline.PassProgress(line)
    run_pipeline(_state(), hooks=(hook,))
    assert hook.steps == len(pipeline.PIPELINE) and line.steps == list(pipeline.PASS_NAMES)


def test_the_tile_verifier_runs_in_debug_mode_only(monkeypatch):
    seen = []
    monkeypatch.setitem(pipeline.VERIFIERS, "tiles", lambda state: seen.append(state.level))
    with flags.override(TRNC_DEBUG=False):
        run_pipeline(_state())
    assert seen == []
    with flags.override(TRNC_DEBUG=True):
        run_pipeline(_state())
    assert seen
