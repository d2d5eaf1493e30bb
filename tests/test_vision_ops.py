"""Convolution, pooling and batch norm through trnc.compile against eager PyTorch, over a grid of shapes, strides,
paddings, dilations and groups.

fp32: within 1e-5 of eager relative to the output's largest magnitude. trnc and eager both sum each output in
fp32 from exact or once-rounded products, in different orders: over K = C_in/groups x KH x KW terms the two
differ by at most about 2 K 2^-24 sum |x w| (Higham 4.2), under 1e-5 of the output scale for these sizes. A 3-d
convolution is one 2-d convolution whose channels are the depth taps' planes: K = C_in/groups x KD x KH x KW
terms summed in PSUM, the same bound (K at most 216 here). A 3-d average pool is two sums of fp32 values (over
H x W, then over the depth window), a different order from eager's over at most 60 terms, far within it.
bf16 (auto_cast="matmult": the convolution's operands in bf16, its sums and the result in fp32): each product's
operands carry a relative error of at most 2^-8 each, so every output is within 2^-7 x conv(|x|, |w|) plus the
fp32 sum's own bound of eager's fp32 result; the test checks that bound element by element.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trnc
from trnc.errors import UnsupportedOpError

FP32_RTOL = 1e-5


def compiled_matches(model: nn.Module, x: torch.Tensor, **options) -> torch.Tensor:
    model = model.eval()
    with torch.no_grad():
        expected = model(x)
        got = trnc.compile(model, (x,), **options)(x)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    scale = expected.abs().max().clamp_min(1e-30)
    assert ((got - expected).abs().max() / scale).item() <= FP32_RTOL
    return got


CONVS = {
    "conv2d 3x3 pad 1": (lambda: nn.Conv2d(8, 16, 3, padding=1), (2, 8, 13, 11)),
    "conv2d 7x7 stride 2 (stem)": (lambda: nn.Conv2d(3, 32, 7, stride=2, padding=3), (1, 3, 40, 40)),
    "conv2d stride 2 no bias": (lambda: nn.Conv2d(16, 24, 3, stride=2, bias=False), (1, 16, 15, 16)),
    "conv2d dilation 2": (lambda: nn.Conv2d(6, 10, 3, dilation=2, padding=2), (1, 6, 12, 12)),
    "conv2d same, odd kernel": (lambda: nn.Conv2d(5, 7, (3, 5), padding="same"), (1, 5, 9, 10)),
    "conv2d valid, rectangular": (lambda: nn.Conv2d(4, 9, (2, 3), stride=(1, 2), padding="valid"), (1, 4, 8, 9)),
    "conv2d groups 4": (lambda: nn.Conv2d(16, 32, 3, padding=1, groups=4), (1, 16, 8, 8)),
    "conv2d depthwise": (lambda: nn.Conv2d(32, 32, 5, padding=2, groups=32), (2, 32, 10, 10)),
    "conv2d depthwise x2 multiplier": (lambda: nn.Conv2d(8, 16, 3, padding=1, groups=8), (1, 8, 7, 7)),
    "conv2d 129 -> 130 channels": (lambda: nn.Conv2d(129, 130, 3, padding=1), (1, 129, 6, 6)),
    "conv2d 1x1": (lambda: nn.Conv2d(64, 128, 1), (1, 64, 7, 7)),
    "conv2d wide rows": (lambda: nn.Conv2d(2, 4, 3, padding=1), (1, 2, 3, 700)),
    "conv1d": (lambda: nn.Conv1d(6, 8, 5, stride=2, padding=2), (2, 6, 33)),
    "conv1d dilated, grouped": (lambda: nn.Conv1d(8, 8, 3, dilation=3, groups=2), (1, 8, 20)),
    "conv_transpose2d stride 2": (lambda: nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1),
                                  (1, 8, 7, 6)),
    "conv_transpose2d groups, dilation": (lambda: nn.ConvTranspose2d(8, 4, 3, stride=2, groups=2, dilation=2),
                                          (1, 8, 5, 5)),
    "conv_transpose2d padding beyond the kernel": (lambda: nn.ConvTranspose2d(4, 4, 2, stride=2, padding=2),
                                                   (1, 4, 6, 6)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(6, 3, 4, stride=3, padding=1), (2, 6, 9)),
    "conv3d 3x3x3 pad 1": (lambda: nn.Conv3d(4, 6, 3, padding=1), (2, 4, 5, 6, 7)),
    "conv3d stride, dilation, no bias": (lambda: nn.Conv3d(3, 5, (3, 2, 3), stride=(2, 1, 2), dilation=(2, 1, 1),
                                                           padding=(2, 0, 1), bias=False), (1, 3, 9, 6, 8)),
    "conv3d groups, depth padding beyond the input": (lambda: nn.Conv3d(8, 4, (5, 3, 3), padding=(3, 1, 0),
                                                                        groups=2), (1, 8, 2, 5, 5)),
    "conv3d depthwise": (lambda: nn.Conv3d(6, 6, 3, padding=1, groups=6), (1, 6, 4, 4, 4)),
    "conv3d 1x1x1": (lambda: nn.Conv3d(16, 8, 1), (2, 16, 3, 4, 5)),
    "conv3d same, depth kernel 1": (lambda: nn.Conv3d(4, 4, (1, 3, 4), padding="same"), (1, 4, 3, 7, 6)),
    "conv_transpose3d stride 2": (lambda: nn.ConvTranspose3d(4, 3, 3, stride=2, padding=1, output_padding=1),
                                  (1, 4, 3, 4, 5)),
    "conv_transpose3d groups, dilation, padding beyond the kernel": (
        lambda: nn.ConvTranspose3d(4, 6, (2, 3, 2), stride=(3, 2, 1), padding=(3, 1, 2), dilation=(2, 1, 2),
                                   output_padding=(1, 1, 0), groups=2), (2, 4, 4, 3, 5)),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_convolution_matches_eager(name):
    make, shape = CONVS[name]
    compiled_matches(make(), torch.randn(shape))


POOLS = {
    "max_pool2d 3/2 pad 1": (nn.MaxPool2d(3, 2, 1), (1, 8, 17, 17)),
    "max_pool2d ceil_mode, dilation": (nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True), (2, 5, 14, 13)),
    "max_pool1d": (nn.MaxPool1d(4, 3, 2, ceil_mode=True), (2, 3, 21)),
    "avg_pool2d count_include_pad": (nn.AvgPool2d(3, 2, 1), (1, 8, 15, 16)),
    "avg_pool2d exclude pad, ceil_mode": (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                                          (1, 8, 15, 16)),
    "avg_pool2d divisor_override": (nn.AvgPool2d((2, 3), divisor_override=5), (1, 4, 8, 9)),
    "avg_pool1d": (nn.AvgPool1d(3, 2, 1), (2, 6, 20)),
    "adaptive_avg_pool2d global": (nn.AdaptiveAvgPool2d(1), (2, 130, 7, 7)),
    "adaptive_avg_pool2d divisible": (nn.AdaptiveAvgPool2d((4, 3)), (1, 8, 12, 12)),
    "adaptive_avg_pool2d uneven": (nn.AdaptiveAvgPool2d((5, 3)), (1, 8, 12, 13)),
    "adaptive_max_pool2d uneven": (nn.AdaptiveMaxPool2d((3, 4)), (1, 8, 10, 9)),
    "adaptive_avg_pool1d": (nn.AdaptiveAvgPool1d(7), (2, 4, 30)),
    "max_pool3d 3/2 pad 1": (nn.MaxPool3d(3, 2, 1), (2, 3, 7, 8, 9)),
    "max_pool3d ceil_mode, dilation": (nn.MaxPool3d((3, 2, 3), (2, 1, 2), 1, dilation=(2, 1, 2), ceil_mode=True),
                                       (1, 4, 9, 6, 10)),
    "avg_pool3d count_include_pad": (nn.AvgPool3d(3, 2, 1), (1, 4, 7, 8, 9)),
    "avg_pool3d exclude pad, ceil_mode": (nn.AvgPool3d((2, 3, 4), (1, 2, 2), (1, 1, 2), ceil_mode=True,
                                                       count_include_pad=False), (2, 3, 5, 7, 8)),
    "avg_pool3d divisor_override, unbatched": (nn.AvgPool3d(2, divisor_override=3), (3, 4, 6, 5)),
    "adaptive_avg_pool3d global": (nn.AdaptiveAvgPool3d(1), (2, 8, 3, 5, 4)),
    "adaptive_avg_pool3d divisible": (nn.AdaptiveAvgPool3d((2, 3, 2)), (1, 4, 4, 9, 6)),
    "adaptive_avg_pool3d uneven": (nn.AdaptiveAvgPool3d((3, 5, 2)), (1, 4, 5, 7, 9)),
    "adaptive_max_pool3d uneven": (nn.AdaptiveMaxPool3d((2, 4, 3)), (1, 4, 5, 7, 8)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_matches_eager(name):
    module, shape = POOLS[name]
    compiled_matches(module, torch.randn(shape))


INDEXED_POOLS = {
    "max_pool2d 3/2 pad 1": lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
    "max_pool2d ceil_mode, dilation": lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True,
                                                             return_indices=True),
    "max_pool2d rectangular, no stride": lambda x: F.max_pool2d(x, (2, 3), 1, return_indices=True),
    "max_pool1d ceil_mode": lambda x: F.max_pool1d(x.flatten(2), 4, 3, 2, ceil_mode=True, return_indices=True),
    "adaptive_max_pool2d uneven": lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
    "adaptive_max_pool1d": lambda x: F.adaptive_max_pool1d(x.flatten(2), 7, return_indices=True),
    "max_pool3d 3/2 pad 1": lambda x: F.max_pool3d(x[None], 3, 2, 1, return_indices=True),
    "max_pool3d ceil_mode, dilation, unbatched": lambda x: F.max_pool3d(x, (3, 2, 3), (2, 1, 2), 1,
                                                                        dilation=(1, 2, 1), ceil_mode=True,
                                                                        return_indices=True),
    "adaptive_max_pool3d uneven": lambda x: F.adaptive_max_pool3d(x[None], (2, 4, 3), return_indices=True),
}


@pytest.mark.parametrize("name", list(INDEXED_POOLS))
def test_max_pool_indices_equal_eager(name):
    """Values and indices bit for bit: small integers make ties everywhere (the first maximum wins), NaNs (the
    last NaN of a window wins), windows all -inf (the window's first element), and padding, which torch's loop
    never visits."""
    g = torch.Generator().manual_seed(1801)
    x = torch.randint(-3, 3, (2, 3, 11, 10), generator=g).float()
    r = torch.rand(x.shape, generator=g)
    x[r < 0.04] = float("nan")
    x[0, 1] = -float("inf")
    fn = INDEXED_POOLS[name]

    class Pool(nn.Module):
        def forward(self, x):
            return fn(x)
    got, want = trnc.compile(Pool(), (x,), cache=False)(x), fn(x)
    for g_, w_ in zip(got, want):
        assert g_.shape == w_.shape and g_.dtype == w_.dtype
        torch.testing.assert_close(g_, w_, rtol=0, atol=0, equal_nan=True)


class ConvBnRelu(nn.Module):
    def __init__(self, cin=8, cout=16):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
        with torch.no_grad():   # running statistics other than the initial 0 and 1
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_conv_batch_norm_relu_matches_eager():
    compiled_matches(ConvBnRelu(), torch.randn(2, 8, 9, 9))


def test_batch_norm_1d_matches_eager():
    bn = nn.BatchNorm1d(12)
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 2)
    compiled_matches(bn, torch.randn(4, 12, 5))


@pytest.mark.parametrize("name", ["conv2d 3x3 pad 1", "conv2d 7x7 stride 2 (stem)", "conv2d depthwise",
                                  "conv3d 3x3x3 pad 1"])
def test_bf16_operands_stay_within_their_rounding_bound(name):
    make, shape = CONVS[name]
    model, x = make().eval(), torch.randn(shape)
    conv = F.conv3d if isinstance(model, nn.Conv3d) else F.conv2d
    with torch.no_grad():
        expected = model(x)
        got = trnc.compile(model, (x,), precision="bf16", auto_cast="matmult")(x)
        magnitude = conv(x.abs(), model.weight.abs(), None, model.stride, model.padding, model.dilation,
                         model.groups)
        terms = model.weight[0].numel()
    bound = 2.0 ** -7 * magnitude + 2 * terms * 2.0 ** -24 * magnitude + 1e-6
    assert got.dtype == torch.float32
    assert ((got - expected).abs() <= bound).all()
    assert (got - expected).abs().max() > 0     # the operands were rounded: bf16 was used


def test_avg_pool3d_keeps_its_partial_sums_in_fp32_under_auto_cast_all():
    """The sums over (H, W) that the depth windows then add are the pool's own intermediates, which eager never
    rounds: with the input and output kept fp32, the result is fp32's."""
    compiled_matches(nn.AvgPool3d(3, 1, 1), torch.randn(1, 4, 6, 7, 8), precision="bf16", auto_cast="all")


def test_adaptive_pooling_to_many_uneven_windows_is_refused_naming_the_op():
    class Pool(nn.Module):
        def forward(self, x):
            return F.adaptive_avg_pool3d(x, (2, 150, 150))
    with pytest.raises(UnsupportedOpError, match=r"aten._adaptive_avg_pool3d.default to \[2, 150, 150\]"):
        trnc.compile(Pool(), (torch.randn(1, 1, 3, 301, 301),))


@pytest.mark.parametrize("transpose", [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d])
def test_conv_transpose_of_a_runtime_weight_matches_eager(transpose):
    """The flipped weight is made on the device (a slice per tap, in reverse order), not at compile time."""
    class Runtime(nn.Module):
        def forward(self, x, w):
            return transpose(x, w, stride=2, padding=1, groups=2)
    rank = int(transpose.__name__[-2])
    x, w = torch.randn(1, 4, *(4,) * rank), torch.randn(4, 3, *(3,) * rank)
    got = trnc.compile(Runtime(), (x, w))(x, w)
    expected = transpose(x, w, stride=2, padding=1, groups=2)
    assert ((got - expected).abs().max() / expected.abs().max()).item() <= FP32_RTOL


def test_a_convolution_of_a_runtime_weight_matches_eager():
    class Runtime(nn.Module):
        def forward(self, x, w):
            return F.conv2d(x, w, padding=1)
    x, w = torch.randn(1, 4, 6, 6), torch.randn(5, 4, 3, 3)
    got = trnc.compile(Runtime(), (x, w))(x, w)
    expected = F.conv2d(x, w, padding=1)
    assert ((got - expected).abs().max() / expected.abs().max()).item() <= FP32_RTOL


class Resample(nn.Module):
    def __init__(self, mode: str, align_corners):
        super().__init__()
        self.mode, self.align_corners = mode, align_corners

    def forward(self, x):
        up = F.interpolate(x, scale_factor=2, mode=self.mode, align_corners=self.align_corners)
        return F.pixel_shuffle(F.channel_shuffle(up, 2), 2)


@pytest.mark.parametrize("mode, align_corners", [("nearest", None), ("bilinear", False), ("bilinear", True)])
def test_resampling_and_shuffles_match_eager(mode, align_corners):
    compiled_matches(Resample(mode, align_corners), torch.randn(1, 8, 5, 7))


def test_a_3d_network_runs_wholly_on_the_device_under_the_backend():
    from trnc import backend
    bn = nn.BatchNorm3d(6)
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 2)
    model = nn.Sequential(nn.Conv3d(2, 6, 3, padding=1), bn, nn.ReLU(), nn.MaxPool3d(2), nn.Conv3d(6, 4, 3, padding=1),
                          nn.AdaptiveAvgPool3d(1)).eval()
    x = torch.randn(1, 2, 6, 8, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="trnc")(x)
        expected = model(x)
    assert backend.last_report().fallback == ()
    assert ((got - expected).abs().max() / expected.abs().max()).item() <= FP32_RTOL
    torch._dynamo.reset()
