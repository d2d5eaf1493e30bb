"""The numerics report: what a precision costs in accuracy, layer by layer and end to end, on the user's model.

`numerics_report(model, example_inputs, precision=..., target=..., **options)` compiles the model at that
precision and compares its outputs with eager fp32; then, for every layer that changes numerics (a linear or
convolution, a norm, a softmax, an attention block: LAYER_KINDS), it compiles that module alone and runs it on
the inputs eager fp32 gave it (teacher forcing: each layer sees exact inputs, so its row measures its own error
and not what the layers before it passed on). Each row holds the module path, the op, the dtype its matmuls
ran in, and SQNR (10 log10 |ref|^2 / |got - ref|^2, dB), relative L2 and max abs error against fp32.

Each layer compiles on its own, with its own parameters: a model's repeated blocks make that the report's cost.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import torch
import torch.utils._pytree as pytree
from torch import nn

from trnc.api import compile as trnc_compile
from trnc.errors import TrncError
from trnc.options import LOW_BIT, Options

# module classes whose output the report measures, by the op they are (a class name containing the key)
LAYER_KINDS = {"Linear": "linear", "Conv1d": "conv", "Conv2d": "conv", "Conv3d": "conv", "ConvTranspose": "conv",
               "LayerNorm": "layer_norm", "RMSNorm": "rms_norm", "GroupNorm": "group_norm", "BatchNorm": "batch_norm",
               "Softmax": "softmax", "Attention": "attention"}


@dataclass
class LayerRow:
    name: str          # the module path, e.g. encoder.layer.0.attention.self.query
    op: str
    dtype: str         # what its matmuls ran in at this precision
    sqnr_db: float
    rel_l2: float
    max_abs_err: float


@dataclass
class NumericsReport:
    precision: str
    target: str
    output_sqnr_db: float
    layers: list[LayerRow] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"numerics at precision {self.precision} on {self.target}: output SQNR {self.output_sqnr_db:.1f} dB "
                 "against fp32 (each layer below fed fp32 inputs)",
                 f"{'layer':48s} {'op':11s} {'dtype':9s} {'SQNR dB':>8s} {'rel L2':>9s} {'max |err|':>10s}"]
        lines += [f"{row.name[-48:]:48s} {row.op:11s} {row.dtype:9s} {row.sqnr_db:8.1f} {row.rel_l2:9.2e} "
                  f"{row.max_abs_err:10.3g}" for row in self.layers]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self), default=float))


def numerics_report(model: nn.Module, example_inputs, *, precision: str, target: str = Options.target,
                    example_kwargs: dict | None = None, **options) -> NumericsReport:
    """The report of `model` at `precision` (see the module docstring); `options` are trnc.compile's."""
    checked = Options(precision, options.get("auto_cast"), target,
                      **{k: v for k, v in options.items() if k != "auto_cast"})   # before anything runs
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    kwargs = dict(example_kwargs or {})
    model = model.eval()
    recorded = _record_layers(model, example_inputs, kwargs)
    with torch.no_grad():
        reference = model(*example_inputs, **kwargs)
    compiled = trnc_compile(model, example_inputs, example_kwargs=kwargs, precision=precision, target=target,
                            cache=False, **options)
    report = NumericsReport(precision, target, _metrics(reference, compiled(*example_inputs, **kwargs))[0])
    for name, module, args, layer_kwargs, output in recorded:
        layer = trnc_compile(_Tensors(module), args, example_kwargs=layer_kwargs, precision=precision, target=target,
                             cache=False, **options)
        sqnr, rel, worst = _metrics(_leaves(output), layer(*args, **layer_kwargs))
        report.layers.append(LayerRow(name, _kind(module), _dtype(checked, module), sqnr, rel, worst))
    return report


class _Tensors(nn.Module):
    """A layer returning only the tensors of its output (an attention block's tuple may hold None)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, *args, **kwargs):
        return _leaves(self.layer(*args, **kwargs))


def _leaves(output) -> tuple:
    return tuple(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))


def _kind(module: nn.Module) -> str | None:
    return next((op for key, op in LAYER_KINDS.items() if key in type(module).__name__), None)


def _dtype(options: Options, module: nn.Module) -> str:
    """What the layer computes in: a linear layer's or convolution's matmul operands, by the precision (a
    scaled one's for linear layers, bf16 for its convolutions: passes/graph/quantize.py); an attention block's
    projections and its core (bf16 under a scaled precision); a norm's or softmax's storage, which auto_cast
    narrows only under "all"."""
    kind, low = _kind(module), options.low_dtype.text
    linear = options.precision if options.precision in LOW_BIT else low
    if kind == "linear":
        return linear
    if kind in ("conv", "attention"):
        projections = any(_kind(m) == "linear" for m in module.modules())
        return f"{linear}/{low}" if kind == "attention" and projections and linear != low else low
    return low if options.auto_cast == "all" else "fp32"


def _record_layers(model: nn.Module, args: tuple, kwargs: dict) -> list[tuple]:
    """(path, module, fp32 args, fp32 kwargs, fp32 output) of every layer the report measures, from one eager
    forward; a layer called without a tensor is left out."""
    recorded, hooks = [], []

    def hook(name):
        def record(module, inputs, layer_kwargs, output):
            if any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((inputs, layer_kwargs))):
                recorded.append((name, module, _detached(tuple(inputs)), _detached(dict(layer_kwargs)),
                                 _detached(output)))
        return record
    for name, module in model.named_modules():
        if name and _kind(module) is not None:
            hooks.append(module.register_forward_hook(hook(name), with_kwargs=True))
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    if not recorded:
        raise TrncError(f"{type(model).__name__} has no layer the numerics report measures "
                        f"(modules of {', '.join(LAYER_KINDS)})")
    return recorded


def _detached(output):
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, output)


def _metrics(reference, got) -> tuple[float, float, float]:
    """SQNR (dB), relative L2 and max abs error over every float leaf of the outputs."""
    ref_all, out_all = (torch.cat([t.double().flatten() for t in pytree.tree_leaves(value)
                                   if isinstance(t, torch.Tensor) and t.is_floating_point()])
                        for value in (reference, got))
    err = out_all - ref_all
    signal, noise = float((ref_all ** 2).sum()), float((err ** 2).sum())
    sqnr = math.inf if noise == 0 else 10 * math.log10(signal / noise) if signal else -math.inf
    rel = math.sqrt(noise / signal) if signal else math.inf
    return sqnr, rel, float(err.abs().max()) if err.numel() else 0.0
