"""The load path's integer loops in native code: happens-before clocks, the execution order, race candidates.

Each is a loop over instructions or pairs of accesses whose step is a few integer operations: Python spends
about a microsecond per step, which on a 100k-instruction program was most of what verifying and loading cost
(isa/races.py, runtime/reference.py). Here they are written once in LLVM IR (isa/native_ir.py), compiled
for the host when first used in a process (about 80 ms) and called through ctypes on int64 numpy arrays.

The callers build every index array themselves and the wrappers check the bounds the loops rely on, so a bad
program gets a Python error, never an access out of bounds in native code. The loops are the specification's
own rules, and tests hold each to a plain Python statement of it (tests/isa/test_native.py).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from trnc.isa.native_ir import BUILDERS, PAIR_ARGS, SCAN_LIMIT


class _Native:
    """The functions, compiled for the host into an MCJIT engine of their own (kept for the process). Not through
    runtime/jit/codegen.py's Codegen: the isa layer imports no runtime (and these loops want no kernel cache)."""

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = ir.Module(name="trnc_native")
        for build in BUILDERS:
            build(module)
        triple = llvm.get_process_triple()
        machine = llvm.Target.from_triple(triple).create_target_machine(opt=2, jit=True)
        parsed = llvm.parse_assembly(str(module))
        parsed.triple = triple
        parsed.verify()
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=2))
        builder.getModulePassManager().run(parsed, builder)
        self._engine = llvm.create_mcjit_compiler(parsed, machine)
        self._engine.finalize_object()

        def function(name: str, args: int):
            kind = ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_int64] * args)
            return kind(self._engine.get_function_address(name))
        self.clocks = function("trnc_clocks", 11)
        self.order = function("trnc_order", 12)
        self.pairs = function("trnc_pairs", 8 + len(PAIR_ARGS))
        self.row_ids = function("trnc_row_ids", 6)
        self.row_starts = function("trnc_row_starts", 4)
        self.gather_columns = function("trnc_gather_columns", 5)


_native: _Native | None = None
_lock = threading.Lock()


def _functions() -> _Native:
    global _native
    with _lock:
        if _native is None:
            _native = _Native()
    return _native


def _ints(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(a, dtype=np.int64) for a in arrays]


def _within(values: np.ndarray, lo: int, hi: int, what: str) -> None:
    if values.size and (values.min() < lo or values.max() >= hi):
        raise ValueError(f"{what} out of [{lo}, {hi})")


def clocks(order: np.ndarray, prev: np.ndarray, wait_first: np.ndarray, wait_source: np.ndarray,
           queue: np.ndarray, pos: np.ndarray, queues: int) -> tuple[np.ndarray, np.ndarray]:
    """Vector clocks [n, queues]: clock[i, q] the number of queue q's instructions that happen before i or are i;
    and ranked[i, q], the number of queue q's instructions before i in `order`. `order` is a topological order,
    prev[i] i's predecessor in its queue (-1 for none) and wait_source[wait_first[i]:wait_first[i + 1]] the
    instructions i's waits follow."""
    n = len(prev)
    order, prev, wait_first, wait_source, queue, pos = _ints(order, prev, wait_first, wait_source, queue, pos)
    _within(order, 0, n, "order")
    _within(prev, -1, n, "prev")
    _within(wait_source, 0, n, "wait source")
    _within(queue, 0, queues, "queue")
    if len(queue) != n or len(pos) != n or len(order) != n:
        raise ValueError("a queue, a position and a place in the order per instruction")
    _check_first(wait_first, n, len(wait_source))
    clock, ranked = np.zeros((n, queues), dtype=np.int64), np.zeros((n, queues), dtype=np.int64)
    counts = np.zeros(queues, dtype=np.int64)
    if n:
        _functions().clocks(n, queues, *(a.ctypes.data for a in (order, prev, wait_first, wait_source, queue, pos,
                                                                    clock, ranked, counts)))
    return clock, ranked


def execution_order(queue_members: list[np.ndarray], wait_first: np.ndarray, wait_semaphore: np.ndarray,
                    wait_value: np.ndarray, signal_first: np.ndarray, signal_semaphore: np.ndarray,
                    semaphores: int) -> np.ndarray:
    """The instructions in the order that starts, each time, the head of the first queue (in the order of
    `queue_members`, each a queue's instructions in queue order) whose waits (semaphore >= value) are met, a
    started instruction counting its signals at once; shorter than the program when none can start."""
    n = sum(len(m) for m in queue_members)
    members = _ints(np.concatenate(queue_members) if queue_members else np.zeros(0))[0]
    starts = np.zeros(len(queue_members) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(m) for m in queue_members])
    wait_first, wait_semaphore, wait_value, signal_first, signal_semaphore = _ints(
        wait_first, wait_semaphore, wait_value, signal_first, signal_semaphore)
    _within(members, 0, n, "instruction")
    if n and np.bincount(members, minlength=n).max() > 1:
        raise ValueError("an instruction is in two queues")
    _check_first(wait_first, n, len(wait_semaphore))
    _check_first(signal_first, n, len(signal_semaphore))
    if len(wait_value) != len(wait_semaphore):
        raise ValueError("a value per wait")
    _within(wait_semaphore, 0, semaphores, "semaphore")
    _within(signal_semaphore, 0, semaphores, "semaphore")
    counts = np.zeros(max(semaphores, 1), dtype=np.int64)
    heads, out = starts[:-1].copy(), np.zeros(n, dtype=np.int64)
    placed = _functions().order(n, len(queue_members), *(a.ctypes.data for a in (
        starts, members, heads, wait_first, wait_semaphore, wait_value, signal_first, signal_semaphore, counts,
        out))) if n else 0
    return out[:placed]


def race_pairs(queue_start: np.ndarray, queue_id: np.ndarray, columns: dict[str, np.ndarray], clock: np.ndarray,
               ranked: np.ndarray, queue_length: np.ndarray, threads: int = 1,
               scan_limit: int = SCAN_LIMIT) -> tuple[np.ndarray, np.ndarray]:
    """(accesses of a, accesses of b) of the race candidates of one memory: trnc_pairs (see _pairs_ir) over
    `columns` (`writes` per queue group; `pos`, the access's instruction's position in its queue, and PAIR_ARGS[3:9]
    per access, grouped by queue), with the rows of clock and ranked (clocks()) of the accesses' instructions, the
    ordering's queue id of each group and the instruction count of each queue id. Time runs of at most `scan_limit`
    accesses are scanned, longer ones searched by byte bucket. Up to `threads` threads walk the groups, each taking
    the next group not yet walked (ctypes lets go of the GIL in the native loop)."""
    queue_start, queue_id, queue_length = _ints(queue_start, queue_id, queue_length)
    arrays = dict(zip(("writes", "pos", *PAIR_ARGS[3:9]), _ints(*(columns[name] for name in ("writes", "pos",
                                                                                            *PAIR_ARGS[3:9])))))
    clock, ranked = np.ascontiguousarray(clock, dtype=np.int64), np.ascontiguousarray(ranked, dtype=np.int64)
    queues = len(queue_id)
    if len(queue_start) != queues + 1:
        raise ValueError("a start per queue group, and the end")
    accesses, sizes = int(queue_start[-1]), np.diff(queue_start)
    if queue_start[0] != 0 or np.any(sizes < 0) or len(arrays["writes"]) != queues or clock.ndim != 2:
        raise ValueError("queue groups do not cover the accesses")
    if ranked.shape != clock.shape:
        raise ValueError("a row of ranked per row of clock")
    for name in ("pos", *PAIR_ARGS[3:9]):
        if len(arrays[name]) != accesses:
            raise ValueError(f"{name} has {len(arrays[name])} values for {accesses} accesses")
    _within(queue_id, 0, clock.shape[1], "queue")
    _within(arrays["instr"], 0, len(clock), "instruction")
    if len(queue_length) != clock.shape[1]:
        raise ValueError("an instruction count per queue")
    group = np.repeat(np.arange(queues), sizes)
    lengths = queue_length[queue_id]
    if np.any(arrays["pos"] < 0) or np.any(arrays["pos"] >= lengths[group]) or np.any(np.diff(arrays["pos"])[
            np.diff(group) == 0] < 0):
        raise ValueError("positions outside their queue or out of queue order")
    fa_start = _starts(lengths + 1)
    # fa[fa_start[g] + k]: the accesses before group g's of its instructions from the k-th on, counted
    before = np.bincount(fa_start[group] + arrays["pos"], minlength=int((lengths + 1).sum()))
    fa = np.cumsum(before) - before
    shared = [queue_start, queue_id, *(arrays[name] for name in PAIR_ARGS[2:9]), clock, ranked, lengths, fa_start,
              *_ints(fa)]
    results: list[np.ndarray | None] = [None] * queues

    def walk(group: int, buckets: int, bucket_columns: list[np.ndarray]) -> None:
        """The pairs of queue group `group` as the later side into results, or None when it meets a long run and
        there are no buckets."""
        pointers = [np.zeros(max(queues * buckets, 1), dtype=np.int64) for _ in range(2)]   # lo_at, hi_at
        addresses = [a.ctypes.data for a in (*shared, *bucket_columns, *pointers)]
        cap = 4 * int(sizes[group]) + 4096   # enough for a synchronized program's; else the walk runs again
        while True:
            out = np.empty(2 * cap, dtype=np.int64)
            found = _functions().pairs(group, group + 1, queues, clock.shape[1], buckets, scan_limit,
                                       out.ctypes.data, cap, *addresses)
            if found <= cap:
                results[group] = out[:2 * found].reshape(-1, 2) if found >= 0 else None
                return
            cap = found

    largest_first = np.argsort(-sizes, kind="stable").tolist()   # so that no long walk starts last
    _in_threads(walk, largest_first, threads, 0, [np.zeros(1, dtype=np.int64)] * 4)
    unfinished = [group for group, found in enumerate(results) if found is None]
    if unfinished:   # queues that rarely synchronize: their long runs are searched by byte bucket
        _in_threads(walk, unfinished, threads, *_buckets(sizes, arrays["blo"], arrays["bhi"]))
    pairs = np.concatenate([np.zeros((0, 2), dtype=np.int64), *results])
    return pairs[:, 0], pairs[:, 1]


def _in_threads(work: Callable[..., None], parts, threads: int, *args) -> None:
    """work(part, *args) for each part, on up to `threads` threads (this one and helpers), each taking the next
    part not yet taken; the first error any raised is raised again here, once all have ended."""
    errors: list[BaseException] = []
    pending = iter(list(parts))
    lock = threading.Lock()

    def worker() -> None:
        while not errors:
            with lock:
                part = next(pending, None)
            if part is None:
                return
            try:
                work(part, *args)
            except BaseException as e:   # re-raised below, in the caller's thread
                errors.append(e)
    helpers = [threading.Thread(target=worker) for _ in range(max(threads, 1) - 1)]
    for helper in helpers:
        helper.start()
    worker()
    for helper in helpers:
        helper.join()
    if errors:
        raise errors[0]


def row_ids(key: np.ndarray) -> np.ndarray:
    """Per row of the 2-D `key`, an id shared by exactly the equal rows: 0, 1, ... in order of first appearance."""
    key = np.ascontiguousarray(key, dtype=np.int64)
    if key.ndim != 2:
        raise ValueError("a key of rows")
    rows, k = key.shape
    ids = np.zeros(rows, dtype=np.int64)
    table = np.full(1 << (2 * rows).bit_length(), -1, dtype=np.int64)
    if rows:
        _functions().row_ids(rows, k, key.ctypes.data, ids.ctypes.data, table.ctypes.data, len(table) - 1)
    return ids


def first_appearances(ids: np.ndarray) -> np.ndarray:
    """Where each id first appears in `ids`, numbered 0, 1, ... in order of first appearance (as row_ids numbers
    them): a sort-free np.unique(ids, return_index=True)[1]."""
    ids = np.asarray(ids, dtype=np.int64)
    before = np.empty_like(ids)   # the largest id before each
    before[:1] = -1
    np.maximum.accumulate(ids[:-1], out=before[1:])
    return np.flatnonzero(ids > before)


def row_starts(words: np.ndarray, n: int) -> np.ndarray:
    """Where each of the n instructions' rows (isa/rows.py) starts in `words`, their join; ValueError when the
    rows' heads do not tile it."""
    words = np.ascontiguousarray(words, dtype=np.int64)
    at = np.zeros(n, dtype=np.int64)
    if n and _functions().row_starts(n, words.ctypes.data, len(words), at.ctypes.data) != 0 or not n and len(words):
        raise ValueError("the rows' heads do not tile their words")
    return at


def gather_columns(words: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """[width, len(starts)]: column c of row r is words[starts[r] + c] (numpy's words[starts + arange(width)[:,
    None]] without its index array)."""
    words, starts = _ints(words, starts)
    _within(starts, 0, len(words) - width + 1, "row start")
    out = np.empty((width, len(starts)), dtype=np.int64)
    if len(starts) and width:
        _functions().gather_columns(len(starts), width, words.ctypes.data, starts.ctypes.data, out.ctypes.data)
    return out


def _buckets(sizes: np.ndarray, blo: np.ndarray, bhi: np.ndarray) -> tuple[int, list[np.ndarray]]:
    """The byte buckets of trnc_pairs: (bucket count, [first_bucket, last_bucket, bucket_start, bucket_member]).
    A bucket is a power of two of bytes, at least the median range, doubled until the accesses cover at most
    4 buckets each on average and there are not many more buckets than accesses."""
    n, queues = len(blo), len(sizes)
    base = int(blo.min(initial=0))
    width = 1 << max(int(np.median(bhi - blo)) - 1, 0).bit_length() if n else 1
    while True:
        first = (blo - base) // width
        last = np.maximum((bhi - 1 - base) // width, first)
        count = last - first + 1
        buckets = int(last.max(initial=0)) + 1
        if int(count.sum()) <= 4 * n + 64 and buckets <= 4 * n + 64:
            break
        width *= 2
    owner = np.repeat(np.arange(n), count)
    bucket = first[owner] + np.arange(len(owner)) - np.repeat(_starts(count), count)
    group = np.repeat(np.arange(queues), sizes)[owner]
    local = owner - np.repeat(_starts(sizes), sizes)[owner]
    key = group * buckets + bucket
    order = np.lexsort((local, key))
    start = np.zeros(queues * buckets + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=queues * buckets), out=start[1:])
    return buckets, _ints(first, last, start, local[order])


def _starts(counts: np.ndarray) -> np.ndarray:
    return np.cumsum(counts) - counts


def _check_first(first: np.ndarray, n: int, total: int) -> None:
    """first is a CSR row start array over n rows of `total` entries."""
    if len(first) != n + 1 or first[0] != 0 or first[-1] != total or np.any(np.diff(first) < 0):
        raise ValueError("row starts do not cover the entries")
