"""`trnc run` and `trnc profile` on a .trnc artifact (a compiled model with its signature); `trnc disasm` loads it.

program_cmds hands a file here when it starts with the artifact magic (or is named *.trnc, so a
damaged artifact reports the ArtifactError rather than an assembly syntax error). Inputs follow the
model's input order and recorded torch dtypes: .npy files hold no bf16, so float arrays are rounded
to the recorded float type, and integer arrays are cast to the recorded integer type. Without
--inputs, floats are standard normal and integers are drawn from [0, 2), which keeps token ids and
other indices inside any table (a model with a one-row table is the only one it could overrun).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from trnc.errors import TrncError


JIT_TIMED_CALLS = 3   # after the first: the second still does one-time work (the clearing plan of the kept
# buffers, runtime/jit/clearing.py: 7 to 65 ms for the README's MLP, whose run takes about 1 ms)


def is_artifact(path: str) -> bool:
    from trnc.artifact import MAGIC
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
    return head == MAGIC or Path(path).suffix == ".trnc"


def load(path: str):
    """The CompiledModel in a .trnc file (ArtifactError when it is damaged)."""
    import trnc
    return trnc.load(path)


def _signature(model, dtypes) -> str:
    return ", ".join(f"{str(dt).removeprefix('torch.')} {list(d.shape)}" for d, dt in zip(model.inputs, dtypes))


def _given_inputs(model, dtypes, files: list[str]) -> list:
    import torch
    if len(files) != len(model.inputs):
        raise TrncError(f"--inputs gives {len(files)} file(s); the model takes {len(model.inputs)} input(s), in "
                        f"order: {_signature(model, dtypes)}")
    tensors = []
    for path, decl, dtype in zip(files, model.inputs, dtypes):
        try:
            value = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise TrncError(f"{path}: not a .npy array ({e}); save each input with numpy.save") from e
        if tuple(value.shape) != decl.shape:
            raise TrncError(f"{path}: shape {list(value.shape)}; the model was compiled for {list(decl.shape)} "
                            "(shapes are static: compile again for a new shape)")
        if value.dtype.kind == "f" and not dtype.is_floating_point:
            raise TrncError(f"{path}: {value.dtype} values for an input of type {dtype}; save integers")
        t = torch.from_numpy(value)
        tensors.append((t.float() if t.is_floating_point() else t).to(dtype))
    return tensors


def random_inputs(model, dtypes, seed: int) -> list:
    """Inputs of the recorded shapes and dtypes: floats standard normal, integers in [0, 2) (see above)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for decl, dtype in zip(model.inputs, dtypes):
        if dtype.is_floating_point:
            tensors.append(torch.randn(decl.shape, generator=gen).to(dtype))
        else:
            tensors.append(torch.randint(0, 2, decl.shape, generator=gen).to(dtype))
    return tensors


def _named_outputs(model, result) -> list[tuple[str, object]]:
    """(label, tensor) per output, labelled by program name and place in the output structure."""
    import torch.utils._pytree as pytree
    try:
        leaves = [(pytree.keystr(path), t) for path, t in pytree.tree_flatten_with_path(result)[0]]
    except ValueError:   # a pytree node type registered without key names
        leaves = [("", t) for t in pytree.tree_leaves(result)]
    return [(f"{decl.name}{path}", t) for decl, (path, t) in zip(model.outputs, leaves)]


def drive_run(args) -> int:
    if args.input or args.fill_nan:
        raise TrncError(f"{args.file} is a .trnc artifact: give its inputs in order with --inputs a.npy b.npy ..."
                        " (--input NAME=FILE and --fill-nan are for ISA programs)")
    model = load(args.file)
    dtypes = list(model.info.input_dtypes)   # the torch dtypes the model was traced with
    inputs = _given_inputs(model, dtypes, args.inputs) if args.inputs else random_inputs(model, dtypes, args.seed)
    call, calls, first = model.run_reference, 1, ""
    if args.engine == "jit":   # the first call compiles the kernels (or loads them from the cache): timed apart
        call, calls, started = model, JIT_TIMED_CALLS, time.perf_counter()
        model(*inputs)
        first = f"; first call {(time.perf_counter() - started) * 1e3:.2f} ms including kernel compilation"
    seconds = float("inf")
    for _ in range(calls):
        started = time.perf_counter()
        result = call(*inputs)
        seconds = min(seconds, time.perf_counter() - started)
    source = "--inputs" if args.inputs else f"random, seed {args.seed}"
    print(f"{args.file}: inputs ({source}): {_signature(model, dtypes)}")
    best = f" (best of {calls} calls)" if calls > 1 else ""
    print(f"outputs ({args.engine}, host time {seconds * 1e3:.2f} ms{best}{first}):")
    for (label, t), decl in zip(_named_outputs(model, result), model.outputs):
        as_f64 = t.double()
        values = (f" min {float(as_f64.min()):.6g} max {float(as_f64.max()):.6g} mean {float(as_f64.mean()):.6g}"
                  if t.numel() else "")
        print(f"  {label}: {str(t.dtype).removeprefix('torch.')} {list(t.shape)}{values}")
        if args.save_outputs:
            Path(args.save_outputs).mkdir(parents=True, exist_ok=True)
            # .npy holds no bf16: floats are saved as float32 (exact for bf16 and fp16)
            np.save(Path(args.save_outputs) / f"{decl.name}.npy", (t.float() if t.is_floating_point() else t).numpy())
    print(f"modeled time on {model.program.target}: {model.stats['seconds'] * 1e6:.3f} us "
          f"(efficiency {model.stats['efficiency']:.1%})")
    if args.trace:
        write_trace(args.trace, model.program, model.perf)
    if args.host_profile:
        print_host_profile(model.host_profile(*inputs))
    return 0


def drive_profile(args) -> int:
    from trnc.cli.model_cmds import engine_table
    model = load(args.file)
    s = model.stats
    print(model.perf.table())
    print()
    print("\n".join(engine_table(model.program, s)))
    print(f"efficiency {s['efficiency']:.1%}: roofline {s['roofline_seconds'] * 1e6:.3f} us "
          f"({s['roofline_cycles']:.0f} pe cycles) over modeled {s['seconds'] * 1e6:.3f} us ({s['cycles']:.0f})")
    if args.trace:
        write_trace(args.trace, model.program, model.perf)
    return 0


def print_host_profile(profile) -> None:
    """The host time per opcode of a profiled run (runtime/jit/host_profile.py)."""
    print("\nhost profile (one serial run; 'again': each step rerun at once, its data in cache):")
    print(profile.table())


def write_trace(path: str, program, report) -> None:
    from trnc.isa.config import get_target
    from trnc.runtime import trace
    trace.write_chrome_trace(path, program, report, get_target(program.target))
    print(f"trace: {path} (load it in ui.perfetto.dev or chrome://tracing)")
