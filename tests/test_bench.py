"""`trnc bench` (benchmarks/harness.py): a run on a small subset writes the report, its plots and traces, with
every figure's fields; what cannot run is listed with its reason; bad arguments are clear errors."""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from trnc.cli.main import run_cli

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("bench")
    code = run_cli(["bench", "--quick", "--models", "mlp", "--precisions", "fp32,bf16,mxfp8,mxfp4",
                    "--repeats", "1", "--out", str(out)])
    assert code == 0
    return out, json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_the_report_holds_every_file(report):
    out, data = report
    for name in ("report.md", "roofline.png", "utilization.png", "compile.png", "precision.png"):
        assert (out / name).stat().st_size > 1000, name
    for name in data["plots"].values():
        assert (out / name).read_bytes()[:8] == PNG
    trace = json.loads(gzip.decompress((out / data["models"][0]["runs"][1]["trace"]).read_bytes()))
    assert {e["ph"] for e in trace["traceEvents"]} >= {"M", "X"}
    text = (out / "report.md").read_text()
    assert "| mlp |" in text and "![roofline](roofline.png)" in text


@pytest.mark.slow
def test_the_report_has_every_figure(report):
    _, data = report
    assert data["machine"]["cores"] >= 1 and data["versions"]["torch"].startswith("2.13")
    assert data["date"][:4].isdigit() and data["run"]["quick"] is True
    (mlp,) = data["models"]
    compile_ = mlp["compile"]
    assert compile_["trnc_s"] > 0 and compile_["inductor_s"] > 0
    assert compile_["ratio"] == pytest.approx(compile_["trnc_s"] / compile_["inductor_s"])
    assert mlp["host"]["trnc_ms"] > 0 and mlp["host"]["eager_ms"] > 0 and mlp["host"]["threads"] >= 1
    runs = {(r["precision"], r["target"]): r for r in mlp["runs"]}
    # each precision on the first target that has it, and bf16 on every target used (the speedups' baseline)
    assert set(runs) == {("fp32", "trn2"), ("bf16", "trn2"), ("mxfp8", "trn3"), ("mxfp4", "trn3"), ("bf16", "trn3")}
    for r in runs.values():
        assert 0 < r["roofline_us"] <= r["modeled_us"] and r["efficiency"] == pytest.approx(
            r["roofline_us"] / r["modeled_us"], rel=1e-6)
        assert r["bound"] in ("pe", "act", "dve", "pool", "dma", "semaphore waits")
        assert 0 <= r["utilization"]["pe"] <= 1 and r["flops"] > 0 and r["hbm_bytes"] > 0
    # SQNR against eager fp32 orders the formats as precision.md's table does
    assert runs["fp32", "trn2"]["sqnr_db"] > 100
    assert 40 < runs["bf16", "trn2"]["sqnr_db"] < 70
    assert runs["mxfp4", "trn3"]["sqnr_db"] < runs["mxfp8", "trn3"]["sqnr_db"] < runs["bf16", "trn3"]["sqnr_db"]


@pytest.mark.slow
def test_a_precision_no_target_has_is_listed_with_its_reason(tmp_path):
    code = run_cli(["bench", "--quick", "--models", "gemm-1024", "--precisions", "mxfp4", "--targets", "trn2",
                    "--no-inductor", "--repeats", "1", "--out", str(tmp_path)])
    assert code == 0
    (row,) = json.loads((tmp_path / "report.json").read_text())["models"]
    assert row["runs"] == [{"precision": "mxfp4", "error": "none of the targets trn2 has mxfp4 (see --targets)"}]
    assert "inductor_s" not in row["compile"]
    assert "| gemm-1024 | mxfp4 | - | cannot run: none of the targets trn2 has mxfp4" in (
        tmp_path / "report.md").read_text()


def test_unknown_names_are_clear_errors(tmp_path, capsys):
    assert run_cli(["bench", "--models", "resnet51", "--out", str(tmp_path)]) == 2
    assert "unknown model resnet51; choose among gemm-1024" in capsys.readouterr().err
    assert run_cli(["bench", "--precisions", "fp64", "--out", str(tmp_path)]) == 2
    assert "unknown precision fp64" in capsys.readouterr().err


def test_help_lists_the_zoo(capsys):
    assert run_cli(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    assert "bert-base" in text and "resnet50" in text and "[quick]" in text
