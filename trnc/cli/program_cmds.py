"""Subcommands on ISA programs: asm, verify, disasm, run and profile (through the JIT or the reference).

A program file is assembly text, or the binary encoding (recognised by its magic bytes). disasm,
run and profile also take a .trnc artifact (recognised by its magic): they hand it to artifact_cmds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from trnc.cli import artifact_cmds
from trnc.errors import TrncError
from trnc.isa import asm, cost, decoding, encoding, verify
from trnc.isa.config import get_target
from trnc.isa.program import BOUND_KINDS, Program, TensorKind


def load_program(path: str) -> Program:
    data = Path(path).read_bytes()
    if data.startswith(encoding.MAGIC):
        return decoding.decode(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TrncError(f"{path}: neither trnc assembly text (not UTF-8), a binary program (no {encoding.MAGIC!r} "
                        "magic) nor a .trnc artifact") from None
    return asm.parse_program(text)


def drive_asm(args) -> int:
    program = load_program(args.file)
    verify.verify(program)
    out = Path(args.output or Path(args.file).with_suffix(".bin"))
    data = encoding.encode(program)
    out.write_bytes(data)
    print(f"{args.file}: {len(program.instructions)} instructions, verified; wrote {len(data)} bytes to {out}")
    return 0


def drive_verify(args) -> int:
    program = load_program(args.file)
    violations = verify.check(program)
    for v in violations:
        print(f"{args.file}: {v}", file=sys.stderr)
    if violations:
        print(f"{args.file}: {len(violations)} violation(s)", file=sys.stderr)
        return 2
    print(f"{args.file}: ok, {len(program.instructions)} instructions on target {program.target}")
    return 0


def drive_disasm(args) -> int:
    if artifact_cmds.is_artifact(args.file):
        program = artifact_cmds.load(args.file).program
    else:
        program = load_program(args.file)
    sys.stdout.write(asm.format_program(program))
    return 0


def _random_input(decl, rng: np.random.Generator) -> np.ndarray:
    from trnc.runtime.convert import from_fp32
    if decl.dtype.is_int:
        info = np.iinfo(decl.dtype.storage)
        return rng.integers(max(info.min, -100), min(info.max, 100) + 1, size=decl.shape).astype(decl.dtype.storage)
    return from_fp32(rng.standard_normal(decl.shape).astype(np.float32), decl.dtype)


def _as_dtype(value: np.ndarray, decl) -> np.ndarray:
    """.npy files hold no bf16/fp8: float arrays convert (fp64 rounds to fp32 first, then RNE to the dtype)."""
    from trnc.runtime.convert import from_fp32
    if value.dtype == decl.dtype.storage or not (decl.dtype.is_float and value.dtype.kind == "f"):
        return value
    return from_fp32(value.astype(np.float32), decl.dtype)


def _load_inputs(program: Program, specs: list[str], seed: int) -> dict[str, np.ndarray]:
    given = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            raise TrncError(f"--input '{spec}': expected NAME=FILE.npy")
        given[name] = np.load(path, allow_pickle=False)
    rng = np.random.default_rng(seed)
    inputs = {}
    for decl in program.tensors:
        if decl.kind in BOUND_KINDS:
            inputs[decl.name] = (_as_dtype(given.pop(decl.name), decl) if decl.name in given
                                 else _random_input(decl, rng))
    if given:
        raise TrncError(f"--input names no input tensor: {', '.join(given)}; inputs are "
                        f"{', '.join(d.name for d in program.tensors if d.kind is TensorKind.INPUT)}")
    return inputs


def drive_run(args) -> int:
    import time

    from trnc.runtime import perf, reference
    from trnc.runtime.jit import executor
    if args.host_profile and args.engine != "jit":
        raise TrncError("--host-profile times the JIT's run: it does not go with --engine reference")
    if artifact_cmds.is_artifact(args.file):   # a compiled model: inputs by position, outputs by structure
        return artifact_cmds.drive_run(args)
    if args.inputs:
        raise TrncError(f"{args.file} is an ISA program: name its inputs with --input NAME=FILE.npy "
                        "(--inputs in order is for .trnc artifacts)")
    program = load_program(args.file)
    verify.verify(program)
    hw = get_target(program.target)
    inputs = _load_inputs(program, args.input or [], args.seed)
    started = time.perf_counter()
    if args.engine == "jit":
        jit = executor.load(program, hw=hw, verified=True)
        outputs = jit.run(inputs, fill_nan=args.fill_nan)
    else:
        outputs = reference.run(program, inputs, hw=hw, fill_nan=args.fill_nan, verified=True)
    host_seconds = time.perf_counter() - started
    report = perf.simulate(program, hw, verified=True)
    timeline = report.timeline
    ns_per_tick = 1e9 / timeline.ticks_per_second
    print(f"{'#':>4}  {'queue':<6} {'opcode':<20} {'cycles':>8} {'start ns':>10} {'end ns':>10}")
    for i, instr in enumerate(program.instructions):
        print(f"{i:>4}  {instr.queue_name:<6} {instr.opcode:<20} {cost.cycles(instr, hw):>8} "
              f"{timeline.start[i] * ns_per_tick:>10.1f} {timeline.end[i] * ns_per_tick:>10.1f}")
    print()
    print(report.table())
    if args.trace:
        artifact_cmds.write_trace(args.trace, program, report)
    print(f"\noutputs ({args.engine}, host time {host_seconds * 1e3:.2f} ms including compilation):")
    for name, value in outputs.items():
        as_f64 = value.astype(np.float64)
        print(f"  {name}: {value.dtype} {list(value.shape)} min {as_f64.min():.6g} max {as_f64.max():.6g} "
              f"mean {as_f64.mean():.6g}")
        if args.save_outputs:
            Path(args.save_outputs).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.save_outputs) / f"{name}.npy", value)
    if args.host_profile:
        artifact_cmds.print_host_profile(jit.host_profile(inputs))
    return 0


def drive_profile(args) -> int:
    from trnc.runtime import perf
    if artifact_cmds.is_artifact(args.file):
        return artifact_cmds.drive_profile(args)
    program = load_program(args.file)
    verify.verify(program)
    report = perf.simulate(program, get_target(program.target), verified=True)
    print(report.table())
    if args.trace:
        artifact_cmds.write_trace(args.trace, program, report)
    return 0


def add_parsers(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("asm", help="assemble and verify a program, writing its binary encoding.",
                       formatter_class=fmt, epilog="example:\n  trnc asm examples/gemm.s -o gemm.bin")
    p.add_argument("file", help="assembly text, e.g. examples/gemm.s.")
    p.add_argument("-o", "--output", help="binary output file. Defaults to FILE with suffix .bin.")
    p.set_defaults(drive=drive_asm)

    p = sub.add_parser("verify", help="check a program against every rule of the machine.",
                       formatter_class=fmt, epilog="example:\n  trnc verify examples/gemm.s")
    p.add_argument("file", help="assembly text or binary program.")
    p.set_defaults(drive=drive_verify)

    p = sub.add_parser("disasm", help="print a program or the program of a .trnc artifact as assembly text.",
                       formatter_class=fmt, epilog="example:\n  trnc disasm gemm.bin\n  trnc disasm mlp.trnc")
    p.add_argument("file", help="binary program, .trnc artifact (or assembly text, re-printed canonically).")
    p.set_defaults(drive=drive_disasm)

    p = sub.add_parser("run", help="run a program or a .trnc artifact (JIT or reference interpreter) and print "
                                   "its outputs, host time and modeled time.",
                       formatter_class=fmt,
                       epilog="An ISA program also prints its modeled timeline and counters. An artifact takes\n"
                              "its inputs in the model's order (float .npy files are rounded to the recorded\n"
                              "dtype, e.g. bf16); without --inputs, floats are standard normal and integers\n"
                              "are drawn from [0, 2), so token ids stay inside any embedding table.\n\n"
                              "example:\n  trnc run examples/gemm.s --input a=a.npy --save-outputs out/\n"
                              "  trnc run mlp.trnc --inputs x.npy --save-outputs out/")
    p.add_argument("file", help="assembly text, binary program or .trnc artifact.")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="ISA programs: value of an input tensor; others are random (standard normal). Repeatable.")
    p.add_argument("--inputs", nargs="+", metavar="FILE.npy",
                   help="artifacts: one .npy file per model input, in the model's input order.")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs. Defaults to 0.")
    p.add_argument("--fill-nan", action="store_true",
                   help="ISA programs: start SBUF and PSUM as NaN bytes so reads of uninitialised memory show.")
    p.add_argument("--save-outputs", metavar="DIR", help="write each output tensor to DIR/NAME.npy.")
    p.add_argument("--engine", choices=("jit", "reference"), default="jit",
                   help="what executes the program: the llvmlite JIT or the numpy reference. Defaults to jit.")
    p.add_argument("--trace", metavar="FILE.json", help="write the modeled timeline as a Chrome/Perfetto trace.")
    p.add_argument("--host-profile", action="store_true",
                   help="jit: also time each instruction of one serial run, as reached and again at once, and "
                        "print the host time per opcode.")
    p.set_defaults(drive=drive_run)

    p = sub.add_parser("profile", help="print the modeled counters of a .trnc artifact or a program: time, "
                                       "engine utilization, traffic, roofline and efficiency.",
                       formatter_class=fmt, epilog="example:\n  trnc profile mlp.trnc --trace trace.json")
    p.add_argument("file", help=".trnc artifact, assembly text or binary program.")
    p.add_argument("--trace", metavar="FILE.json",
                   help="write the timeline as a Chrome/Perfetto trace (open it in ui.perfetto.dev).")
    p.set_defaults(drive=drive_profile)
