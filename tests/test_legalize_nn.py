"""The vision layers of passes/graph/legalize_nn.py compiled end to end (trnc.compile, the JIT) against torch:
activations against the same function in float64, paddings bit for bit against eager, group, instance and
training-mode batch norm against eager; bf16 within bounds derived below; the errors that name the op.

Activation tolerance (fp32): |got - exact| <= 2^-20 |exact| + 1e-36, with `exact` the function in float64.
The formulas of legalize_nn.py are within 4.4 ulp of float64 (measured there over dense sweeps); an ulp is at
most 2^-23 of the value, so 8 ulp is 2^-20. The absolute 1e-36 admits the flushed results of mish below
that magnitude (2.6e-37 at most), and nothing else: every other result is held to its relative error.
"""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trnc
from trnc.capture import capture
from trnc.errors import UnsupportedOpError
from trnc.passes.graph.legalize import Legalize

ACT_RTOL, ACT_ATOL = 2.0 ** -20, 1e-36
# Norms: the fp32 statistics of a row of D values (D <= 9 * 129 here) are sums whose rounding errors, in
# any order (eager's and the kernel's differ), stay near sqrt(D) 2^-24 <= 2e-6 of the terms' magnitude, and
# every output shares them in proportion to max|y|: 1e-5 of max|y| is five times that.
NORM_RTOL = 1e-5


class Fn(nn.Module):
    """A module around a function. Defined here, not shared: torch.export records only module forwards in a node's
    stack trace, so the line an error names is this forward's, which the tests check is in this file."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def compiled(model, *xs, **options):
    return trnc.compile(model.eval(), xs, cache=False, **options)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches and shape guesses reset before and after (a later test's shapes must not look
    dynamic to dynamo because this one compiled the same module code at other shapes)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def within(got: torch.Tensor, ref: torch.Tensor, rtol: float) -> bool:
    """max|got - ref| <= rtol max|ref| (the max norm: a norm's errors scale with its largest output)."""
    return float((got - ref).detach().abs().max()) <= rtol * float(ref.detach().abs().max())


def wide_values(*shape) -> torch.Tensor:
    """Magnitudes from 1e-30 to 100 of both signs, zeros and ordinary normals: every range the formulas split."""
    n = math.prod(shape)
    magnitude = torch.exp(torch.empty(n).uniform_(-69, 4.6)) * torch.where(torch.rand(n) < 0.5, -1.0, 1.0)
    values = torch.where(torch.rand(n) < 0.5, magnitude, 3 * torch.randn(n))
    values[torch.rand(n) < 0.02] = 0.0
    return values.reshape(shape)


ACTIVATIONS = {
    "elu": F.elu,
    "elu_alpha_0.5": lambda x: F.elu(x, 0.5),
    "elu_alpha_2": lambda x: F.elu(x, 2.0),   # alpha * input_scale > 1: the select form
    "elu_negative_input_scale": lambda x: torch.ops.aten.elu(x, 1.0, 1.5, -0.5),   # expm1 of positive values
    "selu": F.selu,
    "celu": F.celu,
    "celu_0.3": lambda x: F.celu(x, 0.3),
    # a negative alpha takes expm1 of positive values, where its condition number is the argument (up to 46
    # here): 1 / alpha must be exact in fp32 there, or its rounding (as torch's fp32 kernel's) shows
    "celu_negative": lambda x: F.celu(x, -2.0),
    "leaky_relu": F.leaky_relu,
    "leaky_relu_2": lambda x: F.leaky_relu(x, 2.0),
    "leaky_relu_negative": lambda x: F.leaky_relu(x, -0.5),
    "softplus": F.softplus,
    "softplus_beta_2_threshold_5": lambda x: F.softplus(x, 2.0, 5.0),
    "softplus_beta_0.5_threshold_30": lambda x: F.softplus(x, 0.5, 30.0),
    "mish": F.mish,
    "logsigmoid": F.logsigmoid,
    "expm1": torch.expm1,
    "log1p": lambda x: torch.log1p(torch.where(x > -1, x, x.abs())),   # exact in fp32 and float64 alike
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "relu6": F.relu6,
}


def _all_activations(x):
    return tuple(f(x) for f in ACTIVATIONS.values())


@pytest.mark.parametrize("shape", [(127,), (3, 128), (1, 129, 2)])
def test_activations_match_float64(shape):
    torch.manual_seed(1401)
    x = wide_values(*shape)
    model = Fn(_all_activations)
    got = compiled(model, x)(x)
    exact = model(x.double())
    for name, g, e in zip(ACTIVATIONS, got, exact):
        assert g.dtype == torch.float32 and g.shape == e.shape, name
        bound = ACT_RTOL * e.abs() + ACT_ATOL
        bad = (g.double() - e).abs() > bound
        assert not bad.any(), f"{name}: x={x[bad][:4].tolist()} got {g[bad][:4].tolist()} exact {e[bad][:4].tolist()}"


def test_activations_at_special_values_match_eager():
    """Infinities, NaN, signed zeros, subnormals and the ends of exp's range give what eager gives (but softplus
    with a threshold above 88.7, where eager's e^x overflows to inf: not taken here)."""
    torch.manual_seed(1402)
    big = torch.finfo(torch.float32).max
    x = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 88.0, 89.0, -88.0,
                      -104.0, big, -big, 20.0, 20.5, -20.0])
    model = Fn(_all_activations)
    for name, g, r in zip(ACTIVATIONS, compiled(model, x)(x), model(x)):
        torch.testing.assert_close(g, r, rtol=ACT_RTOL, atol=ACT_ATOL, equal_nan=True, msg=lambda m: f"{name}: {m}")


def test_activations_in_bf16_stay_within_the_rounding_bound():
    """bf16 with auto_cast="all": the input and the result are rounded to bf16 (2^-9 relative each), and so is
    any intermediate that crosses kernels; elu, mish and softplus magnify an input error by at most 1.2 times
    (x f'(x) / f(x) < 1.2 away from mish's and softplus's small values), so 4 roundings' worth, 2^-7, bounds it."""
    torch.manual_seed(1403)
    x = 4 * torch.randn(3, 129)
    model = Fn(lambda x: (F.elu(x), F.mish(x), F.softplus(x), F.selu(x)))
    got = compiled(model, x, precision="bf16", auto_cast="all")(x)
    for g, e in zip(got, model(x.double())):
        assert bool(((g.double() - e).abs() <= 2 ** -7 * e.abs() + 1e-30).all())


PADS = {
    "constant": lambda x: F.pad(x, (1, 2, 3, 0), value=0.5),
    "constant_negative": lambda x: F.pad(x, (-1, 2, 0, -2), value=-3.0),
    "constant_3d": lambda x: F.pad(x, (0, 1, 1, 0, 2, 1)),
    "reflect": lambda x: F.pad(x[0], (2, 1), mode="reflect"),
    "reflect_3d": lambda x: F.pad(x, (1, 0, 1, 1, 1, 0), mode="reflect"),
    "reflect_2d": lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
    "reflect_negative": lambda x: torch.ops.aten.reflection_pad2d(x, [-2, 2, 1, -1]),
    "replicate": lambda x: F.pad(x[0], (3, 0), mode="replicate"),
    "replicate_3d": lambda x: F.pad(x, (2, 1, 0, 3, 1, 1), mode="replicate"),
    "replicate_2d": lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate"),
    "replicate_negative": lambda x: torch.ops.aten.replication_pad2d(x, [2, -3, -1, 2]),
    "circular": lambda x: F.pad(x, (1, 2, 2, 1), mode="circular"),
}


@pytest.mark.parametrize("shape", [(1, 3, 4, 127), (2, 2, 3, 129)])
def test_paddings_match_eager_exactly(shape):
    torch.manual_seed(1404)
    x = torch.randn(*shape)
    model = Fn(lambda x: tuple(f(x) for f in PADS.values()))
    for name, g, r in zip(PADS, compiled(model, x)(x), model(x)):
        assert torch.equal(g, r), name


def test_padding_keeps_dtypes_and_is_movement_only():
    """An int32 tensor is padded by its own dtype's fill (a float value truncates as torch fills it), and the
    pads lower to slices, expands and cats: no gather of computed indices (torch's decomposition)."""
    torch.manual_seed(1405)
    x = torch.randint(-50, 50, (2, 3, 128), dtype=torch.int32)
    model = Fn(lambda x: (F.pad(x, (1, 1), value=2.7), F.pad(x.float(), (2, 3), mode="reflect")))
    for g, r in zip(compiled(model, x)(x), model(x)):
        assert g.dtype == r.dtype and torch.equal(g, r)
    graph, _ = capture(model, (x,))
    Legalize().run(SimpleNamespace(graph=graph))
    assert {n.op for n in graph.nodes} <= {"input", "const", "cast", "slice", "expand", "cat"}


@pytest.mark.parametrize("shape, groups", [((2, 6, 127), 3), ((1, 4, 3, 43), 1), ((3, 8, 2, 2), 8)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_eager(shape, groups, affine):
    torch.manual_seed(1406)
    model = nn.GroupNorm(groups, shape[1], affine=affine)
    if affine:
        nn.init.normal_(model.weight)
        nn.init.normal_(model.bias)
    x = 2 + 3 * torch.randn(*shape)
    got, ref = compiled(model, x)(x), model(x)
    assert within(got, ref, NORM_RTOL)


def test_native_group_norm_statistics_match_eager():
    torch.manual_seed(1407)
    x, weight, bias = torch.randn(2, 6, 5, 5), torch.randn(6), torch.randn(6)
    model = Fn(lambda x: torch.ops.aten.native_group_norm(x, weight, bias, 2, 6, 25, 3, 1e-5))
    for g, r in zip(compiled(model, x)(x), model(x)):
        assert g.shape == r.shape and within(g, r, NORM_RTOL)


@pytest.mark.parametrize("affine", [True, False])
def test_instance_norm_matches_eager(affine):
    torch.manual_seed(1408)
    model = nn.InstanceNorm2d(3, affine=affine)
    if affine:
        nn.init.normal_(model.weight)
        nn.init.normal_(model.bias)
    x = torch.randn(2, 3, 9, 129)
    got, ref = compiled(model, x)(x), model(x)
    assert within(got, ref, NORM_RTOL)


def test_group_norm_in_bf16_stays_within_the_rounding_bound():
    """bf16 with auto_cast="all": x rounded to bf16 moves each normalized value by 2^-9 |x| / sigma at most (and
    the statistics by as much), the normalized rows and the affine result round once each (2^-9 of |y|), so
    2^-9 (2 max|x| / sigma |w| + 2 |y|) bounds the error; 2^-7 max(|x|/sigma |w|, |y|) covers it."""
    torch.manual_seed(1409)
    model = nn.GroupNorm(2, 4)
    nn.init.normal_(model.weight)
    nn.init.normal_(model.bias)
    x = torch.randn(2, 4, 128)
    got = compiled(model, x, precision="bf16", auto_cast="all")(x)
    ref = model(x)
    scale = float((x.abs().max() / x.reshape(2, 2, -1).std(-1).min()) * model.weight.detach().abs().max())
    assert float((got - ref).detach().abs().max()) <= 2 ** -7 * max(scale, float(ref.detach().abs().max()))


class TrainingBatchNorm(nn.Module):
    """BatchNorm2d in training mode without its batch counter (an int64 add, which the engines refuse)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(channels)), nn.Parameter(torch.randn(channels))
        self.register_buffer("running_mean", torch.randn(channels))
        self.register_buffer("running_var", torch.rand(channels) + 0.5)

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, True, 0.3, 1e-5)


def test_training_batch_norm_through_torch_compile_updates_the_running_statistics(fresh_dynamo):
    """Training mode is what torch.compile hands the backend for batch norm in training and for instance norm with
    running statistics: the output and the buffers it writes (moved by momentum toward the batch's mean and
    unbiased variance) match eager's, twice in a row."""
    torch.manual_seed(1410)
    x = torch.randn(4, 3, 5, 7)
    for make in (lambda: TrainingBatchNorm(3), lambda: nn.InstanceNorm2d(3, affine=True, track_running_stats=True)):
        eager = make().train()
        device = make().train()
        device.load_state_dict(eager.state_dict())
        torch._dynamo.reset()
        run = torch.compile(device, backend="trnc", options={"fallback": False})
        for _ in range(2):
            got, ref = run(x), eager(x)
            assert within(got, ref, NORM_RTOL)
        for name in ("running_mean", "running_var"):
            assert torch.allclose(getattr(device, name), getattr(eager, name), rtol=1e-5, atol=1e-7), name


def test_a_vision_block_through_torch_compile(fresh_dynamo):
    torch.manual_seed(1411)
    block = nn.Sequential(nn.ReflectionPad2d(1), nn.GroupNorm(2, 4), nn.Mish(), nn.ReplicationPad2d((0, 1, 1, 0)),
                          nn.InstanceNorm2d(4), nn.ELU(), nn.ZeroPad2d(2), nn.LeakyReLU(0.2)).eval()
    x = torch.randn(2, 4, 6, 7)
    got = torch.compile(block, backend="trnc", options={"fallback": False})(x)
    ref = block(x)
    assert within(got, ref, NORM_RTOL)


def test_unsupported_configurations_name_the_op_and_the_line():
    torch.manual_seed(1412)
    x = torch.randn(8, 3)
    with pytest.raises(UnsupportedOpError, match=r"aten\.leaky_relu\.default with negative_slope=inf"):
        compiled(Fn(lambda x: F.leaky_relu(x, math.inf)), x)
    with pytest.raises(UnsupportedOpError, match=r"aten\.copy\.default from torch\.float32 to torch\.int64"):
        compiled(Fn(lambda x: torch.ops.aten.copy(torch.zeros(8, 3, dtype=torch.int64), x)), x)
