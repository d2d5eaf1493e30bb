"""The fused attention kernel (passes/tile/kernels/attention.py) against torch's scaled_dot_product_attention, through
tile/allocate/schedule/emit and both runtimes (the harness requires the reference and the JIT to agree bit for
bit). Head dims that are multiples of 32 (below 128) take the transposed plan, the others the standard plan.

Tolerances.
- fp32 compute: max|diff| / max|ref| <= 1e-5 (products and sums in fp32; exp accurate to 1 ulp).
- bf16 compute (fp32 inputs rounded to bf16 on chip, unit roundoff u = 2^-8): per output element
  |diff| <= (2 L + 4 u) A + 1e-6 max|ref|, where A = sum_j p_j |v_j| (the softmax-weighted magnitude of v) and
  L = 2 u scale max_j sum_d |q_d k_jd| bounds the error of the logits from rounding q and k. A logit error
  of at most L changes each softmax weight by a factor within exp(+-2L); rounding P (u for the weights of the
  standard plan, 2u once renormalized by the transposed plan's sums of the rounded P), and v (u) add the
  4u; fp32 accumulation and exp are far below that.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

import harness
from harness import rel_err
from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.dtypes import DType

F32, BF16 = DType.FP32, DType.BF16
TOL = 1e-5
BF16_U = 2.0 ** -8




def randn(rng, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def attention(q, k, v, mask=None, *, causal=False, scale=None, dtype=F32, name="att") -> ir.Node:
    inputs = (q, k, v) + ((mask,) if mask is not None else ())
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    shape = (*q.shape[:-1], v.shape[-1])
    return ir.Node("attention", inputs, shape, dtype, {"scale": scale, "causal": causal,
                                                       "has_mask": mask is not None}, name=name)


def reference(qa, ka, va, mask=None, causal=False, scale=None) -> np.ndarray:
    q, k, v = (torch.from_numpy(a) for a in (qa, ka, va))
    m = None if mask is None else torch.from_numpy(mask)
    if m is not None and causal:   # torch takes one or the other: fold causal into the additive mask
        sq, sk = qa.shape[-2], ka.shape[-2]
        m = m + torch.full((sq, sk), -torch.inf).triu(1)
        causal = False
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                                            scale=scale).numpy()


def run_attention(batch, sq, sk, d, dv, *, mask_shape=None, causal=False, scale=None, cd=F32, out=F32, seed=0,
                  mask_fill=None):
    rng = np.random.default_rng(seed)
    arrays = [randn(rng, (*batch, sq, d)), randn(rng, (*batch, sk, d)), randn(rng, (*batch, sk, dv))]
    if mask_shape is not None:
        mask = randn(rng, mask_shape)
        if mask_fill is not None:
            mask_fill(mask)
        arrays.append(mask)
    nodes = [harness.inp(i, a.shape, F32) for i, a in enumerate(arrays)]
    att = attention(*nodes, causal=causal, scale=scale, dtype=out)
    (got,), state = harness.compile_and_run(nodes, [ir.Kernel("attention", [att], compute_dtype=cd)], arrays)
    ref = reference(*arrays, causal=causal, scale=scale)
    return got.astype(np.float32), ref, arrays, state


def opcodes(state) -> Counter:
    return Counter(i.opcode for i in state.program.instructions)


# -- fp32: both plans, odd sizes ---------------------------------------------------------------------

@pytest.mark.parametrize("d", [64, 40])
def test_odd_sizes_match_torch(d):
    got, ref, _, state = run_attention((2,), 200, 300, d, 40)
    assert rel_err(got, ref) <= TOL
    transposes = opcodes(state)["transpose"]
    if d == 64:   # transposed plan: one transpose per query tile (its -max row), none of P
        assert transposes == 2 * 2
    else:         # standard plan: P^T block by block (3 key tiles per query tile)
        assert transposes == 2 * 2 * 3


@pytest.mark.parametrize("d", [32, 48])
@pytest.mark.parametrize("sq,sk", [(200, 300), (300, 200), (1, 50)])
def test_causal_is_top_left_aligned(d, sq, sk):
    got, ref, _, _ = run_attention((1, 2), sq, sk, d, 24, causal=True)
    assert rel_err(got, ref) <= TOL


def test_causal_masked_keys_get_exactly_zero_weight():
    """Row 0 may only see key 0: its output is v[0] exactly, whatever the other keys score."""
    rng = np.random.default_rng(3)
    qa, ka, va = randn(rng, (130, 64)), randn(rng, (140, 64)) * 30, randn(rng, (140, 16))
    nodes = [harness.inp(i, a.shape, F32) for i, a in enumerate((qa, ka, va))]
    (got,), _ = harness.compile_and_run(nodes, [ir.Kernel("attention", [attention(*nodes, causal=True)])],
                                        [qa, ka, va])
    np.testing.assert_array_equal(got[0], va[0])


def test_small_and_negative_scale():
    got, ref, _, _ = run_attention((3,), 20, 50, 64, 8, scale=-0.3)
    assert rel_err(got, ref) <= TOL


# -- additive masks ----------------------------------------------------------------------------------

def _some_neg_inf(mask):
    mask[..., ::7] = -np.inf
    mask[..., 0] = 0.0     # no row fully masked (torch gives NaN there)


@pytest.mark.parametrize("mask_shape", [(150, 260), (2, 1, 150, 260), (2, 1, 1, 260)])
def test_additive_masks_with_broadcast_and_neg_inf(mask_shape):
    got, ref, _, state = run_attention((2, 3), 150, 260, 64, 32, mask_shape=mask_shape, mask_fill=_some_neg_inf)
    assert rel_err(got, ref) <= TOL
    # a mask that does not vary over the heads is loaded once per (batch, query tile), not once per head
    mask_tensor = next(i for i, t in enumerate(state.program.tensors) if t.name == "in3")
    loaded = sum(i["src"].num_bytes for i in state.program.instructions
                 if i.opcode == "dma_copy" and i["src"].tensor == mask_tensor)
    distinct = math.prod(mask_shape[:-2])
    assert loaded == distinct * 150 * 260 * 4


def test_mask_and_causal_together():
    got, ref, _, _ = run_attention((2,), 140, 100, 48, 16, mask_shape=(140, 100), causal=True)
    assert rel_err(got, ref) <= TOL


# -- strided views -----------------------------------------------------------------------------------

def test_permuted_and_expanded_views():
    """q stored [B, S, H, D] and permuted to [B, H, S, D]; k, v with one head expanded to 4 (GQA after legalize)."""
    rng = np.random.default_rng(5)
    b, s, h, d = 2, 70, 4, 64
    qa, ka, va = randn(rng, (b, s, h, d)), randn(rng, (b, 1, 90, d)), randn(rng, (b, 1, 90, 32))
    q, k, v = (harness.inp(i, a.shape, F32) for i, a in enumerate((qa, ka, va)))
    qp = ir.Node("permute", (q,), (b, h, s, d), F32, {"dims": (0, 2, 1, 3)})
    ke = ir.Node("expand", (k,), (b, h, 90, d), F32)
    ve = ir.Node("expand", (v,), (b, h, 90, 32), F32)
    att = attention(qp, ke, ve)
    kernels = [ir.Kernel("movement", [n]) for n in (qp, ke, ve)] + [ir.Kernel("attention", [att])]
    (got,), _ = harness.compile_and_run([q, k, v], kernels, [qa, ka, va])
    ref = reference(np.ascontiguousarray(qa.transpose(0, 2, 1, 3)), np.broadcast_to(ka, (b, h, 90, d)).copy(),
                    np.broadcast_to(va, (b, h, 90, 32)).copy())
    assert rel_err(got, ref) <= TOL


# -- bf16 --------------------------------------------------------------------------------------------

def bf16_bound(qa, ka, va, scale, ref) -> np.ndarray:
    """The per-element bound of the module docstring, from the data (fp64)."""
    q, k, v = (a.astype(np.float64) for a in (qa, ka, va))
    logit_err = 2 * BF16_U * abs(scale) * np.einsum("...qd,...kd->...qk", np.abs(q), np.abs(k)).max(-1)
    s = scale * np.einsum("...qd,...kd->...qk", q, k)
    p = np.exp(s - s.max(-1, keepdims=True))
    weighted = np.einsum("...qk,...kv->...qv", p, np.abs(v)) / p.sum(-1, keepdims=True)
    return (2 * logit_err[..., None] + 4 * BF16_U) * weighted + 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("d,out", [(64, F32), (40, BF16)])
def test_bf16_compute_within_the_rounding_bound(d, out):
    got, ref, (qa, ka, va), _ = run_attention((2,), 150, 200, d, 24, cd=BF16, out=out)
    bound = bf16_bound(qa, ka, va, 1.0 / math.sqrt(d), ref)
    if out is BF16:
        bound = bound + BF16_U * np.abs(ref)
    assert (np.abs(got - ref) <= bound).all()
    assert rel_err(got, ref) > 1e-4   # the operands really were rounded to bf16


# -- limits ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,match", [
    (((1, 8, 130), (1, 8, 130), (1, 8, 4)), r"head dim D=130.*D <= 128"),
    (((1, 8, 32), (1, 2100, 32), (1, 2100, 4)), r"Sk=2100 keys.*Sk <= 2048"),     # the transposed plan
    (((1, 8, 16), (1, 1100, 16), (1, 1100, 4)), r"Sk=1100 keys.*Sk <= 1024"),     # the standard plan
    (((1, 8, 16), (1, 8, 16), (1, 8, 600)), r"value dim Dv=600.*Dv <= 511"),
])
def test_shapes_beyond_the_kernel_are_errors_naming_the_limit(shape, match):
    nodes = [harness.inp(i, s, F32) for i, s in enumerate(shape)]
    with pytest.raises(UnsupportedOpError, match=match):
        harness.compile_kernels(nodes, [ir.Kernel("attention", [attention(*nodes)])])
