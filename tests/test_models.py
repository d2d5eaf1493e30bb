"""End to end: real models compiled by trnc.compile against torch eager, and the JIT against the reference.

Tolerances. fp32: max|diff| / max|ref| <= 1e-5 (fp32 everywhere; activation functions are a few ulp
and matmuls accumulate in a fixed k order, both far inside it). bf16 with auto_cast="all": every
kernel rounds its stored result to bf16 once (relative error <= u = 2^-8, bf16's unit roundoff), and
errors along a chain of kernels add, so the bound is u times the number of kernels on the longest
path of the compiled graph (counted per model below); matmul accumulation stays fp32.
"""
import networkx as nx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trnc.api as trnc_api
from golden import MLP   # the golden MLP program's model

U_BF16 = 2.0 ** -8


def _rel(got, ref) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).abs().max() / ref.abs().max())


def _first(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "last_hidden_state"):
        return out["last_hidden_state"]
    return out[0]


def _kernel_depth(compiled_graph) -> int:
    """Kernels on the longest input-to-output path of the fused graph."""
    kernel_of = {n: i for i, k in enumerate(compiled_graph.kernels) for n in k.nodes}
    g = nx.DiGraph()
    g.add_nodes_from(range(len(compiled_graph.kernels)))
    for i, k in enumerate(compiled_graph.kernels):
        for n in k.inputs:
            if n in kernel_of:
                g.add_edge(kernel_of[n], i)
    return nx.dag_longest_path_length(g) + 1


def _check_bit_exact(compiled, args):
    jit, ref = compiled(*args), compiled.run_reference(*args)
    for a, b in zip(torch.utils._pytree.tree_leaves(jit), torch.utils._pytree.tree_leaves(ref)):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b) or \
            torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)])


def _compare(model, args, *, bit_exact=True, **options):
    model.eval()
    with torch.no_grad():
        ref = model(*args)
        compiled = trnc_api.compile(model, args, **options)
        got = compiled(*args)
    rel = _rel(_first(got), _first(ref))
    assert type(got) is type(ref) or isinstance(ref, dict)
    if bit_exact:
        _check_bit_exact(compiled, args)
    return rel, compiled


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block written by hand: sdpa with an additive mask, GELU MLP."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def test_mlp_fp32():
    torch.manual_seed(0)
    rel, compiled = _compare(MLP(), (torch.randn(40, 48),))
    assert rel <= 1e-5
    assert compiled.stats["instructions"] > 0 and 0 < compiled.stats["efficiency"] <= 1


class TanhGeluMLP(nn.Module):
    """GPT-2's MLP as it writes its GELU: the c_fc result h read four times, through the view of a 3-d linear."""

    def __init__(self):
        super().__init__()
        self.fc, self.proj = nn.Linear(48, 96), nn.Linear(96, 48)

    def forward(self, x):
        h = self.fc(x)
        return self.proj(0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0)))))


def test_a_gelu_that_reads_the_matmul_result_four_times_is_its_epilogue():
    """Two kernels, the two matmuls: the GELU is evaluated on c_fc's PSUM tiles (it was a kernel of its own that
    read the result back from HBM through a view), with eager's answer and the reference's bits."""
    torch.manual_seed(0)
    rel, compiled = _compare(TanhGeluMLP(), (torch.randn(2, 40, 48),))
    assert rel <= 1e-5
    assert compiled.stats["kernels"] == 2


def test_encoder_block_fp32_and_bf16():
    torch.manual_seed(1)
    x, mask = torch.randn(2, 24, 64), torch.randn(2, 1, 24, 24)
    rel, _ = _compare(EncoderBlock(), (x, mask))
    assert rel <= 1e-5
    rel, compiled = _compare(EncoderBlock(), (x, mask), precision="bf16", auto_cast="all", bit_exact=False)
    assert rel <= _depth_bound(EncoderBlock(), (x, mask))


def _depth_bound(model, args) -> float:
    from trnc.capture import capture
    from trnc.isa.config import get_target
    from trnc.passes.graph.fold import FoldConstants
    from trnc.passes.graph.fuse import Fuse
    from trnc.passes.graph.legalize import Legalize
    from trnc.options import Options
    from trnc.passes.pipeline import CompileState
    graph, _ = capture(model.eval(), args)
    state = CompileState(graph, Options("bf16", "all"), get_target("trn2"))
    for p in (Legalize(), FoldConstants(), Fuse()):
        p.run(state)
    return _kernel_depth(state.graph) * U_BF16


def _hf(kind):
    import transformers as tf
    torch.manual_seed(0)
    if kind == "bert":
        cfg = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            vocab_size=120, max_position_embeddings=64, attn_implementation="sdpa")
        model = tf.BertModel(cfg)
    elif kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=120, n_positions=64, use_cache=False,
                            attn_implementation="sdpa")
        model = tf.GPT2Model(cfg)
    elif kind == "mixtral":   # experts through transformers' grouped matmul: sort, histc, cumsum, index_put
        cfg = tf.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=120,
                               max_position_embeddings=64, use_cache=False, attn_implementation="sdpa")
        model = tf.MixtralModel(cfg)
    else:
        cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=120, max_position_embeddings=64, use_cache=False,
                             attn_implementation="sdpa")
        model = tf.LlamaModel(cfg)
    _randomize_norms(model)
    ids = torch.randint(0, 120, (2, 16))
    return model.eval(), (ids,)


def _randomize_norms(model: nn.Module) -> None:
    """Norm layers start as weight 1 and bias 0, which would hide a kernel that drops them."""
    with torch.no_grad():
        for module in model.modules():
            if "Norm" in type(module).__name__:
                if getattr(module, "weight", None) is not None:
                    module.weight.normal_(1.0, 0.3)
                if getattr(module, "bias", None) is not None:
                    module.bias.normal_(0.0, 0.3)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama", "mixtral"])
def test_hugging_face_fp32(kind):
    model, args = _hf(kind)
    rel, compiled = _compare(model, args)
    assert rel <= 1e-5, f"{kind}: relative error {rel:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_hugging_face_bf16_all(kind):
    model, args = _hf(kind)
    rel, _ = _compare(model, args, precision="bf16", auto_cast="all", bit_exact=False)
    bound = _depth_bound(model, args)
    assert rel <= bound, f"{kind}: relative error {rel:.3g} above {bound:.3g}"


def test_unsupported_op_names_op_and_line():
    from trnc.errors import UnsupportedOpError

    class Nextafters(nn.Module):
        def forward(self, x):
            return torch.nextafter(x, x) * 2

    with pytest.raises(UnsupportedOpError, match=r"nextafter.*test_models\.py:\d+"):
        trnc_api.compile(Nextafters(), (torch.randn(4, 8),))


def test_static_shapes_are_checked():
    compiled = trnc_api.compile(MLP().eval(), (torch.randn(8, 48),))
    with pytest.raises(Exception, match="compiled for"):
        compiled(torch.randn(9, 48))
    assert np.isfinite(compiled(torch.randn(8, 48)).numpy()).all()


@pytest.mark.slow
def test_bert_with_values_kept_on_chip_between_kernels():
    """A BERT whose shapes fill 128-row tiles (seq 128, hidden 128), so values stay in SBUF between
    kernels: each out-projection and FFN2 sum for its layer norm (plan.py hands_rows_on_chip), each FFN1
    output for FFN2, and each layer norm's transposed result for the matmul after it (the embeddings' and
    LN2 for the next QKV, LN1 for FFN1; hands_transpose_on_chip). fp32 within 1e-5
    and bit-exact against the reference; bf16 auto_cast="all" within the kernel-depth bound."""
    import transformers as tf
    from trnc.capture import capture
    from trnc.isa.config import get_target
    from trnc.options import Options
    from trnc.passes.pipeline import CompileState, run_pipeline
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                        vocab_size=120, max_position_embeddings=128, attn_implementation="sdpa")
    model, args = tf.BertModel(cfg).eval(), (torch.randint(0, 120, (1, 128)),)
    _randomize_norms(model)
    state = CompileState(capture(model, args)[0], Options("bf16", "all"), get_target("trn2"))
    run_pipeline(state)
    assert state.stats["tile"]["kept_on_chip"] == 3 * 2 and state.stats["tile"]["transposed_on_chip"] == 2 * 2
    rel, _ = _compare(model, args)
    assert rel <= 1e-5
    rel, _ = _compare(model, args, precision="bf16", auto_cast="all", bit_exact=False)
    assert rel <= _depth_bound(model, args)


@pytest.mark.slow
def test_gpt2_with_values_kept_on_chip_past_its_views():
    """A pre-norm GPT-2 whose shapes fill 128-row tiles (seq 128, hidden 128). Its Conv1D linears view their
    input as [tokens, features] and their result back to [1, tokens, features], so each hand-over goes past a
    view (ir.hand_over_reader): each layer norm leaves only its transpose for the matmul after it (its one
    reader: nothing stored), each FFN1 result stays for FFN2, and the last FFN2 sum goes to ln_f as rows. fp32
    within 1e-5 and bit-exact against the reference; bf16 auto_cast="all" within the kernel-depth bound."""
    import transformers as tf
    from trnc.capture import capture
    from trnc.isa.config import get_target
    from trnc.options import Options
    from trnc.passes.pipeline import CompileState, run_pipeline
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_embd=128, n_layer=2, n_head=2, n_inner=256, vocab_size=120, n_positions=128,
                        use_cache=False, attn_implementation="sdpa")
    model, args = tf.GPT2Model(cfg).eval(), (torch.randint(0, 120, (1, 128)),)
    _randomize_norms(model)
    state = CompileState(capture(model, args)[0], Options("fp32"), get_target("trn2"))
    run_pipeline(state)
    plans = state.stats["plan"]
    assert plans["transposed_on_chip"] == 2 * 2 and plans["features_on_chip"] == 2 and plans["rows_on_chip"] == 1
    norms = [k for k in state.graph.kernels if k.kind == "layer_norm"]
    assert [k.plan.keep for k in norms] == [True, True] * 2 + [False]   # ln_1 and ln_2 store nothing; ln_f does
    rel, _ = _compare(model, args)
    assert rel <= 1e-5
    rel, _ = _compare(model, args, precision="bf16", auto_cast="all", bit_exact=False)
    assert rel <= _depth_bound(model, args)
