"""legalize rules of matmuls and attention (registered in passes/graph/legalize_table.py's `pm_legalize`)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trnc import ir
from trnc.isa.dtypes import DType
from trnc.passes.tile.kernels import attention as attention_kernel
from trnc.passes.tile.kernels.matmul_plan import on_vector_engines
from trnc.passes.graph.legalize_index import EXACT_FP32, exact_index
from trnc.passes.graph.legalize_table import Unusable, pm_whole, rule

if TYPE_CHECKING:
    from trnc.passes.graph.legalize import Rewriter


def _matmul(rw: Rewriter, a: ir.Node, b: ir.Node, dtype: DType, epilogue=None, scaled: bool = False) -> ir.Node:
    """torch.matmul: 1-D operands get a unit dim (removed again), batch dims broadcast; an empty contraction
    gives zeros. `epilogue(product, **arith)` (addmm's and linear's bias) applies before the product is rounded to
    `dtype`: TensorE's kernel adds it to the fp32 sum in PSUM, so the vector engines' form adds it in fp32 too
    (it added it after the cast: a bf16 linear whose products cancel its bias lost all its digits; seed
    222001033). A `scaled` epilogue (alpha or beta not 1), which TensorE's kernel does not fuse, takes the product
    and beta * bias in fp32 too: in bf16, addmm's result was their roundings where the bias cancels the products."""
    epilogue = epilogue or (lambda x, **arith: x)
    a2 = rw.reshape(a, (1,) + a.shape) if len(a.shape) == 1 else a
    b2 = rw.reshape(b, b.shape + (1,)) if len(b.shape) == 1 else b
    batch = tuple(torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    (m, k), n = a2.shape[-2:], b2.shape[-1]
    shape = batch + (m, n)
    if k == 0:
        out = epilogue(rw.filled(0, shape, dtype))
    elif on_vector_engines(math.prod(batch), m, k, n):
        out = rw.cast(epilogue(_outer_products(rw, a2, b2), dtype=DType.FP32, keep_fp32=True), dtype)
    elif scaled:
        product = rw.emit("matmul", (a2, b2), shape, DType.FP32, keep_fp32=True)
        out = rw.cast(epilogue(product, dtype=DType.FP32, keep_fp32=True), dtype)
    else:
        out = epilogue(rw.emit("matmul", (a2, b2), shape, dtype))
    shape = out.shape[:-2] + out.shape[-2:-1] * (len(a.shape) > 1) + out.shape[-1:] * (len(b.shape) > 1)
    return rw.reshape(out, shape)


def _outer_products(rw: Rewriter, a: ir.Node, b: ir.Node) -> ir.Node:
    """a @ b in fp32 as the sum over k, in order, of the outer products a[..., :, k] b[..., k, :]: one elementwise
    chain, whose products and partial sums are `keep_fp32` (precision never narrows them, as TensorE keeps them in
    PSUM, and rounds the operands of the `outer_product` nodes to the matmul's operand dtype), even where fusion
    splits the chain. It adds in TensorE's order, k = 0..K-1 in fp32, so where
    the products are exact in fp32 (bf16 and fp8 operands) it gives TensorE's bits; fp32 products are rounded
    before their add, where TensorE's multiply-add is fused: one more rounding per step, within an fp32 matmul's
    error bound."""
    rows = len(b.shape) - 2
    total = None
    for k in range(a.shape[-1]):
        term = rw.binary("mul", rw.slice(a, len(a.shape) - 1, k, k + 1), rw.slice(b, rows, k, k + 1), DType.FP32,
                         keep_fp32=True, outer_product=True)
        total = term if total is None else rw.binary("add", total, term, DType.FP32, keep_fp32=True)
    return total


def _scaled_add(rw: Rewriter, product: ir.Node, bias, beta, alpha, **arith) -> ir.Node:
    """beta * bias + alpha * product, skipping the factors that are 1 (addmm, baddbmm, linear); `arith`: the
    dtype and attributes of the arithmetic nodes (fp32 and `keep_fp32` where _matmul's epilogue is `scaled`)."""
    if alpha != 1:
        product = rw.scalar(product, "mul", alpha, **arith)
    if bias is None or beta == 0:
        return product
    if beta != 1:
        bias = rw.scalar(bias, "mul", beta, **arith)
    return rw.binary("add", product, bias, **arith)


def _batch_of(x: ir.Node) -> tuple[ir.Node, tuple[int, ...]] | None:
    """For a bmm operand that flattens the batch dims of a tensor (through an expand of its batch dims only, if
    any): that tensor before the expand, and the flattened batch shape."""
    if x.op != "reshape" or len(x.shape) != 3 or x.inputs[0].shape[-2:] != x.shape[-2:]:
        return None
    src = x.inputs[0]
    before = src.inputs[0] if src.op == "expand" else src
    return (before, src.shape[:-2]) if before.shape[-2:] == x.shape[-2:] else None


def _before_broadcast(x: ir.Node, y: ir.Node) -> tuple[ir.Node, ir.Node] | None:
    """For bmm operands that flatten the same batch shape, at least one through an expand: the tensors before
    the expands, if their broadcast batch is that shape."""
    bx, by = _batch_of(x), _batch_of(y)
    if not (bx and by) or bx[1] != by[1] or not any(v.inputs[0].op == "expand" for v in (x, y)):
        return None
    return (bx[0], by[0]) if tuple(torch.broadcast_shapes(bx[0].shape[:-2], by[0].shape[:-2])) == bx[1] else None


# torch's table spells mv as a product and a sum in fp32, which auto_cast="all" narrows like any intermediate:
# products rounded to bf16 before the sum (a matvec whose 41 terms cancel from 428 to -3 lost 0.2; seed
# 222005423). Whole, it is a matmul: exact products, accumulated in fp32.
pm_whole.add("aten.mv.default")


@rule("aten.mm.default", "aten.bmm.default", "aten.matmul.default", "aten.mv.default")
def _mm(rw: Rewriter, n, a):
    """aten's matmul decomposition expands both operands to the broadcast batch shape and flattens them into a
    bmm; the flattening of an expanded weight is no view, so a bmm of two such operands is the broadcasting
    matmul of the tensors before the expands (a weight of 5 x 511 x 512 broadcast over 93 batches was 486 MB
    copied to HBM and a schedule that took minutes; seed 303000141)."""
    x, y = a["input"], a.get("mat2", a.get("other", a.get("vec")))
    unexpanded = _before_broadcast(x, y) if n.op == "aten.bmm.default" else None
    if unexpanded:
        return rw.reshape(_matmul(rw, *unexpanded, n.dtype), n.shape)
    return _matmul(rw, x, y, n.dtype)


@rule("aten.addmm.default", "aten.baddbmm.default")
def _addmm(rw: Rewriter, n, a):
    x, y = (a["mat1"], a["mat2"]) if "mat1" in a else (a["batch1"], a["batch2"])
    scaled = a["alpha"] != 1 or a["beta"] not in (0, 1)
    return _matmul(rw, x, y, n.dtype, lambda p, **arith: _scaled_add(rw, p, a["input"], a["beta"], a["alpha"], **arith),
                   scaled)


@rule("aten.linear.default")
def _linear(rw: Rewriter, n, a):
    weight = a["weight"]
    weight_t = rw.permute(weight, (1, 0)) if len(weight.shape) == 2 else weight
    return _matmul(rw, a["input"], weight_t, n.dtype, lambda p, **arith: _scaled_add(rw, p, a["bias"], 1, 1, **arith))


@rule("transformers.grouped_mm_fallback.default")
def _grouped_mm(rw: Rewriter, n, a):
    """transformers' grouped matmul of a mixture of experts (its fallback kernel, which models call on the CPU and
    under torch.compile outside bf16): rows start:end of `input` [S, D] (sorted by expert) times `weight[e]` [D, O],
    where end runs through `offs` [E] (cumulative counts) and start is the previous end (0 first), as Python slices
    (a negative bound counts from S); rows in no range stay zero, and a later expert's range overwrites an earlier.
    The ranges are values and the shapes static, so every expert multiplies every row, in one matmul by the
    experts' weights side by side ([D, E * O]), and each expert's range selects its rows: E times the grouped
    kernel's work, as the modeled time shows, with each row's products those of eager's matmul."""
    x, weight, offs = a["input"], a["weight"], a["offs"]
    (s, d), (e, _, o) = x.shape, weight.shape
    if s >= EXACT_FP32:
        rw.fail(f"of {s} rows is not supported: row numbers above 2^24 are not exact in fp32")
    side_by_side = rw.reshape(rw.permute(weight, (1, 0, 2)), (d, e * o))
    products = rw.reshape(_matmul(rw, x, side_by_side, n.dtype), (s, e, o))
    # row numbers and bounds in fp32, kept so under auto_cast "all" (bf16 holds integers exactly only to 256); a
    # bound past +-2^24 rounds but stays past +-S, selecting the same rows
    rows = exact_index(rw.const(torch.arange(s, dtype=torch.float32).reshape(s, 1), DType.FP32))
    offs = rw.cast(offs, DType.FP32)
    bounds = exact_index(rw.where(rw.scalar(offs, "lt", 0), rw.scalar(offs, "add", s, dtype=DType.FP32), offs,
                                  DType.FP32))
    out, start = rw.filled(0, (s, o), n.dtype), None
    for i in range(e):
        end = rw.slice(bounds, 0, i, i + 1)
        inside = rw.binary("lt", rows, end)
        if start is not None:
            inside = rw.binary("and", inside, rw.binary("ge", rows, start))
        out = rw.where(inside, rw.reshape(rw.slice(products, 1, i, i + 1), (s, o)), out, n.dtype)
        start = end
    return out


def _repeat_heads(rw: Rewriter, x: ir.Node, heads: int) -> ir.Node:
    """[..., Hk, S, D] -> [..., heads, S, D], kv head h serving query heads h*r .. h*r+r-1 (torch's enable_gqa)."""
    *batch, hk, s, d = x.shape
    if heads % hk:
        rw.fail(f"with {heads} query heads and {hk} key/value heads is not supported: the counts must divide")
    r = heads // hk
    x = rw.expand(rw.reshape(x, (*batch, hk, 1, s, d)), (*batch, hk, r, s, d))
    return rw.reshape(x, (*batch, heads, s, d))


def _attention(rw: Rewriter, n, a, shape, dtype):
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if a["dropout_p"]:
        rw.fail(f"with dropout_p={a['dropout_p']} is not supported; call model.eval() (dropout_p must be 0)")
    if len(q.shape) >= 3 and k.shape[-3] != q.shape[-3]:
        k, v = _repeat_heads(rw, k, q.shape[-3]), _repeat_heads(rw, v, q.shape[-3])
    if mask is not None and mask.dtype is DType.UINT8:   # bool: True attends
        zero, minus_inf = rw.scalar_const(0.0, DType.FP32), rw.scalar_const(-math.inf, DType.FP32)
        mask = rw.where(mask, zero, minus_inf, DType.FP32)
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    staged = mask is not None or (bool(a["is_causal"]) and scale <= 0)
    if attention_kernel.beyond_limits(q.shape[-1], v.shape[-1], k.shape[-2], staged):
        return _unfused_attention(rw, q, k, v, mask, float(scale), bool(a["is_causal"]), dtype)
    inputs = (q, k, v) + ((mask,) if mask is not None else ())
    return rw.emit("attention", inputs, shape, dtype, scale=float(scale), causal=bool(a["is_causal"]),
                   has_mask=mask is not None)


def _unfused_attention(rw: Rewriter, q, k, v, mask, scale: float, causal: bool, dtype: DType) -> ir.Node:
    """softmax(scale * q k^T + mask) v as two matmuls and a softmax, as torch's math backend computes it, for the
    shapes the fused kernel cannot take (a head dim over 128, more than its keys). Scores are fp32."""
    rank = len(k.shape)
    kt = rw.permute(k, (*range(rank - 2), rank - 1, rank - 2))
    scores = rw.scalar(_matmul(rw, q, kt, DType.FP32), "mul", scale, dtype=DType.FP32)
    if causal:   # top-left aligned: query i sees keys j <= i
        sq, sk = q.shape[-2], k.shape[-2]
        above = torch.ones(sq, sk, dtype=torch.bool).triu(1)
        scores = rw.binary("add", scores, rw.const(torch.zeros(sq, sk).masked_fill(above, -math.inf), DType.FP32),
                           DType.FP32)
    if mask is not None:
        scores = rw.binary("add", scores, mask, DType.FP32)
    weights = rw.emit("softmax", (scores,), scores.shape, q.dtype)
    return _matmul(rw, weights, v, dtype)


@rule("aten.scaled_dot_product_attention.default", whole=True)
def _sdpa(rw: Rewriter, n, a):
    return _attention(rw, n, a, n.shape, n.dtype)


@rule("aten._scaled_dot_product_flash_attention_for_cpu.default", whole=True)
def _sdpa_flash(rw: Rewriter, n, a):
    shape, dtype = n.attrs["outputs"][0]
    return [_attention(rw, n, a, shape, dtype), Unusable("logsumexp")]
