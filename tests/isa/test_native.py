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


@pytest.mark.parametrize("seed", range(20))
def test_clocks_count_the_instructions_of_each_queue_that_reach_each_instruction(seed):
    rng = np.random.default_rng(seed)
    n, queues = int(rng.integers(1, 60)), int(rng.integers(1, 6))
    queue, waits = _random_graph(rng, n, queues)
    prev, pos, last = [-1] * n, [0] * n, {}
    for i, q in enumerate(queue.tolist()):
        prev[i] = last.get(q, -1)
        pos[i] = pos[prev[i]] + 1 if prev[i] >= 0 else 0
        last[q] = i
    reach = [set() for _ in range(n)]   # the instructions that happen before i, or are i
    for i in range(n):
        reach[i] = {i}.union(*(reach[p] for p in [prev[i], *waits[i]] if p >= 0))
    want = np.array([[sum(1 for j in reach[i] if queue[j] == q) for q in range(queues)] for i in range(n)])
    first, source = _csr(waits)
    got = native.clocks(np.arange(n), np.array(prev), first, source, queue, np.array(pos), queues)
    assert np.array_equal(got, want)


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


@pytest.mark.parametrize("seed", range(10))
def test_search_is_searchsorted_for_keys_in_any_order(seed):
    rng = np.random.default_rng(seed)
    hay = np.sort(rng.integers(-5, 20, rng.integers(0, 40)))
    for keys in (rng.integers(-8, 25, 30), np.sort(rng.integers(-8, 25, 30))):
        for side in ("left", "right"):
            assert np.array_equal(native.search(hay, keys, side), np.searchsorted(hay, keys, side))


@pytest.mark.parametrize("seed", range(20))
def test_scan_keeps_exactly_the_unordered_overlapping_pairs_with_a_write(seed):
    rng = np.random.default_rng(seed)
    na, nb = int(rng.integers(1, 30)), int(rng.integers(1, 30))

    def side(count):
        lo, plo = rng.integers(0, 40, count), rng.integers(0, 4, count)
        return {"blo": lo, "bhi": lo + rng.integers(1, 10, count), "plo": plo, "phi": plo + rng.integers(1, 3, count),
                "write": rng.integers(0, 2, count)}
    a, b = side(na), side(nb)
    t_lo = rng.integers(0, na + 1, nb)
    columns = {"t_lo": t_lo, "t_hi": t_lo + rng.integers(0, 6, nb),
               **{f"a_{k}": v for k, v in a.items()}, **{f"b_{k}": v for k, v in b.items()}}

    def kept(i, j):
        return (columns["t_lo"][j] <= i < columns["t_hi"][j] and a["blo"][i] < b["bhi"][j] and b["blo"][j] < a["bhi"][i]
                and a["plo"][i] < b["phi"][j] and b["plo"][j] < a["phi"][i] and (a["write"][i] or b["write"][j]))
    for flip in (False, True):
        owners, others = (na, nb) if flip else (nb, na)
        perm = rng.permutation(others)
        lo = rng.integers(0, others + 1, owners)
        hi = np.minimum(lo + rng.integers(0, others + 1, owners), others)
        want = [((j, perm[k]) if flip else (perm[k], j)) for j in range(owners) for k in range(lo[j], hi[j])]
        want = [(int(i), int(j)) for i, j in want if kept(i, j)]
        ia, ib = native.scan(lo, hi, perm, flip, columns, (na, nb))
        assert list(zip(ia.tolist(), ib.tolist())) == want
    ia, ib = native.scan(t_lo * 0, np.full(nb, na), None, False, columns, (na, nb))   # identity: every a per b
    assert list(zip(ia.tolist(), ib.tolist())) == [(i, j) for j in range(nb) for i in range(na) if kept(i, j)]


def test_indices_out_of_bounds_are_refused_before_any_native_access():
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError, match="wait source"):
        native.clocks(one, np.array([-1]), np.array([0, 1]), np.array([5]), one, one, 1)
    with pytest.raises(ValueError, match="queue"):
        native.clocks(one, np.array([-1]), np.array([0, 0]), np.zeros(0), np.array([3]), one, 1)
    with pytest.raises(ValueError, match="semaphore"):
        native.execution_order([one], np.array([0, 1]), np.array([7]), np.array([1]), np.array([0, 0]),
                               np.zeros(0), 2)
    with pytest.raises(ValueError, match="row starts"):
        native.execution_order([one], np.array([0, 2]), np.array([0]), np.array([1]), np.array([0, 0]),
                               np.zeros(0), 2)
    columns = {name: np.zeros(2 if name.startswith(("t_", "b_")) else 1, dtype=np.int64)
               for name in native._SCAN_ARGS[3:]}
    with pytest.raises(ValueError, match="run outside"):
        native.scan(np.zeros(2), np.array([0, 2]), None, False, columns, (1, 2))
    with pytest.raises(ValueError, match="position"):
        native.scan(np.zeros(2), np.ones(2), np.array([4]), False, columns, (1, 2))
