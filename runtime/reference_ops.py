"""The semantics of every opcode, as numpy code: one function per row of isa/opcodes.py TABLE.

Each function takes the Machine (runtime/reference.py) and the instruction, reads its operands with
`m.read`, computes exactly what the table's `semantics` string and isa/spec_intro.md say, and
stores with `m.write`. Values are computed in fp32 numpy arrays: one numpy float32 operation is one
IEEE binary32 operation rounded to nearest even, which is the machine's arithmetic. Sequential
folds are written as loops, because numpy's own reductions sum pairwise, in a different order.

An instruction reads all of its operands before it writes any, so an operand that is both read
and written (accumulate, in-place elementwise) sees its old values.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trnc.errors import ExecutionError, TrncError
from trnc.isa.dtypes import MX_BLOCK, DType
from trnc.isa.enums import AluOp, ReduceOp, Rounding
from trnc.isa.opcodes import BY_NAME
from trnc.runtime.convert import from_fp32, sr_rand, to_fp32, uniform_draws
from trnc.runtime.fp32math import ACTIVATIONS, ALU, REDUCE
from trnc.runtime.mx import quantize_mx, scale_pow2_f64

SEMANTICS: dict[str, Callable] = {}


def semantics(name: str):
    """Register the function as the semantics of opcode `name` (which must be in the table)."""
    if name not in BY_NAME:
        raise ValueError(f"'{name}' is not an opcode of isa/opcodes.py")

    def register(fn):
        SEMANTICS[name] = fn
        return fn
    return register


# -- operand helpers ------------------------------------------------------------------------------

def _f32(m, ap) -> np.ndarray:
    """fp32(x) of every element of `ap`, as [P, F] in (p, e) order."""
    return to_fp32(m.read(ap), ap.dtype).reshape(ap.partitions, -1)


def _put(m, ap, y: np.ndarray, **rounding) -> None:
    """dst = convert(y, dst.dtype) for fp32 values y in (p, e) order."""
    m.write(ap, from_fp32(np.asarray(y, dtype=np.float32).reshape(ap.partitions, -1), ap.dtype, **rounding))


def _move(m, dst, src_raw: np.ndarray, src_dtype: DType) -> None:
    """dst = src: the bits when the dtypes are equal, else convert(fp32(src), dst.dtype)."""
    if src_dtype is dst.dtype:
        m.write(dst, src_raw.reshape(dst.partitions, -1))
    else:
        _put(m, dst, to_fp32(src_raw, src_dtype))


def _per_partition(m, ap, immediate: float) -> np.ndarray:
    """A per-partition operand as fp32 [P, 1]: read from `ap` when present, else the fp32 immediate."""
    if ap is not None:
        return _f32(m, ap).reshape(-1, 1)
    return np.full((1, 1), immediate, dtype=np.float32)


def _fold(op: Callable, x: np.ndarray) -> np.ndarray:
    """Fold the columns of x [n, k] left to right, starting from column 0: acc = op(acc, x[:, j])."""
    acc = x[:, 0]
    for j in range(1, x.shape[1]):
        acc = op(acc, x[:, j])
    return acc


def _affine(ap, base: int, partition_step: int, steps: tuple[int, ...]) -> np.ndarray:
    """base + p * partition_step + sum(i_j * steps_j) over the free dims of `ap`, wrapped to int32, [P, F].

    Computed exactly in int64 (every term is far below 2^63), then reduced modulo 2^32, which is
    what int32 wrapping arithmetic gives. Steps beyond the AP's free dims multiply no index.
    """
    v = np.zeros((), dtype=np.int64)
    for (_, count), step in zip(ap.dims, steps):
        v = v[..., None] + np.arange(count, dtype=np.int64) * step
    v = base + np.arange(ap.partitions, dtype=np.int64)[:, None] * partition_step + v.reshape(1, -1)
    return ((v + 2**31) % 2**32 - 2**31).astype(np.int32)


# -- DMA ------------------------------------------------------------------------------------------

@semantics("dma_copy")
def dma_copy(m, ins) -> None:
    _move(m, ins["dst"], m.read(ins["src"]), ins["src"].dtype)


@semantics("dma_gather")
def dma_gather(m, ins) -> None:
    table_ap, dst = ins["table"], ins["dst"]
    table = m.read(table_ap).reshape(table_ap.partitions, -1)
    rows = m.read(ins["index"]).reshape(-1).astype(np.int64)
    bad = np.flatnonzero((rows < 0) | (rows >= table_ap.partitions))
    if bad.size:
        p = int(bad[0])
        raise ExecutionError(f"gather index {rows[p]} at partition {p} is outside the table's rows "
                             f"[0, {table_ap.partitions})")
    m.write(dst, table[rows])


# -- TensorE --------------------------------------------------------------------------------------

def _row_groups(m, ap, groups: bool) -> np.ndarray:
    """fp32 operand [K, R, X]: R row groups from the first free dim when `groups`, else R = 1."""
    x = to_fp32(m.read(ap), ap.dtype)
    r = ap.free_shape[0] if groups else 1
    return x.reshape(ap.partitions, r, -1)


def _initial_acc(m, ins) -> np.ndarray:
    dst = ins["dst"]
    if ins["accumulate"]:
        return _f32(m, dst)
    return np.zeros((dst.partitions, dst.free_size), dtype=np.float32)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fp32(a * b + c) rounded once (IEEE 754 fusedMultiplyAdd) for fp32 arrays that broadcast.

    a * b is exact in float64 (48 significant bits, exponents well inside its range). The sum rounds in
    float64; TwoSum gives its exact error, and an inexact sum with an even last bit moves one float64 ulp
    toward the error: that is the sum rounded to odd, from which one RNE rounding to fp32 is the correctly
    rounded result (Boldo and Melquiond: 53 >= 24 + 2 bits). Inf and NaN pass through float64 as they are."""
    with np.errstate(all="ignore"):   # Inf and NaN are IEEE results here, not warnings
        p = a.astype(np.float64) * b.astype(np.float64)
        c = np.asarray(c, np.float64)
        s = np.asarray(p + c)
        t = s - p
        err = (p - (s - t)) + (c - t)
        bits = s.view(np.int64)
        inexact = (err != 0) & np.isfinite(err) & ((bits & 1) == 0)
        toward_err = np.where((err > 0) == (s > 0), 1, -1)   # +1 on the bits is away from zero
        return (bits + np.where(inexact, toward_err, 0)).view(np.float64).astype(np.float32)


@semantics("matmul")
def matmul(m, ins) -> None:
    """for r, for k: acc = fma(s[k, r, m], v[k, r, n], acc) rounded once to fp32, over all (m, n) at once."""
    s = _row_groups(m, ins["stationary"], ins["double_row"])
    v = _row_groups(m, ins["moving"], ins["double_row"])
    acc = _initial_acc(m, ins)
    for r in range(s.shape[1]):
        for k in range(s.shape[0]):
            acc = fma_f32(s[k, r][:, None], v[k, r][None, :], acc)
    _put(m, ins["dst"], acc)


@semantics("matmul_mx")
def matmul_mx(m, ins) -> None:
    """Per row group r and block b of 32 partitions: part = fp32 sum from +0.0 of the exact products in
    partition order; acc = fp32(acc + fp32(f64(part) * 2^(ss + sv - 254)))."""
    st, mv = ins["stationary"], ins["moving"]
    s, v = _row_groups(m, st, len(st.dims) == 2), _row_groups(m, mv, len(mv.dims) == 2)
    groups = s.shape[1]
    ss = m.read(ins["stationary_scale"]).reshape(st.partitions // MX_BLOCK, groups, -1)
    sv = m.read(ins["moving_scale"]).reshape(mv.partitions // MX_BLOCK, groups, -1)
    acc = _initial_acc(m, ins)
    for r in range(groups):
        for b in range(st.partitions // MX_BLOCK):
            part = np.zeros_like(acc)
            for k in range(b * MX_BLOCK, (b + 1) * MX_BLOCK):
                part = part + np.multiply.outer(s[k, r], v[k, r])
            factor = scale_pow2_f64(ss[b, r][:, None], sv[b, r][None, :])
            acc = acc + (part.astype(np.float64) * factor).astype(np.float32)
    _put(m, ins["dst"], acc)


@semantics("transpose")
def transpose(m, ins) -> None:
    src, dst = ins["src"], ins["dst"]
    raw = m.read(src).reshape(src.partitions, -1).T
    _move(m, dst, np.ascontiguousarray(raw), src.dtype)


# -- ScalarE, VectorE, GpSimdE: elementwise ---------------------------------------------------------

@semantics("activation")
def activation(m, ins) -> None:
    """y = func(fp32(fp32(x * scale) + bias)); accum[p] = fp32 sum of y from +0.0 in free order."""
    x = _f32(m, ins["src"])
    scale = _per_partition(m, ins["scale_ap"], ins["scale"])
    bias = _per_partition(m, ins["bias_ap"], ins["bias"])
    y = ACTIVATIONS[ins["func"]]((x * scale) + bias)
    _put(m, ins["dst"], y)
    if ins["accum"] is not None:
        acc = _fold(REDUCE[ReduceOp.SUM], np.concatenate([np.zeros((y.shape[0], 1), np.float32), y], axis=1))
        _put(m, ins["accum"], acc)


@semantics("tensor_tensor")
def tensor_tensor(m, ins) -> None:
    _put(m, ins["dst"], ALU[ins["op"]](_f32(m, ins["in0"]), _f32(m, ins["in1"])))


def _apply(op: AluOp, x: np.ndarray, scalar: np.ndarray, reverse: bool) -> np.ndarray:
    s = np.broadcast_to(scalar, x.shape)
    return ALU[op](s, x) if reverse else ALU[op](x, s)


@semantics("tensor_scalar")
def tensor_scalar(m, ins) -> None:
    t = _f32(m, ins["src"])
    t = _apply(ins["op0"], t, _per_partition(m, ins["scalar0_ap"], ins["scalar0"]), ins["reverse0"])
    t = _apply(ins["op1"], t, _per_partition(m, ins["scalar1_ap"], ins["scalar1"]), ins["reverse1"])
    _put(m, ins["dst"], t)


@semantics("tensor_copy")
def tensor_copy(m, ins) -> None:
    src, dst = ins["src"], ins["dst"]
    if src.dtype is dst.dtype or ins["rounding"] is Rounding.RNE:
        _move(m, dst, m.read(src), src.dtype)
        return
    rand = sr_rand(ins["seed"], dst.partitions, dst.free_size)
    _put(m, dst, _f32(m, src), rounding=Rounding.SR, rand=rand)


@semantics("memset")
def memset(m, ins) -> None:
    dst = ins["dst"]
    _put(m, dst, np.full((dst.partitions, dst.free_size), ins["value"], dtype=np.float32))


@semantics("select")
def select(m, ins) -> None:
    pred = _f32(m, ins["pred"])
    _put(m, ins["dst"], np.where(pred != 0, _f32(m, ins["on_true"]), _f32(m, ins["on_false"])))


@semantics("tensor_reduce")
def tensor_reduce(m, ins) -> None:
    """Reduce the free dims named by the `axes` bits, folding each group in row-major order."""
    src = ins["src"]
    ndim = len(src.dims)
    reduced = [j for j in range(ndim) if ins["axes"] >> j & 1]
    if ins["axes"] >> ndim:
        raise TrncError(f"tensor_reduce axes {ins['axes']:#b} names a free dim beyond the {ndim} of src")
    kept = [j for j in range(ndim) if j not in reduced]
    x = to_fp32(m.read(src), src.dtype)
    x = x.transpose(0, *(1 + j for j in kept), *(1 + j for j in reduced))
    groups = x.reshape(-1, int(np.prod([src.dims[j][1] for j in reduced], dtype=np.int64)))
    _put(m, ins["dst"], _fold(REDUCE[ins["op"]], groups))


# -- GpSimdE --------------------------------------------------------------------------------------

@semantics("iota")
def iota(m, ins) -> None:
    """The int32 expression, stored exactly into int32 and through fp32 into any other dtype."""
    dst = ins["dst"]
    v = _affine(dst, ins["base"], ins["partition_step"], ins["steps"])
    if dst.dtype is DType.INT32:
        m.write(dst, v)
    else:
        _put(m, dst, to_fp32(v, DType.INT32))


@semantics("random")
def random(m, ins) -> None:
    """Uniform draws: the top 24 bits of R(k, 0, v) over 2^24, with k = R(seed, stream, 0) and v the counter."""
    dst = ins["dst"]
    seed = int(m.read(ins["seed"]).reshape(-1).view(np.uint32)[0])
    v = _affine(dst, ins["base"], ins["partition_step"], ins["steps"])
    m.write(dst, uniform_draws(seed, ins["stream"], v))


# The comparisons affine_select may use, on the exact int32 value of its expression.
INT_COMPARE = {AluOp.EQ: np.equal, AluOp.NE: np.not_equal, AluOp.LT: np.less, AluOp.LE: np.less_equal,
               AluOp.GT: np.greater, AluOp.GE: np.greater_equal}


@semantics("affine_select")
def affine_select(m, ins) -> None:
    """dst = fp32(src) where cmp(expression, 0) else fill; the expression runs over dst's free dims."""
    dst, cmp = ins["dst"], ins["cmp"]
    if cmp not in INT_COMPARE:
        raise TrncError(f"affine_select cmp must be a comparison ({', '.join(c.text for c in INT_COMPARE)}), "
                        f"not {cmp.text}")
    v = _affine(dst, ins["base"], ins["partition_step"], ins["steps"])
    keep = INT_COMPARE[cmp](v, 0)
    _put(m, dst, np.where(keep, _f32(m, ins["src"]), np.float32(ins["fill"])))


@semantics("partition_reduce")
def partition_reduce(m, ins) -> None:
    """dst[0, f] = fold over partitions 0..P-1 of fp32(src[p, f])."""
    _put(m, ins["dst"], _fold(REDUCE[ins["op"]], _f32(m, ins["src"]).T).reshape(1, -1))


@semantics("partition_broadcast")
def partition_broadcast(m, ins) -> None:
    src, dst = ins["src"], ins["dst"]
    row = m.read(src).reshape(1, -1)
    _move(m, dst, np.repeat(row, dst.partitions, axis=0), src.dtype)


@semantics("quantize_mx")
def quantize_mx_op(m, ins) -> None:
    dst = ins["dst"]
    codes, scales = quantize_mx(_f32(m, ins["src"]), dst.dtype, ins["scale_mode"])
    m.write(dst, codes)
    m.write(ins["scale"], scales.view(DType.E8M0.storage))
