"""The op proposals of the generator: for each op family, a function that picks operands and attrs on a
Builder (generate.py) and adds the op, returning its node index or None when nothing fitting was found.

PROPOSERS weights the families; elementwise ops and views are cheap and common in models, contractions,
norms and attention are where the tiling is, so every family gets a fair share of the programs.
"""
from __future__ import annotations

import math

import torch

from .ops import BINARY, COMPARE, SOFTMAX, UNARY
from .reference import MAX_ELEMENTS

SCALARS = (0.5, -0.5, 1.0, 2.0, -1.5, 0.25, 3.0, 0.1, -2.0)
THRESHOLDS = tuple((k + 0.5) / 8 for k in range(-12, 12)) + (0.0,)   # off the 1/8 grid of draw.py, and 0
EXPONENTS = (2, 3, 0.5, -0.5, -1, 1, 0, 1.5, -1.5, 2.5, 0.25, -2)
EPS = (1e-5, 1e-6, 1e-3)


def unary(b):
    fn = b.choice(tuple(UNARY) + ("gelu", "gelu_tanh"))
    x = b.pick_float()
    if fn in ("log", "sqrt", "rsqrt", "log2", "log10", "lgamma", "digamma", "bessel_k0", "bessel_k1", "bessel_k0e",
              "bessel_k1e", "trigamma"):
        x = b.positive(x)
    elif fn == "reciprocal":
        x = b.nonzero(x)
    elif fn in ("exp", "exp2", "sinh", "cosh"):
        x = b.bounded(x, 8.0)
    elif fn in ("asin", "acos", "atanh"):
        x = b.bounded(x, 0.9)
    return b.op(fn, [x], form=b.form())


def scalar(b):
    fn, flip, c = b.choice("+-*/"), b.chance(0.3), b.choice(SCALARS)
    x = b.pick_float()
    if fn == "/" and flip:
        x = b.nonzero(x)
    return b.op("scalar", [x], fn=fn, c=c, flip=flip)


def pow_scalar(b):
    e = b.choice(EXPONENTS)
    x = b.pick_float()
    x = x if e in (0, 1, 2, 3) else b.positive(x)
    return b.op("pow_scalar", [b.bounded(x, 6.0) if e in (2, 3, 2.5) else x], e=e, form=b.form())


def clamp(b):
    lo = b.choice((None, -1.0, -0.5, 0.0, 0.25))
    hi = b.choice((0.5, 1.0, 2.0)) + (lo or 0.0) if lo is None or b.chance(0.6) else None
    return b.op("clamp", [b.pick_float()], lo=lo, hi=hi, form=b.form())


def binary(b):
    fn = b.choice(tuple(BINARY))
    a = b.pick_float()
    if a is None:
        return None
    other = b.partner(a) if b.chance(0.6) else None
    if other is not None:
        first, second = (other, a) if b.chance(0.3) else (a, other)
        if fn == "div":
            second = b.nonzero(second)
        if fn == "pow":
            first, second = b.positive(first), b.bounded(second, 2.0)
        return b.op("binary", [first, second], fn=fn, form_b="value", flip=False, form=b.form())
    flip = b.chance(0.3)
    if fn == "div" and flip:
        a = b.nonzero(a)
    if fn == "pow":
        a = b.bounded(a, 2.0) if flip else b.positive(a)
    rank = len(b.shape_of(a)) if a is not None else 0
    keep = tuple(b.chance(0.7) for _ in range(b.int(0, rank)))
    return b.op("binary", [a], fn=fn, form_b="param", flip=flip, keep=keep, pkind=b.choice(("normal", "grid")),
                form=b.form())


def compare(b):
    fn = b.choice(tuple(COMPARE))
    a = b.pick_float()
    if a is not None and b.chance(0.5):
        return b.op("compare", [a, b.partner(a)], fn=fn, form=b.form())
    return b.op("compare", [a], fn=fn, c=b.choice(THRESHOLDS), form=b.form())


def condition(b, like: int | None = None) -> int | None:
    """A bool value: an existing one (broadcasting with `like`), or a new comparison."""
    bools = b.values("bool")
    if like is not None:
        bools = [j for j in bools if _broadcasts(b, like, j)]
    if bools and b.chance(0.6):
        return b.pick(bools)
    return compare(b)


def _broadcasts(b, i: int, j: int) -> bool:
    try:
        return math.prod(torch.broadcast_shapes(b.shape_of(i), b.shape_of(j))) <= MAX_ELEMENTS
    except RuntimeError:
        return False


def logical(b):
    fn = b.choice(("and", "or", "xor", "not"))
    c = condition(b)
    if fn == "not":
        return b.op("logical", [c], fn=fn, form=b.form())
    return b.op("logical", [c, condition(b, c) if c is not None else None], fn=fn, form=b.form())


def where(b):
    c = condition(b)
    if c is None:
        return None
    a = b.partner(c)
    if b.chance(0.5):
        return b.op("where", [c, a, b.partner(a) if a is not None else None])
    return b.op("where", [c, a], s=b.choice(SCALARS + (0.0,)), form=b.form())


def reduce(b):
    fn = b.choice(("sum", "mean", "amax", "amin", "max", "min"))
    x = b.pick_float()
    if x is None:
        return None
    dims = b.dims(len(b.shape_of(x)), single=fn in ("max", "min"))
    return b.op("reduce", [x], fn=fn, dims=dims, keepdim=b.chance(0.4), form=b.form())


def arg(b):
    x = b.pick_float()
    if x is None:
        return None
    rank = len(b.shape_of(x))
    dim = None if b.chance(0.2) else b.dims(rank, single=True)
    return b.op("arg", [x], fn=b.choice(("argmax", "argmin")), dim=dim, keepdim=b.chance(0.4), form=b.form())


def _order_dim(b, x) -> int:
    rank = len(b.shape_of(x))
    return b.int(-max(rank, 1), max(rank, 1) - 1)


def sort(b):
    x = b.pick_float()
    if x is None:
        return None
    return b.op("sort", [x], dim=_order_dim(b, x), descending=b.chance(0.5), out=b.choice(("values", "indices")),
                form=b.form())


def topk(b):
    x = b.pick_float(min_rank=1)
    if x is None:
        return None
    dim = _order_dim(b, x)
    size = b.shape_of(x)[dim]
    return b.op("topk", [x], k=b.int(1, min(size, 8)), dim=dim, largest=b.chance(0.6),
                out=b.choice(("values", "indices")), form=b.form())


def gather(b):
    """x gathered along a dim by the indices of an ordering of a value of x's shape (x itself, or another):
    argmax/argmin with keepdim, sort's or top-k's indices."""
    x = b.pick_float(min_rank=1)
    if x is None:
        return None
    shape = b.shape_of(x)
    same = [j for j in b.values("float") if b.shape_of(j) == shape]
    y = b.pick(same) if b.chance(0.5) else x
    dim = _order_dim(b, x)
    way = b.int(0, 2)
    if way == 0:
        index = b.op("arg", [y], fn=b.choice(("argmax", "argmin")), dim=dim, keepdim=True, form=b.form())
    elif way == 1:
        index = b.op("sort", [y], dim=dim, descending=b.chance(0.5), out="indices", form=b.form())
    else:
        index = b.op("topk", [y], k=b.int(1, min(shape[dim], 8)), dim=dim, largest=b.chance(0.5), out="indices",
                     form=b.form())
    return b.op("gather", [x, index], dim=dim, form=b.form())


def cumsum(b):
    x = b.pick_float()
    if x is None:
        return None
    return b.op("cumsum", [x], dim=_order_dim(b, x), form=b.form())


def var(b):
    x = b.pick_float(min_rank=1)
    if x is None:
        return None
    return b.op("var", [x], fn=b.choice(("var", "std")), dims=b.dims(len(b.shape_of(x))), keepdim=b.chance(0.4),
                correction=b.choice((0, 1)), form=b.form())


def count(b):
    c = condition(b)
    if c is None:
        return None
    return b.op("count", [c], dims=b.dims(len(b.shape_of(c)), single=True))


def softmax(b):
    x = b.pick_float()
    if x is None:
        return None
    rank = len(b.shape_of(x))
    dim = b.int(-max(rank, 1), max(rank, 1) - 1)
    return b.op("softmax", [x], fn=b.choice(tuple(SOFTMAX)), dim=dim, form=b.form())


def layer_norm(b):
    x = b.pick_float(min_rank=1)
    if x is None:
        return None
    k = b.int(1, min(2, len(b.shape_of(x))))
    if b.chance(0.5):
        return b.op("layer_norm", [x], k=k, affine=b.choice(("none", "weight", "both")), eps=b.choice(EPS))
    if b.chance(0.5):
        return b.op("rms_norm", [x], k=k, weight=b.chance(0.7), eps=b.choice(EPS))
    return rms_norm_written_out(b, x)


def rms_norm_written_out(b, x: int) -> int | None:
    """x * rsqrt(mean(x^2, -1) + eps) * w, as models write it."""
    squared = b.op("square", [x], form=b.form()) if b.chance(0.5) else b.op("pow_scalar", [x], e=2, form=0)
    mean = b.op("reduce", [squared], fn="mean", dims=-1, keepdim=True, form=b.form())
    scale = b.op("rsqrt", [b.op("scalar", [mean], fn="+", c=b.choice(EPS), flip=False)], form=b.form())
    y = b.op("binary", [x, scale], fn="mul", form_b="value", flip=False, form=b.form())
    if b.chance(0.6):
        return b.op("binary", [y], fn="mul", form_b="param", flip=False, keep=(True,), pkind="normal", form=0)
    return y


def matmul(b):
    a = b.pick_float(min_rank=1)
    if a is None:
        return None
    shape = b.shape_of(a)
    form_b = b.choice(("param", "value", "self"), p=(0.5, 0.3, 0.2))
    if form_b == "self" and len(shape) >= 2:
        return b.op("matmul", [a], form_b="self", form=b.form())
    if form_b == "value":
        right = _matmul_partner(b, a)
        if right is not None:
            return b.op("matmul", [a, right], form_b="value", form=b.form())
    left = len(shape) >= 2 and b.chance(0.25)
    return b.op("matmul", [a], form_b="param", n=b.size(), batch=b.int(0, max(len(shape) - 2, 0)), left=left,
                form=b.form())


def _matmul_partner(b, a: int) -> int | None:
    """A value that can be x's right operand: [..., K, N] (or [K]) with broadcasting batch dims, or a new input."""
    shape = b.shape_of(a)
    k = shape[-1]

    def fits(j: int) -> bool:
        s = b.shape_of(j)
        if len(s) == 1:
            return s[0] == k
        try:
            torch.broadcast_shapes(shape[:-2], s[:-2])
        except RuntimeError:
            return False
        return s[-2] == k
    found = [j for j in b.values("float", min_rank=1) if fits(j) and b.metas[j].dtype == b.metas[a].dtype]
    if found and b.chance(0.7):
        return b.pick(found)
    return b.input((k, b.size()) if b.chance(0.8) else (k,), b.dtype_name(a))


def bmm(b):
    a = b.pick_float(min_rank=3, max_rank=3)
    if a is None:
        return None
    batch, _, k = b.shape_of(a)
    if b.chance(0.2):
        return b.op("bmm", [a], form_b="self")
    found = [j for j in b.values("float", 3, 3) if b.shape_of(j)[0] == batch and b.shape_of(j)[1] == k
             and b.metas[j].dtype == b.metas[a].dtype]
    if found and b.chance(0.4):
        return b.op("bmm", [a, b.pick(found)], form_b="value")
    return b.op("bmm", [a], form_b="param", n=b.size(), batch=1)


def linear(b):
    return b.op("linear", [b.pick_float(min_rank=1)], n=b.size(), bias=b.chance(0.6))


def sdpa(b):
    q = b.pick_float(min_rank=2)
    if q is None:
        return None
    shape = b.shape_of(q)
    kv = b.choice(("self", "param", "values"), p=(0.4, 0.4, 0.2))
    args = [q]
    sk = b.size() if kv == "param" else shape[-2]
    if kv == "values":
        same = [j for j in b.values("float", len(shape), len(shape))
                if b.shape_of(j)[:-2] == shape[:-2] and b.shape_of(j)[-1] == shape[-1]
                and b.metas[j].dtype == b.metas[q].dtype]
        kv_value = b.pick(same)
        if kv_value is None:
            kv = "self"
        else:
            args += [kv_value, kv_value]
            sk = b.shape_of(kv_value)[-2]
    mask = b.choice(("none", "arg", "param"), p=(0.5, 0.3, 0.2))
    if mask == "arg":
        bool_mask = b.chance(0.6)
        mask_shape = (shape[-2], sk) if b.chance(0.7) else (*shape[:-2], shape[-2], sk)
        made = b.input(mask_shape, "bool", "mask") if bool_mask else b.input(mask_shape, b.dtype_name(q), "normal")
        if made is None:
            mask = "none"
        else:
            args.append(made)
    causal = mask == "none" and b.chance(0.4)
    return b.op("sdpa", args, kv=kv, mask=mask, causal=causal, scale=b.choice((None, None, 0.125, 0.5)), sk=sk,
                dv=b.size())


def attention_written_out(b):
    """softmax(q k^T * scale [+ mask]) v with separate ops."""
    q = b.pick_float(min_rank=2)
    if q is None:
        return None
    t = b.op("transpose", [q], d0=-2, d1=-1, form=b.form()) if b.chance(0.5) else b.op("mT", [q])
    scores = b.op("matmul", [q, t], form_b="value", form=b.form())
    d = b.shape_of(q)[-1]
    scaled = b.op("scalar", [scores], fn="*", c=1 / math.sqrt(d), flip=False)
    if scaled is not None and b.chance(0.4):
        scaled = b.op("binary", [scaled], fn="add", form_b="param", flip=False, keep=(True, True), pkind="normal")
    probs = b.op("softmax", [scaled], fn="softmax", dim=-1, form=b.form())
    return b.op("matmul", [probs, q], form_b="value", form=b.form())


def mlp(b):
    hidden = b.op("linear", [b.pick_float(min_rank=1)], n=b.size(), bias=b.chance(0.7))
    act = b.op(b.choice(("gelu", "relu", "silu", "gelu_tanh")), [hidden], form=b.form())
    return b.op("linear", [act], n=b.size(), bias=b.chance(0.7))


def residual_norm(b):
    x = b.pick_float(min_rank=1)
    normed = b.op("layer_norm", [x], k=1, affine="both", eps=1e-5)
    return b.op("binary", [x, normed], fn="add", form_b="value", flip=False, form=b.form())


def embedding(b):
    index = b.pick([i for i in b.values("index") if getattr(b.nodes[i], "kind", "") == "index"])
    if index is None or b.chance(0.3):
        rows = b.size()
        made = b.input(b.shape(b.int(0, 2), budget=4096), "int64", "index", rows)
        index = made if made is not None else index
    if index is None:
        return None
    rows = b.nodes[index].high
    tables = [j for j in b.values("float", 2, 2) if b.shape_of(j)[0] >= rows]
    if tables and b.chance(0.3):
        return b.op("embedding", [index, b.pick(tables)], table="value", form=b.form())
    return b.op("embedding", [index], table="param", rows=rows, d=b.size(), dtype=b.choice(("float32", "bfloat16")),
                form=b.form())


def cast(b):
    if b.chance(0.2):
        c = condition(b)
        return b.op("cast", [c], dtype=b.choice(("float32", "bfloat16")), form=b.form())
    x = b.pick_float()
    if x is None:
        return None
    targets = [d for d in ("float32", "bfloat16", "float16") if d != b.dtype_name(x)]
    return b.op("cast", [x], dtype=b.choice(targets), form=b.form())


def reshape(b):
    x = b.pick(b.values("any"))
    if x is None:
        return None
    shape = b.shape_of(x)
    way = b.int(0, 3)
    if way == 0 and len(shape) >= 1:
        start = b.int(0, len(shape) - 1)
        end = b.int(start, len(shape) - 1)
        return b.op("flatten", [x], start=start, end=end - len(shape) if b.chance(0.3) else end, form=b.form())
    if way == 1 and len(shape) >= 1:
        d = b.int(0, len(shape) - 1)
        factors = [f for f in range(1, min(shape[d], 64) + 1) if shape[d] % f == 0]
        f = b.choice(factors)
        return b.op("unflatten", [x], dim=d, sizes=(f, -1) if b.chance(0.5) else (-1, f))
    target = _factorization(b, math.prod(shape))
    if target and b.chance(0.4):
        k = b.int(0, len(target) - 1)
        target = target[:k] + (-1,) + target[k + 1:]
    return b.op("reshape", [x], shape=target, form=b.form())


def _factorization(b, n: int) -> tuple[int, ...]:
    """A random shape of n elements, rank 0 to 4 (rank 0 only for n == 1)."""
    primes, m, p = [], n, 2
    while m > 1 and p * p <= m:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    if m > 1:
        primes.append(m)
    rank = b.int(1 if n > 1 else 0, 4)
    dims = [1] * rank
    for f in primes:
        dims[b.int(0, rank - 1)] *= f
    return tuple(dims)


def permute(b):
    x = b.pick(b.values("any", min_rank=2))
    if x is None:
        return None
    rank = len(b.shape_of(x))
    way = b.int(0, 2)
    if way == 0:
        return b.op("permute", [x], dims=tuple(int(d) for d in b.rng.permutation(rank)))
    if way == 1:
        d0, d1 = (int(d) for d in b.rng.choice(rank, 2, replace=False))
        return b.op("transpose", [x], d0=d0 - rank if b.chance(0.3) else d0, d1=d1, form=b.form())
    return b.op("mT", [x])


def _value_and_dim(b):
    """A value of rank 1 or more, its shape and one of its dims, or None when the program has none."""
    x = b.pick(b.values("any", min_rank=1))
    if x is None:
        return None
    shape = b.shape_of(x)
    return x, shape, b.int(0, len(shape) - 1)


def index(b):
    picked = _value_and_dim(b)
    if picked is None:
        return None
    x, shape, d = picked
    size = shape[d]
    dim = d - len(shape) if b.chance(0.3) else d
    way = b.int(0, 3)
    if way == 0:
        i = b.int(-size, size - 1)
        return b.op("select", [x], dim=dim, index=i, start=None, stop=None, step=None, form=b.form())
    start = b.int(0, size - 1)
    if way == 1:
        return b.op("narrow", [x], dim=d, start=start, length=b.int(1, size - start))
    step = b.choice((1, 1, 2, 3, 4, 128))
    stop = b.choice((None, b.int(start + 1, size)))
    start_text = start - size if b.chance(0.2) else (None if start == 0 and b.chance(0.5) else start)
    return b.op("slice", [x], dim=dim, index=None, start=start_text, stop=stop, step=step)


def cat(b):
    picked = _value_and_dim(b)
    if picked is None:
        return None
    x, shape, d = picked
    fits = [j for j in b.values("any", len(shape), len(shape))
            if b.shape_of(j)[:d] + b.shape_of(j)[d + 1:] == shape[:d] + shape[d + 1:] and b.metas[j].dtype == b.metas[x].dtype]
    parts = [x] + [b.pick(fits) for _ in range(b.int(1, 2))]
    return b.op("cat", parts, dim=d - len(shape) if b.chance(0.3) else d, form=b.form())


def split(b):
    picked = _value_and_dim(b)
    if picked is None:
        return None
    x, shape, d = picked
    size = shape[d]
    way = b.int(0, 2)
    if way == 0:
        piece = b.int(1, max(size - 1, 1))
        return b.op("split", [x], dim=d, size=piece, index=b.int(0, -(-size // piece) - 1), form=b.form())
    if way == 1:
        chunks = b.int(2, 4)
        return b.op("chunk", [x], dim=d, chunks=chunks, index=b.int(0, min(chunks, size) - 1))
    return b.op("unbind", [x], dim=d, index=b.int(0, size - 1))


def expand(b):
    x = b.pick(b.values("any"))
    if x is None:
        return None
    shape = b.shape_of(x)
    if 1 not in shape and b.chance(0.7):
        x = b.op("unsqueeze", [x], dim=b.int(0, len(shape)), form=b.form())
        if x is None:
            return None
        shape = b.shape_of(x)
    sizes = tuple(b.size() if s == 1 and b.chance(0.8) else -1 for s in shape)
    if b.chance(0.2) or not sizes:
        sizes = (b.choice((2, 3)),) + sizes
    full = [s if s != -1 else shape[k - len(sizes) + len(shape)] for k, s in enumerate(sizes)]
    if math.prod(full) > MAX_ELEMENTS:
        return None
    return b.op("expand", [x], sizes=sizes)


def squeeze(b):
    x = b.pick(b.values("any"))
    if x is None:
        return None
    shape = b.shape_of(x)
    if b.chance(0.5):
        return b.op("unsqueeze", [x], dim=b.int(-len(shape) - 1, len(shape)), form=b.form())
    ones = [d for d, s in enumerate(shape) if s == 1]
    dim = None if not ones or b.chance(0.3) else b.choice(ones)
    return b.op("squeeze", [x], dim=dim)


def copy(b):
    return b.op("copy", [b.pick(b.values("any"))], form=b.form())


PROPOSERS = {   # family: (proposer, weight)
    "unary": (unary, 10), "scalar": (scalar, 4), "pow": (pow_scalar, 2), "clamp": (clamp, 2), "binary": (binary, 10),
    "compare": (compare, 3), "logical": (logical, 1), "where": (where, 4), "reduce": (reduce, 6), "var": (var, 2),
    "count": (count, 1), "softmax": (softmax, 4), "norm": (layer_norm, 4), "matmul": (matmul, 6), "bmm": (bmm, 2),
    "linear": (linear, 5), "sdpa": (sdpa, 4), "attention": (attention_written_out, 1), "mlp": (mlp, 1),
    "residual": (residual_norm, 1), "embedding": (embedding, 2), "cast": (cast, 3), "reshape": (reshape, 5),
    "permute": (permute, 4), "index": (index, 5), "cat": (cat, 3), "split": (split, 3), "expand": (expand, 2),
    "squeeze": (squeeze, 3), "copy": (copy, 1), "arg": (arg, 2), "sort": (sort, 2), "topk": (topk, 1),
    "gather": (gather, 2), "cumsum": (cumsum, 2),
}

