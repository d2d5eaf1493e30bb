"""From a program's data to torch: the shapes and dtypes of its values, its parameters, forward's source, the
nn.Module and the input tensors.

Shapes and dtypes come from running each op's text on meta tensors, so they are exactly eager's, and a program
that eager rejects (a view of a non-contiguous tensor, a split index past the end) is caught here as Invalid.
The module is built by executing its source, the same text a reproducer holds, so what the fuzzer compiles and
what a reproducer compiles cannot drift apart.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .draw import DTYPES, draw
from .ops import OPS
from .program import Input, Meta, Op, Param, Program

_CODE: dict[str, object] = {}


class Invalid(Exception):
    """A program eager cannot run, or one outside the fuzzer's limits (reference.py): not a test case."""


def render(op: Op, args: list[str], params: list[str]) -> str:
    return OPS[op.kind].render(args, params, op.a)


def evaluate(text: str, args: list, params: list):
    """The value of an op's text with its arguments a0, a1, ... and its parameters self.p0, self.p1, ..."""
    code = _CODE.get(text)
    if code is None:
        code = _CODE[text] = compile(text, "<op>", "eval")
    names = {"torch": torch, "F": F, "self": SimpleNamespace(**{f"p{k}": t for k, t in enumerate(params)})}
    names.update({f"a{k}": t for k, t in enumerate(args)})
    return eval(code, names)


def eval_text(op: Op, n_args: int, n_params: int) -> str:
    return render(op, [f"a{k}" for k in range(n_args)], [f"self.p{k}" for k in range(n_params)])


def param_seed(op: Op, k: int) -> int:
    return op.seed + 7919 * k


def params_of(op: Op, metas: list[Meta]) -> list[Param]:
    return OPS[op.kind].params([metas[a] for a in op.args], op.a)


def resolve_op(node: Op, metas: list[Meta]) -> tuple[Meta, list[Param]]:
    """The meta of an op's value and its parameters, given the metas of the nodes before it; Invalid if eager
    rejects the op."""
    try:
        ps = params_of(node, metas)
        out = evaluate(eval_text(node, len(node.args), len(ps)),
                       [torch.empty(metas[a].shape, dtype=metas[a].dtype, device="meta") for a in node.args],
                       [torch.empty(p.shape, dtype=DTYPES[p.dtype], device="meta") for p in ps])
    except Exception as e:
        raise Invalid(f"{node.kind}: {type(e).__name__}: {e}") from e
    if not isinstance(out, torch.Tensor):
        raise Invalid(f"{node.kind} gives a {type(out).__name__}")
    return Meta(tuple(out.shape), out.dtype), ps


def resolve(program: Program) -> tuple[list[Meta], list[list[Param]]]:
    """The meta of every node and the parameters of every op; Invalid if eager rejects the program."""
    metas: list[Meta] = []
    params: list[list[Param]] = []
    for node in program.nodes:
        if isinstance(node, Input):
            if any(s < 1 for s in node.shape):
                raise Invalid(f"input of shape {list(node.shape)}")
            metas.append(Meta(node.shape, DTYPES[node.dtype]))
            params.append([])
        else:
            meta, ps = resolve_op(node, metas)
            metas.append(meta)
            params.append(ps)
    return metas, params


def _returned(program: Program) -> str:
    names = [f"v{o}" for o in program.outputs]
    if program.structure == "tensor":
        return names[0]
    if program.structure == "dict":
        return "{" + ", ".join(f"'out{k}': {n}" for k, n in enumerate(names)) + "}"
    if program.structure == "list":
        return "[" + ", ".join(names) + "]"
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def module_source(program: Program, params: list[list[Param]]) -> str:
    """The source of `class Model(nn.Module)`: parameters drawn in __init__, one line per op in forward."""
    lines = ["class Model(nn.Module):", "    def __init__(self):", "        super().__init__()"]
    body = []
    for i, node in enumerate(program.nodes):
        if isinstance(node, Input):
            continue
        for k, p in enumerate(params[i]):
            lines.append(f"        self.p{i}_{k} = nn.Parameter(draw({p.shape!r}, {p.dtype!r}, {p.kind!r}, "
                         f"{param_seed(node, k)}, {p.scale!r}), requires_grad=False)")
        text = render(node, [f"v{a}" for a in node.args], [f"self.p{i}_{k}" for k in range(len(params[i]))])
        body.append(f"        v{i} = {text}")
    lines.append("")
    lines.append(f"    def forward(self, {', '.join(f'v{i}' for i in program.inputs)}):")
    lines.extend(body)
    lines.append(f"        return {_returned(program)}")
    return "\n".join(lines) + "\n"


def build(program: Program, params: list[list[Param]]) -> nn.Module:
    names = {"torch": torch, "F": F, "nn": nn, "draw": draw}
    exec(compile(module_source(program, params), "<fuzz program>", "exec"), names)
    return names["Model"]().eval()


def input_tensors(program: Program) -> list[torch.Tensor]:
    return [draw(n.shape, n.dtype, n.kind, n.seed, 1.0, n.high) for n in program.nodes if isinstance(n, Input)]


def batches(op: Op, metas: list[Meta]) -> int:
    """Batch indices of a batched matmul or attention (1 for the other ops)."""
    if op.kind not in ("matmul", "bmm", "sdpa"):
        return 1
    shapes = [metas[i].shape for i in op.args]
    return max(math.prod(s[:-2]) for s in shapes)


def macs(op: Op, metas: list[Meta], out: Meta) -> int:
    """Multiply-adds of a contraction (0 for the other ops): the fuzzer bounds them to keep a program fast."""
    ins = [metas[i] for i in op.args]
    if op.kind in ("matmul", "bmm", "linear"):
        return out.numel * ins[0].shape[-1]
    if op.kind == "sdpa":
        a = op.a
        sk = a["sk"] if a["kv"] == "param" else ins[1].shape[-2] if a["kv"] == "values" else ins[0].shape[-2]
        return math.prod(ins[0].shape) * sk * 2
    return 0
