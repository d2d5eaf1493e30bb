"""The parallel driver: a program's queues run on several host threads, with the same result bits as one.

Why it is safe: each queue is in order and the only order across queues is the semaphores'. The verifier
proves that every two conflicting accesses on different queues are ordered by a semaphore chain, so every
execution that honours each queue's order and each wait gives the bits of the serial order
(runtime/reference.py's `execution_order`). The parallel driver runs one such execution.

How: the instructions, in the serial order, are the *units* of work. Each unit waits on a few
(queue, count) pairs: its queue predecessor (that queue has finished `pos` units), and for each semaphore
wait (s, v), the unit that sends the v-th signal of s (a semaphore is signalled from one queue, so that
queue having finished it means the count has reached v). The run is a legal execution. Workers (one
native function, `trnc_worker`, called from one host thread each; ctypes releases the GIL) take the next
unit of the *take order* from a shared counter, wait until its pairs are met, run its driver steps (staging
copies, then its kernel) and publish the queue's new count with a release store. A waiting worker spins up
to about a tenth of a millisecond, then sleeps on a futex that every finished unit advances, so workers
beyond the free cores cost little time (the machine may be running other work, or more workers than cores).

Of a split instruction's pieces, worker w runs piece w mod (piece count) when no other worker has claimed it
(else the next unclaimed one): each piece's position in the take order is a claim on one of the pieces, which
share their dependencies. So the same worker runs the same columns of each matmul of a chain accumulating
into one PSUM tile, and the same partitions of each elementwise piece, and they stay in its core's cache
instead of moving between cores (GPT-2 bf16 at two threads: 54.3 -> 50.6 ms, in one run).

The take order is a list schedule of the units on the workers, by estimated host cost (`host_seconds`),
longest path to the end first. Taking units in the serial order instead leaves a worker waiting on a unit
its neighbour has just taken while work on other queues is ready. Simulated with each unit's measured time,
GPT-2 (4 layers, hidden 512, seq 256) on two workers runs 1.67x faster than serial in the serial order and
2.0x in this one.

No deadlock: the take order is topological (a unit waits only on units taken before it), so the earliest
unit taken and not yet finished has all it waits on finished, and its worker always proceeds.
Faults: a worker whose kernel fails lowers `stop` to its unit's serial index (an atomic min). Workers skip
the units past `stop` and stop waiting for one, while every unit before it still runs (it waits only on
units before it), so the fault reported is the first one in the serial order, the one the serial driver
reports, once, whatever the thread count.
"""
from __future__ import annotations

import ctypes
import heapq
import threading
from collections.abc import Sequence

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from trnc.isa.program import Instruction, Program
from trnc.runtime.jit.kernels import I8P, I32, I64, KERNEL_TYPE, i64
from trnc.runtime.reference import QUEUE_ORDER

WORKER_SYMBOL = "trnc_worker"
# A unit's words: first step, step count, queue, position in the queue, first dependency, dependency count,
# its instruction's rank in the serial order, that instruction's piece count (runtime/jit/split.py), and the
# unit of its first piece.
UNIT_WORDS = 9
SPINS_BEFORE_SLEEP = 1 << 13   # pause-loop turns (0.14 ms at 16 ns a pause on a 2026 Xeon) before a waiting
# worker sleeps: waking a sleeping vCPU costs tens of microseconds, more than most waits for a unit (with 2^11
# turns, 33 us, GPT-2 fp32 at two threads ran 1.6x faster than serial; now 1.7x)
# Estimated host cost of an instruction (runtime/jit kernels on one core; only the take order uses them):
# per call, per multiply-accumulate of a matmul, per element of the largest operand of anything else.
CALL_SECONDS, MAC_SECONDS, ELEMENT_SECONDS = 5e-7, 1.2e-11, 4e-10
# Words of the shared block: the next unit of the take order, the first faulting unit, the futex generation,
# the sleeping workers, each queue's count of finished instructions, then each instruction's count of finished pieces
# (n words, n the unit count), then each unit's claim (1 once a worker has taken it).
SHARED_NEXT, SHARED_STOP, SHARED_GENERATION, SHARED_SLEEPERS, SHARED_DONE = range(5)
SHARED_PIECES = SHARED_DONE + len(QUEUE_ORDER)   # the first count of finished pieces; the claims start n words on
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}   # Linux system call numbers
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129


class Schedule:
    """The units of a program for the parallel driver: int64 tables of units and (queue, count) dependencies."""

    def __init__(self, program: Program, order: Sequence[int], pieces: Sequence[Sequence[int]], workers: int = 2):
        """`order`: instruction indices in the serial order; `pieces[k]`: the driver steps of each piece of the
        k-th of them (one piece unless runtime/jit/split.py split it). The pieces of an instruction are units
        with the same dependencies; the last of them to finish publishes the queue's count. `workers`: the
        thread count the take order is scheduled for."""
        queue_of = {name: q for q, name in enumerate(QUEUE_ORDER)}
        instructions = program.instructions
        queued = [0] * len(QUEUE_ORDER)                      # units of each queue so far
        signaller = [0] * program.num_semaphores             # the one queue that signals each semaphore
        after: list[list[int]] = [[] for _ in signaller]     # per semaphore: its queue's units after each signal
        units = np.zeros((sum(len(p) for p in pieces), UNIT_WORDS), dtype=np.int64)
        row = 0
        deps: list[tuple[int, int]] = []
        step = 0
        for k, index in enumerate(order):
            ins = instructions[index]
            q = queue_of[ins.queue_name]
            need = {q: queued[q]}
            for s, v in ins.waits:
                if v > 0:   # met by the v-th signal of s, in the serial order already sent
                    need[signaller[s]] = max(need.get(signaller[s], 0), after[s][v - 1])
            wanted = [(dq, c) for dq, c in sorted(need.items()) if c > 0]
            for piece, steps in enumerate(pieces[k]):
                units[row] = (step, steps, q, queued[q], len(deps), len(wanted), k, len(pieces[k]), row - piece)
                row += 1
                step += steps
            deps.extend(wanted)
            queued[q] += 1
            for s in ins.signals:
                signaller[s] = q
                after[s].append(queued[q])
        self.units = units
        self.deps = np.array(deps or [(0, 0)], dtype=np.int64)
        self.queues = sum(1 for c in queued if c)
        self.split = row > len(order)   # some instruction runs as pieces
        costs = [host_seconds(instructions[order[k]]) / len(pieces[k]) for k in units[:, 6].tolist()]
        self.take = self._list_schedule(costs, workers)

    def _predecessors(self) -> list[list[int]]:
        """The units each unit waits for: every piece of the instruction each (queue, count) pair names."""
        units = self.units
        first_of: dict[tuple[int, int], int] = {}
        for u, (q, pos) in enumerate(units[:, 2:4].tolist()):
            first_of.setdefault((q, pos), u)
        preds = []
        for first, count in units[:, 4:6].tolist():
            found = []
            for q, c in self.deps[first:first + count].tolist():
                u = first_of[(q, c - 1)]
                found.extend(range(u, u + int(units[u, 7])))
            preds.append(found)
        return preds

    def _list_schedule(self, costs: list[float], workers: int) -> np.ndarray:
        """The units in the order a list schedule on `workers` starts them: whenever a worker is free, the ready
        unit with the longest estimated path to the end (then the earliest in the serial order)."""
        preds = self._predecessors()
        succs: list[list[int]] = [[] for _ in preds]
        for u, found in enumerate(preds):
            for p in found:
                succs[p].append(u)
        path = [0.0] * len(preds)
        for u in range(len(preds) - 1, -1, -1):   # successors come later in the serial order
            path[u] = costs[u] + max((path[s] for s in succs[u]), default=0.0)
        waiting = [len(found) for found in preds]
        ready = [(-path[u], u) for u, n in enumerate(waiting) if n == 0]
        heapq.heapify(ready)
        running: list[tuple[float, int]] = []
        take, now, idle = [], 0.0, workers
        while ready or running:
            while ready and idle:
                _, u = heapq.heappop(ready)
                take.append(u)
                heapq.heappush(running, (now + costs[u], u))
                idle -= 1
            now, u = heapq.heappop(running)
            idle += 1
            for s in succs[u]:
                waiting[s] -= 1
                if not waiting[s]:
                    heapq.heappush(ready, (-path[s], s))
        return np.array(take, dtype=np.int64)

    def run(self, worker, table: np.ndarray, bases: list[np.ndarray], statuses: list[np.ndarray]) -> list[int]:
        """Run the units on len(bases) threads (the caller's is one); each thread's own memory bases (its own
        staging buffer) and status words. Returns each worker's code (0, or the fault code of its unit)."""
        shared = np.zeros(SHARED_PIECES + 2 * len(self.units), dtype=np.int64)
        shared[SHARED_STOP] = len(self.units)
        codes = [0] * len(bases)

        def work(w: int) -> None:
            codes[w] = worker(self.units.ctypes.data, self.take.ctypes.data, len(self.units), table.ctypes.data,
                              self.deps.ctypes.data, bases[w].ctypes.data, statuses[w].ctypes.data,
                              shared.ctypes.data, w)

        threads = [threading.Thread(target=work, args=(w,), name=f"trnc-worker-{w}") for w in range(1, len(bases))]
        for t in threads:
            t.start()
        work(0)
        for t in threads:
            t.join()
        return codes


def host_seconds(ins: Instruction) -> float:
    """A rough estimate of an instruction's run time on the host: enough to order the units, no more."""
    if ins.opcode == "matmul":
        stationary, moving = ins["stationary"], ins["moving"]
        return CALL_SECONDS + MAC_SECONDS * stationary.partitions * stationary.free_size * moving.free_size
    return CALL_SECONDS + ELEMENT_SECONDS * max((ap.num_elements for _, ap, _ in ins.operands()), default=0)


def supported(triple: str) -> bool:
    """Whether the host can run the parallel driver (its futex calls are Linux's); else runs are serial."""
    return "linux" in triple and triple.split("-")[0] in FUTEX_SYSCALL


def worker_function(address: int):
    """The ctypes function of a loaded `trnc_worker` (units, take, n, steps, deps, mems, status, shared, w)."""
    return ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                            *[ctypes.c_void_p] * 5, ctypes.c_int64)(address)


def declare_runtime_symbols() -> None:
    """Tell LLVM where libc's `syscall` is, for the worker's futex wait and wake (idempotent)."""
    libc = ctypes.CDLL(None)
    llvm.add_symbol("syscall", ctypes.cast(libc.syscall, ctypes.c_void_p).value)


class _Worker:
    """The IR of `trnc_worker` under construction: the shared words and the wait and wake helpers."""

    def __init__(self, triple: str):
        self.module = ir.Module(name=WORKER_SYMBOL)
        args = [I64.as_pointer(), I64.as_pointer(), I64, I64.as_pointer(), I64.as_pointer(), I8P.as_pointer(),
                I64.as_pointer(), I64.as_pointer(), I64]
        self.fn = ir.Function(self.module, ir.FunctionType(I32, args), name=WORKER_SYMBOL)
        self.syscall = ir.Function(self.module, ir.FunctionType(I64, [I64], var_arg=True), name="syscall")
        self.futex = FUTEX_SYSCALL[triple.split("-")[0]]
        self.x86 = triple.startswith("x86_64")
        self.units, self.take, self.n, self.steps, self.deps, self.mems, self.status, self.shared, self.w = \
            self.fn.args
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))

    def block(self, name: str) -> ir.Block:
        return self.fn.append_basic_block(name)

    def word(self, ptr, index):
        return self.b.load(self.b.gep(ptr, [index], inbounds=True))

    def shared_word(self, index) -> ir.Value:
        return self.b.gep(self.shared, [index if isinstance(index, ir.Value) else i64(index)], inbounds=True)

    def atomic(self, index, ordering="acquire"):
        return self.b.load_atomic(self.shared_word(index), ordering, 8)

    def generation(self) -> ir.Value:
        """The futex word: the low half of SHARED_GENERATION (little endian)."""
        return self.b.bitcast(self.shared_word(SHARED_GENERATION), I32.as_pointer())

    def pause(self) -> None:
        if self.x86:
            self.b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "pause", "", side_effect=True), [])

    def sleep(self, seen: ir.Value) -> None:
        """futex_wait(generation, seen): returns at once unless the generation is still `seen`."""
        self.b.call(self.syscall, [i64(self.futex), self.b.ptrtoint(self.generation(), I64), i64(FUTEX_WAIT_PRIVATE),
                                   self.b.zext(seen, I64), i64(0)])

    def wake(self) -> None:
        """Advance the generation; wake every sleeper if there is one (a system call only then)."""
        b = self.b
        b.atomic_rmw("add", self.generation(), ir.Constant(I32, 1), "seq_cst")
        with b.if_then(b.icmp_signed(">", self.atomic(SHARED_SLEEPERS, "seq_cst"), i64(0))):
            b.call(self.syscall, [i64(self.futex), b.ptrtoint(self.generation(), I64), i64(FUTEX_WAKE_PRIVATE),
                                  i64(2**31 - 1)])


def worker_ir(triple: str) -> str:
    """i32 trnc_worker(i64* units, i64* take, i64 n, i64* steps, i64* deps, i8** mems, i64* status, i64* shared,
    i64 w).

    Loop: t = next++ (atomic); past n: return 0; unit i = take[t], or of a split instruction the first piece
    from w mod parts on whose claim word (shared, past the piece counts) was 0; at or past stop: take the next.
    Wait until done[q] >= c for each dependency of unit i (returning 0 if stop drops below i meanwhile): spin a
    while, then sleep on the generation futex. Call its steps like the serial driver; if it is its instruction's last
    piece to finish, done[queue] = position + 1 (release) and wake. On a fault: status[0] = the step,
    stop = min(stop, i), wake, return the code.
    """
    w = _Worker(triple)
    b = w.b
    bb = {name: w.block(name) for name in ("take", "pick", "claim", "unit", "deps", "dep", "spin", "check", "pause",
                                           "sleep", "slept", "next_dep", "run", "step", "stepped", "fault", "finish",
                                           "publish", "done")}
    b.branch(bb["take"])
    b.position_at_end(bb["take"])                       # take the next unit
    t = b.atomic_rmw("add", w.shared_word(SHARED_NEXT), i64(1), "monotonic")
    b.cbranch(b.icmp_signed(">=", t, w.n), bb["done"], bb["pick"])
    b.position_at_end(bb["pick"])                       # its unit; of a split instruction, a piece not yet claimed
    taken = w.word(w.take, t)
    taken_row = b.mul(taken, i64(UNIT_WORDS))
    parts = w.word(w.units, b.add(taken_row, i64(7)))
    b.cbranch(b.icmp_signed("==", parts, i64(1)), bb["unit"], bb["claim"])
    b.position_at_end(bb["claim"])                      # try piece w mod parts first, then the next ones
    j = b.phi(I64, name="j")
    j.add_incoming(i64(0), bb["pick"])
    candidate = b.add(w.word(w.units, b.add(taken_row, i64(8))), b.srem(b.add(w.w, j), parts))
    claim = w.shared_word(b.add(b.add(w.n, candidate), i64(SHARED_PIECES)))
    was = b.atomic_rmw("xchg", claim, i64(1), "monotonic")
    j.add_incoming(b.add(j, i64(1)), bb["claim"])
    b.cbranch(b.icmp_signed("==", was, i64(0)), bb["unit"], bb["claim"])
    b.position_at_end(bb["unit"])                       # unless a fault before it stopped the run
    i = b.phi(I64, name="i")
    i.add_incoming(taken, bb["pick"])
    i.add_incoming(candidate, bb["claim"])
    row = b.mul(i, i64(UNIT_WORDS))
    first_dep = w.word(w.units, b.add(row, i64(4)))
    dep_end = b.add(first_dep, w.word(w.units, b.add(row, i64(5))))
    b.cbranch(b.icmp_signed(">=", i, w.atomic(SHARED_STOP)), bb["take"], bb["deps"])

    b.position_at_end(bb["deps"])                       # for each dependency (queue, count)
    d = b.phi(I64, name="d")
    d.add_incoming(first_dep, bb["unit"])
    b.cbranch(b.icmp_signed("<", d, dep_end), bb["dep"], bb["run"])
    b.position_at_end(bb["dep"])
    queue, count = w.word(w.deps, b.mul(d, i64(2))), w.word(w.deps, b.add(b.mul(d, i64(2)), i64(1)))
    done_at = b.add(queue, i64(SHARED_DONE))
    b.branch(bb["spin"])
    b.position_at_end(bb["spin"])                       # until done[queue] >= count
    spins = b.phi(I64, name="spins")
    spins.add_incoming(i64(0), bb["dep"])
    b.cbranch(b.icmp_signed(">=", w.atomic(done_at), count), bb["next_dep"], bb["check"])
    b.position_at_end(bb["check"])                      # a fault before unit i ends the wait
    stopped = b.icmp_signed("<", w.atomic(SHARED_STOP), i)
    b.cbranch(stopped, bb["done"], bb["pause"])
    b.position_at_end(bb["pause"])
    more = b.add(spins, i64(1))
    w.pause()
    b.cbranch(b.icmp_signed(">", more, i64(SPINS_BEFORE_SLEEP)), bb["sleep"], bb["spin"])
    spins.add_incoming(more, bb["pause"])
    b.position_at_end(bb["sleep"])                      # sleep until some unit finishes (or a fault)
    b.atomic_rmw("add", w.shared_word(SHARED_SLEEPERS), i64(1), "seq_cst")
    seen = b.load_atomic(w.generation(), "seq_cst", 4)
    unmet = b.and_(b.icmp_signed("<", w.atomic(done_at, "seq_cst"), count),
                   b.icmp_signed(">=", w.atomic(SHARED_STOP, "seq_cst"), i))
    with b.if_then(unmet):
        w.sleep(seen)
    b.atomic_rmw("sub", w.shared_word(SHARED_SLEEPERS), i64(1), "seq_cst")
    b.branch(bb["slept"])
    b.position_at_end(bb["slept"])
    b.branch(bb["spin"])
    spins.add_incoming(i64(SPINS_BEFORE_SLEEP), bb["slept"])   # still unmet: sleep again at once
    b.position_at_end(bb["next_dep"])
    d.add_incoming(b.add(d, i64(1)), bb["next_dep"])
    b.branch(bb["deps"])

    b.position_at_end(bb["run"])                        # its steps, as the serial driver calls them
    first_step = w.word(w.units, row)
    step_end = b.add(first_step, w.word(w.units, b.add(row, i64(1))))
    b.branch(bb["step"])
    b.position_at_end(bb["step"])
    s = b.phi(I64, name="s")
    s.add_incoming(first_step, bb["run"])
    b.cbranch(b.icmp_signed("<", s, step_end), bb["stepped"], bb["finish"])
    b.position_at_end(bb["stepped"])
    slot = b.shl(s, i64(1))
    kernel = b.inttoptr(w.word(w.steps, slot), KERNEL_TYPE.as_pointer())
    args = b.inttoptr(w.word(w.steps, b.add(slot, i64(1))), I64.as_pointer())
    code = b.call(kernel, [w.mems, args, w.status])
    s.add_incoming(b.add(s, i64(1)), bb["stepped"])
    b.cbranch(b.icmp_unsigned("!=", code, ir.Constant(I32, 0)), bb["fault"], bb["step"])
    b.position_at_end(bb["fault"])
    b.store(s, w.status)
    b.atomic_rmw("min", w.shared_word(SHARED_STOP), i, "seq_cst")
    w.wake()
    b.ret(code)

    b.position_at_end(bb["finish"])                     # the last piece to finish publishes
    parts = w.word(w.units, b.add(row, i64(7)))
    finished = w.shared_word(b.add(w.word(w.units, b.add(row, i64(6))), i64(SHARED_PIECES)))
    last = b.icmp_signed("==", b.add(b.atomic_rmw("add", finished, i64(1), "acq_rel"), i64(1)), parts)
    b.cbranch(last, bb["publish"], bb["take"])
    b.position_at_end(bb["publish"])                    # the queue has finished position + 1 instructions
    done = w.shared_word(b.add(w.word(w.units, b.add(row, i64(2))), i64(SHARED_DONE)))
    b.store_atomic(b.add(w.word(w.units, b.add(row, i64(3))), i64(1)), done, "release", 8)
    w.wake()
    b.branch(bb["take"])
    b.position_at_end(bb["done"])
    b.ret(ir.Constant(I32, 0))
    return str(w.module)
