"""Benchmark: the JIT runtime (issue 3): matmul GFLOP/s against torch, dispatch cost per instruction, compile time.

Three measurements, each printed with a baseline measured in the same run, their ratio and the issue's goal
(ratio: higher means the JIT is faster than the baseline). Times are the best of several repetitions after
one untimed warm-up, taken with time.perf_counter; the JIT is single-threaded and torch is set to one thread.

- matmul: one program of R identical `matmul` instructions (dst PSUM fp32 [128, 512] += stationary.T @ moving,
  K = M = 128, N = 512, accumulate=True) on the PE queue, operands already in SBUF; only
  `JitProgram.execute` on prepared memories is timed, and the time per matmul is total / R (nothing is
  subtracted). Baseline: `torch.addmm(c, a.T, b, out=c)` on the same tiles in the same dtype, R calls; the
  rounds alternate JIT and torch, so both see the same machine load. Goal: at least 0.7x torch. The ISA
  fixes fp32 accumulation in k order, one fused multiply-add per step (isa/spec_intro.md), so the kernel
  vectorizes over M and N with FMA but cannot reorder the sum.
- dispatch: a program of N small instructions (3 in 4 a tensor_tensor add of [8, 4] fp32 tiles on DVE, 1 in 4
  a memset of one fp32 element on POOL) cycling through 4096 distinct instructions. Timed separately: one
  `execute` (one native call running every instruction; goal under 2 us each), the JIT load with its
  kernels already compiled and the verifier skipped, and the verifier alone. Baseline for execute: the
  numpy reference interpreter (runtime/reference.run) on a shorter program of the same mix.
- compile: a program with ~200 distinct kernel signatures (10 op families x widths). A fresh subprocess with
  an empty temporary TRNC_CACHE_DIR times `load` plus fetching the driver (every kernel compiled: cold);
  a second fresh subprocess on the same directory does the same with TRNC_ASSERT_CACHED=1, so it provably
  compiles nothing (warm; goal under 1 s). Process start and imports are not timed.

The in-process parts use their own temporary cache directory, so the user's kernel cache is left alone.

Run: python benchmarks/bench_jit.py [--quick]   (--quick: small sizes for a smoke run)
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import numpy as np
import torch

from trnc import flags
from trnc.errors import TrncError
from trnc.isa import AP, ActFunc, AluOp, DType, Engine, Instruction, Mem, Program, ReduceOp
from trnc.isa.verify import verify
from trnc.runtime import reference
from trnc.runtime.jit.executor import load, on_chip_memories

K, M, N = 128, 128, 512
MATMUL_FLOPS = 2 * K * M * N
TORCH_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16}


@dataclass(frozen=True)
class Sizes:
    matmul_repeats: int      # matmul instructions per program (R)
    repetitions: int         # timed repetitions of each measurement
    dispatch: int            # instructions of the dispatch program
    reference: int           # instructions of the reference interpreter's baseline program
    kernels: int             # distinct kernel signatures of the compile program


FULL = Sizes(matmul_repeats=20, repetitions=15, dispatch=100_000, reference=5_000, kernels=200)
QUICK = Sizes(matmul_repeats=3, repetitions=3, dispatch=10_000, reference=500, kernels=40)


@dataclass(frozen=True)
class Row:
    """One line of the result table; `baseline` is None when the figure has no baseline or goal."""

    figure: str
    value: str
    baseline: str | None = None
    baseline_value: str = "-"
    ratio: float | None = None
    goal: str = "-"
    met: bool | None = None


def best_seconds(*runs: Callable[[], object], repetitions: int) -> list[float]:
    """Best (lowest) wall time of each run over `repetitions` rounds, after one untimed warm-up call each.

    Each round calls every run once, so runs compared with each other see the same machine load; the lowest
    time is the one least disturbed by other processes."""
    for run in runs:
        run()
    gc.collect()
    best = [float("inf")] * len(runs)
    for _ in range(repetitions):
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            run()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


# -- 1. matmul ------------------------------------------------------------------------------------------

def jit_matmuls(dtype: DType, a: np.ndarray, b: np.ndarray, repeats: int) -> tuple[Callable[[], None], Callable]:
    """(run, check) of the JIT: run executes R accumulating matmuls in one call on operands already in SBUF;
    check(runs) raises unless PSUM holds `runs` accumulated products, so the timed work is the real one."""
    isz = dtype.itemsize
    ins = Instruction.make("matmul", Engine.PE, dst=AP(Mem.PSUM, DType.FP32, M, ((1, N),)),
                           stationary=AP(Mem.SBUF, dtype, K, ((1, M),)),
                           moving=AP(Mem.SBUF, dtype, K, ((1, N),), offset=M * isz), accumulate=True)
    jp = load(Program((), (ins,) * repeats))
    sbuf, psum = on_chip_memories(jp.hw)
    sbuf[:, :M * isz] = a.view(np.uint8)
    sbuf[:, M * isz:(M + N) * isz] = b.view(np.uint8)

    def check(runs: int) -> None:
        expected = runs * (a.astype(np.float64).T @ b.astype(np.float64))
        error = np.abs(psum[:, :4 * N].view(np.float32) - expected).max() / np.abs(expected).max()
        if not error < 1e-4:
            raise TrncError(f"JIT matmul {dtype.text}: relative error {error:.2e} against float64; timing void")

    return (lambda: jp.execute(sbuf, psum, [])), check


def torch_matmuls(dtype: DType, a: np.ndarray, b: np.ndarray, repeats: int) -> Callable[[], None]:
    """R calls of torch.addmm(c, a.T, b, out=c) on the same tiles in the same dtype (a.T as a view: the
    fastest form here; a contiguous copy of a.T makes bf16 about 20x slower)."""
    tdt = TORCH_DTYPES[dtype]
    ta, tb = (torch.from_numpy(x.astype(np.float32)).to(tdt) for x in (a, b))   # exact: values are in dtype
    c = torch.zeros((M, N), dtype=tdt)
    at = ta.T

    def run() -> None:
        for _ in range(repeats):
            torch.addmm(c, at, tb, out=c)

    return run


def matmul_rows(sizes: Sizes) -> list[Row]:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    r = sizes.matmul_repeats
    for dtype in (DType.FP32, DType.BF16):
        a = rng.uniform(-1, 1, (K, M)).astype(dtype.storage)
        b = rng.uniform(-1, 1, (K, N)).astype(dtype.storage)
        jit_run, check = jit_matmuls(dtype, a, b, r)
        jit_s, torch_s = best_seconds(jit_run, torch_matmuls(dtype, a, b, r), repetitions=sizes.repetitions)
        check((1 + sizes.repetitions) * r)
        jit, base = MATMUL_FLOPS * r / jit_s / 1e9, MATMUL_FLOPS * r / torch_s / 1e9
        rows.append(Row(f"matmul {dtype.text} {K}x{M}x{N} (R={r} per execute)", f"{jit:.1f} GFLOP/s",
                        "torch.addmm, 1 thread", f"{base:.1f} GFLOP/s", jit / base, ">= 0.7x torch", jit / base >= 0.7))
    return rows


# -- 2. dispatch ----------------------------------------------------------------------------------------

ADD_SLOTS, MEMSET_SLOTS, INPUT_SLOTS = 3072, 1024, 64
INPUTS_AT, MEMSETS_AT = 65_536, 131_072   # SBUF byte offsets of the read-only inputs and the memset region


def dispatch_program(n: int) -> Program:
    """n instructions cycling through 4096 distinct ones; DVE and POOL write disjoint regions, so the queues
    need no semaphores."""
    f32 = DType.FP32

    def tile(offset: int, start: int, partitions: int = 8, size: int = 4) -> AP:
        return AP(Mem.SBUF, f32, partitions, ((1, size),), offset=offset, start_partition=start)

    adds = [Instruction.make("tensor_tensor", Engine.DVE, dst=tile(16 * j, 32 * (j % 4)),
                             in0=tile(INPUTS_AT + 16 * (j % INPUT_SLOTS), 32 * (j % 4)),
                             in1=tile(INPUTS_AT + 16 * ((j + 1) % INPUT_SLOTS), 32 * (j % 4)), op=AluOp.ADD)
            for j in range(ADD_SLOTS)]
    memsets = [Instruction.make("memset", Engine.POOL, value=float(j % 7),
                                dst=tile(MEMSETS_AT + 4 * j, 32 * (j % 4), partitions=1, size=1))
               for j in range(MEMSET_SLOTS)]
    return Program((), tuple(memsets[(i // 4) % MEMSET_SLOTS] if i % 4 == 3 else adds[i % ADD_SLOTS]
                             for i in range(n)))


def dispatch_rows(sizes: Sizes) -> list[Row]:
    n = sizes.dispatch
    program = dispatch_program(n)
    t0 = time.perf_counter()
    verify(program)
    verify_us = (time.perf_counter() - t0) / n * 1e6
    load(dispatch_program(8), verified=True)   # compiles the two kernels, so the timed load compiles nothing
    program = dispatch_program(n)   # a new Program: not the operand table the verifier built and kept
    gc.collect()
    t0 = time.perf_counter()
    jp = load(program, verified=True)
    load_us = (time.perf_counter() - t0) / n * 1e6
    sbuf, psum = on_chip_memories(jp.hw)
    execute_us = best_seconds(lambda: jp.execute(sbuf, psum, []), repetitions=sizes.repetitions)[0] / n * 1e6
    small = dispatch_program(sizes.reference)
    ref_us = best_seconds(lambda: reference.run(small, {}, verified=True), repetitions=1)[0] / sizes.reference * 1e6
    return [Row(f"dispatch: execute (one native call), per instruction, N={n}", f"{execute_us:.3f} us",
                f"reference interpreter (numpy), N={sizes.reference}", f"{ref_us:.1f} us", ref_us / execute_us,
                "< 2 us", execute_us < 2),
            Row("dispatch: JIT load (kernels compiled, no verifier), per instruction", f"{load_us:.2f} us"),
            Row("dispatch: verifier, per instruction", f"{verify_us:.2f} us")]


# -- 3. compile -----------------------------------------------------------------------------------------

P = 32                    # partitions of every compile-program operand
WIDTH0 = 4                # free size of the first round; round r uses WIDTH0 + r
SLOT_BYTES = 256          # SBUF bytes per partition for each instruction's output
OUT_AT = 4096             # SBUF offset of the outputs (inputs live at 0 and 512, never written)
PSUM_SLOT = 256           # PSUM bytes per partition for each matmul's output (8 per 2 KiB bank)


def _t(dtype: DType, width: int, offset: int) -> AP:
    return AP(Mem.SBUF, dtype, P, ((1, width),), offset=offset)


F32, BF16 = DType.FP32, DType.BF16
FAMILIES: tuple[Callable[[int, int, int], Instruction], ...] = (
    lambda w, o, r: Instruction.make("tensor_tensor", Engine.DVE, dst=_t(F32, w, o), in0=_t(F32, w, 0),
                                     in1=_t(F32, w, 512), op=AluOp.ADD),
    lambda w, o, r: Instruction.make("tensor_tensor", Engine.POOL, dst=_t(BF16, w, o), in0=_t(BF16, w, 0),
                                     in1=_t(F32, w, 512), op=AluOp.MUL),
    lambda w, o, r: Instruction.make("tensor_scalar", Engine.DVE, dst=_t(F32, w, o), src=_t(BF16, w, 0),
                                     op0=AluOp.MUL, scalar0=2.0, op1=AluOp.ADD, scalar1=1.0),
    lambda w, o, r: Instruction.make("activation", Engine.ACT, dst=_t(BF16, w, o), src=_t(F32, w, 0),
                                     func=ActFunc.EXP),
    lambda w, o, r: Instruction.make("activation", Engine.ACT, dst=_t(F32, w, o), src=_t(F32, w, 0),
                                     func=ActFunc.GELU),
    lambda w, o, r: Instruction.make("tensor_copy", Engine.POOL, dst=_t(BF16, w, o), src=_t(F32, w, 0)),
    lambda w, o, r: Instruction.make("tensor_reduce", Engine.DVE, dst=_t(F32, 1, o), src=_t(F32, w, 0),
                                     op=ReduceOp.SUM, axes=1),
    lambda w, o, r: Instruction.make("memset", Engine.POOL, dst=_t(BF16, w, o), value=0.5),
    lambda w, o, r: Instruction.make("select", Engine.DVE, dst=_t(F32, w, o), pred=_t(F32, w, 0),
                                     on_true=_t(F32, w, 512), on_false=_t(BF16, w, 0)),
    lambda w, o, r: Instruction.make("matmul", Engine.PE, dst=AP(Mem.PSUM, F32, P, ((1, w),), offset=PSUM_SLOT * r),
                                     stationary=_t(BF16, P, 0), moving=_t(BF16, w, 512)),
)
MAX_KERNELS = len(FAMILIES) * min(SLOT_BYTES // 4 - WIDTH0 + 1, 16_384 // PSUM_SLOT)   # widths fit slots


def compile_program(n: int) -> Program:
    """n instructions with n distinct kernel signatures: family i mod 10 at width WIDTH0 + i // 10, each
    writing its own slot, on queues that only read shared inputs (no semaphores needed)."""
    if not 1 <= n <= MAX_KERNELS:
        raise TrncError(f"compile benchmark: {n} kernels requested; the generator makes 1 to {MAX_KERNELS}")
    return Program((), tuple(FAMILIES[i % len(FAMILIES)](WIDTH0 + i // len(FAMILIES), OUT_AT + SLOT_BYTES * i,
                                                          i // len(FAMILIES))
                             for i in range(n)))


def compile_child(n: int, cache_dir: Path, warm: bool) -> None:
    """In a fresh process: time load + driver of the compile program on `cache_dir`; print the result as JSON."""
    program = compile_program(n)
    with flags.override(TRNC_CACHE_DIR=cache_dir, TRNC_CACHE=True, TRNC_ASSERT_CACHED=warm):
        t0 = time.perf_counter()
        jp = load(program, verified=True)
        jp.kernels.driver()
        seconds = time.perf_counter() - t0
    stats = jp.kernels.cache.stats
    print(json.dumps({"seconds": seconds, "kernels": jp.distinct_kernels, "misses": stats.misses,
                      "disk_hits": stats.disk_hits}))


def run_child(n: int, cache_dir: Path, warm: bool) -> dict:
    args = [sys.executable, __file__, "--compile-child", str(n), "--cache-dir", str(cache_dir)]
    done = subprocess.run(args + (["--warm"] if warm else []), capture_output=True, text=True)
    if done.returncode:
        raise TrncError(f"compile benchmark child ({'warm' if warm else 'cold'}) failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compile_rows(sizes: Sizes, cache_dir: Path) -> list[Row]:
    verify(compile_program(sizes.kernels))   # the children skip the verifier: check the program here, untimed
    cold = run_child(sizes.kernels, cache_dir, warm=False)
    warm = run_child(sizes.kernels, cache_dir, warm=True)
    if cold["disk_hits"] or warm["misses"]:
        raise TrncError(f"compile benchmark: the cold run must miss and the warm run hit every kernel; got cold "
                        f"{cold}, warm {warm}")
    kernels = cold["kernels"]
    per_kernel_ms = cold["seconds"] / cold["misses"] * 1e3
    return [Row(f"compile cold: {kernels} kernels + driver, fresh process, empty disk cache",
                f"{cold['seconds']:.2f} s ({per_kernel_ms:.1f} ms/kernel)"),
            Row(f"compile warm: same {kernels} kernels + driver, fresh process, warm disk cache",
                f"{warm['seconds']:.3f} s", "cold compile (row above)", f"{cold['seconds']:.2f} s",
                cold["seconds"] / warm["seconds"], "< 1 s", warm["seconds"] < 1)]


# -- report ---------------------------------------------------------------------------------------------

def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{datetime.date.today().isoformat()}, {model}, nproc {len(os.sched_getaffinity(0))}, "
            f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
            f"llvmlite {llvmlite.__version__} (LLVM {'.'.join(map(str, llvm.llvm_version_info))})")


def table(rows: list[Row]) -> str:
    """The rows as a markdown table (ratio: higher means the JIT is faster than the baseline)."""
    head = ["figure", "JIT", "baseline", "baseline value", "ratio", "goal", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        met = "-" if r.met is None else ("yes" if r.met else "no")
        cells = [r.figure, r.value, r.baseline or "-", r.baseline_value, ratio, r.goal, met]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--compile-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_child is not None:
        compile_child(args.compile_child, args.cache_dir, args.warm)
        return
    sizes = QUICK if args.quick else FULL
    print(machine())
    with tempfile.TemporaryDirectory(prefix="trnc-bench-") as tmp:
        with flags.override(TRNC_CACHE_DIR=Path(tmp) / "session"):
            rows = matmul_rows(sizes) + dispatch_rows(sizes)
        rows += compile_rows(sizes, Path(tmp) / "compile")
    print(table(rows))


if __name__ == "__main__":
    main()
