"""The progress line (trnc/progress.py): redrawn on a terminal, erased at the end, absent elsewhere; and in trnc.compile."""
import io
import sys

import pytest
import torch
from torch import nn

import trnc
from trnc import flags
from trnc.passes.pipeline import PASS_NAMES
from trnc.progress import Progress

ERASE = "\r\x1b[K"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_steps_on_a_terminal_are_redrawn_and_erased():
    out = FakeTerminal()
    with Progress(2, stream=out) as p:
        p.begin("capture")
        assert out.getvalue().endswith(f"{ERASE}trnc compile [1/2] capture ...")
        assert p.end(0.25) == 0.25
        assert out.getvalue().endswith(f"{ERASE}trnc compile [1/2] capture 0.25s")
        p.begin("fuse")
        seconds = p.end()
        assert seconds >= 0 and out.getvalue().endswith(f"[2/2] fuse {seconds:.2f}s")
    assert out.getvalue().endswith(ERASE) and "\n" not in out.getvalue()


def test_a_lowered_total_and_an_overrun_total_show_sensible_counts():
    out = FakeTerminal()
    with Progress(10, stream=out) as p:
        p.begin("a")
        p.total = 2
        p.begin("b")
        assert out.getvalue().endswith("[2/2] b ...")
        p.begin("c")
        assert out.getvalue().endswith("[3/3] c ...")


@pytest.mark.parametrize("stream", [io.StringIO(), object()], ids=["not-a-terminal", "no-isatty"])
def test_nothing_is_written_off_a_terminal(stream):
    with Progress(3, stream=stream) as p:
        p.begin("capture")
        p.end()
    if isinstance(stream, io.StringIO):
        assert stream.getvalue() == ""


def test_disabled_writes_nothing_even_on_a_terminal():
    out = FakeTerminal()
    with Progress(3, stream=out, enabled=False) as p:
        p.begin("capture")
        p.end()
    assert out.getvalue() == ""


def test_the_line_is_erased_when_the_step_fails():
    out = FakeTerminal()
    with pytest.raises(RuntimeError):
        with Progress(3, stream=out) as p:
            p.begin("capture")
            raise RuntimeError("boom")
    assert out.getvalue().endswith(ERASE)


def _compile(monkeypatch, stream, **kwargs):
    monkeypatch.setattr(sys, "stderr", stream)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    return trnc.compile(model, (torch.randn(2, 8),), **kwargs)


def test_compile_shows_every_pass_on_a_terminal(monkeypatch, tmp_path):
    out = FakeTerminal()
    with flags.override(TRNC_CACHE_DIR=tmp_path, TRNC_CACHE=True, TRNC_COMPILE_CACHE=True, TRNC_LOG="warning"):
        _compile(monkeypatch, out)
    text = out.getvalue()
    total = 2 + len(PASS_NAMES) + 2
    steps = ["capture", "cache-key", *PASS_NAMES, "perf-model", "cache-store"]
    for i, name in enumerate(steps, 1):
        assert f"trnc compile [{i}/{total}] {name} ..." in text
    assert text.endswith(ERASE) and "\n" not in text
    hit = FakeTerminal()
    with flags.override(TRNC_CACHE_DIR=tmp_path, TRNC_CACHE=True, TRNC_COMPILE_CACHE=True, TRNC_LOG="warning"):
        _compile(monkeypatch, hit)
    assert "trnc compile [3/3] cache-load" in hit.getvalue() and "legalize" not in hit.getvalue()


def test_compile_writes_nothing_off_a_terminal_or_under_debug_logging(monkeypatch, tmp_path):
    plain = io.StringIO()
    with flags.override(TRNC_CACHE_DIR=tmp_path, TRNC_LOG="warning"):
        _compile(monkeypatch, plain, cache=False)
    assert plain.getvalue() == ""
    terminal = FakeTerminal()
    with flags.override(TRNC_CACHE_DIR=tmp_path, TRNC_LOG="debug"):
        _compile(monkeypatch, terminal, cache=False)
    assert "trnc compile [" not in terminal.getvalue()
