"""The window kernels (passes/tile/kernels/conv.py and window.py) against float64 torch, through tile, allocate,
schedule and emit and both runtimes (the harness requires the reference and the JIT to agree bit for bit).

Inputs and weights are small integers, so every product and every partial sum is an integer below 2^24, exact in
fp32 in any order, and exact in bf16 operands too: each result must equal the float64 convolution exactly. The
cases cover each scheme (shifted windows, im2col, depthwise, groups), channel counts across a 128-partition tile,
outputs wider than a PSUM bank, strides, dilations, asymmetric padding and a transposed convolution's zeros
between inputs, then the fused epilogue and pooling.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import harness
from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.passes.tile.kernels import conv as conv_kernel
from trnc.passes.tile.kernels.window import Window
from trnc.isa.ap import Mem
from trnc.passes.tile.tiles import HbmView
from trnc.passes.tile.verify import verify_tiles

F32, BF16 = DType.FP32, DType.BF16
RNG = np.random.default_rng(14)


def ints(*shape, low=-3, high=4) -> np.ndarray:
    return RNG.integers(low, high, size=shape).astype(np.float32)


def conv_node(x: ir.Node, w: ir.Node, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
              input_dilation=(1, 1), dtype=F32) -> ir.Node:
    sizes = tuple(ir.window_out_size(x.shape[2 + d], w.shape[1 + d], stride[d], padding[2 * d:2 * d + 2],
                                     dilation[d], input_dilation[d]) for d in (0, 1))
    return ir.Node("conv", (x, w), (x.shape[0], w.shape[3], *sizes), dtype,
                   {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
                    "input_dilation": input_dilation})


def reference(x: np.ndarray, w: np.ndarray, node: ir.Node) -> np.ndarray:
    """The convolution in float64 from the node's attributes: the input placed with zeros between and around it."""
    a = node.attrs
    (lh, lw), (pt, pb, pl, pr) = a["input_dilation"], a["padding"]
    n, c, h, wd = x.shape
    placed = torch.zeros(n, c, pt + (h - 1) * lh + 1 + pb, pl + (wd - 1) * lw + 1 + pr, dtype=torch.float64)
    placed[:, :, pt:pt + (h - 1) * lh + 1:lh, pl:pl + (wd - 1) * lw + 1:lw] = torch.from_numpy(x).double()
    weight = torch.from_numpy(w).double().permute(3, 0, 1, 2)
    return F.conv2d(placed, weight, stride=a["stride"], dilation=a["dilation"], groups=a["groups"]).numpy()


def run_conv(x_shape, w_shape, compute=F32, epilogue=(), **attrs):
    x_arr, w_arr = ints(*x_shape), ints(*w_shape)
    x = harness.inp(0, x_shape, F32)
    w = harness.const(w_arr, F32)
    node = conv_node(x, w, **attrs)
    kernel = ir.Kernel("conv", [node, *epilogue(node)] if epilogue else [node], compute_dtype=compute)
    outs, state = harness.compile_and_run([x], [kernel], [x_arr])
    return outs[0], reference(x_arr, w_arr, node), node, state


CASES = {
    "3x3 same": dict(x_shape=(1, 8, 10, 12), w_shape=(8, 3, 3, 16), padding=(1, 1, 1, 1)),
    "7x7 stem, stride 2": dict(x_shape=(1, 3, 30, 30), w_shape=(3, 7, 7, 16), stride=(2, 2), padding=(3, 3, 3, 3)),
    "channels over a tile": dict(x_shape=(1, 130, 6, 6), w_shape=(130, 3, 3, 132), padding=(1, 1, 1, 1)),
    "wider than a PSUM bank": dict(x_shape=(1, 4, 2, 600), w_shape=(4, 1, 3, 8), padding=(0, 0, 1, 1)),
    "dilated, asymmetric padding": dict(x_shape=(2, 5, 11, 9), w_shape=(5, 3, 2, 7), dilation=(2, 3),
                                        padding=(2, 0, 1, 3), stride=(1, 2)),
    "grouped": dict(x_shape=(1, 8, 7, 7), w_shape=(4, 3, 3, 6), groups=2, padding=(1, 1, 1, 1)),
    "depthwise, stride 2": dict(x_shape=(2, 24, 9, 10), w_shape=(1, 3, 3, 24), groups=24, stride=(2, 2),
                                padding=(1, 1, 1, 1)),
    "transposed (zeros between inputs)": dict(x_shape=(1, 6, 5, 4), w_shape=(6, 3, 3, 5), input_dilation=(2, 2),
                                              padding=(2, 3, 2, 2)),
    "1x1": dict(x_shape=(3, 16, 4, 5), w_shape=(16, 1, 1, 24)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_conv_is_exact_on_integers(name):
    got, ref, _, _ = run_conv(**CASES[name])
    np.testing.assert_array_equal(got, ref)


def test_bf16_operands_of_small_integers_are_exact():
    got, ref, _, _ = run_conv((1, 8, 9, 9), (8, 3, 3, 16), compute=BF16, padding=(1, 1, 1, 1))
    np.testing.assert_array_equal(got, ref)


def test_the_cost_model_takes_im2col_for_a_3_channel_stem_and_shifted_windows_for_64_channels():
    hw = get_target("trn2")

    def scheme(x_shape, w_shape, stride, pad):
        x = ir.Node("input", (), x_shape, F32)
        w = ir.Node("input", (), w_shape, F32)
        node = conv_node(x, w, stride=stride, padding=(pad,) * 4)
        view = HbmView(0, F32, x_shape, tuple(math.prod(x_shape[d + 1:]) for d in range(4)))
        return conv_kernel.choose_scheme(Window.of(node), view, w_shape, 1, BF16, hw)
    assert scheme((1, 3, 224, 224), (3, 7, 7, 64), (2, 2), 3) == "im2col"
    assert scheme((1, 64, 56, 56), (64, 3, 3, 64), (1, 1), 1) == "shifted"
    assert scheme((1, 256, 14, 14), (256, 3, 3, 256), (1, 1), 1) == "shifted"


def test_the_epilogue_runs_in_the_evacuation_with_a_per_channel_bias():
    bias = harness.const(ints(1, 16, 1, 1), F32)

    def epilogue(node):
        added = ir.Node("binary", (node, bias), node.shape, F32, {"op": "add"})
        return [added, ir.Node("unary", (added,), node.shape, F32, {"func": "relu"})]
    got, ref, _, state = run_conv((1, 8, 6, 6), (8, 3, 3, 16), epilogue=epilogue, padding=(1, 1, 1, 1))
    np.testing.assert_array_equal(got, np.maximum(ref + bias.attrs["value"], 0))
    opcodes = [ins.opcode for ins in state.program.instructions]
    assert "tensor_copy" not in opcodes      # the bias and relu are the evacuation


def pool_node(x: ir.Node, op: str, kernel, stride, padding, dilation=(1, 1)) -> ir.Node:
    sizes = tuple(ir.window_out_size(x.shape[2 + d], kernel[d], stride[d], padding[2 * d:2 * d + 2], dilation[d])
                  for d in (0, 1))
    return ir.Node("pool", (x,), (*x.shape[:2], *sizes), F32 if op == "sum" else x.dtype,
                   {"op": op, "kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation})


@pytest.mark.parametrize("op", ["max", "sum"])
def test_pooling_matches_torch(op):
    x_arr = ints(2, 130, 11, 13)
    x_arr[0, 0, 0, 0] = np.nan if op == "max" else 0.0     # max takes the NaN, as torch's max_pool2d does
    x = harness.inp(0, x_arr.shape, F32)
    node = pool_node(x, op, (3, 2), (2, 2), (1, 2, 0, 1), dilation=(1, 2))
    (got,), _ = harness.compile_and_run([x], [ir.Kernel("pool", [node])], [x_arr])
    fill = -math.inf if op == "max" else 0.0
    placed = F.pad(torch.from_numpy(x_arr).double(), (0, 1, 1, 2), value=fill)
    taps = F.unfold(placed, (3, 2), dilation=(1, 2), stride=(2, 2)).reshape(2, 130, 6, -1)
    ref = (taps.amax(2) if op == "max" else taps.sum(2)).reshape(node.shape).numpy()
    np.testing.assert_array_equal(got, ref)
    assert np.isnan(got[0, 0, 0, 0]) == (op == "max")


def test_an_integer_convolution_is_refused():
    x = harness.inp(0, (1, 2, 4, 4), DType.INT32)
    w = harness.const(np.ones((2, 3, 3, 2), np.int32), DType.INT32)
    node = conv_node(x, w, dtype=DType.INT32)
    with pytest.raises(UnsupportedOpError, match="conv .* with operands in int32"):
        harness.compile_kernels([x], [ir.Kernel("conv", [node], compute_dtype=DType.INT32)])


def _chain(x_arr: np.ndarray, layers) -> tuple[list[ir.Kernel], list[np.ndarray]]:
    """Convolutions in a chain, each a kernel; `layers` holds (weight shape, attrs, residual from layer k or None).
    Returns the kernels and each layer's float64 reference."""
    x = harness.inp(0, x_arr.shape, F32)
    node, kernels, refs, values = x, [], [], [x_arr]
    for w_shape, attrs, residual in layers:
        w_arr = ints(*w_shape, low=-1, high=2)
        conv = conv_node(node, harness.const(w_arr, F32), **attrs)
        ref = reference(values[-1], w_arr, conv)
        nodes = [conv]
        if residual is not None:
            nodes.append(ir.Node("binary", (conv, kernels[residual].output), conv.shape, F32, {"op": "add"}))
            ref = ref + refs[residual]
        kernels.append(ir.Kernel("conv", nodes, compute_dtype=F32))
        refs.append(ref)
        values.append(ref.astype(np.float32))
        node = nodes[-1]
    return [x], kernels, refs


def test_images_stay_in_sbuf_between_convolutions():
    """A chain whose inner images only convolutions read stays on chip: a padded 3x3 reads its bands by copy, a
    1x1 as views, a grouped one whose second group straddles two 128-channel blocks by DMA, and an epilogue
    reads a residual image; results exact as in HBM."""
    x_arr = ints(1, 8, 7, 7, low=-1, high=2)
    inputs, kernels, refs = _chain(x_arr, [
        ((8, 3, 3, 130), dict(padding=(1, 1, 1, 1)), None),
        ((65, 1, 1, 130), dict(groups=2), None),
        ((130, 3, 3, 130), dict(padding=(1, 1, 1, 1)), 0),
        ((130, 1, 1, 6), {}, None)])
    (got,), state = harness.compile_and_run(inputs, kernels, [x_arr])
    np.testing.assert_array_equal(got, refs[-1])
    assert [k.plan.keep for k in kernels] == [True, True, True, False]
    assert len(state.tiles.resident) == 3
    verify_tiles(state.tiles, state.graph)      # never in HBM, used only by their producers and readers
    hbm_reads = {ins.fields["src"].tensor for ins in state.tiles.instrs
                 if ins.opcode == "dma_copy" and getattr(ins.fields["src"], "mem", None) is Mem.HBM}
    assert not hbm_reads & set(state.tiles.resident)


def test_im2col_reads_a_resident_image():
    x_arr = ints(1, 3, 9, 9, low=-1, high=2)
    inputs, kernels, refs = _chain(x_arr, [
        ((3, 3, 3, 4), dict(padding=(1, 1, 1, 1)), None),
        ((4, 5, 5, 8), dict(padding=(2, 2, 2, 2), stride=(2, 2)), None)])
    hw = get_target("trn2")
    second = kernels[1].nodes[0]
    view = HbmView(0, F32, second.inputs[0].shape, (4 * 81, 81, 9, 1))
    assert conv_kernel.choose_scheme(Window.of(second), view, second.inputs[1].shape, 1, F32, hw) == "im2col"
    (got,), state = harness.compile_and_run(inputs, kernels, [x_arr])
    np.testing.assert_array_equal(got, refs[-1])
    assert kernels[0].plan.keep and len(state.tiles.resident) == 1
    verify_tiles(state.tiles, state.graph)


def test_an_image_stays_in_hbm_for_a_reader_other_than_a_window_kernel_or_beyond_the_budget():
    from trnc.passes.graph import plan
    x = harness.inp(0, (1, 4, 8, 8), F32)
    small = conv_node(x, harness.const(ints(4, 1, 1, 4), F32))
    relu = ir.Node("unary", (small,), small.shape, F32, {"func": "relu"})
    state = harness.compile_kernels([x], [ir.Kernel("conv", [small], compute_dtype=F32),
                                          ir.Kernel("elementwise", [relu])])
    assert not state.graph.kernels[0].plan.keep      # an elementwise kernel reads it from HBM
    big_x = harness.inp(0, (1, 4, 120, 120), F32)
    big = conv_node(big_x, harness.const(ints(4, 1, 1, 4), F32))
    after = conv_node(big, harness.const(ints(4, 1, 1, 4), F32))
    assert plan.image_bytes(big) > plan.KEEP_IMAGE_BYTES
    state = harness.compile_kernels([big_x], [ir.Kernel("conv", [big], compute_dtype=F32),
                                              ir.Kernel("conv", [after], compute_dtype=F32)])
    assert not state.graph.kernels[0].plan.keep
