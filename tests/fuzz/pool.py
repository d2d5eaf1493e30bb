"""Worker processes for the long run: each task runs in a child with a timeout, so a crash or a hang of trnc
(a segfault in the JIT, an endless loop in a pass) becomes a "crash" Outcome instead of ending the run.

A Pool keeps `jobs` spawned workers; `run(task)` hands the task to an idle worker and waits for its answer.
A worker that dies, or does not answer within the timeout, is killed and replaced by a fresh one. `run` is
thread-safe: the campaign drives the pool from `jobs` threads, so the workers stay busy. Workers use one torch
thread each (the machine's cores are shared; float64 lanes in several threads only contend).
"""
from __future__ import annotations

import multiprocessing
import queue
import signal
import traceback
import warnings
from dataclasses import dataclass

from .run import Outcome


def serve(conn) -> None:
    """A worker's loop: (name, args) tasks in, Outcomes out; None ends it."""
    import torch

    from .run import run_program, run_seed
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    tasks = {"seed": run_seed, "program": run_program}
    while True:
        task = conn.recv()
        if task is None:
            return
        name, args = task
        try:
            outcome = tasks[name](*args)
        except Exception as e:   # the fuzzer's own failure (no valid program for a seed, ...), not trnc's
            outcome = Outcome("invalid", "fuzzer", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        conn.send(outcome)


@dataclass
class _Worker:
    process: multiprocessing.Process
    conn: object


class Pool:
    def __init__(self, jobs: int, timeout: float, target=serve):
        self.context = multiprocessing.get_context("spawn")
        self.timeout, self.target = timeout, target
        self.idle: queue.Queue[_Worker] = queue.Queue()
        for _ in range(jobs):
            self.idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=self.target, args=(child,), daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    def run(self, task: tuple) -> Outcome:
        worker = self.idle.get()
        try:
            worker.conn.send(task)
            if worker.conn.poll(self.timeout):
                outcome = worker.conn.recv()
                self.idle.put(worker)
                return outcome
            detail = f"timeout after {self.timeout:g} s"
        except (EOFError, OSError):
            detail = None
        worker.process.kill()
        worker.process.join()
        if detail is None:
            code = worker.process.exitcode
            detail = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        self.idle.put(self._spawn())
        return Outcome("crash", detail, f"the worker process ended: {detail}")

    def close(self) -> None:
        while not self.idle.empty():
            worker = self.idle.get()
            try:
                worker.conn.send(None)
            except OSError:
                pass
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.kill()
