"""Regression tests: each a reproducer of a wrong answer, a crash or an internal error that a user, the fuzzer
(tests/fuzz/) or the OpInfo sweep (tests/test_opinfo.py) found, through trnc.compile and torch.compile.

Values are compared with eager PyTorch in fp32 within 1e-5 of the output's largest magnitude (a few roundings
of fp32 in a different order), integer and bool results exactly; structure, shapes and dtypes always exactly.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trnc
from modules import Fn
from trnc.errors import TrncError, UnsupportedOpError

FP32_REL = 1e-5


def run(model: nn.Module, args: tuple, via: str):
    """The model's result through trnc.compile ("api"), the backend without fallback ("backend": every op on the
    device) or with it ("fallback")."""
    if via == "api":
        return trnc.compile(model, args, cache=False)(*args)
    torch._dynamo.reset()
    try:
        return torch.compile(model, backend="trnc", options={"fallback": via == "fallback"})(*args)
    finally:
        torch._dynamo.reset()


def assert_like_eager(out, ref) -> None:
    """The same pytree of tensors: structure, shapes and dtypes exactly; values within FP32_REL (floats) or equal."""
    out_leaves, out_spec = torch.utils._pytree.tree_flatten(out)
    ref_leaves, ref_spec = torch.utils._pytree.tree_flatten(ref)
    assert out_spec == ref_spec
    for o, r in zip(out_leaves, ref_leaves):
        assert (o.shape, o.dtype) == (r.shape, r.dtype)
        if not r.dtype.is_floating_point:
            assert torch.equal(o, r)
        elif r.numel():
            assert torch.equal(o.isnan(), r.isnan())
            o, r = o.nan_to_num(), r.nan_to_num()
            assert float((o - r).abs().max()) <= FP32_REL * float(r.abs().max())


VIA = pytest.mark.parametrize("via", ["api", "backend"])


class OutOfOrder(nn.Module):
    def forward(self, x):
        s = x.sum(0, keepdim=True)
        return 1 / (s.abs() + 1), s


@VIA
def test_outputs_come_back_in_the_order_the_model_returns_them(via):
    """Issue 11: outputs were returned in the order the graph computed them, not the order forward returned."""
    x = torch.randn(128)
    assert_like_eager(run(OutOfOrder(), (x,), via), OutOfOrder()(x))


class ChannelShuffle(nn.Module):
    """The shuffle unit of torchvision's ShuffleNetV2 between its (eager) convolutions: its region returns the two
    halves in the other order than it computes them, which swapped them (1.6e-4 relative on the whole model)."""

    def forward(self, a, b):
        x = torch.cat((F.relu(a), F.relu(b)), dim=1)
        n, c, h, w = x.shape
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        x1, x2 = x.chunk(2, dim=1)
        return x2 * 2, x1


@VIA
def test_a_channel_shuffle_returns_its_halves_in_order(via):
    args = (torch.randn(1, 24, 12, 12), torch.randn(1, 24, 12, 12))
    assert_like_eager(run(ChannelShuffle(), args, via), ChannelShuffle()(*args))


class StdMean(nn.Module):
    def forward(self, x):
        return torch.std_mean(x, dim=1)


@VIA
def test_std_mean_of_a_cube(via):
    """Issue 11: every element of std_mean(x, dim=1) of a [5, 5, 5] tensor was wrong through the backend."""
    x = torch.randn(5, 5, 5)
    assert_like_eager(run(StdMean(), (x,), via), StdMean()(x))


class Add(nn.Module):
    def forward(self, a, b):
        return a + b


class Dot(nn.Module):
    def forward(self, a, b):
        return torch.dot(a, b)


class MeanLoss(nn.Module):
    def forward(self, a, b):
        return F.mse_loss(a, b)


class SortThenSum(nn.Module):
    """No op of it on the device but the sum: the 0-d result crosses from a trnc region."""

    def forward(self, a):
        return torch.sort(a).values.cumsum(0)[-1]


@pytest.mark.parametrize("model, args, via", [
    (Add(), (torch.tensor(1.5), torch.tensor(-2.25)), "api"),
    (Add(), (torch.tensor(1.5), torch.tensor(-2.25)), "backend"),
    (Dot(), (torch.arange(5.0), torch.arange(5.0) - 2), "api"),
    (Dot(), (torch.arange(5.0), torch.arange(5.0) - 2), "backend"),
    (MeanLoss(), (torch.linspace(-1, 1, 12).reshape(4, 3), torch.linspace(0, 1, 12).reshape(4, 3)), "api"),
    (MeanLoss(), (torch.linspace(-1, 1, 12).reshape(4, 3), torch.linspace(0, 1, 12).reshape(4, 3)), "backend"),
    (SortThenSum(), (torch.linspace(3, -1, 7),), "fallback"),
], ids=["add-api", "add-backend", "dot-api", "dot-backend", "mse_loss-api", "mse_loss-backend",
        "sort_cumsum_select-fallback"])
def test_a_zero_dimensional_result_stays_zero_dimensional(model, args, via):
    """Issue 11: 0-d outputs came back with shape [1] (np.ascontiguousarray makes a 0-d array 1-d)."""
    out = run(model, args, via)
    assert out.shape == ()
    assert_like_eager(out, model(*args))


@pytest.mark.parametrize("loss", [F.binary_cross_entropy, F.soft_margin_loss, F.binary_cross_entropy_with_logits])
def test_zero_dimensional_losses(loss):
    """The OpInfo sweep: 0-d inputs of these losses failed through the backend even with fallback ('input 1 has
    shape [1]'; their log1p runs in eager)."""
    class Loss(nn.Module):
        def forward(self, a, b):
            return loss(a, b)
    args = (torch.tensor(0.375), torch.tensor(0.75))
    assert_like_eager(run(Loss(), args, "fallback"), Loss()(*args))


class SharedLayers(nn.Module):
    """ALBERT's pattern: one layer's weights (here Q, K and V of one input) used by every layer; each weight over
    1024 elements, so legalize keeps one transposed copy of it per layer (smaller ones it shares by value)."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        for _ in range(3):
            x = x + F.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x))
        return x


def test_layers_that_share_their_weights(tmp_path):
    """Issue 11: merge-matmuls built one merged weight per layer, all of one name, so the program could not be
    encoded ('declared twice': a compile-cache store or a save failed); now the layers share one merged weight."""
    model, x = SharedLayers().eval(), torch.randn(2, 16, 64)
    with torch.no_grad():
        ref = model(x)
        assert_like_eager(run(model, (x,), "backend"), ref)
        compiled = trnc.compile(model, (x,), cache=False)
    consts = [t.name for t in compiled.program.tensors if t.kind.name == "CONST"]
    assert len(consts) == len(set(consts)) == 2   # one merged weight and one merged bias for the three layers
    compiled.save(tmp_path / "shared.trnc")
    assert_like_eager(trnc.load(tmp_path / "shared.trnc")(x), ref)


@pytest.mark.slow
def test_hf_albert_with_shared_layers():
    transformers = pytest.importorskip("transformers")
    config = transformers.AlbertConfig(vocab_size=100, embedding_size=32, hidden_size=64, num_hidden_layers=3,
                                       num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    model = transformers.AlbertModel(config).eval()
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        ref = model(ids).last_hidden_state
        for via in ("api", "backend"):
            assert_like_eager(run(model, (ids,), via).last_hidden_state, ref)


class Take(nn.Module):
    def forward(self, x, i):
        return torch.take(x, i)


class Index(nn.Module):
    def forward(self, x, i, j):
        return x[i], x[:, j], x[i[:, None], j]


@VIA
def test_negative_indices_wrap_as_in_torch(via):
    """The OpInfo sweep: torch.take with a negative index faulted in the gather; torch wraps it, as x[i] does."""
    x = torch.randn(4, 5)
    take = (x, torch.tensor([-1, 0, 3, -20, 19]))
    assert_like_eager(run(Take(), take, via), Take()(*take))
    index = (x, torch.tensor([-1, 2, -4]), torch.tensor([4, -5, -1]))
    assert_like_eager(run(Index(), index, via), Index()(*index))


class IndexSelect(nn.Module):
    def forward(self, x, i):
        return x.index_select(1, i)


def test_a_negative_index_select_is_an_error_as_in_torch():
    x, i = torch.randn(4, 5), torch.tensor([-1, 2])
    with pytest.raises(RuntimeError, match="out of DATA bounds"):
        IndexSelect()(x, i)
    with pytest.raises(trnc.TrncError, match="gather index -1"):
        run(IndexSelect(), (x, i), "api")


class MultilabelMargin(nn.Module):
    def forward(self, a, t):
        return F.multilabel_margin_loss(a, t)


def test_an_op_torch_decomposes_wrongly_runs_in_eager():
    """The OpInfo sweep: torch's decomposition of multilabel_margin_loss counts the target slots after a -1
    (aot_autograd applies it through the Python dispatcher): the backend runs the graph in eager instead,
    and trnc.compile refuses the op rather than decompose it."""
    a = torch.tensor([[0.5, -1.0, 2.0, 0.25], [1.0, 0.0, -0.5, 0.75]])
    t = torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3]])
    assert_like_eager(run(MultilabelMargin(), (a, t), "fallback"), MultilabelMargin()(a, t))
    assert [f.op for f in trnc.backend.last_report().fallback] == ["aten.multilabel_margin_loss_forward"]
    for via in ("api", "backend"):
        with pytest.raises(UnsupportedOpError, match="multilabel_margin_loss_forward"):
            run(MultilabelMargin(), (a, t), via)


EDGES = {   # OpInfo samples that raised internal errors (ZeroDivisionError, IndexError) or were refused
    "addmm_of_an_empty_contraction": (lambda b, x, y: torch.addmm(b, x, y, alpha=0.6, beta=0.2),
                                      (torch.randn(5, 10), torch.randn(5, 0), torch.randn(0, 10))),
    "matmul_of_no_rows": (lambda x, y: x @ y, (torch.randn(0, 4), torch.randn(4, 5))),
    "sum_over_an_empty_axis": (lambda x: (x.sum(0), torch.linalg.vecdot(x[:, 0], x[:, 1])), (torch.randn(0, 4),)),
    "all_and_any_over_an_empty_axis": (lambda x: ((x > 0).all(0), (x > 0).any(0)), (torch.randn(0, 4),)),
    "an_empty_output_beside_a_full_one": (lambda x: (x[:, :0] * 2, x.sum()), (torch.randn(3, 4),)),
    "logsumexp_of_a_0d_tensor": (lambda x: torch.logsumexp(x, (0,), True), (torch.tensor(2.5),)),
    "index_select_of_a_0d_tensor": (lambda x, i: torch.index_select(x, 0, i), (torch.tensor(2.5), torch.tensor([0]))),
    "variance_of_one_value_is_nan": (lambda x: (x.var(), x.std(0)), (torch.randn(1),)),
    "mean_and_variance_of_no_values_are_nan": (lambda x: (torch.var_mean(x), torch.std_mean(x, dim=0)),
                                               (torch.randn(0, 5),)),
    "aminmax_of_a_0d_tensor": (lambda x: torch.aminmax(x, dim=0), (torch.tensor(2.5),)),
    "rms_norm_of_no_rows": (lambda x, w: F.rms_norm(x, (1,), w), (torch.randn(0, 1), torch.randn(1))),
    "bool_products_are_logical": (lambda x, y: (torch.isclose(x, y), torch.isfinite(x), (x > 0) * (y > 0),
                                                (x > 0) + (y > 0)), (torch.randn(20), torch.randn(20))),
}


@VIA
@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_cases_of_the_opinfo_samples(name, via):
    fn, args = EDGES[name]
    assert_like_eager(run(Fn(fn), args, via), fn(*args))


FUZZED = {   # minimal programs the fuzzer shrank its failures to
    # the softmax's output is written through the permuted view its reader wants, whose rows do not merge as
    # x's do: tile failed ('NoneType' object has no attribute 'box_ap')
    "softmax_over_dim_0_of_unit_dims": (lambda x: F.softmax(F.silu(x), dim=0), (torch.randn(1, 1, 2, 2),)),
    # issue 11's: a layer norm without affine, three reshapes, a binary op and a log_softmax, failed the same way
    "layer_norm_reshapes_binary_log_softmax": (
        lambda x, y: F.log_softmax(F.layer_norm(x, (4,)).reshape(2, 3, 4).reshape(6, 4).reshape(3, 2, 4)
                                   .transpose(0, 1) + y, dim=0), (torch.randn(6, 4), torch.randn(2, 3, 4))),
    # a bmm of an expanded tensor whose expand broadcasts a matrix dim too (a scalar of ones, and a row): the
    # broadcasting-matmul rule of seed 303000141 took it for a batch broadcast (seeds 202006341, 202007060)
    "matmul_of_ones_by_its_transpose": (lambda x: (x ** 0) @ (x ** 0).mT, (torch.randn(1, 1, 1, 1),)),
    "matmul_of_an_expanded_row": (lambda x: x.expand(3, -1, 5, -1) @ x.expand(3, -1, 5, -1).transpose(-1, -2),
                                  (torch.randn(2, 1, 129),)),
    # attention over 2048 keys in the standard plan (head dims not a multiple of 32, or 128) filled PSUM with
    # its score tiles: "PSUM is full" in allocate (seed 515001705; Llama's D = 128 at 2048 tokens too)
    "causal_attention_over_2048_keys_of_one_dim": (lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True),
                                                   (torch.randn(2048, 1, generator=torch.Generator().manual_seed(0)),)),
}


class BroadcastWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 1, 1), requires_grad=False)

    def forward(self, v):
        return v @ self.weight


@VIA
def test_a_batched_matmul_by_a_broadcast_weight(via):
    """The fuzzer: aot_autograd expands, clones and views the weight; legalize shared the clone's value with the
    expand's (equal bytes, zero strides), and torch could not view it (an internal error in legalize)."""
    model, v = BroadcastWeight(), torch.randn(2, 2, 1, 1)
    assert_like_eager(run(model, (v,), via), model(v))


@VIA
@pytest.mark.parametrize("name", sorted(FUZZED))
def test_programs_the_fuzzer_found(name, via):
    fn, args = FUZZED[name]
    assert_like_eager(run(Fn(fn), args, via), fn(*args))


class Float64Softmax(nn.Module):
    def forward(self, x):
        return torch.log_softmax(x, 1, dtype=torch.float64)


class Float64Table(nn.Module):
    """A float64 buffer that only constants read: legalize computes the table with torch, in float64."""

    def __init__(self):
        super().__init__()
        self.register_buffer("freq", torch.linspace(0.5, 2.0, 8, dtype=torch.float64))

    def forward(self, x):
        return x * (self.freq * 3).sin().float()


def test_float64_is_computed_in_float64_or_not_on_the_device():
    """The OpInfo sweep (all samples): a log_softmax with dtype=float64 came back with fp32's accuracy
    (float64 was computed in fp32). Values computed from inputs in float64 are refused now: an error naming
    the op, or with fallback the op runs in eager in float64; float64 constants still fold."""
    x = torch.randn(5, 10)
    with pytest.raises(UnsupportedOpError, match="float64"):
        run(Float64Softmax(), (x,), "api")
    with pytest.raises(UnsupportedOpError, match="float64"):
        run(Add(), (x.double(), x.double()), "api")
    out = run(Float64Softmax(), (x,), "fallback")
    assert out.dtype == torch.float64 and torch.equal(out, Float64Softmax()(x))
    y = torch.randn(3, 8)
    for via in ("api", "backend"):
        assert_like_eager(run(Float64Table(), (y,), via), Float64Table()(y))


class _LinearBesideAMatmul(nn.Module):
    """The fuzzer (seed 202000381, bf16): a linear with a bias and a matmul without one, both of x."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor):
        super().__init__()
        self.w1, self.w2, self.b2 = nn.Parameter(w1), nn.Parameter(w2), nn.Parameter(b2)

    def forward(self, x):
        return (x @ self.w1).sum(0), F.linear(x, self.w2, self.b2)   # a matmul that is an output would not merge


def test_a_bias_is_added_before_the_bf16_rounding_when_sibling_matmuls_merge():
    """merge-matmuls merged the two and left the bias an add after the merged matmul: at auto_cast="all" the dot
    product went to bf16 before its bias was added. The bias here cancels row 0's dot products to about 0.01, so
    that rounding (up to 2^-9 of a dot of about 4) was 10% of the result. Bound: with the operands in bf16 as
    auto_cast rounds them, the fp32 accumulation (49 terms: 49 * 2^-24 of the terms' magnitudes) and one final
    rounding to bf16 (2^-8 of the result)."""
    x, w1, w2 = torch.randn(69, 49), torch.randn(49, 61), torch.randn(512, 49)
    def b16(t):
        return t.to(torch.bfloat16).double()

    dots = b16(x)[0] @ b16(w2).T
    b2 = (-dots + 0.01 * torch.randn(512, dtype=torch.float64)).float()
    model = _LinearBesideAMatmul(w1, w2, b2)
    with torch.no_grad():
        _, got = trnc.compile(model, (x,), precision="bf16", auto_cast="all", cache=False)(x)
    want = b16(x) @ b16(w2).T + b16(b2)
    terms = b16(x).abs() @ b16(w2).abs().T + b16(b2).abs()
    bound = 2.0 ** -8 * want.abs() + 49 * 2.0 ** -24 * terms + 2.0 ** -126
    assert (got.double() - want).abs().le(bound).all()


class _Bmm(nn.Module):
    def forward(self, x, y):
        return torch.bmm(x, y)


@pytest.mark.parametrize("shapes", [((128, 2, 2), (128, 2, 2)), ((511, 1, 6), (511, 6, 7)), ((128, 1, 3), (128, 3, 5))],
                         ids=str)
def test_tiny_batched_matmuls_at_bf16_compute_what_tensore_does(shapes):
    """The fuzzer (seeds 202001784, 202004690, 202009892, 202009666, 202005522 at bf16): a batch of tiny matmuls,
    which legalize writes as outer products on the vector engines, rounded each product to bf16 at
    auto_cast="all" (fusion split the chain, and precision narrowed the partial sums stored between its kernels),
    and kept the model's fp32 inputs unrounded as operands. TensorE rounds the operands to bf16 and accumulates
    their products in fp32, exactly (a product of two bf16 values is exact in fp32), in order over k: so does
    this, bit for bit."""
    x, y = torch.randn(*shapes[0]), torch.randn(*shapes[1])
    with torch.no_grad():
        got = trnc.compile(_Bmm(), (x, y), precision="bf16", auto_cast="all", cache=False)(x, y)
    xb, yb = x.bfloat16().float(), y.bfloat16().float()
    want = xb[..., :, :1] * yb[..., :1, :]
    for k in range(1, x.shape[-1]):
        want = want + xb[..., :, k:k + 1] * yb[..., k:k + 1, :]
    assert got.dtype == torch.float32 and torch.equal(got, want)


class _LongLayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(15210))

    def forward(self, x):
        return F.layer_norm(x.flatten(), (15210,), self.weight, None, eps=1e-6).square()


def test_a_layer_norm_row_too_long_for_sbuf_is_refused_not_an_internal_error():
    """The fuzzer (seeds 202002394, 202005024 at bf16): the row check counted the weight's broadcast but not the
    one-row tile it is loaded into, and allocate failed ('SBUF is full') where the row was refused as too long."""
    x = torch.randn(30, 507)
    with pytest.raises(UnsupportedOpError, match="layer_norm over a last axis of 15210 elements"):
        trnc.compile(_LongLayerNorm(), (x,), precision="bf16", auto_cast="all", cache=False)


class BroadcastWeightBatches(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 128, 128) / 11, requires_grad=False)

    def forward(self, v):
        return self.weight @ v


def test_a_weight_broadcast_over_batches_is_not_copied():
    """The fuzzer (seed 303000141, fp32 via the backend: a hang): aot_autograd expands a weight of 5 x 511 x 512
    over 93 batches and flattens it for a bmm, which is no view; trnc copied the 486 MB to HBM and its schedule
    took minutes (here: a scratch tensor of 160 x 2 x 128 x 128, too big for fold to make a constant of). Now the
bmm is the broadcasting matmul of the weight: no scratch tensor."""
    from trnc.isa.program import TensorKind
    model, v = BroadcastWeightBatches(), torch.randn(160, 2, 128, 1)
    assert_like_eager(run(model, (v,), "backend"), model(v))
    (region,) = trnc.backend.last_report().regions
    assert not region.program.tensors_of(TensorKind.SCRATCH)


class TinyLinear(nn.Module):
    def __init__(self, weight, bias):
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight, requires_grad=False), nn.Parameter(bias, requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def test_a_tiny_bf16_linear_adds_its_bias_to_the_fp32_sum():
    """The fuzzer, bf16 (seed 222001033): a linear with K = 3 over 256 rows runs on the vector engines as outer
    products, which rounded x w to bf16 before adding the bias (as the matmul's output dtype), so where the bias
    cancels the products (to about 1e-3) the result lost all its digits. Now the bias joins the fp32 sum, as in
    TensorE's PSUM: trnc's error is within one bf16 rounding of the result plus fp32 accumulation."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1, 3, generator=g).to(torch.bfloat16)
    weight = torch.randn(8, 3, generator=g).to(torch.bfloat16)
    products = x.double().unsqueeze(-2) * weight.double()                    # [256, 1, 8, 3]
    bias = (-products[0, 0].sum(-1) + 1e-3).to(torch.bfloat16)               # cancels row 0's products
    exact = products.sum(-1) + bias.double()
    magnitude = products.abs().sum(-1) + bias.double().abs()
    with torch.no_grad():
        got = trnc.compile(TinyLinear(weight, bias), (x,), precision="bf16", auto_cast="all", cache=False)(x)
    allowed = 2.0 ** -8 * exact.abs() + 4 * 2.0 ** -24 * magnitude
    assert ((got.double() - exact).abs() <= allowed).all()


@pytest.mark.parametrize("causal", [False, True])
def test_attention_over_2048_keys_of_head_dim_128_compiles_within_the_fp32_bound(causal):
    """Llama's head dim at 2048 tokens filled PSUM in the standard plan ("PSUM is full" in allocate); it is lowered
    unfused now. Bound: a sum of Sk fp32 terms errs by at most Sk * 2^-24 * sum |terms| (here sum_j p_j |v_j| <=
    max |v|), against the float64 result."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 2048, 128, generator=g)
    model = Fn(lambda t: F.scaled_dot_product_attention(t, t, t, is_causal=causal))
    with torch.no_grad():
        got = trnc.compile(model, (x,), cache=False)(x).double()
    exact = F.scaled_dot_product_attention(x.double(), x.double(), x.double(), is_causal=causal)
    assert float((got - exact).abs().max()) <= 2048 * 2.0 ** -24 * float(x.abs().max())


def test_the_std_of_one_fp16_value_is_zero_under_bf16_auto_cast():
    """The fuzzer, bf16 (seed 2222003707): std over a dim of one fp16 value was the difference between the value
    and its mean rounded to bf16 (auto_cast "all" stored the decomposition's fp32 mean in bf16), so not 0, and a
    layer_norm of those near-zero rows made O(1) noise where eager gives its bias. The decomposition's
    intermediates stay fp32 now, so x - mean is exactly 0, as in eager, and the layer_norm gives its bias."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 9, generator=g).to(torch.float16)
    bias = torch.randn(9, generator=g).to(torch.float16)
    model = Fn(lambda t: F.layer_norm(t.std(1, correction=0), (9,), None, bias))
    with torch.no_grad():
        got = trnc.compile(model, (x,), precision="bf16", auto_cast="all", cache=False)(x)
        assert torch.equal(trnc.compile(Fn(lambda t: t.std(1, correction=0)), (x,), precision="bf16",
                                        auto_cast="all", cache=False)(x), torch.zeros(64, 9, dtype=torch.float16))
    assert torch.equal(got, bias.to(torch.bfloat16).to(torch.float16).expand(64, 9))   # auto_cast stores it in bf16


@pytest.mark.parametrize("batched", [False, True])   # addmm on TensorE; baddbmm of 128 tiny matrices as outer products
def test_a_bf16_addmm_with_beta_adds_its_scaled_bias_in_fp32(batched):
    """addmm and baddbmm with alpha 2 and beta 3, bf16 with auto_cast "all": beta * bias was stored in bf16, the
    TensorE product was rounded to bf16 before the (unfused) epilogue, and on the outer-product path precision
    rounded the operands of every keep_fp32 mul, the fp32 sum included. Where the bias cancels the products (to
    1e-3), the result was those roundings (1500 to 7000x the bound). Now: one bf16 rounding of the result plus
    fp32 accumulation, as eager."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*((128, 2) if batched else (256,)), 3, generator=g).to(torch.bfloat16)
    w = torch.randn(*((128,) if batched else ()), 3, 4, generator=g).to(torch.bfloat16)
    products = x.double().unsqueeze(-1) * w.double().unsqueeze(-3)             # [..., M, K, N]
    bias = (-2 * products.sum(-2) / 3 + 1e-3).to(torch.bfloat16)            # 3 * bias cancels 2 * the sums
    exact = 2 * products.sum(-2) + 3 * bias.double()
    magnitude = 2 * products.abs().sum(-2) + 3 * bias.double().abs()
    op = torch.baddbmm if batched else torch.addmm
    model = Fn(lambda a, b: op(b, a, w, beta=3, alpha=2))
    with torch.no_grad():
        got = trnc.compile(model, (x, bias), precision="bf16", auto_cast="all", cache=False)(x, bias)
    allowed = 2.0 ** -8 * exact.abs() + 8 * 2.0 ** -24 * magnitude
    assert ((got.double() - exact).abs() <= allowed).all()


class MixedOperands(nn.Module):
    """A bf16 tensor against a Python float, a 0-d fp32 tensor and a float64 number: torch converts each to bf16
    (the ops' common dtype) before comparing or computing."""

    def forward(self, x, y):
        return x > 0.1, torch.ge(x, y), x <= y, torch.maximum(x, y), x + y, torch.add(x, y, alpha=3), x == 0.2


@pytest.mark.parametrize("via", ["api", "backend"])
def test_operands_are_rounded_to_the_common_dtype_before_a_comparison(via):
    """Fuzzer seed 7777000880: torch.ge of a bf16 [1, 2, 125] tensor and a 0-d fp32 one differed at one element;
    trnc compared against the unrounded fp32 value. 0.10009765625 is bf16(0.1) and bf16(y)."""
    x = torch.tensor([0.10009765625, 0.1, 0.2, 256, -3.5], dtype=torch.bfloat16)
    y = torch.tensor(0.10009, dtype=torch.float32)
    for got, ref in zip(run(MixedOperands(), (x, y), via), MixedOperands()(x, y)):
        assert got.dtype == ref.dtype and torch.equal(got, ref)


class ArgmaxAndEqual(nn.Module):
    def forward(self, x):
        return x.argmax(1), x == 16777215


def test_integer_inputs_at_or_above_2_24_are_refused_at_the_call():
    """The engines compare integers in fp32: 16777217 and 16777216 both read as 2^24, so argmax would pick the
    wrong index and == would hold. Below 2^24 every integer is exact and the answers are torch's."""
    small = torch.tensor([[3, 16777215, 16777214, 16777215], [-16777215, 0, 5, 5]])
    compiled = trnc.compile(ArgmaxAndEqual(), (small,), cache=False)
    assert_like_eager(compiled(small), ArgmaxAndEqual()(small))
    for big in (torch.tensor([[3, 16777217, 16777216, 1], [0, 0, 0, 0]]), torch.full((2, 4), -2 ** 40)):
        with pytest.raises(TrncError, match="input 0 holds integers of magnitude 2\\^24 or more"):
            compiled(big)


def test_the_fp8_scale_of_a_one_element_activation_is_from_its_magnitude():
    """A reduction over size-1 axes only is a copy, which dropped the amax's |x| (found by the issue 16 work): the
    dynamic fp8 scale of [[-3.0]] came out negative and the linear layer's output wrong in sign and size."""
    torch.manual_seed(0)
    model, x = nn.Linear(1, 4), torch.tensor([[-3.0]])
    got = trnc.compile(model, (x,), precision="fp8", cache=False)(x)
    with torch.no_grad():
        ref = model(x)
    # fp8 e4m3 operands: each within 2^-4 relative of its value, the product of two within about 2^-3
    assert ((got - ref).abs() <= 2.0 ** -3 * ref.abs() + 1e-6).all()


class Bf16Widened(nn.Module):
    """Three bf16 values a `.float()` reads where they were computed: a reduction's epilogue, an elementwise chain
    and a matmul's result; and bf16 tensors times and over a number."""

    def forward(self, w, a, b):
        return (torch.linalg.vector_norm(w, dim=1).float(), ((a * 1.7).float() + 1.0).exp(),
                (a @ b).float(), a * 1.7, a / 0.3)


@VIA
def test_a_bf16_value_widened_by_a_cast_is_rounded_first(via):
    """A helper compiling vector_norm(w_bf16, dim=1).float(): the engines computed the norm in fp32 and the cast
    to fp32 read that, so the result was the unrounded norm, up to half a bf16 ulp (0.06 at 17) off eager, which
    rounds every op's result to its dtype. A cast now reads its input as stored in its dtype, so the results
    equal eager's to fp32 rounding. Found with it: legalize rounded the number of `a * 1.7` to bf16 (1.703125),
    where torch's CPU kernels of mul and div multiply a bf16 or fp16 tensor by the number in fp32 (a third of the
    products were a bf16 ulp off)."""
    torch.manual_seed(0)
    w, a, b = (torch.randn(8, 300).bfloat16(), torch.randn(64, 96).bfloat16(), torch.randn(96, 48).bfloat16())
    model = Bf16Widened()
    assert_like_eager(run(model, (w, a, b), via), model(w, a, b))
