"""Benchmark: instructions per second of the counting-only performance model (runtime/perf.py).

Goal (issue 3): at least 1M instructions/s. The program is a generated 4-queue pipeline, double-buffered
like examples/overlap.s: per tile, dma0 loads x, pe multiplies, act evacuates PSUM, dma1 stores y, with
semaphores for every dependency. Two forms of the same program are timed:

- `loop`: the program streams x through the pipeline several times (as repeated layers or batches do);
  each distinct instruction (one per HBM tile of x and y) is built once and repeated with new semaphore
  counts (`Instruction.replace`), so repeats share their field tuple, as a loop unroller emits them. This
  is the case the goal is about.
- `fresh`: the same program, but every instruction is built from scratch with `Instruction.make` and new
  access patterns, so the model must look each instruction up by value.

Only `simulate(program, verified=True)` is timed, best of --repeat runs in wall-clock and CPU time:
generation and verification are not (a smaller copy of each program is verified first, to show the
generator emits valid programs).

Run: python benchmarks/bench_perf_model.py [--instructions N] [--repeat R]
"""
from __future__ import annotations

import argparse
import gc
import math
import time

from trnc.isa import AP, ActFunc, DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind
from trnc.isa.verify import verify
from trnc.runtime.perf import simulate

TILE_N = 64                 # columns per tile: x and y tiles are [128, 64] bf16
TILES_IN_HBM = 4096         # x and y hold this many tiles (even); tile t uses HBM tile t mod TILES_IN_HBM
S_LOAD, S_MM, S_ACT, S_STORE, S_W = range(5)


def sbuf(offset: int, n: int, dtype=DType.BF16) -> AP:
    return AP(Mem.SBUF, dtype, 128, ((1, n),), offset=offset)


def psum(bank: int) -> AP:
    return AP(Mem.PSUM, DType.FP32, 128, ((1, TILE_N),), offset=bank * 2048)


def hbm(tensor: int, tile: int) -> AP:
    return AP(Mem.HBM, DType.BF16, 128, ((1, TILE_N),), offset=2 * TILE_N * (tile % TILES_IN_HBM), tensor=tensor,
              partition_stride=TILE_N * TILES_IN_HBM)


def body(slot: int, tile: int) -> list[Instruction]:
    """The four instructions of one tile, without semaphores: load, matmul, activation, store."""
    x, y = sbuf(256 + slot * 2 * TILE_N, TILE_N), sbuf(256 + 4 * TILE_N + slot * 2 * TILE_N, TILE_N)
    return [Instruction.make("dma_copy", queue=0, dst=x, src=hbm(1, tile)),
            Instruction.make("matmul", dst=psum(slot), stationary=sbuf(0, 128), moving=x),
            Instruction.make("activation", dst=y, src=psum(slot), func=ActFunc.RELU),
            Instruction.make("dma_copy", queue=1, dst=hbm(2, tile), src=y)]


def synchronize(ins: list[Instruction], t: int) -> list[Instruction]:
    """Tile t's semaphores: each step waits for its producer in this tile and for the step of tile t-2 that
    last read the buffer it overwrites (double buffering)."""
    prev = [] if t < 2 else [(S_MM, t - 1)]
    load = ins[0].replace(waits=tuple(prev), signals=(S_LOAD,))
    mm_waits = [(S_LOAD, t + 1)] + ([(S_W, 1)] if t == 0 else []) + ([(S_ACT, t - 1)] if t >= 2 else [])
    mm = ins[1].replace(waits=tuple(mm_waits), signals=(S_MM,))
    act = ins[2].replace(waits=((S_MM, t + 1),) + (((S_STORE, t - 1),) if t >= 2 else ()), signals=(S_ACT,))
    store = ins[3].replace(waits=((S_ACT, t + 1),), signals=(S_STORE,))
    return [load, mm, act, store]


def pipeline(tiles: int, fresh: bool) -> Program:
    tensors = (TensorDecl("w", TensorKind.INPUT, DType.BF16, (128, 128)),
               TensorDecl("x", TensorKind.INPUT, DType.BF16, (128, TILE_N * TILES_IN_HBM)),
               TensorDecl("y", TensorKind.OUTPUT, DType.BF16, (128, TILE_N * TILES_IN_HBM)))
    w_load = Instruction.make("dma_copy", Engine.DMA, queue=2, signals=(S_W,), dst=sbuf(0, 128),
                              src=AP(Mem.HBM, DType.BF16, 128, ((1, 128),), tensor=0, partition_stride=128))
    instrs = [w_load]
    loop = [body(t % 2, t) for t in range(min(tiles, TILES_IN_HBM))]
    for t in range(tiles):
        instrs += synchronize(body(t % 2, t) if fresh else loop[t % TILES_IN_HBM], t)
    return Program(tensors, tuple(instrs))


def measure(tiles: int, fresh: bool, repeat: int) -> tuple[int, float, float]:
    """Instructions and the best of `repeat` replays in wall-clock and in CPU seconds (the CPU time is the
    less disturbed by other processes on a busy machine)."""
    program = pipeline(tiles, fresh)
    gc.collect()
    wall = cpu = math.inf
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        report = simulate(program, verified=True)
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    assert report.instructions == len(program.instructions)
    return len(program.instructions), wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instructions", type=int, default=1_000_000, help="program size (default 1000000).")
    parser.add_argument("--repeat", type=int, default=3, help="replays per program, the best counts (default 3).")
    args = parser.parse_args()
    tiles = max(2, args.instructions // 4)
    for fresh in (False, True):
        verify(pipeline(1000, fresh))
    for fresh in (False, True):
        n, wall, cpu = measure(tiles, fresh, args.repeat)
        print(f"{'fresh' if fresh else 'loop':<6} {n:>9} instructions in {wall:6.3f} s ({cpu:6.3f} s CPU): "
              f"{n / wall / 1e6:5.2f} M instructions/s ({n / cpu / 1e6:5.2f} M per CPU second)")


if __name__ == "__main__":
    main()
