"""The load path's integer loops written in LLVM IR (llvmlite's builder): happens-before clocks, the execution order,
race candidates, row ids, row starts and column gathers.

Each builder adds one function to a module; isa/native.py compiles the module for the host and calls the functions
through ctypes, behind wrappers that check every bound these loops rely on. The loops trust their arguments.
"""
from __future__ import annotations

import contextlib

from llvmlite import ir

I64 = ir.IntType(64)
_P = I64.as_pointer()


def _i(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


class _Builder(ir.IRBuilder):
    """IRBuilder with the loop shapes the functions need; variables live in allocas (mem2reg lifts them)."""

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
    """clocks(n, nq, order, prev, wptr, wsrc, queue, pos, clock, ranked, counts): in `order`, each instruction's row
    of clock is its queue predecessor's, raised to every waited-on instruction's, with its own queue's entry its
    position + 1; its row of ranked is `counts`, the instructions of each queue placed before it in `order`."""
    fn, b = _function(module, "trnc_clocks", 11)
    n, nq, *arrays = fn.args
    order, prev, wptr, wsrc, queue, pos, clock, ranked, counts = (b.inttoptr(a, _P) for a in arrays)
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
        with b.loop(_i(0), nq) as q:
            b.store(b.get(counts, q), b.at(ranked, b.add(row, q)))
        mine = b.at(counts, b.get(queue, i))
        b.store(b.add(b.load(mine), _i(1)), mine)
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


def _walk(b: _Builder, hay, base, n, key, at, right: bool):
    """numpy.searchsorted(hay[base:base + n], key, side) for sorted hay, walking the pointer `at` (an alloca, the
    previous answer) back or forward: a run of sorted keys costs O(n + keys) in all."""
    def before(value):   # value lies before key's position: value < key (left), value <= key (right)
        return b.icmp_signed("<=" if right else "<", value, key)
    for step in (-1, 1):
        test, body, done = (b.append_basic_block(x) for x in ("walk", "step", "walked"))
        b.branch(test)
        b.position_at_end(test)
        p = b.load(at)
        if step < 0:
            go = b.and_(b.icmp_signed(">", p, _i(0)), b.not_(before(b.get(hay, b.add(base, b.sub(p, _i(1)))))))
        else:
            inside = b.icmp_signed("<", p, n)
            go = b.and_(inside, before(b.get(hay, b.add(base, b.select(inside, p, _i(0))))))
        b.cbranch(go, body, done)
        b.position_at_end(body)
        b.store(b.add(p, _i(step)), at)
        b.branch(test)
        b.position_at_end(done)
    return b.load(at)


PAIR_ARGS = ("qstart", "qid", "writes", "instr", "blo", "bhi", "plo", "phi", "write", "clock", "ranked", "qlen",
             "fa_start", "fa", "first_bucket", "last_bucket", "bucket_start", "bucket_member", "lo_at", "hi_at")
SCAN_LIMIT = 128   # a time run of at most this many accesses is scanned; a longer one is searched by byte bucket


def _pairs_ir(module: ir.Module) -> None:
    """pairs(qb_first, qb_last, queues, nq, buckets, scan, out, cap, *PAIR_ARGS) -> pairs found: isa/races.py's race
    candidates of one memory, for the accesses of queues qb_first..qb_last - 1 as the later side b.

    Accesses are grouped by queue (queue g's are [qstart[g], qstart[g + 1]), in queue order). For each access j of
    queue b and each other queue a, one of the two writing, the run of a's accesses that j's clock has not seen and
    that rank before j is [fa(clock), fa(ranked)) of j's instruction's rows: fa[fa_start[a] + k] is where a's
    accesses of its instructions from the k-th on start (k clamped to the qlen[a] instructions of a's queue). A run
    of at most `scan` accesses is scanned. A longer one (queues that rarely synchronize) is searched in the byte
    buckets j covers: the byte space is cut into `buckets` equal buckets, access x covers buckets
    first_bucket[x]..last_bucket[x], and a's accesses covering bucket k are bucket_member[bucket_start[a * buckets +
    k]:...], by access; the run's ends only move forward along b, so each is a pointer walked on per queue a and
    bucket (lo_at, hi_at); a pair is kept there once, in the bucket where its byte ranges' overlap starts. With
    `buckets` 0 (none built yet), a longer run returns -1 at once. A pair is kept when the byte and partition ranges
    meet and one of the two writes. The first `cap` pairs kept go to out as (access of a, access of b)."""
    fn, b = _function(module, "trnc_pairs", 8 + len(PAIR_ARGS))
    qb_first, qb_last, queues, nq, buckets, scan, out_address, cap, *arrays = fn.args
    out = b.inttoptr(out_address, _P)
    (qstart, qid, writes, instr, blo, bhi, plo, phi, write, clock, ranked, qlen, fa_start, fa, first_bucket,
     last_bucket, bucket_start, bucket_member, lo_at, hi_at) = (b.inttoptr(a, _P) for a in arrays)
    found = b.var(0)

    def less(p, q):
        return b.icmp_signed("<", p, q)

    def side(g):   # an access's byte range, partition range and write flag
        return [b.get(column, g) for column in (blo, bhi, plo, phi, write)]

    def run_end(qa, counted):   # fa of queue a at `counted` of its instructions, clamped into its table
        top = b.get(qlen, qa)
        k = b.select(less(counted, _i(0)), _i(0), b.select(less(top, counted), top, counted))
        return b.get(fa, b.add(b.get(fa_start, qa), k))

    def keep(ga, gb, meet):
        with b.if_then(meet):
            n = b.load(found)
            with b.if_then(less(n, cap)):
                b.store(ga, b.at(out, b.mul(n, _i(2))))
                b.store(gb, b.at(out, b.add(b.mul(n, _i(2)), _i(1))))
            b.store(b.add(n, _i(1)), found)

    with b.loop(qb_first, qb_last) as qb:
        sb = b.get(qstart, qb)
        with b.loop(_i(0), b.mul(queues, buckets)) as k:
            b.store(_i(0), b.at(lo_at, k))
            b.store(_i(0), b.at(hi_at, k))
        with b.loop(sb, b.get(qstart, b.add(qb, _i(1)))) as gb:
            row = b.mul(b.get(instr, gb), nq)
            b_lo, b_hi, b_plo, b_phi, b_w = side(gb)

            def meets(ga):
                a_lo, a_hi, a_plo, a_phi, a_w = side(ga)
                ok = b.and_(b.and_(less(a_lo, b_hi), less(b_lo, a_hi)), b.and_(less(a_plo, b_phi), less(b_plo, a_phi)))
                return b.and_(ok, b.icmp_signed("!=", b.or_(a_w, b_w), _i(0)))

            with b.loop(_i(0), queues) as qa:
                writing = b.icmp_signed("!=", b.or_(b.get(writes, qa), b.get(writes, qb)), _i(0))
                with b.if_then(b.and_(b.icmp_signed("!=", qa, qb), writing)):
                    at_queue = b.add(row, b.get(qid, qa))
                    lo, hi = run_end(qa, b.get(clock, at_queue)), run_end(qa, b.get(ranked, at_queue))
                    with b.if_else(b.icmp_signed("<=", b.sub(hi, lo), scan)) as (short, long):
                        with short, b.loop(lo, hi) as ga:
                            keep(ga, gb, meets(ga))
                        with long:
                            with b.if_then(b.icmp_signed("==", buckets, _i(0))):
                                b.ret(_i(-1))
                            sa = b.get(qstart, qa)
                            kb, kb_last = b.get(first_bucket, gb), b.get(last_bucket, gb)
                            with b.loop(kb, b.add(kb_last, _i(1))) as k:
                                at = b.add(b.mul(qa, buckets), k)
                                start = b.get(bucket_start, at)
                                size = b.sub(b.get(bucket_start, b.add(at, _i(1))), start)
                                first = _walk(b, bucket_member, start, size, b.sub(lo, sa), b.at(lo_at, at), False)
                                last = _walk(b, bucket_member, start, size, b.sub(hi, sa), b.at(hi_at, at), False)
                                with b.loop(b.add(start, first), b.add(start, last)) as p:
                                    ga = b.add(sa, b.get(bucket_member, p))
                                    ka = b.get(first_bucket, ga)
                                    once = b.icmp_signed("==", k, b.select(less(kb, ka), ka, kb))
                                    keep(ga, gb, b.and_(meets(ga), once))
    b.ret(b.load(found))


def _row_ids_ir(module: ir.Module) -> None:
    """row_ids(rows, k, key, ids, table, mask) -> distinct rows: ids[r] numbers the distinct rows of key ([rows, k],
    row-major) in order of first appearance. An open-addressing hash table (`mask` + 1 slots, a power of two above
    the row count, filled with -1) holds the first row of each id; a probe compares whole rows, so ids are exact."""
    fn, b = _function(module, "trnc_row_ids", 6)
    rows, k, *arrays, mask = fn.args
    key, ids, table = (b.inttoptr(a, _P) for a in arrays)
    distinct = b.var(0)
    with b.loop(_i(0), rows) as r:
        base = b.mul(r, k)
        h = b.var(-3750763034362895579)   # FNV-1a's offset basis, then its step per word
        with b.loop(_i(0), k) as c:
            b.store(b.mul(b.xor(b.load(h), b.get(key, b.add(base, c))), _i(1099511628211)), h)
        mixed = b.load(h)
        slot = b.var(b.and_(b.xor(mixed, b.lshr(mixed, _i(29))), mask))
        probing = b.var(1)
        with b.loop(_i(0), b.add(mask, _i(1)), go=probing):
            first = b.get(table, b.load(slot))
            with b.if_else(b.icmp_signed("<", first, _i(0))) as (empty, taken):
                with empty:
                    b.store(r, b.at(table, b.load(slot)))
                    b.store(b.load(distinct), b.at(ids, r))
                    b.store(b.add(b.load(distinct), _i(1)), distinct)
                    b.store(_i(0), probing)
                with taken:
                    same = b.var(1)
                    other = b.mul(first, k)
                    with b.loop(_i(0), k, go=same) as c:
                        with b.if_then(b.icmp_signed("!=", b.get(key, b.add(base, c)), b.get(key, b.add(other, c)))):
                            b.store(_i(0), same)
                    with b.if_else(b.icmp_signed("!=", b.load(same), _i(0))) as (equal, differ):
                        with equal:
                            b.store(b.get(ids, first), b.at(ids, r))
                            b.store(_i(0), probing)
                        with differ:
                            b.store(b.and_(b.add(b.load(slot), _i(1)), mask), slot)
    b.ret(b.load(distinct))


def _row_starts_ir(module: ir.Module) -> None:
    """row_starts(n, words, total, at) -> 0, or -1 when the heads do not tile the words: the rows of n instructions
    (isa/rows.py: a head of three part lengths, -1 for an absent part, then the parts) lie one after the other in
    words[0:total]; at[i] is where row i starts."""
    fn, b = _function(module, "trnc_row_starts", 4)
    n, words_address, total, at_address = fn.args
    words, at = b.inttoptr(words_address, _P), b.inttoptr(at_address, _P)
    pos, good = b.var(0), b.var(1)
    with b.loop(_i(0), n, go=good) as i:
        start = b.load(pos)
        b.store(start, b.at(at, i))
        with b.if_else(b.icmp_signed(">", b.add(start, _i(3)), total)) as (short, room):
            with short:
                b.store(_i(0), good)
            with room:
                end = b.var(b.add(start, _i(3)))
                for k in range(3):
                    length = b.get(words, b.add(start, _i(k)))
                    bad = b.or_(b.icmp_signed("<", length, _i(-1)), b.icmp_signed(">", length, total))
                    with b.if_then(bad):
                        b.store(_i(0), good)
                    b.store(b.add(b.load(end), b.select(b.icmp_signed(">", length, _i(0)), length, _i(0))), end)
                with b.if_then(b.icmp_signed(">", b.load(end), total)):
                    b.store(_i(0), good)
                b.store(b.load(end), pos)
    tiled = b.and_(b.icmp_signed("!=", b.load(good), _i(0)), b.icmp_signed("==", b.load(pos), total))
    b.ret(b.select(tiled, _i(0), _i(-1)))


def _gather_columns_ir(module: ir.Module) -> None:
    """gather_columns(rows, width, words, starts, out): out[c * rows + r] = words[starts[r] + c], the row-major
    spans of `words` gathered into column-major [width, rows]."""
    fn, b = _function(module, "trnc_gather_columns", 5)
    rows, width, *arrays = fn.args
    words, starts, out = (b.inttoptr(a, _P) for a in arrays)
    with b.loop(_i(0), rows) as r:
        start = b.get(starts, r)
        with b.loop(_i(0), width) as c:
            b.store(b.get(words, b.add(start, c)), b.at(out, b.add(b.mul(c, rows), r)))
    b.ret(_i(0))


BUILDERS = (_clocks_ir, _order_ir, _pairs_ir, _row_ids_ir, _row_starts_ir, _gather_columns_ir)
