"""Where a host run's time goes: one serial run with every driver step timed, as the run reaches it and again.

Each step (an instruction's staging copies, then its kernel) is timed as the run reaches it, its data wherever
the steps before left it: that is the run's own time. Then it runs a second time at once and is timed again:
the same kernel on data now in cache, the kernel's own speed. The sum of those second times is what the run
would take if no step ever waited for memory beyond the caches, so a floor for any run of the program one
instruction at a time (benchmarks/bench_host.py compares it with eager PyTorch).

Running a step twice leaves its results twice applied (an accumulating matmul adds twice), so the values the
later steps see differ from a plain run's and the run's outputs are dropped; a kernel's time hardly depends on
its values (no data-dependent branches; only subnormal results can cost more on x86). A fault of a step as the
run reaches it is the run's fault and is raised as `run` raises it; a code the second call returns is ignored
(a kernel checks each index before it uses it, so memory stays safe). Each call goes through ctypes,
whose cost (the median of empty driver calls) is taken off every time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

CALIBRATION_CALLS = 501   # empty driver calls whose median time is one call's ctypes cost


@dataclass(frozen=True)
class HostProfile:
    """Per instruction of the program (index order): its opcode and host seconds as the run reached it and
    again at once."""

    opcodes: tuple[str, ...]
    seconds: np.ndarray
    again: np.ndarray

    @property
    def total(self) -> float:
        return float(self.seconds.sum())

    @property
    def again_total(self) -> float:
        return float(self.again.sum())

    def by_opcode(self) -> list[tuple[str, int, float, float]]:
        """(opcode, instructions, seconds, seconds again) per opcode, the most time first."""
        names, index = np.unique(np.array(self.opcodes, dtype=str), return_inverse=True)
        counts = np.bincount(index, minlength=len(names))
        seconds = np.bincount(index, self.seconds, minlength=len(names))
        again = np.bincount(index, self.again, minlength=len(names))
        rows = [(str(name), int(c), float(s), float(a)) for name, c, s, a in zip(names, counts, seconds, again)]
        return sorted(rows, key=lambda row: (-row[2], row[0]))

    def table(self) -> str:
        total = self.total
        lines = [f"{'opcode':<20} {'instrs':>7} {'host ms':>9} {'share':>6} {'again ms':>9}"]
        for name, count, seconds, again in self.by_opcode():
            share = seconds / total if total else 0.0
            lines.append(f"{name:<20} {count:>7} {seconds * 1e3:>9.2f} {share:>6.1%} {again * 1e3:>9.2f}")
        lines.append(f"{'total':<20} {len(self.opcodes):>7} {total * 1e3:>9.2f} {'':>6} {self.again_total * 1e3:>9.2f}")
        return "\n".join(lines)


def timed_steps(driver, table: np.ndarray, bases: np.ndarray, status: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                           int]:
    """(seconds as reached, seconds again) per step of the driver table, and the first step's fault code (the
    steps after a fault are not run; their times stay 0)."""
    clock = time.perf_counter_ns
    base, status_at, start = bases.ctypes.data, status.ctypes.data, table.ctypes.data
    empty = np.empty(CALIBRATION_CALLS, dtype=np.int64)
    for k in range(CALIBRATION_CALLS):
        t0 = clock()
        driver(start, 0, base, status_at)
        empty[k] = clock() - t0
    cost = int(np.median(empty))
    n = len(table)
    first, second = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    row = table.strides[0]
    for i in range(n):
        at = start + i * row
        t0 = clock()
        code = driver(at, 1, base, status_at)
        t1 = clock()
        if code:
            status[0] = i   # the driver numbers the step within its table of one
            return first * 1e-9, second * 1e-9, code
        driver(at, 1, base, status_at)
        t2 = clock()
        first[i], second[i] = max(t1 - t0 - cost, 0), max(t2 - t1 - cost, 0)
    return first * 1e-9, second * 1e-9, 0
