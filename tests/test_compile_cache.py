"""The compile cache (trnc/compile_cache.py) through trnc.compile: hits, misses, off switches, corrupt entries, bounds, logs.

Every test points TRNC_CACHE_DIR at its own tmp_path, so nothing touches the user's cache.
"""
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

import trnc
from trnc import compile_cache, flags, ir
from trnc.capture import capture
from trnc.isa.dtypes import DType
from trnc.options import Options


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).eval()


X = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def cache_dir(tmp_path):
    with flags.override(TRNC_CACHE_DIR=tmp_path / "cache", TRNC_CACHE=True, TRNC_COMPILE_CACHE=True):
        yield tmp_path / "cache" / "models"


def entries(folder) -> list:
    return sorted(folder.glob("*.trnc")) if folder.exists() else []


def test_second_compile_hits_with_identical_results(cache_dir):
    model = mlp()
    first = trnc.compile(model, (X,))
    assert first.stats["cache"] == "miss" and len(entries(cache_dir)) == 1
    second = trnc.compile(model, (X,))
    assert second.stats["cache"] == "hit"
    assert "legalize" not in second.stats["pass_seconds"] and "cache-load" in second.stats["pass_seconds"]
    assert "legalize" in second.stats["cached_pass_seconds"]
    assert set(first.stats) - {"pass_seconds", "compile_seconds"} <= set(second.stats)
    for k in ("instructions", "cycles", "seconds", "kernels", "sbuf_peak_bytes", "model_macs", "efficiency"):
        assert second.stats[k] == first.stats[k], k
    a, b = first(X), second(X)
    assert a.dtype == b.dtype and torch.equal(a, b)


def test_hit_keeps_the_output_structure_of_a_hugging_face_model(cache_dir):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        vocab_size=50, max_position_embeddings=16, attn_implementation="sdpa")
    model = tf.BertModel(cfg).eval()
    ids = torch.randint(0, 50, (1, 8))
    fresh = trnc.compile(model, (ids,))(ids)
    cached = trnc.compile(model, (ids,))
    assert cached.stats["cache"] == "hit"
    again = cached(ids)
    assert type(again) is type(fresh) and list(again.keys()) == list(fresh.keys())
    for x, y in zip(pytree.tree_leaves(fresh), pytree.tree_leaves(again)):
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_other_weights_options_or_shapes_miss(cache_dir):
    model = mlp()
    assert trnc.compile(model, (X,)).stats["cache"] == "miss"
    other = mlp()
    with torch.no_grad():
        other[2].bias[0] += 1.0      # one element of one constant
    assert trnc.compile(other, (X,)).stats["cache"] == "miss"
    assert trnc.compile(model, (X,), precision="bf16").stats["cache"] == "miss"
    assert trnc.compile(model, (X[:2],)).stats["cache"] == "miss"
    assert len(entries(cache_dir)) == 4
    assert trnc.compile(other, (X,)).stats["cache"] == "hit"
    assert not torch.equal(trnc.compile(other, (X,))(X), trnc.compile(model, (X,))(X))


def test_key_is_stable_and_covers_constants_and_options():
    model = mlp()
    g1, _ = capture(model, (X,))
    g2, _ = capture(model, (X,))
    fp32, bf16 = Options("fp32", "none", "trn2"), Options("bf16", "matmult", "trn2")
    assert compile_cache.graph_key(g1, fp32) == compile_cache.graph_key(g2, fp32)
    assert compile_cache.graph_key(g1, fp32) != compile_cache.graph_key(g1, bf16)
    const = next(n for n in g2.nodes if n.op == "const")
    value = const.attrs["value"].copy()
    value.reshape(-1)[-1] = np.nextafter(value.reshape(-1)[-1], np.float32(np.inf))
    const.attrs["value"] = value
    assert compile_cache.graph_key(g1, fp32) != compile_cache.graph_key(g2, fp32)


def test_an_attribute_the_key_cannot_serialize_makes_the_graph_uncacheable():
    x = ir.Node("input", (), (4,), DType.FP32, {"index": 0}, name="x")
    y = ir.Node("aten.weird", (x,), (4,), DType.FP32, {"thing": object()}, name="y")
    with pytest.raises(compile_cache.Uncacheable, match="object"):
        compile_cache.graph_key(ir.Graph([x, y], [x], [y]), Options())


def test_cache_off_writes_nothing(cache_dir, capsys):
    model = mlp()
    with flags.override(TRNC_CACHE=False):
        assert trnc.compile(model, (X,)).stats["cache"] == "off"
    with flags.override(TRNC_COMPILE_CACHE=False):
        assert trnc.compile(model, (X,)).stats["cache"] == "off"
    assert trnc.compile(model, (X,), cache=False).stats["cache"] == "off"
    assert not cache_dir.parent.exists()
    assert trnc.compile(model, (X,), print_after=["emit"]).stats["cache"] == "off"
    assert "after emit" in capsys.readouterr().err and not cache_dir.parent.exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_corrupt_entry_is_deleted_and_compiled_again(cache_dir, caplog, damage):
    model = mlp()
    reference = trnc.compile(model, (X,))(X)
    [entry] = entries(cache_dir)
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) // 3]
    else:
        data = b"not an artifact"
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="trnc"):
        again = trnc.compile(model, (X,))
    assert again.stats["cache"] == "miss"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "compile cache entry" in r.getMessage()]
    assert len(warnings) == 1 and str(entry) in warnings[0].getMessage()
    assert torch.equal(again(X), reference)
    assert trnc.compile(model, (X,)).stats["cache"] == "hit"     # the entry was written again, whole


def test_the_entry_count_bound_evicts_the_least_recently_used(cache_dir, monkeypatch):
    monkeypatch.setattr(compile_cache, "MAX_ENTRIES", 2)
    model = mlp()
    shapes = [X[:1], X[:2], X[:3]]
    keys = []
    for x in shapes:
        trnc.compile(model, (x,))
        keys.append(max(entries(cache_dir), key=lambda p: p.stat().st_mtime_ns).stem)
        os.utime(cache_dir / f"{keys[-1]}.trnc", ns=(len(keys) * 10**9,) * 2)   # distinct ages on any clock
    assert {p.stem for p in entries(cache_dir)} == {keys[1], keys[2]}
    assert trnc.compile(model, (shapes[1],)).stats["cache"] == "hit"     # touches keys[1]: keys[2] is now oldest
    trnc.compile(model, (shapes[0],))
    assert {p.stem for p in entries(cache_dir)} == {keys[0], keys[1]}


def test_the_byte_bound_evicts_and_too_large_models_are_not_stored(cache_dir, monkeypatch):
    model = mlp()
    trnc.compile(model, (X,))
    [first] = entries(cache_dir)
    monkeypatch.setattr(compile_cache, "MAX_BYTES", first.stat().st_size + first.stat().st_size // 2)
    trnc.compile(model, (X[:1],))
    [kept] = entries(cache_dir)
    assert kept != first
    monkeypatch.setattr(compile_cache, "MAX_BYTES", 100)      # below the constants of the MLP
    assert trnc.compile(model, (X[:2],)).stats["cache"] == "miss"
    assert entries(cache_dir) == [kept]


def test_a_stale_temp_file_is_removed(cache_dir):
    trnc.compile(mlp(), (X,))
    stale = cache_dir / ".leftover.trnc.abc.tmp"
    stale.write_bytes(b"partial")
    fresh = cache_dir / ".current.trnc.abc.tmp"
    fresh.write_bytes(b"being written")
    os.utime(stale, (1, 1))
    compile_cache.ModelCache(cache_dir).evict()
    assert not stale.exists() and fresh.exists()


def test_logs_at_info_and_debug(cache_dir, caplog):
    model = mlp()
    with flags.override(TRNC_LOG="debug"), caplog.at_level(logging.DEBUG, logger="trnc"):
        trnc.compile(model, (X,))
        trnc.compile(model, (X,))
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name == "trnc.api"]
    assert len(info) == 2
    assert "Sequential" in info[0] and "precision=fp32" in info[0] and "cache miss" in info[0]
    assert "instructions" in info[0] and "modeled" in info[0] and "cache hit" in info[1]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(m.startswith("pass legalize:") for m in debug) and any(m.startswith("pass emit:") for m in debug)
    [entry] = entries(cache_dir)
    assert any(entry.stem in m and str(entry) in m for m in debug)


def test_quiet_at_the_default_log_level(cache_dir, caplog):
    with flags.override(TRNC_LOG="warning"), caplog.at_level(logging.DEBUG):
        trnc.compile(mlp(), (X,))
    assert not [r for r in caplog.records if r.name.startswith("trnc")]


def test_an_entry_written_by_one_process_hits_in_another(cache_dir, tmp_path):
    model = mlp()
    expected = trnc.compile(model, (X,))(X)
    np.save(tmp_path / "x.npy", X.numpy())
    code = f"""
import numpy as np, torch
from torch import nn
import trnc
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).eval()
x = torch.from_numpy(np.load({str(tmp_path / 'x.npy')!r}))
compiled = trnc.compile(model, (x,))
np.save({str(tmp_path / 'y.npy')!r}, compiled(x).numpy())
from trnc.compile_cache import compiler_fingerprint
print(compiled.stats["cache"], compiler_fingerprint())
"""
    env = {**os.environ, "TRNC_CACHE_DIR": str(cache_dir.parent), "TRNC_CACHE": "1", "TRNC_COMPILE_CACHE": "1",
           "TRNC_LOG": "warning"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    status, fingerprint = out.stdout.split()
    # a miss is right only when the compiler's source changed since this process hashed it (a file was edited)
    assert status == "hit" or fingerprint != compile_cache.compiler_fingerprint()
    if status == "hit":
        assert np.array_equal(np.load(tmp_path / "y.npy"), expected.numpy())
