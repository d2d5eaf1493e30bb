"""capture: nn.Modules (torch.export) and aot_autograd GraphModules to ir.Graphs of aten nodes, the CaptureInfo
that calls them like the model, the errors for models export cannot trace, and Hugging Face BERT, GPT-2 and
Llama through the whole front end (capture, legalize, fold) against eager (slow)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from trnc import ir
from trnc.capture import capture, decomposition_table, source_of
from trnc.errors import TrncError
from trnc.interpret import run_graph
from trnc.ir import TensorArg
from trnc.isa.dtypes import DType
from trnc.passes.graph.fold import FoldConstants
from trnc.passes.graph.legalize import Legalize


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("offset", torch.arange(3.0))
        self.register_buffer("table", torch.tensor([7, 8, 9]), persistent=False)
        self.scale = torch.tensor(0.5)   # a plain tensor attribute: a lifted constant

    def forward(self, x, ids, *, mask, repeat: int = 1):
        y = self.fc(x) * self.scale + self.offset
        return {"y": y.masked_fill(mask, 0.0) * repeat, "picked": self.table[ids]}


def _block_inputs():
    return (torch.randn(2, 4), torch.tensor([2, 0])), {"mask": torch.rand(2, 3) > 0.5, "repeat": 2}


def legalized(model, args, kwargs=None):
    graph, info = capture(model, args, kwargs, decompose=True)
    state = SimpleNamespace(graph=graph)
    Legalize().run(state)
    FoldConstants().run(state)
    ir.verify(graph)
    return graph, info


def run_like_the_model(graph, info, args, kwargs):
    """What the API does: flatten the call, take the graph's inputs, run, rebuild the model's output structure."""
    leaves = pytree.tree_leaves((args, kwargs))
    outs = run_graph(graph, [leaves[i] for i in info.input_leaves])
    return pytree.tree_unflatten([o.to(d) for o, d in zip(outs, info.output_dtypes)], info.out_spec)


def test_module_inputs_constants_and_aten_nodes():
    model = Block().eval()
    args, kwargs = _block_inputs()
    graph, info = capture(model, args, kwargs, decompose=True)
    ir.verify(graph, legalized=False)
    assert [n.name for n in graph.inputs] == ["x", "ids", "mask"]          # flattened call order, kwargs last
    assert [n.attrs["index"] for n in graph.inputs] == [0, 1, 2]
    assert [n.dtype for n in graph.inputs] == [DType.FP32, DType.INT32, DType.UINT8]
    assert info.input_leaves == (0, 1, 2)                                  # leaf 3 is the Python int `repeat`
    assert info.input_dtypes == (torch.float32, torch.int64, torch.bool)
    assert info.input_shapes == ((2, 4), (2,), (2, 3))
    assert info.output_dtypes == (torch.float32, torch.int64)              # dict leaves in insertion order
    consts = {n.name: n for n in graph.nodes if n.op == "const"}
    assert set(consts) == {"fc_weight", "fc_bias", "offset", "table", "scale"}
    assert consts["table"].dtype is DType.INT32 and consts["table"].attrs["value"].dtype == np.int32
    np.testing.assert_array_equal(consts["fc_weight"].attrs["value"], model.fc.weight.detach().numpy())
    where = next(n for n in graph.nodes if n.op == "aten.where.self")      # masked_fill, decomposed
    assert where.attrs["args"] == (TensorArg(0, torch.bool), TensorArg(1, torch.float32), TensorArg(2, torch.float32))
    assert where.inputs[0] is graph.inputs[2] and where.shape == (2, 3) and where.dtype is DType.FP32
    assert where.source.startswith("test_capture.py:") and "masked_fill" in where.source
    scale = next(n for n in graph.nodes if n.op == "aten.mul.Tensor" and n.inputs[0] is where)
    assert scale.attrs["args"] == (TensorArg(0, torch.float32), 2)       # `repeat` is fixed at capture


def test_capture_info_calls_the_graph_like_the_model():
    model = Block().eval()
    args, kwargs = _block_inputs()
    graph, info = legalized(model, args, kwargs)
    out = run_like_the_model(graph, info, args, kwargs)
    ref = model(*args, **kwargs)
    assert set(out) == {"y", "picked"}
    assert torch.equal(out["picked"], ref["picked"]) and out["picked"].dtype == torch.int64
    torch.testing.assert_close(out["y"], ref["y"], rtol=1e-6, atol=1e-6)


def test_multi_output_ops_are_getitem_nodes():
    graph, _ = capture(Fn(lambda a: torch.split(a, [1, 3], dim=1)[1] * 2), (torch.randn(2, 4),), decompose=True)
    split = next(n for n in graph.nodes if n.op == "aten.split_with_sizes.default")
    assert split.attrs["outputs"] == [((2, 1), DType.FP32), ((2, 3), DType.FP32)] and split.shape == ()
    (item,) = [n for n in graph.nodes if n.op == "getitem"]
    assert item.attrs == {"index": 1} and item.inputs == (split,) and item.shape == (2, 3)


def test_the_decomposition_table_keeps_fused_ops_whole():
    table = decomposition_table()
    for op in (torch.ops.aten._softmax.default, torch.ops.aten.native_layer_norm.default,
               torch.ops.aten.gelu.default, torch.ops.aten.silu.default,
               torch.ops.aten.scaled_dot_product_attention.default,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default):
        assert op not in table
    assert torch.ops.aten.addcmul.default in table    # the core decompositions stay
    q = torch.randn(1, 2, 3, 4)
    graph, _ = capture(Fn(lambda q: F.silu(F.scaled_dot_product_attention(q, q, q).softmax(-1))), (q,), decompose=True)
    assert [n.op for n in graph.nodes if n.op.startswith("aten.")] == [
        "aten.scaled_dot_product_attention.default", "aten.softmax.int", "aten.silu.default"]


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def test_an_aten_graph_module_is_captured_with_every_placeholder_an_input():
    def f(x, w):
        return torch.nn.functional.layer_norm(x @ w, (3,)).relu(), x.sum()

    x, w = torch.randn(2, 4), torch.randn(4, 3)
    gm = make_fx(f)(x, w)                       # aten-level, as aot_autograd hands it to a backend
    graph, info = legalized(gm, [x, w])
    assert [n.op for n in graph.inputs] == ["input", "input"] and info.input_leaves == (0, 1)
    out = run_like_the_model(graph, info, ((x, w),), {})
    ref = f(x, w)
    assert isinstance(out, tuple) and len(out) == 2
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-6, atol=1e-6)


def test_a_graph_module_holding_parameters_gets_them_as_constants():
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(-1))
    x = torch.randn(2, 4)
    graph, info = legalized(torch.fx.symbolic_trace(model), [x])
    assert len(graph.inputs) == 1 and sum(n.op == "const" for n in graph.nodes) == 2
    torch.testing.assert_close(run_graph(graph, [x])[0], model(x), rtol=1e-6, atol=1e-6)


def test_a_torch_compile_backend_graph_is_captured():
    """A backend built on capture: aot_autograd's forward graph (parameters are inputs) runs through the IR."""
    from torch._dynamo.backends.common import aot_autograd
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.LayerNorm(4)).eval()
    captured = []

    def backend(gm, example_inputs):
        graph, _ = legalized(gm, example_inputs)
        captured.append(graph)
        return lambda *args: tuple(run_graph(graph, list(args)))

    x = torch.randn(3, 4)
    with torch.no_grad():
        out = torch.compile(model, backend=aot_autograd(fw_compiler=backend))(x)
        ref = model(x)
        hidden = model[1](model[0](x))
    torch._dynamo.reset()
    (graph,) = captured
    assert len(graph.inputs) == 5 and {n.op for n in graph.nodes} >= {"matmul", "layer_norm", "unary"}
    # The IR computes the linear as a matmul and an add where eager fuses an addmm: a few fp32 roundings of the
    # hidden values (4 products and a bias), which the layer norm over 4 features scales by 1/std of its row.
    amplification = float(hidden.abs().max() / hidden.std(-1, correction=0).min())
    tolerance = 8 * torch.finfo(torch.float32).eps * amplification
    torch.testing.assert_close(out, ref, rtol=0, atol=tolerance)


def test_source_is_the_innermost_frame_outside_torch():
    trace = ('  File "/home/u/model.py", line 12, in forward\n    y = self.fc(x)\n'
             f'  File "{torch.__file__[:-12]}/nn/modules/linear.py", line 134, in forward\n'
             '    return F.linear(input, self.weight, self.bias)\n')
    assert source_of(trace) == "model.py:12: y = self.fc(x)"
    assert source_of('  File "a/b.py", line 3, in f\n    z = g()\n') == "b.py:3: z = g()"
    assert source_of(None) == ""


def test_a_model_export_cannot_trace_gets_the_reason_the_line_and_a_hint():
    class Branches(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    line = Branches.forward.__code__.co_firstlineno + 1
    with pytest.raises(TrncError, match="torch.export could not trace the model") as info:
        capture(Branches(), (torch.randn(3),))
    message = str(info.value)
    assert f"test_capture.py:{line}: if x.sum() > 0:" in message
    assert "data-dependent Python control flow" in message


def test_a_non_tensor_output_is_refused():
    with pytest.raises(TrncError, match="not a tensor"):
        capture(Fn(lambda a: (a * 2, 3)), (torch.randn(2),))


def test_a_model_that_mutates_buffers_is_refused():
    with pytest.raises(TrncError, match="during forward"):
        capture(nn.BatchNorm1d(4).train(), (torch.randn(3, 4),))


# -- Hugging Face models through the whole front end (tiny random configs, no downloads) -----------------------
HF_REL_TOL = 1e-5


def _hf_check(model, kwargs):
    model = model.eval()
    graph, info = legalized(model, (), kwargs)
    with torch.no_grad():
        ref = model(**kwargs)
    out = run_like_the_model(graph, info, (), kwargs)
    assert type(out) is type(ref)
    for o, r in zip(pytree.tree_leaves(out), pytree.tree_leaves(ref)):
        assert o.shape == r.shape
        assert ((o - r).abs().max() / r.abs().max()).item() <= HF_REL_TOL
    assert not any(n.op.startswith("aten.") for n in graph.nodes)
    return graph


def _ids():
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, -3:] = 0
    return ids, mask


@pytest.mark.slow
def test_hf_bert():
    import transformers
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=32, attn_implementation="sdpa")
    ids, mask = _ids()
    graph = _hf_check(transformers.BertModel(config), {"input_ids": ids, "attention_mask": mask})
    assert sum(n.op == "attention" for n in graph.nodes) == 2


@pytest.mark.slow
def test_hf_gpt2():
    import transformers
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                     attn_implementation="sdpa", use_cache=False)
    ids, mask = _ids()
    graph = _hf_check(transformers.GPT2Model(config), {"input_ids": ids, "attention_mask": mask})
    assert sum(n.op == "attention" for n in graph.nodes) == 2


@pytest.mark.slow
def test_hf_llama():
    import transformers
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=32,
                                      attn_implementation="sdpa", use_cache=False)
    ids, _ = _ids()
    graph = _hf_check(transformers.LlamaModel(config), {"input_ids": ids})
    assert sum(n.op == "attention" for n in graph.nodes) == 2


def test_graphs_legalize_knows_skip_the_decompositions():
    """A module whose input-dependent ops all have legalize rules keeps them as exported (aten.linear, not
    addmm), which saves a second trace; an op without a rule (addcmul) makes capture decompose."""
    model = nn.Sequential(nn.Linear(4, 3), nn.GELU()).eval()
    graph, _ = capture(model, (torch.randn(2, 4),))
    assert "aten.linear.default" in {n.op for n in graph.nodes}
    graph, _ = capture(Fn(lambda a: torch.addcmul(a, a, a)), (torch.randn(3),))
    assert "aten.addcmul.default" not in {n.op for n in graph.nodes}
