"""Elementwise kernels (tile stage): a fused chain of unary, binary, scalar, where and cast nodes, box by box.

The output's index space and every input's view of it are simplified together (passes/tile/kernels/boxes.py);
one dim goes on the partitions (the layout pass's choice when it made one) and the rest is cut into boxes
of at most a few thousand elements per partition. Per box each input is loaded once, in its storage dtype:
an input whose box varies only along the partitions (a bias column, a 0-d tensor) loads as a [P, 1] tile
and enters instructions as a per-partition operand, which costs one pass over the data where a second
full tensor would cost two. A constant holding one value needs no load at all: it becomes an immediate.

The chain itself (`emit_chain`) is shared with the matmul epilogue: values stay fp32 in SBUF between
nodes (a cast node rounds to its dtype, as the model asked, after rounding its input to the input's dtype, as
eager stored it), the last node writes the output tile in its
dtype. Cheap fusions: x*s+b followed by a ScalarE function is one activation (scale and bias, immediate or
per partition); two scalar steps in a row are one tensor_scalar; x*x and pow with exponent 2, 0.5, -0.5 or
-1 use the square, sqrt, rsqrt and reciprocal functions, as torch computes them.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from trnc import ir
from trnc.errors import UnsupportedOpError
from trnc.isa.dtypes import DType
from trnc.isa.enums import COMPARISONS, ActFunc, AluOp
from trnc.passes.tile.kernels import boxes
from trnc.passes.tile.kernels.engines import emit, stochastic, write
from trnc.passes.tile.kernels.movement import copy_view
from trnc.passes.tile.tiles import HbmView, TileBuilder, Tile

MAX_FREE = 8192            # elements per partition in one box: instructions and DMAs that hide their fixed cost
SBUF_BUDGET = 64 * 1024    # bytes per partition live in one box, so several boxes are in flight
CANDIDATES = 2             # partition dims offered to the layout pass
ACT_FUNCS = frozenset(f.text for f in ActFunc) - {"copy"}
# pow exponents torch computes with a function instead (its pow_tensor_scalar kernel)
POW_FUNCS = {2.0: "square", 0.5: "sqrt", -0.5: "rsqrt", -1.0: "reciprocal"}
COMMUTATIVE = frozenset({AluOp.ADD, AluOp.MUL, AluOp.EQ, AluOp.NE, AluOp.AND, AluOp.OR, AluOp.XOR})
# ops whose result on integers is exact in fp32 (for |values| <= 2^24) and never wraps
INT_EXACT = COMPARISONS | {AluOp.AND, AluOp.OR, AluOp.XOR, AluOp.MAX, AluOp.MIN}
FP32_EXACT_INTEGERS = 2 ** 24   # every integer up to this magnitude is an fp32 value


@dataclass(frozen=True)
class Operand:
    """A value on chip: a full [P, F] tile, or a [P, 1] tile whose value holds along the free axis."""

    tile: Tile
    per_partition: bool


Value = Operand | float   # a float is an immediate: a constant whose elements are all equal


def immediate(node: ir.Node) -> float | None:
    """The one value (as the engines read it, in fp32) of a constant whose elements are all equal, else None."""
    if node.op != "const":
        return None
    flat = np.asarray(node.attrs["value"]).reshape(-1).astype(np.float32)
    if flat.size == 0 or not np.all(flat.view(np.uint32) == flat[:1].view(np.uint32)):
        return None
    return float(flat[0])


def check_supported(nodes: list[ir.Node]) -> None:
    """Reject what the fp32 engines cannot compute as torch does: integer arithmetic and float-to-int casts."""
    for n in nodes:
        src = n.inputs[0].dtype if n.inputs else n.dtype
        if n.op == "cast" and n.dtype.is_int and not src.is_int and not n.attrs.get("integral"):
            raise UnsupportedOpError(
                f"cast of %{n.name} from {src.text} to {n.dtype.text}{n.where()}: torch truncates toward zero and "
                "the engines round to nearest; cast after an explicit trunc/round, or keep the value in float")
        if not n.dtype.is_int or n.op in ("cast", "where") or (n.op == "unary" and n.attrs["func"] == "copy"):
            continue
        if n.op in ("binary", "scalar") and AluOp.from_text(n.attrs["op"]) in INT_EXACT:
            continue
        if n.attrs.get("index_bound", FP32_EXACT_INTEGERS + 1) <= FP32_EXACT_INTEGERS:   # index math, exact in fp32
            continue
        what = n.attrs.get("op") or n.attrs.get("func")
        raise UnsupportedOpError(
            f"integer {n.op} '{what}' of %{n.name} ({n.dtype.text}){n.where()}: the engines compute in fp32, which "
            "loses integers above 2^24 and does not wrap; compute in float and cast, or keep the index math on "
            "the host")


@dataclass(frozen=True)
class _Step:
    """`x op scalar` (`scalar op x` when reversed): one stage of tensor_scalar, or the scale/bias of an
    activation; the scalar is an immediate or a per-partition [P, 1] tile."""

    x: ir.Node
    op: AluOp
    scalar: float | Tile
    reverse: bool


def _normalized(x: ir.Node, op: AluOp, scalar, reverse: bool) -> _Step:
    if op is AluOp.SUB and isinstance(scalar, float) and not reverse:   # x - c == x + (-c) exactly
        op, scalar = AluOp.ADD, -scalar
    return _Step(x, op, scalar, reverse and op not in COMMUTATIVE)


def _step(n: ir.Node, values: dict[ir.Node, Value]) -> _Step | None:
    """n as one tensor operand and one scalar operand, or None (two full tensors, or no tensor at all)."""
    if n.op == "unary" and n.attrs["func"] == "neg" and isinstance(values[n.inputs[0]], Operand):
        return _Step(n.inputs[0], AluOp.MUL, -1.0, False)
    if n.op == "scalar" and isinstance(values[n.inputs[0]], Operand) and _pow_func(n) is None:
        scalar = float(np.float32(n.attrs["value"]))
        return _normalized(n.inputs[0], AluOp.from_text(n.attrs["op"]), scalar, bool(n.attrs.get("reverse")))
    if n.op != "binary" or n.inputs[0] is n.inputs[1]:
        return None
    a, b = n.inputs
    va, vb = values[a], values[b]
    op = AluOp.from_text(n.attrs["op"])
    if isinstance(va, Operand) and (isinstance(vb, float) or vb.per_partition):
        return _normalized(a, op, vb if isinstance(vb, float) else vb.tile, False)
    if isinstance(vb, Operand) and (isinstance(va, float) or va.per_partition):
        return _normalized(b, op, va if isinstance(va, float) else va.tile, True)
    return None


def _pow_func(n: ir.Node) -> str | None:
    if n.op == "scalar" and n.attrs["op"] == "pow" and not n.attrs.get("reverse"):
        return POW_FUNCS.get(float(n.attrs["value"]))
    return None


def _act_func(n: ir.Node) -> str | None:
    """The ScalarE function computing n from its one tensor input, or None."""
    if n.op == "unary" and n.attrs["func"] in ACT_FUNCS:
        return n.attrs["func"]
    if n.op == "binary" and n.attrs["op"] == "mul" and n.inputs[0] is n.inputs[1]:
        return "square"
    return _pow_func(n)


class _Chain:
    """The values of one chain on one tile: operands, intermediates and the output tile."""

    def __init__(self, kb: TileBuilder, nodes: list[ir.Node], operands: dict[ir.Node, Operand], out: Tile):
        self.kb, self.nodes, self.out = kb, nodes, out
        self.parts, self.free = out.partitions, out.free_size
        inside = set(nodes)
        self.values: dict[ir.Node, Value] = {}
        for n in nodes:
            for i in n.inputs:
                if i not in inside and i not in self.values:
                    imm = immediate(i)
                    self.values[i] = imm if imm is not None else operands[i]
        self.uses = Counter(i for n in nodes for i in n.inputs)
        self.cast_inputs = {i for n in nodes if n.op == "cast" for i in n.inputs}
        self.uses[nodes[-1]] += 1

    # -- operands ------------------------------------------------------------------------------------
    def column(self, v: Value) -> Tile:
        """A per-partition value (or an immediate, set into a fresh column) as its [P, 1] tile."""
        if isinstance(v, float):
            col = self.kb.sbuf("imm", DType.FP32, self.parts, (1,))
            emit(self.kb, "memset", dst=col, value=v)
            return col
        return v.tile

    def full(self, v: Value) -> Tile:
        """Any value as a [P, F] operand: a column is read F times through a zero stride."""
        if isinstance(v, Operand) and not v.per_partition:
            return v.tile
        col = self.column(v)
        return replace(col, dims=((0, self.free),))

    def narrow(self, nodes: list[ir.Node]) -> bool:
        """True when these nodes compute a per-partition value: every input is one, and it is not the output."""
        if nodes[-1] is self.nodes[-1]:
            return False
        ins = [i for n in nodes for i in n.inputs if i not in nodes]
        return all(not isinstance(self.values[i], Operand) or self.values[i].per_partition for i in ins)

    def src(self, v: Value, per_partition: bool) -> Tile:
        return self.column(v) if per_partition else self.full(v)

    def dst(self, n: ir.Node, per_partition: bool) -> Operand:
        if n is self.nodes[-1] or (not per_partition and self.rounds_into_out(n)):
            return Operand(self.out, False)
        # a cast rounds, and so does a value a cast reads, as eager stored it; other intermediates stay fp32
        dtype = n.dtype if n.op == "cast" or self.read_by_cast(n) else DType.FP32
        free = (1,) if per_partition else (self.free,)
        return Operand(self.kb.sbuf(f"t_{n.name}", dtype, self.parts, free), per_partition)

    def read_by_cast(self, n: ir.Node) -> bool:
        """n is narrower than fp32 and a cast reads it (a bf16 model's `.float()`): eager rounded n to its dtype
        first, so the cast must see it rounded, not the fp32 the engines computed."""
        return n in self.cast_inputs and _narrow_float(n.dtype)

    def rounds_into_out(self, n: ir.Node) -> bool:
        """n only feeds the last node, a cast to the output's dtype: n's instruction writes the output itself,
        since every instruction computes in fp32 and rounds as it stores, as the cast's tensor_copy would."""
        last = self.nodes[-1]
        return (last.op == "cast" and not last.attrs and last.inputs[0] is n and self.uses[n] == 1
                and last.dtype is self.out.dtype
                and n.op != "const" and not self.read_by_cast(n))

    def as_stored(self, x: ir.Node, v: Value, per_partition: bool) -> Value:
        """An operand from outside the chain that a cast reads, rounded to x's dtype first if its tile holds
        more (a bf16 matmul's fp32 PSUM result)."""
        if not isinstance(v, Operand) or v.tile.dtype is x.dtype or not _narrow_float(x.dtype):
            return v
        rounded = self.kb.sbuf(f"t_{x.name}_r", x.dtype, self.parts, (1,) if per_partition else (self.free,))
        write(self.kb, rounded, self.src(v, per_partition))
        return Operand(rounded, per_partition)

    def scalar(self, name: str, s: float | Tile) -> dict:
        return {f"{name}_ap": s} if isinstance(s, Tile) else {name: s}

    # -- fused groups --------------------------------------------------------------------------------
    def private(self, n: ir.Node, next_node: ir.Node) -> bool:
        """n feeds only `next_node`, so the two may fuse."""
        return n is not self.nodes[-1] and self.uses[n] == 1 and n in next_node.inputs

    def step_at(self, j: int, start: int) -> _Step | None:
        """_step of nodes[j] while nodes[start:j] are not computed yet: they count as the operand kind
        they would have."""
        values = self.values
        if j > start:
            values = {**values, self.nodes[j - 1]: Operand(self.out, self.narrow(self.nodes[start:j]))}
        return _step(self.nodes[j], values)

    def activation(self, i: int) -> int:
        """x [* scale] [+ bias] -> func as one activation at nodes[i:]; the number of nodes taken, or 0."""
        steps: list[_Step] = []
        j = i
        for wanted in (AluOp.MUL, AluOp.ADD):
            if j + 1 >= len(self.nodes):
                break
            s = self.step_at(j, i)
            if s is None or s.op is not wanted or not self.private(self.nodes[j], self.nodes[j + 1]) \
                    or (steps and s.x is not self.nodes[j - 1]):
                continue
            steps.append(s)
            j += 1
        f = self.nodes[j]
        func = _act_func(f)
        if func is None or (steps and f.inputs[0] is not self.nodes[j - 1]):
            return 0
        x = steps[0].x if steps else f.inputs[0]
        if not isinstance(self.values[x], Operand):
            return 0
        group = self.nodes[i:j + 1]
        pp = self.narrow(group)
        dst = self.dst(f, pp)
        fields = {"scale": 1.0, "bias": -0.0}     # + -0.0 keeps every x, -0.0 included
        for s in steps:
            fields.update(self.scalar("scale" if s.op is AluOp.MUL else "bias", s.scalar))
        emit(self.kb, "activation", dst=dst.tile, src=self.src(self.values[x], pp), func=ActFunc.from_text(func),
             **fields)
        self.values[f] = dst
        return len(group)

    def scalar_steps(self, i: int) -> int:
        """One or two scalar steps in a row as one tensor_scalar; the number of nodes taken, or 0."""
        first = _step(self.nodes[i], self.values)
        if first is None:
            return 0
        steps = [first]
        if i + 1 < len(self.nodes) and self.private(self.nodes[i], self.nodes[i + 1]):
            second = self.step_at(i + 1, i)
            if second is not None and second.x is self.nodes[i]:
                steps.append(second)
        group = self.nodes[i:i + len(steps)]
        pp = self.narrow(group)
        dst = self.dst(group[-1], pp)
        fields = {}
        for k, s in enumerate(steps):
            fields.update({f"op{k}": s.op, f"reverse{k}": s.reverse, **self.scalar(f"scalar{k}", s.scalar)})
        emit(self.kb, "tensor_scalar", dst=dst.tile, src=self.src(self.values[first.x], pp), **fields)
        self.values[group[-1]] = dst
        return len(group)

    def single(self, i: int) -> int:
        """Node i alone, by its own instruction (its operands made full or per-partition as needed)."""
        n = self.nodes[i]
        ins = [self.values[x] for x in n.inputs]
        if n is self.nodes[-1] and n.op == "cast" and isinstance(ins[0], Operand) and ins[0].tile is self.out:
            self.values[n] = ins[0]          # its input rounded into the output already (rounds_into_out)
            return 1
        pp = self.narrow([n])
        dst = self.dst(n, pp)
        if n.op == "cast":
            ins[0] = self.as_stored(n.inputs[0], ins[0], pp)
        if n.op == "where":
            emit(self.kb, "select", dst=dst.tile, pred=self.src(ins[0], pp), on_true=self.src(ins[1], pp),
                 on_false=self.src(ins[2], pp))
        elif n.op == "binary":
            emit(self.kb, "tensor_tensor", dst=dst.tile, in0=self.src(ins[0], pp), in1=self.src(ins[1], pp),
                 op=AluOp.from_text(n.attrs["op"]))
        elif n.op in ("cast", "unary"):      # unary copy, or an operand that is an immediate
            func = _act_func(n)
            if func is None and n.attrs.get("func") == "neg":
                emit(self.kb, "tensor_scalar", dst=dst.tile, src=self.src(ins[0], pp), op0=AluOp.MUL, scalar0=-1.0)
            elif func is None:       # a cast rounds as the program does (engines.write)
                write(self.kb, dst.tile, self.src(ins[0], pp))
            else:
                emit(self.kb, "activation", dst=dst.tile, src=self.src(ins[0], pp), func=ActFunc.from_text(func),
                     bias=-0.0)
        elif n.op == "scalar":               # of an immediate: set it in a column first
            self.values[n.inputs[0]] = Operand(self.column(ins[0]), True)
            return self.activation(i) or self.scalar_steps(i)
        else:
            raise UnsupportedOpError(f"%{n.name} = {n.op} is not an elementwise op{n.where()}")
        self.values[n] = dst
        return 1

    def run(self) -> None:
        i = 0
        while i < len(self.nodes):
            i += self.activation(i) or self.scalar_steps(i) or self.single(i)


def _narrow_float(dtype: DType) -> bool:
    return dtype.is_float and dtype.itemsize < 4


def emit_chain(kb: TileBuilder, nodes: list[ir.Node], operands: dict[ir.Node, Operand], out: Tile) -> None:
    """Compute `nodes` (elementwise, in order) on one tile. Each node's inputs are earlier nodes of the list
    or keys of `operands` (an operand's tile may be in PSUM, e.g. a matmul result); a constant input whose
    elements are all equal is used as an immediate and needs no operand. Writes the last node's value into
    `out` (an SBUF tile [P, F]), converting to out.dtype (stochastically where the program rounds so: the chain
    then ends in an fp32 tile, which engines.write converts)."""
    check_supported(nodes)
    if not stochastic(kb, out.dtype):
        _Chain(kb, nodes, operands, out).run()
        return
    wide = kb.sbuf("wide", DType.FP32, out.partitions, (out.free_size,))   # then rounded stochastically
    _Chain(kb, nodes, operands, wide).run()
    write(kb, out, wide)


def _operand_ap(view: HbmView, pdim: int | None, box: boxes.Box):
    """The AP to load and whether it is per-partition (the box varies along the partition dim only)."""
    varies = any(count > 1 and stride != 0 for d, ((_, count), stride) in enumerate(zip(box, view.strides))
                 if d != pdim)
    if varies:
        return view.box_ap(pdim, box), False
    column = tuple((start, count if d == pdim else 1) for d, (start, count) in enumerate(box))
    return view.box_ap(pdim, column), True


def load_operand(kb: TileBuilder, view: HbmView, pdim: int, box: tuple[tuple[int, int], ...], name: str) -> Operand:
    """Load the box of an external input (broadcast dims have stride 0) as a full or per-partition tile."""
    ap, per_partition = _operand_ap(view, pdim, box)
    tile = kb.sbuf(name, view.dtype, ap.partitions, (ap.free_size,))
    boxes.spread(kb, tile, ap)
    return Operand(tile, per_partition)


def _per_partition_inputs(strides_of: list[tuple[int, ...]], shape, d: int) -> int:
    """How many inputs would be per-partition with dim d on the partitions."""
    return sum(1 for st in strides_of if st[d] != 0 and shape[d] > 1
               and all(s == 0 or shape[e] == 1 for e, s in enumerate(st) if e != d))


def _preference(shape, strides_of, d: int):
    """Sort key of dim d as the partition dim: partitions well used, then per-partition inputs, then outer."""
    size = shape[d]
    used = size / (math.ceil(size / boxes.PARTITIONS) * boxes.PARTITIONS)
    return (used >= 0.5, _per_partition_inputs(strides_of, shape, d), used, -d)


def candidates(kernel: ir.Kernel) -> list[int]:
    """Output dims worth putting on the partitions, best first (by the preference `lower` uses itself); the
    best CANDIDATES only, since the layout pass lowers each one to cost it."""
    shape = kernel.output.shape
    strides_of = []
    for i in kernel.inputs:
        padded = (1,) * (len(shape) - len(i.shape)) + i.shape
        strides_of.append(tuple(0 if s == 1 else 1 for s in padded))
    dims = [d for d, size in enumerate(shape) if size > 1]
    return sorted(dims, key=lambda d: _preference(shape, strides_of, d), reverse=True)[:CANDIDATES]


def _partition_dim(space: boxes.Space, hint) -> int:
    if isinstance(hint, int) and not isinstance(hint, bool):
        d = space.dim_of(hint)
        if d is not None:
            return d
    strides_of = [v.strides for v in space.views[1:]]
    return max(range(len(space.shape)), key=lambda d: _preference(space.shape, strides_of, d))


def _regions(space: boxes.Space, pdim: int, budget: int) -> list[boxes.Space]:
    """boxes.split_rows, unless an input is per-partition along the partition dim (it would stop being one)."""
    strides_of = [v.strides for v in space.views[1:]]
    if space.numel() > space.shape[pdim] and _per_partition_inputs(strides_of, space.shape, pdim):
        return [space]
    return boxes.split_rows(space, pdim, budget)


def _peak_intermediates(nodes: list[ir.Node]) -> int:
    last_use = {i: k for k, n in enumerate(nodes) for i in n.inputs}
    live, peak = set(), 0
    for k, n in enumerate(nodes[:-1]):
        live = {m for m in live if last_use.get(m, -1) >= k} | {n}
        peak = max(peak, len(live))
    return peak


def lower(kb: TileBuilder, kernel: ir.Kernel, views: dict[ir.Node, HbmView], out: HbmView,
          plan: ir.KernelPlan) -> None:
    nodes = kernel.nodes
    check_supported(nodes)
    if out.shape and math.prod(out.shape) == 0:
        return
    first = nodes[0]
    if len(nodes) == 1 and (first.op == "cast" or (first.op == "unary" and first.attrs["func"] == "copy")):
        copy_view(kb, views[first.inputs[0]].expand(out.shape), out)     # the DMA converts
        return
    loads = [n for n in kernel.inputs if immediate(n) is None]
    space = boxes.simplify([out] + [views[n].expand(out.shape) for n in loads])
    pdim = _partition_dim(space, plan.partition_dim)
    per_element = sum(views[n].dtype.itemsize for n in loads) + 4 * _peak_intermediates(nodes) + out.dtype.itemsize
    budget = max(1, min(MAX_FREE, SBUF_BUDGET // per_element))
    for region in _regions(space, pdim, budget):
        _lower_region(kb, nodes, loads, region, pdim, budget)


def _lower_region(kb: TileBuilder, nodes: list[ir.Node], loads: list[ir.Node], region: boxes.Space, pdim: int,
                  budget: int) -> None:
    """Every box of one region: load the inputs (a box or two ahead), compute the chain, store."""
    shape, views = region.shape, region.views
    chunks = boxes.plan(shape, pdim, boxes.pchunk(shape[pdim]), budget, lambda box: boxes.aps_fit(views, pdim, box))
    one_free_box = all(chunks[d] == shape[d] for d in range(len(shape)) if d != pdim)
    cache: dict = {}

    def load(box):
        return {n: _load(kb, views[k + 1], pdim, box, f"in_{n.name}", cache, one_free_box)
                for k, n in enumerate(loads)}

    def finish(box, operands):
        result = kb.sbuf("out", views[0].dtype, boxes.partitions(box, pdim), (boxes.free_size(box, pdim),))
        emit_chain(kb, nodes, operands, result)
        boxes.spread(kb, views[0].box_ap(pdim, box), result)

    boxes.pipelined(boxes.boxes(shape, chunks, boxes.partition_first(len(shape), pdim)), load, finish)


def _load(kb, view, pdim, box, name, cache: dict, one_free_box: bool) -> Operand:
    """load_operand, reusing the tile of an earlier box with the same data: a column across the free boxes of
    a partition chunk, or a partition-invariant input (read with partition stride 0) when there is one free box."""
    ap, per_partition = _operand_ap(view, pdim, box)
    key = replace(ap, partitions=0) if ap.partition_stride == 0 else ap
    hit = cache.get(key)
    if hit is not None and hit.tile.partitions >= ap.partitions:
        return Operand(hit.tile.narrow(0, 0, ap.partitions), hit.per_partition)
    operand = load_operand(kb, view, pdim, box, name)
    if per_partition or one_free_box:
        cache[key] = operand
    return operand
