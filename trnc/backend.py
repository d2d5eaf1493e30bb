"""The torch.compile backend: `torch.compile(model, backend="trnc", options={...})`, the dynamo entry point.

Registered through the `torch_dynamo_backends` entry point (setup.cfg), so torch finds it by name
without an import of trnc. Dynamo hands `trnc_backend` an fx graph of torch calls; aot_autograd, with
trnc's decomposition table (trnc.capture.decomposition_table: Core ATen minus the ops trnc lowers
whole, so attention arrives as one sdpa op), turns it into an aten graph and calls the forward compiler
here. The forward graph is specialized to concrete input shapes, partitioned (trnc/partition.py), and
each device region compiled with `trnc.compile`; unsupported ops run in eager PyTorch between regions,
listed once per compile in a WARNING and in `last_report()`.

Shapes are static. Dynamo compiles the first shapes it sees as static; after a shape change it may
recompile with symbolic sizes (automatic dynamic shapes). The forward compiler then keeps one compiled
variant per concrete signature (shapes, dtypes, integer arguments) in an LRU of MAX_VARIANTS: a ninth
signature evicts the least recently used one, which compiles again if it returns. Every variant is
compiled on its first call, outside dynamo's tracing, so a trnc error (fallback=False) reaches the user
as itself rather than wrapped in dynamo's BackendCompilerFailed.

Inference is the target. In an inference graph, parameters and buffers (dynamo's static inputs) are
frozen into the variant as constants, as trnc.compile does, so legalize folds what depends on them
alone; a variant remembers each weight's identity and version counter and compiles again when one is
replaced or written in place. When autograd needs the graph (grad mode with inputs or parameters that
require grad) the forward runs on trnc with the weights as inputs, and the backward runs in eager
PyTorch: aot_autograd's backward graph, uncompiled, on the activations the device computed.
"""
from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass, field

import torch
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from trnc import api
from trnc.capture import WRONG_DECOMPOSITIONS, decomposition_table, source_of
from trnc.errors import TrncError, UnsupportedOpError
from trnc.log import get_logger
from trnc.options import OPTION_NAMES, Options
from trnc.partition import FallbackOp, freeze, partition

MAX_VARIANTS = 8   # compiled shape variants kept per dynamo graph (least recently used evicted)

_last: Report | None = None


@dataclass(frozen=True)
class BackendOptions:
    """The `options=` of torch.compile: trnc.compile's Options, and whether unsupported ops run in eager."""

    compile: Options = Options()
    fallback: bool = True


def parse_options(options: dict | None) -> BackendOptions:
    """BackendOptions from torch.compile's options dict; an unknown key or value raises TrncError naming it."""
    options = dict(options or {})
    names = (*OPTION_NAMES, "fallback")
    for key in options:
        if key not in names:
            raise TrncError(f"unknown trnc backend option {key!r}; the options are {', '.join(names)}")
    fallback = options.pop("fallback", True)
    if fallback is not True and fallback is not False:
        raise TrncError(f"trnc backend option fallback={fallback!r} is not allowed; choose one of True, False")
    try:
        return BackendOptions(Options(**options), fallback)
    except TrncError as e:
        raise TrncError(f"trnc backend option {e}") from None


@dataclass(frozen=True)
class Report:
    """What one backend compile did: device regions, the ops that run in eager PyTorch, and where they are."""

    input_shapes: tuple[tuple[int, ...], ...]   # the graph's tensor inputs other than parameters and buffers
    device_partitions: int          # regions compiled by trnc.compile
    device_nodes: int               # aten nodes inside them
    fallback: tuple[FallbackOp, ...]
    options: BackendOptions
    compile_seconds: float
    variants: int = 1               # compiled shape variants this graph holds after this compile
    regions: tuple = field(default=(), repr=False)   # the CompiledModels, for their .stats and .perf
    device_ops: tuple[str, ...] = ()                  # the distinct aten ops of the device regions' nodes

    @property
    def fallback_nodes(self) -> int:
        return sum(f.count for f in self.fallback)

    def text(self) -> str:
        """The WARNING's text: one line per fallback op with its count, reason and the user's source lines."""
        head = (f"{self.fallback_nodes} node(s) of {len(self.fallback)} op(s) run in eager PyTorch (CPU fallback) "
                f"around {self.device_partitions} trnc region(s) for inputs {list(map(list, self.input_shapes))}:")
        lines = [head]
        for f in self.fallback:
            lines.append(f"  {f.op} x{f.count}: {f.reason}")
            lines.extend(f"      at {s}" for s in f.sources)
        lines.append("  options={'fallback': False} makes this an error")
        return "\n".join(lines)


def last_report() -> Report | None:
    """The Report of the most recent backend compile in this process (None before the first)."""
    return _last


def trnc_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """The dynamo backend: torch.compile calls it with the graph, its example inputs and `options=`."""
    if mode not in (None, "default"):
        raise TrncError(f"torch.compile mode={mode!r} is not supported by the trnc backend; pass options= instead")
    opts = parse_options(options)
    wrong = _wrong_decomposition(gm)
    if wrong is not None:
        return _eager_whole(gm, example_inputs, opts, *wrong)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    return aot_autograd(fw_compiler=functools.partial(_forward_compiler, opts, False),
                        inference_compiler=functools.partial(_forward_compiler, opts, True),
                        decompositions=decomposition_table(),
                        bw_compiler=lambda bw, _: make_boxed_func(bw.forward))(gm, example_inputs)


def _wrong_decomposition(gm: torch.fx.GraphModule) -> tuple[torch.fx.Node, str] | None:
    """The first call of a torch function whose decomposition aot_autograd would apply and torch gets wrong
    (capture.WRONG_DECOMPOSITIONS), and that op's name; None when there is none."""
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", None) if node.op == "call_function" else None
        for op, functions in WRONG_DECOMPOSITIONS.items():
            if name in functions:
                return node, op.rstrip(".")
    return None


def _eager_whole(gm: torch.fx.GraphModule, example_inputs, opts: BackendOptions, node: torch.fx.Node, op: str):
    """The dynamo graph uncompiled, in eager PyTorch (visible: a WARNING and the report), or with fallback=False a
    callable that raises UnsupportedOpError naming the op at the first call."""
    global _last
    source = source_of(node.meta.get("stack_trace"))
    reason = f"{op} is not supported: torch's decomposition of it is wrong, so the graph runs in eager PyTorch"
    if not opts.fallback:
        def refuse(*args):
            raise UnsupportedOpError(f"{reason}{f' (at {source})' if source else ''}")
        return refuse
    shapes = tuple(tuple(int(s) for s in a.shape) for a in example_inputs if isinstance(a, torch.Tensor))
    nodes = sum(n.op == "call_function" for n in gm.graph.nodes)
    _last = Report(shapes, 0, 0, (FallbackOp(op, nodes, (source,) if source else (), reason),), opts, 0.0)
    get_logger(__name__).warning(_last.text())
    return gm.forward


def _is_static(value) -> bool:
    if isinstance(value, torch.Tensor):
        return all(isinstance(s, int) for s in value.shape)
    return not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _forward_compiler(opts: BackendOptions, freeze: bool, gm: torch.fx.GraphModule, example_inputs):
    """aot_autograd's forward (training) or inference compiler: a boxed callable that runs the variant compiled
    for each signature. Dynamo's static inputs (parameters, buffers) are frozen into inference variants only:
    an optimizer step would otherwise recompile on every step."""
    context = torch._guards.TracingContext.try_get()
    weights = set(context.fw_metadata.static_input_indices) if context and context.fw_metadata else set()
    return Variants(gm, opts, all(_is_static(a) for a in example_inputs), weights, freeze)


class Variants:
    """One dynamo graph's compiled variants, keyed by the concrete signature of the call, in an LRU."""

    _boxed_call = True   # aot_autograd passes the arguments as one list

    def __init__(self, gm: torch.fx.GraphModule, opts: BackendOptions, static: bool, weights: set[int], freeze: bool):
        self.gm, self.opts, self.static = gm, opts, static
        self.weights = sorted(weights)   # argument positions of the parameters and buffers
        self.frozen = self.weights if freeze else []
        self.cache: collections.OrderedDict[tuple, tuple[torch.nn.Module, tuple]] = collections.OrderedDict()

    def __call__(self, args: list):
        run = self.variant(args)
        out = run(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def variant(self, args: list) -> torch.nn.Module:
        """The variant for these arguments' signature, compiled now if it is new or its frozen weights changed
        (another tensor, or the same one written in place: load_state_dict, an optimizer step)."""
        key = _signature(args)
        stamp = tuple((id(args[i]), args[i]._version) for i in self.frozen)
        if key in self.cache and self.cache[key][1] == stamp:
            self.cache.move_to_end(key)
            return self.cache[key][0]
        if key in self.cache:
            get_logger(__name__).info("parameters or buffers changed since the trnc compile; compiling again")
            del self.cache[key]
        run = self._compile(args)
        self.cache[key] = (run, stamp)
        while len(self.cache) > MAX_VARIANTS:
            self.cache.popitem(last=False)
        return run

    def _compile(self, args: list) -> torch.nn.Module:
        global _last
        start = time.perf_counter()
        graph, positions = (self.gm, list(range(len(args)))) if self.static else _specialize(self.gm, args)
        frozen = [k for k, i in enumerate(positions) if i in self.frozen]
        if frozen:
            graph = freeze(graph, [args[i] for i in positions], frozen)
        regions = []

        def compile_region(sub, inputs):
            compiled = api.compile(sub, inputs, **vars(self.opts.compile))
            regions.append(compiled)
            return compiled

        result = partition(graph, compile_region, self.opts.fallback)
        shapes = tuple(tuple(int(s) for s in a.shape) for i, a in enumerate(args)
                       if isinstance(a, torch.Tensor) and i not in self.weights)
        _last = Report(shapes, result.device_partitions, result.device_nodes, result.fallback, self.opts,
                       time.perf_counter() - start, min(len(self.cache) + 1, MAX_VARIANTS), tuple(regions),
                       result.device_ops)
        log = get_logger(__name__)   # asked for each time: TRNC_LOG may have changed
        if result.fallback:
            log.warning(_last.text())
        else:
            log.info("%d trnc region(s), %d nodes, no fallback, for inputs %s (%.2f s)", _last.device_partitions,
                     _last.device_nodes, list(map(list, shapes)), _last.compile_seconds)
        return _Picked(result.module, [i for k, i in enumerate(positions) if k not in frozen])


def _specialize(gm: torch.fx.GraphModule, args: list) -> tuple[torch.fx.GraphModule, list[int]]:
    """`gm` (with symbolic sizes and SymInt arguments) re-traced for these concrete arguments: a static aten
    graph whose placeholders are the tensor arguments, and their positions; integer arguments become constants."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def run(*xs):
        full = list(args)
        for i, x in zip(tensors, xs):
            full[i] = x
        return torch.fx.Interpreter(gm).run(*full)

    with fx_traceback.preserve_node_meta():
        traced = make_fx(run, decomposition_table=decomposition_table(), tracing_mode="fake",
                         _allow_non_fake_inputs=True)(*[args[i] for i in tensors])
    return traced, tensors


class _Picked(torch.nn.Module):
    """Calls a variant's graph with the arguments it still takes: integers were specialized, weights frozen."""

    def __init__(self, module: torch.nn.Module, positions: list[int]):
        super().__init__()
        self.module, self.positions = module, positions

    def forward(self, *args):
        return self.module(*[args[i] for i in self.positions])

