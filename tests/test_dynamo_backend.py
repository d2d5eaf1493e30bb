"""The torch.compile backend (trnc/backend.py, trnc/partition.py), driven the way users drive it.

Every case goes through `torch.compile(model, backend="trnc")` and compares with torch eager.
Tolerances are those of tests/test_models.py: fp32 max|diff| / max|ref| <= 1e-5; bf16 with
auto_cast="all" u = 2^-8 (bf16's unit roundoff) times the kernels on the longest path of the
compiled graph, since each kernel rounds its stored result once and errors along a chain add.
"""
import logging
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from test_models import MLP, EncoderBlock, _depth_bound
from torch import nn

import trnc.api
import trnc.backend as backend
from trnc import flags
from trnc.errors import TrncError, UnsupportedOpError
from trnc.options import Options


@pytest.fixture(autouse=True)
def _fresh(tmp_path):
    torch._dynamo.reset()
    with flags.override(TRNC_CACHE_DIR=tmp_path / "cache"):
        yield
    torch._dynamo.reset()


def _rel(got, ref) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).abs().max() / ref.abs().max())


def _run(model, args, **options):
    model.eval()
    compiled = torch.compile(model, backend="trnc", options=options or None)
    with torch.no_grad():
        return compiled(*args), model(*args)


def _all_on_device():
    report = backend.last_report()
    assert report.fallback == () and report.device_partitions == 1
    return report


def test_mlp_fp32_and_bf16():
    torch.manual_seed(0)
    x = torch.randn(40, 48)
    got, ref = _run(MLP(), (x,))
    assert _rel(got, ref) <= 1e-5
    assert len(_all_on_device().regions[0].inputs) == 1   # the weights were frozen into constants
    torch._dynamo.reset()
    got, ref = _run(MLP(), (x,), precision="bf16", auto_cast="all")
    assert got.dtype == torch.float32
    assert 0 < _rel(got, ref) <= _depth_bound(MLP(), (x,))   # nonzero: bf16 really ran
    assert _all_on_device().regions[0].options.precision == "bf16"


def test_transformer_block_fp32_and_bf16():
    torch.manual_seed(1)
    model = EncoderBlock()
    args = (torch.randn(2, 24, 64), torch.randn(2, 1, 24, 24))
    got, ref = _run(model, args)
    assert _rel(got, ref) <= 1e-5
    _all_on_device()
    torch._dynamo.reset()
    got, ref = _run(model, args, precision="bf16", auto_cast="all", target="trn1")
    assert 0 < _rel(got, ref) <= _depth_bound(model, args)
    compiled = _all_on_device().regions[0]
    assert compiled.program.target == "trn1" and compiled.options.auto_cast == "all"


class FallbackBlock(nn.Module):
    """torch.nextafter has no legalize rule: it runs in eager between two device regions."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 32), nn.Linear(32, 16)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = torch.nextafter(h, h)
        return self.fc2(h)


def _fallback_line() -> str:
    import inspect
    lines, start = inspect.getsourcelines(FallbackBlock.forward)
    offset = next(i for i, line in enumerate(lines) if "nextafter" in line)
    return f"test_dynamo_backend.py:{start + offset}: h = torch.nextafter(h, h)"


def test_unsupported_op_falls_back_to_eager_with_one_warning(caplog):
    torch.manual_seed(2)
    x = torch.randn(8, 32)
    with caplog.at_level(logging.WARNING, logger="trnc"):
        got, ref = _run(FallbackBlock(), (x,))
    assert _rel(got, ref) <= 1e-5
    warnings = [r for r in caplog.records if r.name.startswith("trnc") and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "aten.nextafter.default x1" in text and _fallback_line() in text and "CPU fallback" in text
    report = backend.last_report()
    assert [(f.op, f.count, f.sources) for f in report.fallback] == [("aten.nextafter.default", 1, (_fallback_line(),))]
    assert report.device_partitions == 2 and report.fallback_nodes == 1 and report.text() == text


class InfiniteSlopeBlock(nn.Module):
    """aten.leaky_relu.default has a rule that refuses an infinite slope: it raises UnsupportedOpError while its
    region compiles. The nextafter before it makes two regions in the first round, the first one reused after the
    second fails."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.nextafter(h, h)
        return (F.leaky_relu(self.fc2(h), math.inf) * 3.0).tanh()


def test_an_op_its_rule_refuses_moves_to_eager_and_the_graph_is_partitioned_again(monkeypatch):
    compiles = []
    real_compile = trnc.api.compile
    monkeypatch.setattr(trnc.api, "compile", lambda *a, **k: compiles.append(1) or real_compile(*a, **k))
    torch.manual_seed(6)
    x = torch.randn(4, 8)
    got, ref = _run(InfiniteSlopeBlock(), (x,))
    assert _rel(got, ref) <= 1e-5
    report = backend.last_report()
    assert [(f.op, f.count) for f in report.fallback] == [("aten.nextafter.default", 1), ("aten.leaky_relu.default", 1)]
    assert "is not supported" in report.fallback[1].reason
    assert report.fallback[1].sources[0].endswith(
        "return (F.leaky_relu(self.fc2(h), math.inf) * 3.0).tanh()")
    # regions: fc1 | fc2 | mul, tanh; the first compiled once, fc2..tanh failed once on the leaky relu
    assert report.device_partitions == 3 and len(compiles) == 4


def test_fallback_false_raises_naming_the_op_and_line():
    compiled = torch.compile(FallbackBlock().eval(), backend="trnc", options={"fallback": False})
    with torch.no_grad(), pytest.raises(UnsupportedOpError) as info:
        compiled(torch.randn(8, 32))
    message = str(info.value)
    assert "aten.nextafter.default" in message and _fallback_line() in message and "'fallback': True" in message


def test_options_are_validated():
    assert backend.parse_options({"precision": "bf16", "auto_cast": "all", "target": "trn2", "fallback": False}) \
        == backend.BackendOptions(Options("bf16", "all", "trn2"), False)
    with pytest.raises(TrncError, match="unknown trnc backend option 'precison'; the options are precision"):
        backend.parse_options({"precison": "bf16"})
    with pytest.raises(TrncError, match=r"auto_cast='most' is not allowed; choose one of None, 'none', 'matmult'"):
        backend.parse_options({"auto_cast": "most"})
    with pytest.raises(TrncError, match="fallback=1 is not allowed; choose one of True, False"):
        backend.parse_options({"fallback": 1})
    # what a user of torch.compile sees: dynamo wraps a backend's exception, the trnc message intact
    compiled = torch.compile(MLP(), backend="trnc", options={"target": "trn9"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(torch.randn(4, 48))
    assert "TrncError: trnc backend option target='trn9' is not allowed; choose one of 'trn1'" in str(info.value)
    assert isinstance(info.value.inner_exception, TrncError)


def test_new_shapes_recompile_within_a_bounded_number_of_variants(monkeypatch):
    """Dynamo compiles the first shape static and the next ones with a symbolic batch dimension; the
    backend then keeps at most MAX_VARIANTS compiled shapes, least recently used evicted."""
    monkeypatch.setattr(backend, "MAX_VARIANTS", 2)
    compiles = []
    real_compile = trnc.api.compile
    monkeypatch.setattr(trnc.api, "compile", lambda *a, **k: compiles.append(a[1][-1].shape) or real_compile(*a, **k))
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8)).eval()
    compiled = torch.compile(model, backend="trnc")
    counts = []
    for batch in (4, 6, 8, 10, 8, 6):
        x = torch.randn(batch, 16)
        with torch.no_grad():
            assert _rel(compiled(x), model(x)) <= 1e-5
        counts.append(len(compiles))
    # 4: static graph; 6, 8: variants of the dynamic graph; 10 evicts 6; 8 is cached; 6 compiles again
    assert counts == [1, 2, 3, 4, 4, 5]
    assert backend.last_report().variants == 2 and backend.last_report().input_shapes[-1] == (6, 16)


def test_weights_written_in_place_compile_again(monkeypatch):
    compiles = []
    real_compile = trnc.api.compile
    monkeypatch.setattr(trnc.api, "compile", lambda *a, **k: compiles.append(1) or real_compile(*a, **k))
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(16, 8), nn.Tanh()).eval()
    compiled = torch.compile(model, backend="trnc")
    x = torch.randn(3, 16)
    with torch.no_grad():
        compiled(x)
        compiled(x)
        assert len(compiles) == 1
        model[0].weight.mul_(-2.0)
        assert _rel(compiled(x), model(x)) <= 1e-5
    assert len(compiles) == 2


def test_gradients_flow_with_an_eager_backward():
    """Forward on trnc, backward in eager PyTorch. The backward needs native_layer_norm's saved mean and rstd:
    trnc computes them too (they were refused, and the node ran in eager), so the whole forward is on the device
    and the gradients, which read them, match eager's."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    x = torch.randn(6, 16, requires_grad=True)
    y = torch.compile(model, backend="trnc")(x)
    y.square().sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    ref_y = model(x)
    ref_y.square().sum().backward()
    ref = [x.grad] + [p.grad for p in model.parameters()]
    assert _rel(y, ref_y) <= 1e-5
    assert all(_rel(g, r) <= 1e-5 for g, r in zip(got, ref))
    assert not backend.last_report().fallback


def test_backend_found_by_name_without_importing_trnc(tmp_path):
    code = (
        "import sys, torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()\n"
        "x = torch.randn(3, 8)\n"
        "with torch.no_grad():\n"
        "    y = torch.compile(m, backend='trnc', options={'precision': 'fp32'})(x)\n"
        "    err = float((y - m(x)).abs().max() / m(x).abs().max())\n"
        "print('trnc' in torch._dynamo.list_backends(), 'trnc.backend' in sys.modules, err <= 1e-5)\n"
    )
    env = {**os.environ, "TRNC_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]


@pytest.mark.slow
def test_hugging_face_bert_fp32():
    import transformers as tf
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        vocab_size=120, max_position_embeddings=64, attn_implementation="sdpa")
    model = tf.BertModel(cfg).eval()
    ids = torch.randint(0, 120, (2, 16))
    got, ref = _run(model, (ids,))
    assert _rel(got.last_hidden_state, ref.last_hidden_state) <= 1e-5
    assert _rel(got.pooler_output, ref.pooler_output) <= 1e-5
    assert backend.last_report().fallback == ()
