"""isa/native.py's loops against plain Python statements of the same rules, on random inputs."""
import numpy as np
import pytest

from trnc.isa import native


def _random_graph(rng, n: int, queues: int):
    """Queue of each instruction, and per instruction some earlier instructions it waits for."""
    queue = rng.integers(0, queues, n)
    waits = [sorted(set(rng.integers(0, i, rng.integers(0, 3)).tolist())) if i else [] for i in range(n)]
    return queue, waits


def _csr(rows):
    first = np.zeros(len(rows) + 1, dtype=np.int64)
    first[1:] = np.cumsum([len(r) for r in rows])
    return first, np.array([x for r in rows for x in r], dtype=np.int64)


def _clock_oracle(queue, waits):
    """prev, pos, and per instruction the set of instructions that happen before it or are it."""
    n = len(queue)
    prev, pos, last = [-1] * n, [0] * n, {}
    for i, q in enumerate(queue.tolist()):
        prev[i] = last.get(q, -1)
        pos[i] = pos[prev[i]] + 1 if prev[i] >= 0 else 0
        last[q] = i
    reach = []
    for i in range(n):
        reach.append({i}.union(*(reach[p] for p in [prev[i], *waits[i]] if p >= 0)))
    return prev, pos, reach


@pytest.mark.parametrize("seed", range(20))
def test_clocks_count_the_instructions_of_each_queue_that_reach_each_instruction(seed):
    rng = np.random.default_rng(seed)
    n, queues = int(rng.integers(1, 60)), int(rng.integers(1, 6))
    queue, waits = _random_graph(rng, n, queues)
    prev, pos, reach = _clock_oracle(queue, waits)
    want = np.array([[sum(1 for j in reach[i] if queue[j] == q) for q in range(queues)] for i in range(n)])
    first, source = _csr(waits)
    order = _random_topological_order(rng, prev, waits)
    got, ranked = native.clocks(order, np.array(prev), first, source, queue, np.array(pos), queues)
    assert np.array_equal(got, want)
    placed = order.tolist()
    assert np.array_equal(ranked, [[sum(1 for j in placed[:placed.index(i)] if queue[j] == q) for q in range(queues)]
                                   for i in range(n)])


def _random_topological_order(rng, prev, waits) -> np.ndarray:
    """A topological order of the queue and wait edges, each step taking a random instruction whose sources are
    placed."""
    placed: list[int] = []
    ready = [i for i in range(len(prev)) if prev[i] < 0 and not waits[i]]
    while ready:
        i = ready.pop(int(rng.integers(0, len(ready))))
        placed.append(i)
        ready += [j for j in range(len(prev)) if j not in placed and j not in ready
                  and all(p in placed for p in [prev[j], *waits[j]] if p >= 0)]
    return np.array(placed)


def _oracle_order(members, waits, signals, semaphores):
    """The rule as stated: each step, the head of the first queue whose waits are met; its signals count."""
    heads, counts, order = [0] * len(members), [0] * semaphores, []
    while True:
        for q, queue in enumerate(members):
            if heads[q] < len(queue) and all(counts[s] >= v for s, v in waits[queue[heads[q]]]):
                i = queue[heads[q]]
                heads[q] += 1
                order.append(i)
                for s in signals[i]:
                    counts[s] += 1
                break
        else:
            return order


@pytest.mark.parametrize("seed", range(30))
def test_execution_order_follows_the_first_ready_queue_rule(seed):
    rng = np.random.default_rng(seed)
    n, queues, semaphores = int(rng.integers(1, 50)), int(rng.integers(1, 5)), int(rng.integers(1, 5))
    queue = rng.integers(0, queues, n)
    signals = [rng.integers(0, semaphores, rng.integers(0, 3)).tolist() for _ in range(n)]
    waits = [[(int(s), int(rng.integers(1, 4))) for s in rng.integers(0, semaphores, rng.integers(0, 3))]
             for _ in range(n)]   # some never met: then the order ends early (a deadlock)
    members = [np.flatnonzero(queue == q) for q in range(queues)]
    want = _oracle_order([m.tolist() for m in members], waits, signals, semaphores)
    wait_first, wait_pairs = _csr(waits)
    signal_first, signal_semaphore = _csr(signals)
    got = native.execution_order(members, wait_first, wait_pairs.reshape(-1, 2)[:, 0] if len(wait_pairs) else
                                 wait_pairs, wait_pairs.reshape(-1, 2)[:, 1] if len(wait_pairs) else wait_pairs,
                                 signal_first, signal_semaphore, semaphores)
    assert got.tolist() == want


@pytest.mark.parametrize("seed", range(24))
def test_race_pairs_are_the_unordered_overlapping_pairs_with_a_write(seed):
    """Every pair of accesses on two queues, a ranked before b (in a random topological order) and not happening
    before it, whose byte and partition ranges meet, one writing: each once, by time runs scanned, searched by byte
    bucket or both, on 1 to 3 threads. Few waits make long runs in time; ranges of many lengths, the pairs meeting
    in several byte buckets."""
    rng = np.random.default_rng(seed)
    n, queues = int(rng.integers(2, 50)), int(rng.integers(2, 5))
    queue = rng.integers(0, queues, n)
    waits = [sorted(set(rng.integers(0, i, rng.integers(0, 2) * (seed % 3)).tolist())) if i else []
             for i in range(n)]
    prev, pos, reach = _clock_oracle(queue, waits)
    first, source = _csr(waits)
    order = _random_topological_order(rng, prev, waits)
    rank = np.argsort(order)
    clock, ranked = native.clocks(order, np.array(prev), first, source, queue, np.array(pos), queues)
    instr = np.sort(rng.integers(0, n, int(rng.integers(1, 2 * n))))   # accesses, in program order
    # byte ranges mostly short, some long (over many byte buckets), from an offset base
    lo, plo = 1000 * seed + rng.integers(0, 30, len(instr)), rng.integers(0, 3, len(instr))
    length = np.where(rng.random(len(instr)) < 0.2, rng.integers(1, 40, len(instr)), rng.integers(1, 6, len(instr)))
    acc = {"instr": instr, "blo": lo, "bhi": lo + length, "plo": plo,
           "phi": plo + rng.integers(1, 3, len(instr)), "write": rng.integers(0, 2, len(instr))}
    by = np.lexsort((instr, queue[instr]))
    acc = {k: v[by] for k, v in acc.items()}
    group = queue[acc["instr"]]
    cuts = np.flatnonzero(np.r_[True, group[1:] != group[:-1], True])
    columns = {**acc, "writes": np.logical_or.reduceat(acc["write"], cuts[:-1]), "pos": np.array(pos)[acc["instr"]]}
    ia, ib = native.race_pairs(cuts, group[cuts[:-1]], columns, clock, ranked, np.bincount(queue, minlength=queues),
                               threads=1 + seed % 3, scan_limit=[0, 3, native.SCAN_LIMIT][seed % 3])
    got = list(zip(ia.tolist(), ib.tolist()))

    def racy(i, j):
        a, b = int(acc["instr"][i]), int(acc["instr"][j])
        return (group[i] != group[j] and rank[a] < rank[b] and a not in reach[b] and acc["blo"][i] < acc["bhi"][j]
                and acc["blo"][j] < acc["bhi"][i] and acc["plo"][i] < acc["phi"][j] and acc["plo"][j] < acc["phi"][i]
                and bool(acc["write"][i] or acc["write"][j]))
    want = {(i, j) for i in range(len(group)) for j in range(len(group)) if racy(i, j)}
    assert len(got) == len(set(got)) and set(got) == want


def test_indices_out_of_bounds_are_refused_before_any_native_access():
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError, match="wait source"):
        native.clocks(one, np.array([-1]), np.array([0, 1]), np.array([5]), one, one, 1)
    with pytest.raises(ValueError, match="queue"):
        native.clocks(one, np.array([-1]), np.array([0, 0]), np.zeros(0), np.array([3]), one, 1)
    with pytest.raises(ValueError, match="semaphore"):
        native.execution_order([one], np.array([0, 1]), np.array([7]), np.array([1]), np.array([0, 0]),
                               np.zeros(0), 2)
    with pytest.raises(ValueError, match="a queue, a position and a place in the order"):
        native.clocks(one, np.array([-1]), np.array([0, 0]), np.zeros(0), np.zeros(0), one, 1)
    with pytest.raises(ValueError, match="a value per wait"):
        native.execution_order([one], np.array([0, 1]), np.array([0]), np.zeros(0), np.array([0, 0]),
                               np.zeros(0), 2)
    with pytest.raises(ValueError, match="row starts"):
        native.execution_order([one], np.array([0, 2]), np.array([0]), np.array([1]), np.array([0, 0]),
                               np.zeros(0), 2)
    no_syncs = np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="in two queues"):
        native.execution_order([np.array([0, 1]), np.array([1])], no_syncs, np.zeros(0), np.zeros(0), no_syncs,
                               np.zeros(0), 0)
    columns = {name: np.zeros(2, dtype=np.int64) for name in ("pos", *native.PAIR_ARGS[3:9])}
    columns["writes"] = np.ones(1, dtype=np.int64)
    clock, length = np.zeros((1, 1)), np.array([2])
    with pytest.raises(ValueError, match="instruction"):
        native.race_pairs(np.array([0, 2]), np.zeros(1), {**columns, "instr": np.array([0, 1])}, clock, clock, length)
    with pytest.raises(ValueError, match="a start per queue group"):
        native.race_pairs(np.array([0]), np.zeros(1), columns, clock, clock, length)
    with pytest.raises(ValueError, match="accesses"):
        native.race_pairs(np.array([0, 3]), np.zeros(1), columns, clock, clock, length)
    with pytest.raises(ValueError, match="a row of ranked"):
        native.race_pairs(np.array([0, 2]), np.zeros(1), columns, clock, np.zeros((2, 1)), length)
    with pytest.raises(ValueError, match="positions outside"):
        native.race_pairs(np.array([0, 2]), np.zeros(1), {**columns, "pos": np.array([0, 2])}, clock, clock, length)
    with pytest.raises(ValueError, match="out of queue order"):
        native.race_pairs(np.array([0, 2]), np.zeros(1), {**columns, "pos": np.array([1, 0])}, clock, clock, length)


def test_race_pairs_over_far_apart_and_huge_byte_ranges():
    """Byte ranges 2^40 apart and one spanning them all: the buckets widen until few, and every pair is found."""
    n = 4   # instructions 0, 1 on queue 0 and 2, 3 on queue 1, none waiting: every cross pair is unordered
    queue = np.array([0, 0, 1, 1])
    clock, ranked = native.clocks(np.arange(n), np.array([-1, 0, -1, 2]), np.zeros(n + 1, dtype=np.int64),
                                  np.zeros(0, dtype=np.int64), queue, np.array([0, 1, 0, 1]), 2)
    far = 2 ** 40
    columns = {"instr": np.arange(n), "blo": np.array([0, far, 8, 0]), "bhi": np.array([4, far + 4, 12, 2 * far]),
               "plo": np.zeros(n, dtype=np.int64), "phi": np.ones(n, dtype=np.int64), "write": np.array([0, 0, 0, 1]),
               "writes": np.array([0, 1]), "pos": np.array([0, 1, 0, 1])}
    ia, ib = native.race_pairs(np.array([0, 2, 4]), np.array([0, 1]), columns, clock, ranked, np.array([2, 2]))
    assert sorted(zip(ia.tolist(), ib.tolist())) == [(0, 3), (1, 3)]


@pytest.mark.parametrize("shape", [(0, 3), (7, 0), (1, 1), (3000, 2), (5000, 13)])
def test_row_ids_number_the_distinct_rows_in_order_of_first_appearance(shape):
    """Few values per column make many equal rows and, at the table's load, many rows that probe past others."""
    rng = np.random.default_rng(shape[0])
    key = rng.integers(-2, 3, shape) * (1 << 40)
    got = native.row_ids(key)
    firsts: dict[tuple, int] = {}
    want = [firsts.setdefault(tuple(row), len(firsts)) for row in key.tolist()]
    assert got.tolist() == want
    assert native.first_appearances(got).tolist() == np.unique(got, return_index=True)[1].tolist()


def test_first_appearances_of_no_ids_and_of_one():
    assert native.first_appearances(np.zeros(0, dtype=np.int64)).tolist() == []
    assert native.first_appearances(np.array([0, 0, 1, 0, 2, 1])).tolist() == [0, 2, 4]


def test_gather_columns_is_numpys_gather_and_refuses_spans_past_the_words():
    rng = np.random.default_rng(5)
    words = rng.integers(-2**62, 2**62, 100)
    starts = rng.integers(0, 100 - 7, 40)
    assert np.array_equal(native.gather_columns(words, starts, 7), words[starts + np.arange(7)[:, None]])
    assert native.gather_columns(words, np.zeros(0, dtype=np.int64), 7).shape == (7, 0)
    with pytest.raises(ValueError, match="row start"):
        native.gather_columns(words, np.array([94]), 7)
    with pytest.raises(ValueError, match="row start"):
        native.gather_columns(words, np.array([-1]), 7)
