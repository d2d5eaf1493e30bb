"""The load path's integer loops in native code: happens-before clocks, the execution order, the race scan.

Each is a loop over instructions or pairs of accesses whose step is a few integer operations: Python spends
about a microsecond per step, which on a 100k-instruction program was most of what verifying and loading cost
(isa/races.py, runtime/reference.py). Here they are written once in LLVM IR (llvmlite's builder), compiled
for the host when first used in a process (about 50 ms) and called through ctypes on int64 numpy arrays.

The callers build every index array themselves and the wrappers check the bounds the loops rely on, so a bad
program gets a Python error, never an access out of bounds in native code. The loops are the specification's
own rules, and tests hold each to a plain Python statement of it (tests/isa/test_native.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

I64 = ir.IntType(64)
_P = I64.as_pointer()
_ARRAY = ctypes.c_void_p


def _i(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


class _Builder(ir.IRBuilder):
    """IRBuilder with the loop shapes the three functions need; variables live in allocas (mem2reg lifts them)."""

    def var(self, value) -> ir.AllocaInstr:
        with self.goto_entry_block():
            slot = self.alloca(I64)
        self.store(value if isinstance(value, ir.Value) else _i(value), slot)
        return slot

    def at(self, array, index):
        return self.gep(array, [index], inbounds=True)

    def get(self, array, index):
        return self.load(self.at(array, index))

    @contextlib.contextmanager
    def loop(self, start, stop, go=None):
        """for i in range(start, stop), while the flag `go` (an alloca, when given) stays non-zero."""
        i = self.var(start)
        test, body, done = (self.append_basic_block(x) for x in ("test", "body", "done"))
        self.branch(test)
        self.position_at_end(test)
        more = self.icmp_signed("<", self.load(i), stop)
        if go is not None:
            more = self.and_(more, self.icmp_signed("!=", self.load(go), _i(0)))
        self.cbranch(more, body, done)
        self.position_at_end(body)
        yield self.load(i)
        self.store(self.add(self.load(i), _i(1)), i)
        self.branch(test)
        self.position_at_end(done)


def _function(module: ir.Module, name: str, args: int) -> tuple[ir.Function, _Builder]:
    fn = ir.Function(module, ir.FunctionType(I64, [I64] * args), name=name)
    b = _Builder(fn.append_basic_block("entry"))
    return fn, b


def _clocks_ir(module: ir.Module) -> None:
    """clocks(n, nq, order, prev, wptr, wsrc, queue, pos, clock): in `order`, each instruction's row of clock is
    its queue predecessor's, raised to every waited-on instruction's, with its own queue's entry its position + 1."""
    fn, b = _function(module, "trnc_clocks", 9)
    n, nq, *arrays = fn.args
    order, prev, wptr, wsrc, queue, pos, clock = (b.inttoptr(a, _P) for a in arrays)
    with b.loop(_i(0), n) as r:
        i = b.get(order, r)
        row = b.mul(i, nq)
        p = b.get(prev, i)
        with b.if_then(b.icmp_signed(">=", p, _i(0))):
            base = b.mul(p, nq)
            with b.loop(_i(0), nq) as q:
                b.store(b.get(clock, b.add(base, q)), b.at(clock, b.add(row, q)))
        with b.loop(b.get(wptr, i), b.get(wptr, b.add(i, _i(1)))) as k:
            base = b.mul(b.get(wsrc, k), nq)
            with b.loop(_i(0), nq) as q:
                mine, theirs = b.at(clock, b.add(row, q)), b.get(clock, b.add(base, q))
                b.store(b.select(b.icmp_signed(">", theirs, b.load(mine)), theirs, b.load(mine)), mine)
        b.store(b.add(b.get(pos, i), _i(1)), b.at(clock, b.add(row, b.get(queue, i))))
    b.ret(_i(0))


def _order_ir(module: ir.Module) -> None:
    """order(n, nq, qptr, qidx, heads, wptr, wsem, wval, sptr, ssem, counts, out) -> instructions placed: each
    step starts the head of the first queue whose waits are met and counts its signals; fewer than n when none
    can start (a deadlock)."""
    fn, b = _function(module, "trnc_order", 12)
    n, nq, *arrays = fn.args
    qptr, qidx, heads, wptr, wsem, wval, sptr, ssem, counts, out = (b.inttoptr(a, _P) for a in arrays)
    placed = b.var(n)
    running = b.var(1)
    with b.loop(_i(0), n, go=running) as step:
        chosen = b.var(-1)
        searching = b.var(1)
        with b.loop(_i(0), nq, go=searching) as q:
            head = b.get(heads, q)
            with b.if_then(b.icmp_signed("<", head, b.get(qptr, b.add(q, _i(1))))):
                i = b.get(qidx, head)
                met = b.var(1)
                with b.loop(b.get(wptr, i), b.get(wptr, b.add(i, _i(1))), go=met) as k:
                    with b.if_then(b.icmp_signed("<", b.get(counts, b.get(wsem, k)), b.get(wval, k))):
                        b.store(_i(0), met)
                with b.if_then(b.icmp_signed("!=", b.load(met), _i(0))):
                    b.store(q, chosen)
                    b.store(_i(0), searching)
        q = b.load(chosen)
        with b.if_else(b.icmp_signed("<", q, _i(0))) as (stuck, go):
            with stuck:
                b.store(step, placed)
                b.store(_i(0), running)
            with go:
                head = b.get(heads, q)
                b.store(b.add(head, _i(1)), b.at(heads, q))
                i = b.get(qidx, head)
                b.store(i, b.at(out, step))
                with b.loop(b.get(sptr, i), b.get(sptr, b.add(i, _i(1)))) as k:
                    count = b.at(counts, b.get(ssem, k))
                    b.store(b.add(b.load(count), _i(1)), count)
    b.ret(b.load(placed))


def _search_ir(module: ir.Module) -> None:
    """search(n, hay, m, keys, right, out): out[j] = numpy.searchsorted(hay, keys[j], side) for sorted `hay`, by a
    pointer that walks from the previous answer (either way), so sorted keys cost O(n + m) in all."""
    fn, b = _function(module, "trnc_search", 6)
    n, hay_address, m, keys_address, right, out_address = fn.args
    hay, keys, out = (b.inttoptr(a, _P) for a in (hay_address, keys_address, out_address))
    p = b.var(0)
    strict = b.icmp_signed("!=", right, _i(0))

    def before(value, key):   # hay[p] < key for side left, hay[p] <= key for side right
        return b.select(strict, b.icmp_signed("<=", value, key), b.icmp_signed("<", value, key))
    with b.loop(_i(0), m) as j:
        key = b.get(keys, j)
        for step, move in ((-1, "back"), (1, "forward")):
            test, body, done = (b.append_basic_block(f"{move}_{x}") for x in ("test", "body", "done"))
            b.branch(test)
            b.position_at_end(test)
            at = b.load(p)
            if step < 0:   # back while hay[p - 1] is not before key
                go = b.and_(b.icmp_signed(">", at, _i(0)), b.not_(before(b.get(hay, b.sub(at, _i(1))), key)))
            else:          # forward while hay[p] is before key
                inside = b.icmp_signed("<", at, n)
                go = b.and_(inside, before(b.get(hay, b.select(inside, at, _i(0))), key))
            b.cbranch(go, body, done)
            b.position_at_end(body)
            b.store(b.add(at, _i(step)), p)
            b.branch(test)
            b.position_at_end(done)
        b.store(b.load(p), b.at(out, j))
    b.ret(_i(0))


_SCAN_ARGS = ("lo", "hi", "perm", "t_lo", "t_hi", "a_blo", "a_bhi", "a_plo", "a_phi", "a_write",
              "b_blo", "b_bhi", "b_plo", "b_phi", "b_write")


def _scan_ir(module: ir.Module) -> None:
    """scan(owners, flip, out, cap, *_SCAN_ARGS) -> pairs found: for each owner j and k in [lo[j], hi[j]), the
    pair (perm[k], j), or (j, perm[k]) when flip (perm null: k itself), of a position in queue a and one in
    queue b, kept when a is in b's unordered run [t_lo[b], t_hi[b]), their byte ranges and partition ranges
    overlap and one writes; the first `cap` pairs kept are written to out as (a, b)."""
    fn, b = _function(module, "trnc_scan", 4 + len(_SCAN_ARGS))
    owners, flip, out_address, cap, *arrays = fn.args
    out = b.inttoptr(out_address, _P)
    lo, hi, perm, t_lo, t_hi, a_blo, a_bhi, a_plo, a_phi, a_w, b_blo, b_bhi, b_plo, b_phi, b_w = (
        b.inttoptr(a, _P) for a in arrays)
    found = b.var(0)
    flipped = b.icmp_signed("!=", flip, _i(0))
    identity = b.icmp_unsigned("==", b.ptrtoint(perm, I64), _i(0))
    with b.loop(_i(0), owners) as j:
        with b.loop(b.get(lo, j), b.get(hi, j)) as k:
            x = b.select(identity, k, b.get(perm, b.select(identity, _i(0), k)))
            ia, ib = b.select(flipped, j, x), b.select(flipped, x, j)

            def less(p, q):
                return b.icmp_signed("<", p, q)

            def meet(a_lo, a_hi, b_lo, b_hi):   # [a_lo, a_hi) of a and [b_lo, b_hi) of b intersect
                return b.and_(less(b.get(a_lo, ia), b.get(b_hi, ib)), less(b.get(b_lo, ib), b.get(a_hi, ia)))
            keep = b.and_(b.icmp_signed("<=", b.get(t_lo, ib), ia), less(ia, b.get(t_hi, ib)))
            keep = b.and_(keep, b.and_(meet(a_blo, a_bhi, b_blo, b_bhi), meet(a_plo, a_phi, b_plo, b_phi)))
            keep = b.and_(keep, b.icmp_signed("!=", b.or_(b.get(a_w, ia), b.get(b_w, ib)), _i(0)))
            with b.if_then(keep):
                at = b.load(found)
                with b.if_then(less(at, cap)):
                    b.store(ia, b.at(out, b.mul(at, _i(2))))
                    b.store(ib, b.at(out, b.add(b.mul(at, _i(2)), _i(1))))
                b.store(b.add(at, _i(1)), found)
    b.ret(b.load(found))


class _Native:
    """The functions, compiled for the host into an MCJIT engine of their own (kept for the process)."""

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = ir.Module(name="trnc_native")
        for build in (_clocks_ir, _order_ir, _search_ir, _scan_ir):
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
        self.clocks = function("trnc_clocks", 9)
        self.order = function("trnc_order", 12)
        self.search = function("trnc_search", 6)
        self.scan = function("trnc_scan", 4 + len(_SCAN_ARGS))


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
           queue: np.ndarray, pos: np.ndarray, queues: int) -> np.ndarray:
    """Vector clocks [n, queues]: clock[i, q] the number of queue q's instructions that happen before i or are i.
    `order` is a topological order, prev[i] i's predecessor in its queue (-1 for none) and wait_source[
    wait_first[i]:wait_first[i + 1]] the instructions i's waits follow."""
    n = len(prev)
    order, prev, wait_first, wait_source, queue, pos = _ints(order, prev, wait_first, wait_source, queue, pos)
    _within(order, 0, n, "order")
    _within(prev, -1, n, "prev")
    _within(wait_source, 0, n, "wait source")
    _within(queue, 0, queues, "queue")
    _check_first(wait_first, n, len(wait_source))
    clock = np.zeros((n, queues), dtype=np.int64)
    if n and len(order) == n:
        _functions().clocks(n, queues, *(a.ctypes.data for a in (order, prev, wait_first, wait_source, queue, pos,
                                                                    clock)))
    elif n:
        raise ValueError("order is not a permutation of the instructions")
    return clock


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
    if len(np.unique(members)) != n:
        raise ValueError("an instruction is in two queues")
    _check_first(wait_first, n, len(wait_semaphore))
    _check_first(signal_first, n, len(signal_semaphore))
    _within(wait_semaphore, 0, semaphores, "semaphore")
    _within(signal_semaphore, 0, semaphores, "semaphore")
    counts = np.zeros(max(semaphores, 1), dtype=np.int64)
    heads, out = starts[:-1].copy(), np.zeros(n, dtype=np.int64)
    placed = _functions().order(n, len(queue_members), *(a.ctypes.data for a in (
        starts, members, heads, wait_first, wait_semaphore, wait_value, signal_first, signal_semaphore, counts,
        out))) if n else 0
    return out[:placed]


def search(hay: np.ndarray, keys: np.ndarray, side: str = "left") -> np.ndarray:
    """numpy.searchsorted(hay, keys, side) for sorted int `hay`, in time linear in both when keys are sorted."""
    hay, keys = _ints(hay, keys)
    out = np.empty(len(keys), dtype=np.int64)
    if len(keys):
        _functions().search(len(hay), hay.ctypes.data, len(keys), keys.ctypes.data, int(side == "right"),
                            out.ctypes.data)
    return out


def scan(lo: np.ndarray, hi: np.ndarray, perm: np.ndarray | None, flip: bool, columns: dict[str, np.ndarray],
         sizes: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(positions in a, positions in b) of the pairs trnc_scan keeps, in enumeration order (owner, then k).
    `perm` None stands for the identity; `columns` holds _SCAN_ARGS[3:] (t_lo, t_hi per b; the a_ columns per a,
    the b_ ones per b), `sizes` the lengths of queue a and b."""
    owner_size, other_size = (sizes[0], sizes[1]) if flip else (sizes[1], sizes[0])
    lo, hi = _ints(lo, hi)
    if perm is not None:
        perm = _ints(perm)[0]
        _within(perm, 0, other_size, "position")
    if len(lo) != owner_size or len(hi) != owner_size:
        raise ValueError("one run per owner")
    if owner_size and (lo.min() < 0 or hi.max() > (other_size if perm is None else len(perm)) or np.any(lo > hi)):
        raise ValueError("a run outside perm")
    arrays = _ints(*(columns[name] for name in _SCAN_ARGS[3:]))
    for name, array in zip(_SCAN_ARGS[3:], arrays):
        if len(array) != sizes[name.startswith(("t_", "b_"))]:
            raise ValueError(f"{name} has {len(array)} values")
    addresses = [lo.ctypes.data, hi.ctypes.data, 0 if perm is None else perm.ctypes.data,
                 *(a.ctypes.data for a in arrays)]
    cap = 1024
    while True:
        out = np.empty(2 * cap, dtype=np.int64)
        found = _functions().scan(len(lo), int(flip), out.ctypes.data, cap, *addresses)
        if found <= cap:
            pairs = out[:2 * found].reshape(-1, 2)
            return pairs[:, 0], pairs[:, 1]
        cap = found


def _check_first(first: np.ndarray, n: int, total: int) -> None:
    """first is a CSR row start array over n rows of `total` entries."""
    if len(first) != n + 1 or first[0] != 0 or first[-1] != total or np.any(np.diff(first) < 0):
        raise ValueError("row starts do not cover the entries")
