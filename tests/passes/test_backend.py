"""allocate, schedule and emit on hand-built tile programs: addresses, engines, semaphores, results."""
import numpy as np
import pytest

from trnc.errors import TrncError
from trnc.isa.ap import Engine
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.isa.enums import ActFunc
from trnc.isa.program import Program, TensorKind
from trnc.isa.verify import verify
from trnc.isa import races
from trnc.passes.tile import allocate, schedule
from trnc.passes.tile.tiles import TileBuilder, TileProgram
from trnc.runtime import reference

HW = get_target("trn2")


def _exp_program(tiles: int, cols: int = 256):
    """out = exp(x) over `tiles` row tiles of 128 x cols: load, activation, store per tile."""
    tp = TileProgram(HW)
    kb = TileBuilder(tp, "k0")
    x = kb.tensor("x", TensorKind.INPUT, DType.FP32, (tiles * 128, cols))
    out = kb.tensor("out", TensorKind.OUTPUT, DType.FP32, (tiles * 128, cols))
    tp.inputs, tp.outputs = ["x"], ["out"]
    for t in range(tiles):
        box = ((t * 128, 128), (0, cols))
        a = kb.sbuf(f"a{t}", DType.FP32, 128, (cols,))
        b = kb.sbuf(f"b{t}", DType.FP32, 128, (cols,))
        kb.dma(a, x.box_ap(0, box))
        kb.emit("activation", (Engine.ACT,), dst=b, src=a, func=ActFunc.EXP)
        kb.dma(out.box_ap(0, box), b)
    return tp


def _build(tp):
    stats = allocate.place(tp)
    instrs, sync = schedule.schedule(tp)
    program = Program(tuple(tp.tensors), tuple(instrs), HW.name)
    verify(program, HW)
    return program, stats, sync


def test_pipeline_of_tiles_is_race_free_and_correct():
    tp = _exp_program(6)
    program, stats, sync = _build(tp)
    x = np.random.default_rng(0).standard_normal((6 * 128, 256)).astype(np.float32)
    got = reference.run(program, {"x": x}, verified=True)["out"]
    np.testing.assert_allclose(got, np.exp(x), rtol=4e-7)
    # each activation waits for its load and each store for its activation: at least 2 waits per tile
    assert sync["waits"] >= 12
    # loads and stores spread over several DMA queues
    assert len({i.queue for i in program.instructions if i.engine is Engine.DMA}) >= 4


def test_no_wait_is_implied_by_another():
    program, _, _ = _build(_exp_program(4))
    for ins in program.instructions:
        assert len({s for s, _ in ins.waits}) == len(ins.waits)   # at most one wait per semaphore


def test_freed_space_is_reused_late_within_a_ring():
    tp = _exp_program(8)
    allocate.place(tp)
    offsets = [b.offset for b in tp.buffers]   # a0, b0, a1, b1, ...: 1 KiB each, at most two live at once
    ring = allocate.RING_SLACK * 2 * 1024
    assert len(set(offsets)) < len(offsets)                   # space is reused ...
    assert all(offset + 1024 <= ring for offset in offsets)   # ... within the ring, not round all of SBUF
    for t in range(1, 8):   # ... and not the space the previous tile has just freed
        assert not {offsets[2 * t], offsets[2 * t + 1]} & {offsets[2 * t - 2], offsets[2 * t - 1]}


def test_a_buffer_that_fits_nowhere_in_the_ring_goes_past_it():
    arena = allocate._NextFit(10, 4)
    assert arena.place(3) == 0
    assert arena.place(3) == 3      # [3, 6) is past the ring, the only place it fits
    arena.release(0, 3)
    assert arena.place(2) == 0      # the cursor (6) is past the ring: back to its start
    assert arena.place(5) is None   # 1 + 4 free bytes, none contiguous enough


def test_sbuf_overflow_names_the_buffer():
    tp = TileProgram(HW)
    kb = TileBuilder(tp, "k3")
    x = kb.tensor("x", TensorKind.INPUT, DType.FP32, (128, 8))
    big = [kb.sbuf(f"big{i}", DType.FP32, 128, (HW.sbuf_bytes_per_partition // 8,)) for i in range(3)]
    for t in big:   # all three live at once
        kb.dma(t.narrow(1, 0, 8), x.box_ap(0, ((0, 128), (0, 8))))
    for t in big:
        kb.dma(t.narrow(1, 8, 8), x.box_ap(0, ((0, 128), (0, 8))))
    with pytest.raises(TrncError, match=r"SBUF is full: buffer k3\.big\d"):
        allocate.place(tp)


def _bytes_of(ap):
    """Exact set of (partition, byte) an AP touches (HBM: partition 0), for checking footprints."""
    from trnc.isa.ap import Mem
    isz = ap.dtype.itemsize
    free = ap.free_offsets()
    out = set()
    for p in range(ap.partitions):
        base = ap.offset + (p * ap.partition_stride * isz if ap.mem is Mem.HBM else 0)
        part = 0 if ap.mem is Mem.HBM else ap.start_partition + p
        for e in free:
            for b in range(isz):
                out.add((part, base + int(e) * isz + b))
    return out


def test_footprints_never_miss_a_shared_byte():
    """schedule's row footprints may over-approximate, never under-approximate (sound ordering)."""
    from trnc.isa.ap import AP, Mem
    rng = np.random.default_rng(5)
    missed_apart = 0
    for _ in range(1500):
        aps = []
        for _ in range(2):
            if rng.random() < 0.5:   # rows on the partitions, or transposed: an outer free dim of larger stride
                rows, cols = int(rng.integers(1, 6)), int(rng.integers(1, 6))
                pstride = int(rng.integers(1, 12))
                free = ((1, cols),) if rng.random() < 0.5 else \
                    ((int(rng.integers(1, 40)), int(rng.integers(1, 5))), (int(rng.integers(1, 4)), cols))
                aps.append(AP(Mem.HBM, DType.FP32, rows, free, int(rng.integers(0, 40)) * 4, tensor=0,
                              partition_stride=pstride))
            else:
                c0, c1, s0 = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 10))
                aps.append(AP(Mem.SBUF, DType.BF16, int(rng.integers(1, 3)), ((s0, c0), (1, c1)),
                              int(rng.integers(0, 30)) * 2, start_partition=int(rng.integers(0, 2))))
        a, b = aps
        if a.mem is not b.mem:
            continue
        fa, fb = races.footprint(a), races.footprint(b)
        boxes_meet = fa[1] < fb[2] and fb[1] < fa[2] and fa[3] < fb[4] and fb[3] < fa[4]
        exact = bool(_bytes_of(a) & _bytes_of(b))
        claimed = boxes_meet and races.footprints_overlap(fa, fb)
        assert claimed or not exact, (a, b)
        missed_apart += boxes_meet and not exact and not claimed
    assert missed_apart > 10   # and the rows do tell apart accesses whose bounding boxes meet


def test_transposed_stores_of_other_columns_are_apart():
    """Stores of a token-major [512, 768] fp32 matrix with features on the partitions (a matmul's N on the
    partitions): rows of tokens, each as wide as its feature block, so two feature blocks do not meet,
    while a load of whole token rows meets both."""
    from trnc.isa.ap import AP, Mem

    def block(f0, features, t0, tokens):
        return AP(Mem.HBM, DType.FP32, 128, ((128, features // 128), (768, tokens)), (t0 * 768 + f0) * 4,
                  tensor=0, partition_stride=1)
    first, second = races.footprint(block(0, 512, 0, 57)), races.footprint(block(512, 256, 0, 128))
    assert not races.footprints_overlap(first, second)
    rows = races.footprint(AP(Mem.HBM, DType.FP32, 21, ((1, 768),), 0, tensor=0, partition_stride=768))
    assert races.footprints_overlap(rows, first) and races.footprints_overlap(rows, second)


def test_the_verifiers_column_form_of_footprints_overlap_agrees_with_the_schedulers():
    """isa/races.py states the rows test twice: scalar for the scheduler, over columns for the race check."""
    from trnc.isa.ap import AP, Mem
    rng = np.random.default_rng(8)
    pairs = []
    for _ in range(3000):
        fp = []
        for _ in range(2):
            dims = tuple((int(rng.integers(-3, 40)), int(rng.integers(1, 6))) for _ in range(int(rng.integers(0, 3))))
            if rng.random() < 0.5:
                ap = AP(Mem.HBM, DType.FP32, int(rng.integers(1, 6)), dims, int(rng.integers(40, 80)) * 4, tensor=0,
                        partition_stride=int(rng.integers(0, 50)))
            else:
                ap = AP(Mem.SBUF, DType.BF16, 2, dims, int(rng.integers(100, 200)) * 2)
            fp.append(races.footprint(ap)[3:])
        pairs.append(fp)
    scalar = [races.footprints_overlap((None, 0, 1, *a), (None, 0, 1, *b)) for a, b in pairs]
    columns = races.footprint_columns(np.array([a for a, _ in pairs]).T, np.array([b for _, b in pairs]).T)
    assert columns.tolist() == scalar
    assert 100 < sum(scalar) < len(scalar) - 100   # both answers occur
