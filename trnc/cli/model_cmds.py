"""The `trnc compile` subcommand: a model defined in a Python file to a .trnc artifact and a summary.

FILE.py defines `model` and `example_inputs` at module level, or FILE.py:NAME names a function in it
returning `(model, example_inputs)`. The file is imported the way `python FILE.py` would see it (its
folder first on sys.path while it loads and while NAME runs), under a private module name so it can
never replace an installed module. Every mistake in the file becomes one TrncError naming the file and
the fix; the original exception stays chained for `TRNC_LOG=debug`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import logging
import re
import sys
from collections import Counter
from pathlib import Path

from trnc.errors import TrncError
from trnc.log import debug_enabled
from trnc.isa.ap import Engine
from trnc.isa.config import TARGETS
from trnc.options import ATTENTION_PRECISIONS, FP8_FORMATS, FP8_SCALING, MX_SCALES, PRECISIONS, ROUNDINGS, Options

DEFINES = ("in it, define `model` and `example_inputs` at module level, or a function returning (model, "
           "example_inputs) and give its name as FILE.py:NAME")


def split_spec(spec: str) -> tuple[Path, str | None]:
    """FILE.py[:NAME] -> (path, NAME or None); a colon is a separator only before an identifier."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail.isidentifier():
        return Path(head), tail
    return Path(spec), None


@contextlib.contextmanager
def _folder_on_path(folder: Path):
    """The model file's own imports (helpers next to it) resolve as under `python FILE.py`."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        if entry in sys.path:
            sys.path.remove(entry)


def _import(path: Path):
    name = "_trnc_model_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TrncError(f"{path}: not an importable Python file; give a Python model file ({DEFINES})")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclasses and typing look their module up while it executes
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise TrncError(f"{path} raised {type(e).__name__} while importing: {e}; fix the file "
                        "(TRNC_LOG=debug shows the traceback)") from e
    return module


def _functions(module) -> list[str]:
    return sorted(n for n, v in vars(module).items()
                  if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_"))


def load_model(spec: str):
    """(model, example_inputs, path) from FILE.py[:NAME]; a TrncError saying what to change otherwise."""
    path, name = split_spec(spec)
    if not path.is_file():
        raise TrncError(f"{path}: no such file; give the path of a Python model file ({DEFINES})")
    if path.suffix != ".py":
        hint = "; run or inspect an artifact with `trnc run` or `trnc disasm`" if path.suffix == ".trnc" else ""
        raise TrncError(f"{path}: not a .py file; compile takes a Python model file ({DEFINES}){hint}")
    with _folder_on_path(path.resolve().parent):
        module = _import(path)
        functions = _functions(module)
        listing = f"functions in it: {', '.join(functions)}" if functions else "it defines no functions"
        if name is None:
            missing = [n for n in ("model", "example_inputs") if not hasattr(module, n)]
            if missing:
                raise TrncError(f"{path} defines no {' or '.join(missing)} at module level; {DEFINES} ({listing})")
            return module.model, module.example_inputs, path
        factory = getattr(module, name, None)
        if not callable(factory):
            raise TrncError(f"{path} has no function {name!r}; {listing}")
        try:
            made = factory()
        except Exception as e:
            raise TrncError(f"{path}:{name}() raised {type(e).__name__}: {e}; fix it "
                            "(TRNC_LOG=debug shows the traceback)") from e
    if not (isinstance(made, tuple) and len(made) == 2):
        raise TrncError(f"{path}:{name}() returned {type(made).__name__}; it must return (model, example_inputs)")
    return made[0], made[1], path


def _print_after(values: list[str] | None) -> set[str]:
    """--print-after is repeatable and comma-separated; the names are checked here, before the slow capture."""
    from trnc.passes.pipeline import print_after_names
    return print_after_names(n.strip() for v in values or () for n in v.split(",") if n.strip())


def engine_table(program, stats: dict) -> list[str]:
    """One row per engine (the DMA queues as one): instructions, busy time, utilization and opcode counts."""
    dma_queues: set[str] = set()
    opcodes: dict[str, Counter] = {}
    for ins in program.instructions:
        engine = "dma" if ins.engine is Engine.DMA else ins.queue_name
        if engine == "dma":
            dma_queues.add(ins.queue_name)
        opcodes.setdefault(engine, Counter())[str(ins.opcode)] += 1
    util = stats.get("engine_utilization", {})
    lines = [f"{'engine':<7} {'instrs':>7} {'busy us':>10} {'util':>7}  opcodes"]
    for engine, busy in stats.get("engine_busy", {}).items():
        counts = opcodes.get(engine, Counter())
        text = ", ".join(f"{op} {n}" for op, n in sorted(counts.items())) or "-"
        share = util.get(engine, 0.0)
        if engine == "dma":
            share = sum(util.get(q, 0.0) for q in dma_queues) / len(dma_queues) if dma_queues else 0.0
            text += f" (on {len(dma_queues)} queues)" if dma_queues else ""
        lines.append(f"{engine:<7} {sum(counts.values()):>7} {busy * 1e6:>10.3f} {share:>7.1%}  {text}")
    lines.append(f"{'total':<7} {len(program.instructions):>7}")
    return lines


def summary(model, source: Path, out: Path, size: int) -> str:
    """The table `trnc compile` prints: work per engine, memory, modeled time, traffic and compile time."""
    from trnc.isa.config import get_target
    s, hw = model.stats, get_target(model.program.target)
    o = model.options
    lines = [f"{source} -> {out} ({size} bytes): precision {o.precision}, auto_cast {o.auto_cast}, "
             f"target {o.target}", *engine_table(model.program, s)]
    lines[-1] += f" in {s['kernels']} kernels"
    sbuf_cap = hw.sbuf_bytes_per_partition * hw.partitions
    psum_cap = hw.psum_bytes_per_partition * hw.partitions
    lines.append(f"SBUF peak {s['sbuf_peak_bytes']} B ({s['sbuf_peak_bytes'] / sbuf_cap:.1%} of {sbuf_cap}); "
                 f"PSUM peak {s['psum_peak_bytes']} B ({s['psum_peak_bytes'] / psum_cap:.1%} of {psum_cap})")
    lines.append(f"modeled time {s['seconds'] * 1e6:.3f} us ({s['cycles']:.0f} pe cycles); roofline "
                 f"{s['roofline_seconds'] * 1e6:.3f} us; efficiency {s['efficiency']:.1%}")
    directions = ", ".join(f"{d} {b}" for d, b in model.perf.dma_bytes.items() if b)
    lines.append(f"DMA bytes {s['dma_bytes']}" + (f" ({directions})" if directions else ""))
    steps = ", ".join(f"{p} {t:.3f}" for p, t in s["pass_seconds"].items())
    cache = f"compile cache {s['cache']}; " if "cache" in s else ""
    lines.append(f"compile time {s['compile_seconds']:.2f} s ({cache}s per step: {steps})")
    return "\n".join(lines)


@contextlib.contextmanager
def _quiet_torch():
    """A failed trace shows as one error line: torch's own warnings about it are dropped, unless
    TRNC_LOG=debug (capture holds back the graph torch prints)."""
    if debug_enabled():
        yield
        return
    torch_logger = logging.getLogger("torch")
    level = torch_logger.level
    torch_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        torch_logger.setLevel(level)


def _kept(pairs) -> dict:
    """--keep-precision PATTERN=PRECISION arguments as Options.keep_precision."""
    kept = {}
    for pair in pairs or ():
        pattern, sep, precision = pair.rpartition("=")
        if not sep or not pattern:
            raise TrncError(f"--keep-precision {pair!r}: expected PATTERN=PRECISION, e.g. 'lm_head=bf16'")
        kept[pattern] = precision
    return kept


def drive_compile(args) -> int:
    # with --json, stdout carries the JSON only: anything the model file prints goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with quiet:
        model, example_inputs, source = load_model(args.file)
        print_after = _print_after(args.print_after)   # before the slow capture
        from trnc import api   # after the model file, which imports torch and so sets up torch's loggers
        with _quiet_torch():
            compiled = api.compile(model, example_inputs, precision=args.precision, target=args.target,
                                   auto_cast=args.auto_cast, fp8_format=args.fp8_format,
                                   fp8_scaling=args.fp8_scaling, mx_scale=args.mx_scale, emulate=args.emulate,
                                   keep_precision=_kept(args.keep_precision), rounding=args.rounding,
                                   seed=args.seed, attention_precision=args.attention_precision,
                                   print_after=print_after)
        out = Path(args.output) if args.output else source.with_suffix(".trnc")
        compiled.save(out)
    report = None
    if args.numerics:
        from trnc.numerics import numerics_report
        with quiet, _quiet_torch():
            report = numerics_report(model, example_inputs, precision=args.precision, target=args.target,
                                     auto_cast=args.auto_cast, fp8_format=args.fp8_format,
                                     fp8_scaling=args.fp8_scaling, mx_scale=args.mx_scale, emulate=args.emulate,
                                     keep_precision=_kept(args.keep_precision), rounding=args.rounding,
                                     seed=args.seed, attention_precision=args.attention_precision)
    if args.json:
        stats = dict(compiled.stats, **({"numerics": report.to_dict()} if report else {}))
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        print(summary(compiled, source, out, out.stat().st_size))
        if report:
            print(report.table())
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "compile", help="compile a model defined in a Python file to a .trnc artifact and print a summary.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="FILE.py defines `model` and `example_inputs` (a tensor or a tuple of tensors) at module\n"
               "level, or FILE.py:NAME names a function in it returning (model, example_inputs).\n\n"
               "example:\n  trnc compile examples/mlp.py -o mlp.trnc\n"
               "  trnc compile examples/tiny_bert.py:bert --precision bf16 --print-after fuse --json")
    p.add_argument("file", metavar="FILE.py[:NAME]", help="the model file, e.g. examples/mlp.py.")
    p.add_argument("-o", "--output", metavar="OUT.trnc", help="artifact to write. Defaults to FILE with suffix .trnc.")
    p.add_argument("--precision", default=Options.precision,
                   help=f"{', '.join(PRECISIONS)}: the type auto-cast casts to (fp8: weights' matmuls in fp8 "
                        f"scaled per tensor, the rest as bf16). Defaults to {Options.precision}.")
    p.add_argument("--fp8-format", default=Options.fp8_format, choices=tuple(FP8_FORMATS),
                   help=f"the fp8 operands' format with --precision fp8. Defaults to {Options.fp8_format}.")
    p.add_argument("--fp8-scaling", default=Options.fp8_scaling, choices=FP8_SCALING,
                   help="activation scales computed on the device (dynamic) or from the example inputs (static). "
                        f"Defaults to {Options.fp8_scaling}.")
    p.add_argument("--mx-scale", default=Options.mx_scale, choices=tuple(MX_SCALES),
                   help=f"the E8M0 block scale rule with --precision mxfp8 or mxfp4. Defaults to {Options.mx_scale}.")
    p.add_argument("--keep-precision", action="append", metavar="PATTERN=PRECISION",
                   help="keep the matmuls of the modules matching a glob over their path in fp32, bf16 or fp16, "
                        "e.g. 'lm_head=bf16' or '*.attn.*=bf16'. Repeatable.")
    p.add_argument("--attention-precision", default=Options.attention_precision, choices=ATTENTION_PRECISIONS,
                   help="what attention's two matmuls compute in; auto follows --auto-cast (bf16 under fp8 and MX). "
                        "Defaults to auto.")
    p.add_argument("--rounding", default=Options.rounding, choices=tuple(ROUNDINGS),
                   help="how values written in bf16, fp16 or fp8 round. Defaults to nearest (even).")
    p.add_argument("--seed", type=int, default=Options.seed, help="the seed of stochastic rounding. Defaults to 0.")
    p.add_argument("--emulate", action="store_true",
                   help="run fp8 on a target without fp8 double-row matmuls (trn1), or mxfp8 and mxfp4 on one "
                        "without MX matmuls (trn1, trn2), at bf16 speed.")
    p.add_argument("--target", choices=TARGETS, default=Options.target,
                   help=f"the machine preset. Defaults to {Options.target}.")
    p.add_argument("--auto-cast", help="what is cast to the precision: none, matmult (matmul operands) or all "
                                       "(every value). Defaults to none for fp32, matmult otherwise.")
    p.add_argument("--print-after", action="append", metavar="PASS",
                   help="print the IR after a pass on stderr, e.g. 'fuse,tile' or 'all'. Repeatable.")
    p.add_argument("--numerics", action="store_true",
                   help="also print the numerics report: each layer's error at this precision against fp32, fed "
                        "fp32 inputs, and the output's (docs/precision.md).")
    p.add_argument("--json", action="store_true", help="print the stats as JSON instead of the table.")
    p.set_defaults(drive=drive_compile)
