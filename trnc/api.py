"""trnc.compile and CompiledModel: the library entry point from a PyTorch model to a runnable, profiled program.

compile() captures the model (trnc/capture.py), looks the captured graph up in the compile cache
(trnc/compile_cache.py), and on a miss runs the pass pipeline (passes/pipeline.py), models the
program's time (runtime/perf.py) and stores the result. The CompiledModel is called like the model:
torch tensors in, the model's output structure out, executed by the JIT (or the numpy reference).
On a terminal each step shows on one progress line (trnc/progress.py); the `trnc.api` logger says
at INFO what was compiled and how, and at DEBUG each step's time and the cache entry.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

from trnc import artifact, compile_cache
from trnc.capture import capture, layout_of
from trnc.dtypes import numpy_of, tensor_of
from trnc.errors import TrncError
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.isa.program import Program, TensorKind
from trnc.log import get_logger
from trnc.options import Options
from trnc.passes import roofline
from trnc.passes.pipeline import CompileState, PassProgress, print_after_names, run_pipeline
from trnc.passes.tile.kernels.elementwise import FP32_EXACT_INTEGERS
from trnc.progress import Progress
from trnc.runtime import perf, reference

def compile(model, example_inputs, *, precision: str = Options.precision, target: str = Options.target,
            auto_cast: str | None = None, fp8_format: str = Options.fp8_format,
            fp8_scaling: str = Options.fp8_scaling, mx_scale: str = Options.mx_scale,
            emulate: bool = Options.emulate, keep_precision: dict | None = None,
            rounding: str = Options.rounding, seed: int = Options.seed,
            attention_precision: str = Options.attention_precision, example_kwargs: dict | None = None,
            print_after=(), verify: bool = True,
            cache: bool = True) -> "CompiledModel":
    """Compile `model` for the example inputs' shapes; see CompiledModel for what comes back.

    precision: "fp32", "bf16", "fp16" (the type auto_cast casts to), "fp8" (weights' matmuls in fp8 scaled
    per tensor), "mxfp8" or "mxfp4" (weights' matmuls in MX blocks of 32 along K, on trn3 or emulated); the rest of a
    scaled precision's model as bf16 would be (passes/graph/quantize.py). auto_cast: "none", "matmult"
    (default but for fp32: matmul operands) or "all" (every intermediate value). target: "trn1", "trn2",
    "trn3". fp8_format: "e4m3" (OCP e4m3fn) or "e5m2", the fp8 and mxfp8 elements; fp8_scaling: "dynamic"
    (activation scales computed on the device) or "static" (calibrated on the example inputs); mx_scale:
    "floor" (OCP v1.0), "rceil" or "trn_alt", the E8M0 scale rule; emulate: run fp8 on a target without fp8
    double-row matmuls (trn1), or mxfp8 and mxfp4 on one without MX matmuls (trn1, trn2), at bf16 speed;
    keep_precision: {module-path glob: "fp32" | "bf16" | "fp16"}, the layers whose matmuls keep that precision,
    e.g. {"lm_head": "bf16", "*.attn.*": "bf16"}; rounding:
    "nearest" (even) or "stochastic" for every value the program converts to bf16, fp16 or fp8 (kernel results,
    evacuations and the conversions of loads, stores and copies; constants cast at compile time round to
    nearest: docs/precision.md), reproducible from `seed`. attention_precision: "auto" (attention's two
    matmuls follow auto_cast: bf16 under the scaled precisions), "fp32", "bf16" or "fp16".
    cache: reuse and fill the compile cache on disk (trnc/compile_cache.py); False, TRNC_CACHE=0 or a
    print_after request (the passes must run to print) compile without it. stats["cache"] says "hit",
    "miss" or "off"; stats["compile_seconds"] is the time of this call. trnc/options.py checks the values.
    """
    options = Options(precision, auto_cast, target, fp8_format, fp8_scaling, mx_scale, emulate,
                      dict(keep_precision or {}), rounding, seed, attention_precision)
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    start = time.perf_counter()
    print_after = print_after_names(print_after)
    calibrated = options.fp8_dtype is not None and options.fp8_scaling == "static"   # depends on input values
    models = compile_cache.open_cache(cache and not print_after and not calibrated)
    # the progress line stays off when DEBUG lines or printed IR would interleave with it
    debug = get_logger(__name__).isEnabledFor(logging.DEBUG)
    with Progress(0, enabled=not (print_after or debug)) as progress:
        passes = PassProgress(progress)
        progress.total = 2 + passes.steps + (2 if models else 0)    # capture, [key], passes, perf model, [store]
        times: dict[str, float] = {}
        graph, info = _step(progress, times, "capture", capture, model, tuple(example_inputs), example_kwargs)
        key = _step(progress, times, "cache-key", _cache_key, models, graph, options) if models else None
        record = None
        if key is not None and models.has(key):
            progress.total = len(times) + 1
            record = _step(progress, times, "cache-load", models.lookup, key)
        if record is not None:   # with the caller's own capture: the same call and output structure
            compiled = CompiledModel.of(dataclasses.replace(record, info=info))
            stored = compiled.stats
            stored["cached_compile_seconds"] = stored.pop("compile_seconds", None)
            stored["cached_pass_seconds"] = stored.pop("pass_seconds", {})
            status = "hit"
        else:
            progress.total = len(times) + passes.steps + 1 + (key is not None)
            tensors = tuple(x for x in pytree.tree_leaves((tuple(example_inputs), dict(example_kwargs or {})))
                            if isinstance(x, torch.Tensor))
            compiled = _run_passes(graph, info, options, tensors, progress, times, print_after, verify, passes)
            status = "off" if key is None else "miss"
            if key is not None:
                compiled.stats.update(compile_seconds=time.perf_counter() - start, pass_seconds=dict(times))
                _step(progress, times, "cache-store", models.store, key, compiled.record())
    compiled.stats.update(cache=status, compile_seconds=time.perf_counter() - start, pass_seconds=times)
    _log_compile(model, options, compiled.stats)
    return compiled


def _step(progress: Progress, times: dict[str, float], name: str, fn, *args):
    """Run one step of compile under the progress line; its seconds go to times[name]."""
    progress.begin(name)
    result = fn(*args)
    times[name] = progress.end()
    get_logger(__name__).debug("%s: %.3f s", name, times[name])
    return result


def _cache_key(models: compile_cache.ModelCache, graph, options: Options) -> str | None:
    log = get_logger(__name__)
    try:
        key = compile_cache.graph_key(graph, options)
    except compile_cache.Uncacheable as e:
        log.debug("compile cache: not used for this model: %s", e)
        return None
    log.debug("compile cache key %s, entry %s (%s)", key, models.path(key),
              "present" if models.has(key) else "absent")
    return key


def _run_passes(graph, info, options: Options, example_inputs: tuple, progress: Progress, times: dict[str, float],
                print_after, verify: bool, passes: PassProgress) -> "CompiledModel":
    """The pass pipeline (each pass a step of the progress line), then the performance model."""
    state = CompileState(graph, options, get_target(options.target), example_inputs)
    times.update(run_pipeline(state, print_after=print_after, verify=verify, hooks=(passes,)))

    def model() -> CompiledModel:
        compiled = CompiledModel(state.program, state.tiles.constants, info, options)
        compiled.stats.update(roofline.compiled_stats(state.graph, state.hw, compiled.perf,
                                                      state.stats.get("allocate", {})))
        return compiled
    return _step(progress, times, "perf-model", model)


def _log_compile(model, options: Options, stats: dict) -> None:
    get_logger(__name__).info(
        "compiled %s (precision=%s auto_cast=%s target=%s): cache %s, %.2f s, %d instructions, modeled %.2f us",
        type(model).__name__, options.precision, options.auto_cast, options.target, stats["cache"],
        stats["compile_seconds"], stats["instructions"], stats["seconds"] * 1e6)


class CompiledModel:
    """A compiled model: call it like the model. `.program` is the isa.Program, `.stats` its counters,
    `.perf` the performance model's report (computed on first use when the stats came with the program)."""

    def __init__(self, program: Program, constants: dict[str, np.ndarray], info, options: Options,
                 stats: dict | None = None):
        self.program = program
        self.constants = constants
        self.info = info
        self.options = options
        self.inputs = program.tensors_of(TensorKind.INPUT)
        self.seeds = program.tensors_of(TensorKind.SEED)   # the random ops' seed: a new one each call
        self.outputs = program.tensors_of(TensorKind.OUTPUT)
        self._jit = None
        self._perf = None
        self.stats = dict(stats) if stats is not None else self._perf_stats()

    @classmethod
    def of(cls, record: artifact.Record) -> "CompiledModel":
        return cls(record.program, record.constants, record.info, record.options, record.stats)

    def record(self) -> artifact.Record:
        """What an artifact file and the compile cache keep of the model."""
        return artifact.Record(self.program, self.constants, self.info, self.options, self.stats)

    @property
    def perf(self) -> perf.PerfReport:
        if self._perf is None:
            self._perf = perf.simulate(self.program, get_target(self.program.target), verified=True)
        return self._perf

    def _perf_stats(self) -> dict:
        return roofline.program_stats(self.perf, get_target(self.program.target))

    # -- calling ---------------------------------------------------------------------------------------
    def _feed(self, args, kwargs) -> dict[str, np.ndarray]:
        leaves = [x for x in pytree.tree_leaves((tuple(args), dict(kwargs))) if isinstance(x, torch.Tensor)]
        if len(leaves) != len(self.inputs):
            raise TrncError(f"called with {len(leaves)} tensors; the model was compiled for {len(self.inputs)}")
        feed = dict(self.constants)
        layouts = getattr(self.info, "input_layouts", None)
        for i, (t, decl) in enumerate(zip(leaves, self.inputs)):
            if tuple(t.shape) != decl.shape:
                raise TrncError(f"input {i} has shape {list(t.shape)}; it was compiled for {list(decl.shape)} "
                                "(shapes are static: compile again for new shapes)")
            if layouts and layouts[i] is not None and layout_of(t) != tuple(layouts[i]):
                raise TrncError(f"input {i} has strides {list(t.stride())} and storage offset {t.storage_offset()}; "
                                f"the model reads storage (as_strided) and was compiled for the layout {layouts[i]} "
                                "(call with that layout, or compile again)")
            if decl.dtype is DType.INT32 and t.numel() and max(int(t.max()), -int(t.min())) >= FP32_EXACT_INTEGERS:
                raise TrncError(f"input {i} holds integers of magnitude 2^24 or more: the engines compare and "
                                "compute integers in fp32, exactly only below 2^24 (compute in float, or keep "
                                "such integers on the host)")
            feed[decl.name] = numpy_of(t, decl.dtype)
        for decl in self.seeds:   # from torch's default generator, so torch.manual_seed makes runs repeat
            feed[decl.name] = torch.randint(-2 ** 31, 2 ** 31, (1,), dtype=torch.int64).to(torch.int32).numpy()
        return feed

    def _result(self, out: dict[str, np.ndarray]):
        flat = []
        for decl, torch_dtype in zip(self.outputs, self.info.output_dtypes):
            value = out[decl.name]
            flat.append(tensor_of(value, decl.dtype).reshape(value.shape).to(torch_dtype))
        return pytree.tree_unflatten(flat, self.info.out_spec) if self.info.out_spec is not None else tuple(flat)

    def _loaded(self):
        if self._jit is None:
            from trnc.runtime.jit import executor
            self._jit = executor.load(self.program, verified=True)
        return self._jit

    def __call__(self, *args, **kwargs):
        return self._result(self._loaded().run(self._feed(args, kwargs)))

    def host_profile(self, *args, **kwargs):
        """Where the JIT's host time goes on these inputs: one serial run with each instruction timed as the run
        reaches it and again at once (runtime/jit/host_profile.py; `.table()` prints it per opcode)."""
        return self._loaded().host_profile(self._feed(args, kwargs))

    def run_reference(self, *args, **kwargs):
        """Execute on the numpy reference interpreter (slow; the JIT must agree with it bit for bit)."""
        return self._result(reference.run(self.program, self._feed(args, kwargs), verified=True))

    def save(self, path) -> None:
        artifact.save(self.record(), Path(path))


def load(path) -> CompiledModel:
    """A CompiledModel from a .trnc artifact written by CompiledModel.save (checked and verified by
    trnc/artifact.py before it can run)."""
    return CompiledModel.of(artifact.load(Path(path)))
