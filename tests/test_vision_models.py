"""torchvision's CNNs (random weights, no downloads) wholly on the device, through torch.compile(backend="trnc")
with nothing left to eager PyTorch, and through trnc.compile; and one small CNN on the reference interpreter.

fp32 within 1e-5 of eager relative to the output's largest magnitude: each layer sums in fp32 as eager does, in
another order (test_vision_ops.py), and what a network compounds stays far below that (measured: at most
1.6e-6). Each model compiles in about 10 s, so they carry the slow mark.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import trnc
from trnc.bench.vision import torchvision
from trnc import backend

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny",
          "squeezenet1_1", "shufflenet_v2_x0_5"]
RESOLUTION = 64
FP32_RTOL = 1e-5


def _model(name: str) -> nn.Module:
    return getattr(torchvision().models, name)(weights=None).eval()


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape and got.dtype == expected.dtype
    return ((got - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_torchvision_model_runs_wholly_on_the_device_through_the_backend(name):
    model, x = _model(name), torch.randn(1, 3, RESOLUTION, RESOLUTION)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="trnc")(x)
    report = backend.last_report()
    assert report.fallback_nodes == 0, report.text()
    assert _relative(got, expected) <= FP32_RTOL


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_torchvision_model_compiles_with_trnc_compile(name):
    model, x = _model(name), torch.randn(1, 3, RESOLUTION, RESOLUTION)
    compiled = trnc.compile(model, (x,))
    with torch.no_grad():
        assert _relative(compiled(x), model(x)) <= FP32_RTOL
    assert compiled.stats["macs"] > 0


class SmallCNN(nn.Module):
    """A stem, a depthwise-separable block with batch norm, both poolings and a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Hardswish(), nn.Conv2d(8, 16, 1))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = x + self.block(x).narrow(1, 0, 8)
        return self.head(nn.functional.adaptive_avg_pool2d(torch.cat([x, x], 1), 1).flatten(1))


def test_a_small_cnn_runs_bit_exactly_on_the_reference_interpreter():
    model, x = SmallCNN().eval(), torch.randn(2, 3, 16, 16)
    compiled = trnc.compile(model, (x,))
    jit, ref = compiled(x), compiled.run_reference(x)
    assert torch.equal(jit.view(torch.int32), ref.view(torch.int32))
    with torch.no_grad():
        assert _relative(jit, model(x)) <= FP32_RTOL


@pytest.mark.slow
def test_hugging_face_vit_compiles_with_trnc_compile():
    """Its patch embedding is a 8x8 convolution of stride 8; the rest is the transformer encoder."""
    import transformers as tf
    config = tf.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                          image_size=32, patch_size=8, attn_implementation="sdpa")
    model, x = tf.ViTModel(config).eval(), torch.randn(2, 3, 32, 32)
    compiled = trnc.compile(model, (x,))
    got = compiled(x)
    with torch.no_grad():
        expected = model(x)
    assert list(got.keys()) == list(expected.keys())
    for key in expected.keys():
        assert _relative(got[key], expected[key]) <= FP32_RTOL
