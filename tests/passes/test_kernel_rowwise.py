"""Row-wise kernels (passes/tile/kernels/rowwise.py): softmax, log_softmax and layer_norm against torch, through
tile/allocate/schedule/emit and both runtimes (the harness requires the reference and the JIT to agree bit for
bit).

Tolerance: fp32 results within max|diff| / max|ref| <= 1e-5. The kernel accumulates in fp32 in free-axis
order (torch uses vectorized partial sums), and exp, log and rsqrt are fixed fp32 sequences accurate to a
few ulp (runtime/fp32math.py), so the differences stay near 1e-7. A bf16 output adds one rounding:
|diff| <= 2^-8 |ref| per element (bf16's unit roundoff) on top of the fp32 error.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import harness
from harness import rel_err
from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.dtypes import DType
from trnc.passes.tile.kernels.rowwise import merged_rows, row_tiles
from trnc.passes.tile.tiles import HbmView

F32, BF16 = DType.FP32, DType.BF16
RNG = np.random.default_rng(11)
TOL = 1e-5
BF16_U = 2.0 ** -8




def rowwise(op, inputs, shape, dtype=F32, **attrs) -> ir.Node:
    return ir.Node(op, tuple(inputs), shape, dtype, attrs)


def run(inputs, kernels, arrays):
    outs, _ = harness.compile_and_run(inputs, kernels, arrays)
    return outs[0].astype(np.float32)


def randn(*shape, scale=1.0, offset=0.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale + offset).astype(np.float32)


# -- row tiling --------------------------------------------------------------------------------------

def test_leading_dims_merge_only_where_the_strides_allow():
    contiguous = HbmView(0, F32, (4, 5, 6, 7), (210, 42, 7, 1))
    assert merged_rows(contiguous)[0].shape == (120, 7)
    sliced = contiguous.narrow(1, 1, 4)              # [4, 3, 6, 7]: dims 1 and 2 merge, dim 0 no longer does
    assert merged_rows(sliced)[0].shape == (4, 18, 7)
    assert merged_rows(contiguous.permute((1, 0, 2, 3)))[0].shape == (5, 4, 6, 7)
    assert merged_rows(HbmView(0, F32, (9,), (1,)))[0].shape == (1, 9)


def test_an_input_and_its_output_merge_only_the_dims_both_can():
    """A softmax written through a permuted view (its result is returned transposed): the rows of x merge, the
    output's do not, so neither does x's (found by the fuzzer: softmax over dim 0 of [1, 1, 2, 2])."""
    x = HbmView(0, F32, (2, 3, 4), (12, 4, 1))
    out = HbmView(1, F32, (2, 3, 4), (4, 8, 1))
    rows_x, rows_out = merged_rows(x, out)
    assert rows_x.shape == rows_out.shape == (2, 3, 4)
    assert (rows_x.strides, rows_out.strides) == ((12, 4, 1), (4, 8, 1))
    assert merged_rows(x, x)[1].shape == (6, 4)


def test_row_tiles_cover_every_row_once():
    for rows in [(300,), (5, 24), (3, 200), (1,), (128,), (7, 3, 2)]:
        seen = []
        for pdim, parts, segments in row_tiles(rows):
            assert parts <= 128
            for p0, box in segments:
                assert box[pdim][1] <= parts - p0
                for r in range(box[pdim][1]):
                    seen.append(tuple(start + (r if d == pdim else 0) for d, (start, _) in enumerate(box)))
        assert sorted(seen) == sorted(np.ndindex(*rows)), rows


# -- softmax and log_softmax -------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 200, 70), (128, 33), (1, 1), (5,)])
def test_softmax_matches_torch(shape):
    x = harness.inp(0, shape, F32)
    a = randn(*shape, scale=4.0)
    got = run([x], [ir.Kernel("softmax", [rowwise("softmax", [x], shape)])], [a])
    assert rel_err(got, torch.softmax(torch.from_numpy(a), -1).numpy()) <= TOL


def test_softmax_of_a_permuted_view_with_unmergeable_rows():
    """x [40, 5, 30] permuted to [5, 40, 30]: the row dims have strides 30 and 1200, so each tile gathers runs."""
    x = harness.inp(0, (40, 5, 30), F32)
    perm = rowwise("permute", [x], (5, 40, 30), dims=(1, 0, 2))
    sm = rowwise("softmax", [perm], (5, 40, 30))
    a = randn(40, 5, 30, scale=3.0)
    got = run([x], [ir.Kernel("movement", [perm]), ir.Kernel("softmax", [sm])], [a])
    assert rel_err(got, torch.softmax(torch.from_numpy(a).permute(1, 0, 2), -1).numpy()) <= TOL


def test_softmax_over_a_strided_last_axis_and_expanded_rows():
    """Last axis strided (a transposed matrix) and a leading dim of stride 0 (expand)."""
    x = harness.inp(0, (50, 1, 6), F32)
    t = rowwise("permute", [x], (6, 1, 50), dims=(2, 1, 0))
    e = rowwise("expand", [t], (6, 3, 50))
    sm = rowwise("log_softmax", [e], (6, 3, 50))
    a = randn(50, 1, 6, scale=2.0)
    got = run([x], [ir.Kernel("movement", [t]), ir.Kernel("movement", [e]), ir.Kernel("log_softmax", [sm])], [a])
    ref = torch.log_softmax(torch.from_numpy(a).permute(2, 1, 0).expand(6, 3, 50), -1).numpy()
    assert rel_err(got, ref) <= TOL


def test_log_softmax_with_large_magnitude_inputs():
    x = harness.inp(0, (200, 300), F32)
    a = randn(200, 300, scale=1e4, offset=1e5)
    got = run([x], [ir.Kernel("log_softmax", [rowwise("log_softmax", [x], (200, 300))])], [a])
    ref = torch.log_softmax(torch.from_numpy(a), -1).numpy()
    assert np.isfinite(got).all()
    assert rel_err(got, ref) <= TOL


def test_softmax_bf16_input_and_output():
    x = harness.inp(0, (130, 96), BF16)
    a = randn(130, 96, scale=3.0).astype(BF16.storage)
    got = run([x], [ir.Kernel("softmax", [rowwise("softmax", [x], (130, 96), BF16)])], [a])
    ref = torch.softmax(torch.from_numpy(a.astype(np.float32)), -1).numpy()
    assert (np.abs(got - ref) <= BF16_U * np.abs(ref) + TOL * np.abs(ref).max()).all()


def test_softmax_rows_sum_to_one_and_masked_entries_vanish():
    x = harness.inp(0, (4, 9), F32)
    a = randn(4, 9)
    a[:, 3] = -np.inf
    got = run([x], [ir.Kernel("softmax", [rowwise("softmax", [x], (4, 9))])], [a])
    assert (got[:, 3] == 0).all()
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-6)


# -- layer_norm --------------------------------------------------------------------------------------

@pytest.mark.parametrize("weight,bias", [(True, True), (True, False), (False, True), (False, False)])
def test_layer_norm_matches_torch(weight, bias):
    rows, c = 300, 96
    x = harness.inp(0, (3, 100, c), F32)
    inputs, arrays = [x], [randn(3, 100, c, scale=2.0, offset=3.0)]
    w = b = None
    if weight:
        inputs.append(harness.inp(len(inputs), (c,), F32))
        arrays.append(w := randn(c))
    if bias:
        inputs.append(harness.inp(len(inputs), (c,), F32))
        arrays.append(b := randn(c))
    ln = rowwise("layer_norm", inputs, (3, 100, c), eps=1e-5, has_weight=weight, has_bias=bias)
    got = run(inputs, [ir.Kernel("layer_norm", [ln])], arrays)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(arrays[0]), (c,),
                                         None if w is None else torch.from_numpy(w),
                                         None if b is None else torch.from_numpy(b), 1e-5).numpy()
    assert rows == 300 and rel_err(got, ref) <= TOL


def test_layer_norm_wide_rows_with_an_offset_eps_and_bf16_output():
    """768 columns of mean 5 and std 0.1: a plain running sum of x would lose ~1e-5 of the spread in the mean
    (its partial sums reach 3840); the shifted sum keeps it. eps is not negligible here."""
    c = 768
    x, w, b = harness.inp(0, (200, c), F32), harness.inp(1, (c,), F32), harness.inp(2, (c,), F32)
    a, wa, ba = randn(200, c, scale=0.1, offset=5.0), randn(c), randn(c)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(a), (c,), torch.from_numpy(wa), torch.from_numpy(ba),
                                         1e-2).numpy()
    for dtype in (F32, BF16):
        ln = rowwise("layer_norm", [x, w, b], (200, c), dtype, eps=1e-2, has_weight=True, has_bias=True)
        got = run([x, w, b], [ir.Kernel("layer_norm", [ln])], [a, wa, ba])
        if dtype is F32:
            assert rel_err(got, ref) <= TOL
        else:
            assert (np.abs(got - ref) <= BF16_U * np.abs(ref) + TOL * np.abs(ref).max()).all()


def test_layer_norm_last_row_tile_in_column_halves_of_an_odd_width():
    """The last row tile's passes and store go in two column halves (100 and 101 columns here): every column
    of every row is written, and right."""
    c = 201
    x, w, b = harness.inp(0, (300, c), F32), harness.inp(1, (c,), F32), harness.inp(2, (c,), F32)
    a, wa, ba = randn(300, c, scale=2.0), randn(c), randn(c)
    ln = rowwise("layer_norm", [x, w, b], (300, c), eps=1e-5, has_weight=True, has_bias=True)
    outs, state = harness.compile_and_run([x, w, b], [ir.Kernel("layer_norm", [ln])], [a, wa, ba])
    widths = sorted({ins["dst"].free_size for ins in state.program.instructions
                     if ins.opcode == "tensor_tensor"})
    assert widths == [100, 101, 201]
    ref = torch.nn.functional.layer_norm(torch.from_numpy(a), (c,), torch.from_numpy(wa), torch.from_numpy(ba),
                                         1e-5).numpy()
    assert rel_err(outs[0], ref) <= TOL


# -- limits ------------------------------------------------------------------------------------------

def test_a_row_too_long_for_sbuf_is_an_error_naming_the_size():
    c = 40000
    x = harness.inp(0, (2, c), F32)
    with pytest.raises(UnsupportedOpError, match=r"softmax over a last axis of 40000 elements.*at most \d+ elements"):
        harness.compile_kernels([x], [ir.Kernel("softmax", [rowwise("softmax", [x], (2, c))])])
