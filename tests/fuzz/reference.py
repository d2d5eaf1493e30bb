"""The float64 reference of a program and its tolerance, from re-running it with its roundings perturbed.

Why this design. A fixed rtol/atol is either too loose for a short fp32 program or too tight for a long bf16
one, and it fails wherever cancellation makes a small result depend on large intermediates. Instead the
program runs in float64 lanes:

- lane 0, the reference: exact arithmetic, the casts to bfloat16/float16 applied as torch applies them;
- per precision, a deterministic lane: the reference plus the roundings every implementation makes alike,
  computed exactly: matmul and attention operands in the operand dtype (bf16 under auto_cast="all"),
  constants narrowed to bf16 (auto_cast="all"), casts;
- per precision, LANES noisy lanes: the deterministic lane with every op's result also moved by its local
  rounding error bound times a random sign and a random size in [1/2, 1] (ops.py computes each step):
  - a rounded op (add, div, sqrt, casts, and exact ops such as views, max or where whose value is not
    representable in the storage dtype): u * |y|, u the storage dtype's unit roundoff, 2^-24 fp32, 2^-11 fp16,
    2^-8 bf16. A representable result is exact on any IEEE machine and is left alone, so exact ops on exact
    values stay exact and ties between them stay ties;
  - a function (exp, tanh, gelu, pow, ...): (u + 2 k 2^-24) * |y|, k its documented error in fp32 ulps;
  - a sum of n terms (sum, mean, matmul, linear, the sums in softmax, norms and attention): n * 2^-24 times
    the sum of the terms' magnitudes (trnc and eager both accumulate in fp32), then the rounding of the result.
- per precision, the rounding lane: the deterministic lane with every stored value rounded to nearest even
  in its storage dtype, as a plain implementation stores it. Random signs sum n roundings as a random walk,
  sqrt(n) short of roundings that all go one way, and structured values round so: the square of an odd
  multiple of 1/8 above 2 always rounds down in bf16, and the bf16 mean of 87 such squares was off by 1.6x
  the tolerance before this lane (seed 2222005245). The rounding lane counts as one of the noisy lanes below.

The storage dtype is the program's own dtype at precision fp32, and bf16 for every float value at precision
bf16 with auto_cast="all" (trnc narrows every intermediate there, the intermediates of what torch decomposes,
var/std and rms_norm, included; the fused kernels keep fp32 inside). A noisy lane thus samples how local
errors of the sizes an implementation may make propagate to the outputs, through cancellation and
amplification. An output element's deviation is |deterministic - reference| + the largest |noisy -
deterministic|: added rather than sampled together, so noise that happens to cancel the deterministic error
cannot hide it, and the sizes in [1/2, 1] keep a lone error from being sampled near zero. Noisy values are not
re-rounded to the storage grid: snapping every lane to the same grid point made the sampled spread vanish
exactly where the real error is half an ulp (seen at bf16). Nor are a noisy lane's matmul operands: it moves
them by the deterministic lane's rounding of the same operands (Lane.operand). A few lanes still sample a sum of several errors
near zero in some element of a large tensor now and then (with four lanes, about 1e-4 per element for four
errors of one size: seen at bf16 as a mismatch of 1.05x the tolerance; hence LANES = 6), so an element's
deviation is at least RELATIVE_FLOOR times the median relative deviation of its value's inexact elements:
the elements of one value come from the same chain of ops, and one far below the rest is a sampling accident
more often than a better conditioned element. The tolerance is

    SAFETY * deviation + u_out * (|ref| + max |ref|) + tiny_out

with SAFETY = 8 for the gap between a few samples and the worst case (the accumulation terms are already
worst cases, n rather than sqrt(n)), u_out * |ref| the final rounding into the output dtype and tiny_out the
smallest normal of the output dtype, for results that underflow (every rounding step also allows the
underflow of its storage dtype: fp16 underflows below 6e-5). u_out * max |ref|, one rounding of the output's
largest element, is the floor for elements far below it: exp amplifies an error in its argument
exponentially, so a softmax of large logits can be off by a factor of e^10 in an element of 1e-27 (seen in
eager), which SAFETY, a factor on the output rather than on the exponent, cannot cover. Eager itself must lie within the fp32
tolerance; a program where it does not is dropped (that measures the bound, not trnc).

Programs the bound cannot judge are re-drawn instead: a non-finite or huge (> LIMIT) value in any lane, and a
comparison whose operands are within SAFETY times their deviations of a tie in some element, since rounding
may flip it legitimately (if both operands are exact, a tie is a tie and stays); and a softmax or attention
whose logits deviate by more than 1 / SAFETY nats: past that the result is decided by which of two near-equal
large logits wins, a discontinuity in all but name (seen at bf16: logits of 1e4 two nats apart, where eager
picked one key and trnc, within bf16's rounding, weighed two); and a layer norm whose scale, sqrt(var + eps),
deviates by more than 1 / SAFETY of itself: the row's spread is then of the size of its roundings, and rounding
decides which way the normalized row points (seen at bf16: two features 0.005 apart at 3.8, a third of a bf16
ulp; they rounded to one value, the normalized row became the bias, and a std and x / sqrt(x^2 + c) downstream
gave 0.37 for a reference of 0.97, where eager in bf16 gives 0.17). max, min, amax and clamp need
no such check: they are continuous, so a near-tie moves their value by no more than the operands' errors.
But they have flat pieces (relu, clamp, maximum, minimum, amax, amin, max, min), where the sampled deviation
vanishes while SAFETY times the operand's deviation would cross the kink: a clamp at -2 of a value of -2.375
whose sampled deviation is 0.1 has none, yet an error of 0.73 in its operand (within SAFETY times 0.1) gives
0.36 (seen at bf16 behind a linear that cancels). exp falls short the same way, by its growth: SAFETY times
the deviation of exp(x) is far below exp(x + SAFETY * deviation of x) - exp(x) once that deviation nears one
(seen at bf16: exp(8 tanh(a layer norm of bf16 values)) 15x its reference, within a third of a nat at the
layer norm). These "magnified" ops evaluate their noisy lanes at SAFETY times their operands' deviations
from the deterministic lane, in both directions (the lanes' errors can all lie on one side, as they did at
the clamp: a kink turns a sign into a size), and divide the wider result's deviation by SAFETY: the same on
a linear piece, and across a kink or up exp's slope what SAFETY * deviation reaches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from .build import Invalid, batches, build, eval_text, evaluate, input_tensors, macs, param_seed, resolve
from .check import compare
from .draw import DTYPES, draw
from .ops import OPS
from .program import Input, Meta, Op, Param, Program

U = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
TINY = {torch.float32: 2.0 ** -126, torch.bfloat16: 2.0 ** -126, torch.float16: 2.0 ** -14}
SAFETY = 8.0
LANES = 6
RELATIVE_FLOOR = 0.25
LIMIT = 1e4
MAX_ELEMENTS = 2 ** 18      # per value: a program runs in well under a second
MAX_MACS = 2 ** 23          # per matmul or attention, for the float64 lanes' sake
MAX_BATCHES = 1024          # batch indices of a matmul or attention: trnc lowers each on its own but for tiny
                            # matrices, so compile time grows with them (1024 of 16 x 16: 2 s; 65664 of 1 x 1 took
                            # 10 minutes before trnc moved tiny ones to the vector engines)
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Mode:
    """How trnc stores values: "fp32" in the program's dtypes (auto_cast="none"), "bf16" with auto_cast="all"."""

    precision: str

    def storage(self, dtype: torch.dtype) -> torch.dtype:
        return torch.bfloat16 if self.precision == "bf16" else dtype

    @property
    def internal(self) -> torch.dtype:
        return torch.bfloat16 if self.precision == "bf16" else torch.float32


def _round(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return y.to(dtype).double() if dtype in U else y


class Lane:
    """One float64 run of a program: the reference (mode None), or in a mode either the deterministic lane (the
    roundings every implementation makes alike: matmul operands, constants, casts), a noisy lane (those plus
    every op's local rounding error, with a random sign and a random size in [1/2, 1] of its bound), or the
    rounding lane (a noisy lane whose every stored value is rounded to nearest even in its storage dtype)."""

    def __init__(self, mode: Mode | None, index: int, det: Lane | None = None, rounding: bool = False):
        self.mode, self.index, self.det, self.rounding = mode, index, det, rounding
        self.perturbed, self.noisy = mode is not None, det is not None
        self.gen = torch.Generator()
        self.offsets: list[torch.Tensor] = []   # the deterministic lane's: its operand roundings in this op
        self.taken = 0                           # a noisy lane's: how many of them it has used

    def start(self, seed: int) -> None:
        """Begin one op: seed its noise (its draws depend on the op, not on what was evaluated before), and
        forget the previous op's operands."""
        self.gen.manual_seed(seed * 64 + self.index)
        self.offsets, self.taken = [], 0

    @property
    def internal(self) -> torch.dtype:
        return self.mode.internal if self.perturbed else torch.float32

    def _noise(self, y: torch.Tensor) -> torch.Tensor:
        size = 0.5 + 0.5 * torch.rand(y.shape, generator=self.gen, dtype=torch.float64)
        return torch.where(torch.rand(y.shape, generator=self.gen) < 0.5, -size, size)

    def store(self, y: torch.Tensor, dtype: torch.dtype, ulps: float = 0.0, absolute=None) -> torch.Tensor:
        """y rounded once (plus `ulps` fp32 ulps of function error, plus an `absolute` error bound) into the dtype
        it is stored in."""
        if not self.noisy or not dtype.is_floating_point:
            return y
        storage = self.mode.storage(dtype)
        if self.rounding:
            return _round(y, storage)
        bound = (U[storage] + 2 * ulps * U[torch.float32]) * y.abs() + TINY[storage]   # TINY: underflow
        if ulps == 0:
            bound = torch.where(_round(y, storage) == y, 0.0, bound)
        if absolute is not None:
            bound = bound + absolute
        return y + torch.where(torch.isfinite(y), bound, 0.0) * self._noise(y)

    def acc(self, y: torch.Tensor, magnitude: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
        """A sum of n terms whose magnitudes sum to `magnitude`, accumulated in fp32, stored in `dtype`."""
        if not self.noisy or self.rounding:
            return self.store(y, dtype)
        bound = torch.where(torch.isfinite(magnitude), n * U[torch.float32] * magnitude, 0.0)
        return self.store(y + bound * self._noise(y), dtype)

    def operand(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A matmul operand of dtype `dtype` as the machine feeds it: in bf16 under auto_cast="all". The
        deterministic lane rounds it; a noisy lane moves its own value by the deterministic lane's rounding of the
        same operand (the op's k-th operand call in both), so its deviation is its upstream errors, as with any
        other value. Snapped to the grid instead, a noisy operand mostly lands on the deterministic lane's grid
        point, and the lanes' spread vanishes where an implementation's operand, off by its own upstream
        roundings, lands on the next one (seen at bf16: a gelu of 2.03 fed to a linear whose bias cancels it,
        1.56x the tolerance with every lane on one grid point; seed 12002002341)."""
        if not self.perturbed:
            return x
        y = _round(x, torch.bfloat16 if self.mode.precision == "bf16" else dtype)
        if self.det is None:
            self.offsets.append(y - x)
        elif not self.rounding:
            offset = self.det.offsets[self.taken]
            self.taken += 1
            return x + offset
        return y

    def operand_bound(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The largest error of feeding x as a matmul operand when the value rounded is the implementation's own
        choice (attention's probabilities: trnc's kernel rounds them before the division by their sum, a
        decomposed softmax after it, eager either): u |x| where the operand is narrower than fp32, else 0."""
        low = (torch.bfloat16 if self.mode.precision == "bf16" else dtype) if self.noisy else torch.float32
        return U[low] * x.abs() if low in (torch.bfloat16, torch.float16) else torch.zeros_like(x)

    def param(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A parameter: trnc narrows every float constant to bf16 under auto_cast="all"."""
        return _round(t, torch.bfloat16) if self.perturbed and self.mode.precision == "bf16" else t

    def cast(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """x converted to `dtype` as torch converts it (in every lane), off by its rounding when noisy."""
        if not x.is_floating_point():
            return x.double()
        y = _round(x, dtype)
        if self.noisy and not self.rounding:
            y = y + torch.where(y != x, U[dtype] * y.abs(), 0.0) * self._noise(y)
        return self.store(y, dtype)


class Evaluation:
    """A program's values in every lane, node by node (the generator adds and removes nodes as it goes)."""

    def __init__(self, precisions=PRECISIONS):
        self.modes = [Mode(p) for p in precisions]
        self.lanes = [Lane(None, 0)]
        for j, m in enumerate(self.modes):   # the deterministic lane, the noisy lanes, the rounding lane
            det = Lane(m, 1 + j * (LANES + 2))
            self.lanes += [det] + [Lane(m, det.index + k, det, rounding=k > LANES) for k in range(1, LANES + 2)]
        self.values: list[list[torch.Tensor]] = []
        self.metas: list[Meta] = []
        self.nats: dict[int, list[torch.Tensor]] = {}   # per lane, of the nodes with OpDef.nats

    def lanes_of(self, precision: str) -> tuple[int, list[int]]:
        """The deterministic lane and the noisy lanes (the rounding lane among them) of a precision."""
        first = 1 + [m.precision for m in self.modes].index(precision) * (LANES + 2)
        return first, list(range(first + 1, first + LANES + 2))

    def add(self, node: Input | Op, meta: Meta, params: list[Param]) -> None:
        if isinstance(node, Input):
            t = draw(node.shape, node.dtype, node.kind, node.seed, 1.0, node.high)
            t = t.double() if t.is_floating_point() else t
            self.values.append([t] * len(self.lanes))
        else:
            self.values.append(self._op(node, meta, params))
        self.metas.append(meta)

    def _op(self, node: Op, meta: Meta, params: list[Param]) -> list[torch.Tensor]:
        drawn = [draw(p.shape, p.dtype, p.kind, param_seed(node, k), p.scale).double() for k, p in enumerate(params)]
        text = eval_text(node, len(node.args), len(params))

        def ev(args, ps):
            return evaluate(text, args, ps)

        metas = [self.metas[a] for a in node.args]
        nats = OPS[node.kind].nats
        out, lane_params = [], []
        for j, lane in enumerate(self.lanes):
            lane.start(node.seed)
            ps = [lane.param(t, DTYPES[p.dtype]) for t, p in zip(drawn, params)]
            args = [self.values[a][j].contiguous() for a in node.args]   # eager (meta) decides which views are valid
            y = OPS[node.kind].reference(lane, ev, args, ps, node.a, metas, meta)
            if tuple(y.shape) != meta.shape:
                raise AssertionError(f"the reference of {node.kind} has shape {list(y.shape)}, eager {meta.shape}")
            out.append(y)
            lane_params.append(ps)
            if nats is not None:
                self.nats.setdefault(len(self.values), []).append(nats(lane, args, ps, node.a, metas))
        if OPS[node.kind].magnified(node.a):
            self._magnify(node, meta, out, ev, lane_params)
        return out

    def _magnify(self, node: Op, meta: Meta, out: list[torch.Tensor], ev, lane_params) -> None:
        """Re-evaluate the noisy lanes of a magnified op (see the module docstring) at SAFETY times their inputs'
        deviations from the deterministic lane, both ways, and scale the wider result's deviation down by SAFETY."""
        for mode in self.modes:
            det, noisy = self.lanes_of(mode.precision)
            for j in noisy:
                up, down = (ev([(d + sign * SAFETY * (self.values[a][j] - d) if d.is_floating_point() else d)
                                .contiguous() for a in node.args for d in [self.values[a][det]]], lane_params[j])
                            - out[det] for sign in (1, -1))
                self.lanes[j].start(node.seed)
                wider = torch.where(up.abs() >= down.abs(), up, down)
                out[j] = self.lanes[j].store(out[det] + wider / SAFETY, meta.dtype)

    def pop(self) -> None:
        self.nats.pop(len(self.values) - 1, None)
        self.values.pop()
        self.metas.pop()

    def _spread(self, values: list[torch.Tensor], precision: str) -> torch.Tensor:
        """|deterministic - reference| + the largest |noisy - deterministic|, elementwise."""
        det, noisy = self.lanes_of(precision)
        spread = torch.stack([(values[j] - values[det]).abs() for j in noisy]).amax(0)
        return (values[det] - values[0]).abs() + spread

    def deviation(self, index: int, precision: str) -> torch.Tensor:
        """The spread of the lanes, at least RELATIVE_FLOOR times the value's median relative deviation (see the
        module docstring)."""
        values = self.values[index]
        dev = self._spread(values, precision)
        size = values[0].abs()
        relative = (dev / size)[(dev > 0) & (size > 0)]
        if relative.numel():
            dev = torch.maximum(dev, RELATIVE_FLOOR * relative.median() * size)
        return dev

    def tolerance(self, index: int, precision: str) -> torch.Tensor:
        dtype, ref = self.metas[index].dtype, self.values[index][0].abs()
        scale = ref.max() if ref.numel() else 0.0
        return SAFETY * self.deviation(index, precision) + U[dtype] * (ref + scale) + TINY[dtype]

    def trouble(self, index: int, node: Input | Op) -> str | None:
        """Why node `index` makes the program one the tolerance cannot judge, or None."""
        meta, values = self.metas[index], self.values[index]
        if meta.is_float:
            if not torch.isfinite(values[0]).all():
                return "a non-finite value"
            if values[0].numel() and values[0].abs().max() > LIMIT:
                return "a value over LIMIT"
            if not all(torch.isfinite(v).all() for v in values[1:]):
                return "a non-finite value in a perturbed lane"
        if isinstance(node, Op) and OPS[node.kind].compare:
            return self._near_tie(node)
        if isinstance(node, Op) and (order := OPS[node.kind].order(node.a, len(self.metas[node.args[0]].shape))):
            return self._near_tie_in_order(node.args[0], order)
        if index in self.nats:
            nats = [torch.where(torch.isfinite(t), t, 0.0) for t in self.nats[index]]
            if any((SAFETY * self._spread(nats, m.precision)).max() > 1 for m in self.modes):
                return "rounding errors of 1 / SAFETY nats where they decide the result"
        return None

    def _near_tie_in_order(self, a: int, order) -> str | None:
        """An ordering (ops.Order) whose decisive neighbours, ranked by the reference, lie within SAFETY times
        their deviations of each other: rounding may swap them. An exact tie of exact values stays a tie, and is
        judged where torch defines its result (the first index, a stable sort). The deviations include the
        rounding of the operand to its storage dtype (an fp32 input is ordered in bf16 under auto_cast="all":
        two inputs that round to one bf16 value tie there; seed 92000043, an argmin)."""
        value, meta = self.values[a][0], self.metas[a]
        x = _rows(value, order.dim)
        ranked, at = (-x if order.descending else x).sort(dim=-1, stable=True)
        k = x.shape[-1] if order.k is None else min(order.k + 1, x.shape[-1])
        gap = ranked[:, 1:k] - ranked[:, :k - 1]
        for m in self.modes:
            dev = self.deviation(a, m.precision)
            storage = m.storage(meta.dtype) if meta.is_float else meta.dtype
            if storage != meta.dtype:
                dev = dev + torch.where(_round(value, storage) == value, 0.0, U[storage] * value.abs())
            dev = _rows(dev, order.dim).gather(-1, at)
            tol = SAFETY * (dev[:, 1:k] + dev[:, :k - 1])
            exact_tie = (gap == 0) & (tol == 0)
            if ((gap <= tol) & ~(exact_tie & order.ties_defined)).any():
                return f"a near-tie of an ordering at {m.precision}"
        return None

    def _near_tie(self, node: Op) -> str | None:
        a = node.args[0]
        b = node.args[1] if len(node.args) > 1 else None
        if a == b:      # x < x: one value on both sides, equal whatever its rounding
            return None
        ref_b = self.values[b][0] if b is not None else torch.tensor(float(node.a["c"]), dtype=torch.float64)
        margin = (self.values[a][0] - ref_b).abs()
        for m in self.modes:
            dev = self.deviation(a, m.precision) + (self.deviation(b, m.precision) if b is not None else 0.0)
            if not ((margin > SAFETY * dev) | (dev == 0)).all():
                return f"a near-tie of a comparison at {m.precision}"
        return None


def _rows(t: torch.Tensor, dim: int | None) -> torch.Tensor:
    """t with `dim` moved last (every element in one row for None), as [rows, n]."""
    if dim is None or t.dim() == 0:
        return t.reshape(1, -1)
    moved = t.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1])


def size_trouble(op: Op | Input, metas: list[Meta], meta: Meta) -> str | None:
    if not 1 <= meta.numel <= MAX_ELEMENTS:
        return f"a value of {meta.numel} elements"
    if isinstance(op, Op) and macs(op, metas, meta) > MAX_MACS:
        return "a contraction over MAX_MACS"
    if isinstance(op, Op) and batches(op, metas) > MAX_BATCHES:
        return "a contraction over MAX_BATCHES"
    return None


def evaluation(program: Program, precisions=PRECISIONS) -> tuple[Evaluation, list[list[Param]]]:
    """Every lane of the program, and its parameters; Invalid if any value is out of bounds, non-finite or a
    comparison near a tie."""
    metas, params = resolve(program)
    ev = Evaluation(precisions)
    for i, node in enumerate(program.nodes):
        reason = size_trouble(node, metas, metas[i])
        if reason is None:
            ev.add(node, metas[i], params[i])
            reason = ev.trouble(i, node)
        if reason is not None:
            raise Invalid(f"node {i} ({getattr(node, 'kind', 'input')}): {reason}")
    return ev, params


@dataclass
class Case:
    """A program ready to compile: the module, its inputs, eager's outputs, the reference and the tolerance of
    every output leaf at the precision (None for integer and bool leaves)."""

    program: Program
    module: torch.nn.Module
    inputs: list[torch.Tensor]
    eager: object
    ref: list
    tol: list
    redraws: tuple[str, ...] = ()   # why the generator dropped the drafts before this program


def prepare(program: Program, precision: str) -> Case:
    """The Case of `program` at `precision`; Invalid if the program is unfit, or eager is outside its fp32 bound."""
    precisions = ("fp32",) if precision == "fp32" else ("fp32", precision)
    ev, params = evaluation(program, precisions)
    module, inputs = build(program, params), input_tensors(program)
    try:
        with torch.no_grad():
            eager = module(*inputs)
    except Exception as e:
        raise Invalid(f"eager: {type(e).__name__}: {e}") from e
    refs = [ev.values[o][0] if ev.metas[o].is_float else None for o in program.outputs]
    sanity = compare(eager, eager, refs, [_tol(ev, o, "fp32") for o in program.outputs])
    if sanity:
        raise Invalid(f"eager outside its fp32 bound: {sanity[0]}")
    if len(pytree.tree_leaves(eager)) != len(program.outputs):
        raise AssertionError("forward's leaves are not the program's outputs")
    return Case(program, module, inputs, eager, refs, [_tol(ev, o, precision) for o in program.outputs])


def _tol(ev: Evaluation, index: int, precision: str):
    return ev.tolerance(index, precision) if ev.metas[index].is_float else None
