"""The performance model and its trace: timelines and counters of small programs against numbers worked out by hand.

Time unit: on trn2 the clocks are pe 2.4, act 1.2, dve 0.96, pool 1.2 GHz and DMA counts ns (1 GHz); their
least common multiple is 24 GHz, so one tick is 1/24 ns and one cycle is PE = 10, ACT = 20, DVE = 25 ticks,
one ns NS = 24 ticks. DMA durations are ceil(600 ns + bytes / 23 B/ns) (isa/cost.py, trn2 preset).
"""
import json
from pathlib import Path

import pytest

from trnc.errors import VerifyError
from trnc.isa import AP, DType, Engine, Instruction, Mem, Program, TensorDecl, TensorKind
from trnc.isa.asm import format_instruction, parse_program
from trnc.isa.config import DMA_QUEUES, TARGETS, get_target
from trnc.runtime.perf import simulate, time_base
from trnc.runtime.trace import chrome_trace, write_chrome_trace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PE, ACT, DVE, NS = 10, 20, 25, 24
TPS = 24_000_000_000


def program(text: str) -> Program:
    return parse_program(".target trn2\n" + text)


def example(name: str) -> Program:
    return parse_program((EXAMPLES / name).read_text())


def test_time_base_is_the_lcm_of_the_trn2_clocks():
    assert time_base(get_target("trn2")) == (TPS, {"pe": PE, "act": ACT, "dve": DVE, "pool": 20, "dma": NS})


def test_the_dma_queues_together_never_exceed_hbm_bandwidth():
    # Why the model needs no shared HBM cap: 16 queues at full speed stay below the core's HBM bandwidth.
    for hw in TARGETS.values():
        assert DMA_QUEUES * hw.dma_queue_bytes_per_ns * 1e9 <= hw.hbm_bytes_per_s, hw.name


def test_single_queue_runs_back_to_back():
    p = program("""
dve   memset dst=sbuf[0:128]+0:fp32[1,100] value=1
dve   tensor_tensor dst=sbuf[0:128]+400:fp32[1,100] in0=sbuf[0:128]+0:fp32[1,100] in1=sbuf[0:128]+0:fp32[1,100] op=add
dve   tensor_copy dst=sbuf[0:128]+800:fp32[1,32] src=sbuf[0:128]+0:fp32[1,32]
""")
    r = simulate(p)
    # memset max(64, 100) = 100 cycles, tensor_tensor max(64, 2 * 100) = 200, tensor_copy max(64, 32) = 64.
    assert r.timeline.start.tolist() == [0, 100 * DVE, 300 * DVE]
    assert r.timeline.end.tolist() == [100 * DVE, 300 * DVE, 364 * DVE]
    assert r.total_ticks == 364 * DVE                                  # 9100 ticks = 379.17 ns
    assert r.total_seconds == pytest.approx(364 / 0.96e9, rel=1e-12)
    assert r.total_cycles("pe") == 910                                  # 9100 / 10
    dve = r.queues["dve"]
    assert (dve.instructions, dve.busy_cycles, dve.utilization) == (3, 364, 1.0)
    assert (dve.stall_dma_ticks, dve.stall_semaphore_ticks, dve.idle_ticks) == (0, 0, 0)
    for name, per_cycle in (("pe", PE), ("act", ACT), ("pool", 20)):
        q = r.queues[name]
        assert (q.instructions, q.busy_ticks, q.idle_ticks, q.idle_cycles) == (0, 0, 9100, 9100 / per_cycle)
    assert list(r.queues) == ["pe", "act", "dve", "pool"]               # no DMA queue in use


TWO_QUEUES = """
.tensor a input bf16 [128, 64]
dma0  dma_copy dst=sbuf[0:128]+0:bf16[1,64] src=a[64;128]+0:bf16[1,64] signal=s0
act   activation dst=sbuf[0:128]+128:bf16[1,64] src=sbuf[0:128]+0:bf16[1,64] func=copy wait=s0>=1 signal=s1
dve   tensor_copy dst=sbuf[0:128]+256:bf16[1,64] src=sbuf[0:128]+128:bf16[1,64] wait=s1>=1
dve   memset dst=sbuf[0:128]+512:fp32[1,64] value=0 wait=s0>=1
"""


def test_a_waiter_starts_at_its_signallers_completion_and_the_stall_names_the_signaller():
    r = simulate(program(TWO_QUEUES))
    load = 1313 * NS            # 128 * 64 * 2 = 16384 B: ceil(600 + 16384 / 23) = ceil(1312.35) ns
    act_end = load + 64 * ACT   # activation: max(64, 64) cycles, starts exactly when the load completes
    copy_end = act_end + 64 * DVE
    memset_end = copy_end + 64 * DVE  # its wait (the load) was satisfied long before: no stall
    assert r.timeline.start.tolist() == [0, load, act_end, copy_end]
    assert r.total_ticks == memset_end == 35992
    act, dve, dma0 = r.queues["act"], r.queues["dve"], r.queues["dma0"]
    assert (act.stall_dma_ticks, act.stall_semaphore_ticks, act.busy_ticks) == (load, 0, 64 * ACT)
    assert act.idle_ticks == memset_end - act_end
    assert act.stall_dma_cycles == pytest.approx(1313 * 1.2)             # ns at 1.2 GHz
    assert (dve.stall_dma_ticks, dve.stall_semaphore_ticks, dve.busy_ticks, dve.idle_ticks) == \
        (0, act_end, 128 * DVE, 0)
    assert (dma0.busy_cycles, dma0.idle_ticks, dma0.dma_bytes) == (1313, memset_end - load, 16384)


# examples/overlap.s and examples/serial.s: y = relu(w.T @ x) over 4 tiles of [128, 512] bf16.
W = 2025 * NS     # w [128, 128] bf16 = 32768 B: ceil(600 + 1424.70) ns
X = 6299 * NS     # an x or y tile [128, 512] bf16 = 131072 B: ceil(600 + 5698.78) ns
MM = 512 * PE     # matmul max(min(64, 128), 512) = 512 cycles
AC = 512 * ACT    # activation max(64, 512) = 512 cycles


def test_overlap_example_by_hand():
    r = simulate(example("overlap.s"))
    # Instruction (queue): start = the max of its queue's free time and its waits' completions; end = start + d.
    w = (0, W)                                          # 0 dma0 load w
    x0 = (W, W + X)                                     # 1 dma0 load x0
    x1 = (0, X)                                         # 2 dma1 load x1
    mm0 = (x0[1], x0[1] + MM)                           # 3 pe: waits w, x0
    act0 = (mm0[1], mm0[1] + AC)                        # 4 act: waits mm0
    st0 = (act0[1], act0[1] + X)                        # 5 dma2: waits act0
    x2 = (mm0[1], mm0[1] + X)                           # 6 dma0: free at x0's end < mm0's end (slot 0 read)
    mm1 = (mm0[1], mm0[1] + MM)                         # 7 pe: x1 long done, pe free at mm0's end
    act1 = (act0[1], act0[1] + AC)                      # 8 act: mm1 ends before act0 does
    st1 = (act1[1], act1[1] + X)                        # 9 dma3
    x3 = (mm1[1], mm1[1] + X)                           # 10 dma1: waits mm1 (slot 1 read)
    mm2 = (x2[1], x2[1] + MM)                           # 11 pe: x2 is the latest of x2, act0
    act2 = (st0[1], st0[1] + AC)                        # 12 act: st0 (slot 0 of y read) is the latest
    st2 = (act2[1], act2[1] + X)                        # 13 dma2
    mm3 = (x3[1], x3[1] + MM)                           # 14 pe: x3 ends exactly when mm2 does
    act3 = (st1[1], st1[1] + AC)                        # 15 act: st1 ends exactly when act2 does
    st3 = (act3[1], act3[1] + X)                        # 16 dma3
    expected = [w, x0, x1, mm0, act0, st0, x2, mm1, act1, st1, x3, mm2, act2, st2, mm3, act3, st3]
    assert list(zip(r.timeline.start.tolist(), r.timeline.end.tolist())) == expected
    assert r.total_ticks == st3[1] == 537968                            # 22415.33 ns
    # pe: stalled on DMA until x0 arrives and again from mm1's end to x2's end; idle after mm3.
    pe = r.queues["pe"]
    assert (pe.stall_dma_ticks, pe.stall_semaphore_ticks) == (x0[1] + x2[1] - mm1[1], 0)
    assert (pe.busy_ticks, pe.idle_ticks) == (4 * MM, r.total_ticks - mm3[1])
    # act: waits on pe (semaphore) for mm0, then on the store st0 (dma) before act2.
    act = r.queues["act"]
    assert (act.stall_semaphore_ticks, act.stall_dma_ticks) == (mm0[1], st0[1] - act1[1])
    for q in r.queues.values():
        assert q.busy_ticks + q.stall_dma_ticks + q.stall_semaphore_ticks + q.idle_ticks == r.total_ticks


def test_serial_example_is_the_sum_of_durations_and_slower_than_the_overlap():
    serial, overlap = simulate(example("serial.s")), simulate(example("overlap.s"))
    assert serial.total_ticks == W + 4 * (X + MM + AC + X) == 1319448   # 54977 ns
    starts, ends = serial.timeline.start.tolist(), serial.timeline.end.tolist()
    assert starts[1:] == ends[:-1]                                      # each starts when the previous ends
    assert overlap.total_ticks < serial.total_ticks
    assert (serial.macs, serial.dma_bytes, serial.opcode_counts) == (overlap.macs, overlap.dma_bytes,
                                                                      overlap.opcode_counts)


def test_program_order_need_not_be_a_schedule():
    # The same program listed queue by queue: matmuls come before the loads they wait for.
    p = example("overlap.s")
    order = sorted(range(len(p.instructions)), key=lambda i: (p.instructions[i].queue_name != "pe", i))
    shuffled = Program(p.tensors, tuple(p.instructions[i] for i in order), p.target)
    base, r = simulate(p), simulate(shuffled)
    assert r.total_ticks == base.total_ticks
    assert r.timeline.start.tolist() == [base.timeline.start[i] for i in order]
    assert r.queues == base.queues


def test_gemm_counters_and_roofline():
    r = simulate(example("gemm.s"))     # c[128, 512] = a[256, 128].T @ b[256, 512], bf16, two K tiles
    assert r.macs == 2 * 128 * 128 * 512 == 16777216
    assert r.transpose_macs == 0
    assert r.opcode_counts == {"dma_copy": 5, "matmul": 2, "activation": 1}
    # loads: a tiles 128 x 128 x 2 B, b tiles 128 x 512 x 2 B; store: c 128 x 512 x 4 B.
    assert r.dma_bytes == {"hbm->sbuf": 2 * 32768 + 2 * 131072, "sbuf->hbm": 262144, "sbuf->sbuf": 0, "hbm->hbm": 0}
    assert (r.sbuf_high_water, r.psum_high_water) == (2560 + 512 * 4, 512 * 4)   # c staged at 2560; one bank
    # Timeline: mm0 after b0 (6299 ns), mm1 right after, the activation, then the store:
    # ceil(600 + 262144 / 23) = 11998 ns.
    assert r.total_ticks == 6299 * NS + 2 * MM + AC + 11998 * NS == 459608
    assert r.compulsory_bytes == 256 * 128 * 2 + 256 * 512 * 2 + 128 * 512 * 4 == 589824
    assert r.roofline.pe_seconds == pytest.approx(16777216 / 16384 / 2.4e9, rel=1e-12)   # 1024 cycles
    assert r.roofline.hbm_seconds == pytest.approx(589824 / 375e9, rel=1e-12)           # 3 TB/s / 8 cores
    assert r.roofline.seconds == r.roofline.hbm_seconds
    assert r.efficiency == pytest.approx((589824 / 375e9) / (459608 / 24e9), rel=1e-12)  # 8.2 %


def test_dma_directions_transposes_and_gathers():
    r = simulate(program("""
.tensor t input fp32 [128, 64]
.tensor s scratch fp32 [128, 16]
.tensor o output fp32 [128, 8]
dma0  dma_copy dst=s[16;128]+0:fp32[1,16] src=t[64;128]+0:fp32[1,16]
dma1  dma_copy dst=sbuf[0:128]+0:fp32[1,64] src=t[64;128]+0:fp32[1,64]
dma1  dma_copy dst=sbuf[0:128]+256:bf16[1,32] src=sbuf[0:128]+0:fp32[1,32]
dma1  dma_copy dst=o[8;128]+0:fp32[1,8] src=sbuf[0:128]+0:fp32[1,8]
dma1  dma_gather dst=sbuf[0:16]+512:fp32[1,64] table=t[64;128]+0:fp32[1,64] index=sbuf[0:16]+768:int32[1,1] signal=s0
pe    transpose dst=psum[0:32]+0:bf16[1,128] src=sbuf[0:128]+256:bf16[1,32] wait=s0>=1
"""))
    # hbm->hbm 128 x 16 x 4; hbm->sbuf 128 x 64 x 4 plus the gathered 16 rows x 64 x 4; sbuf->sbuf a cast
    # fp32 -> bf16 counts the larger side, 128 x 32 x 4; sbuf->hbm 128 x 8 x 4.
    assert r.dma_bytes == {"hbm->sbuf": 32768 + 4096, "sbuf->hbm": 4096, "sbuf->sbuf": 16384, "hbm->hbm": 8192}
    assert (r.queues["dma0"].dma_bytes, r.queues["dma1"].dma_bytes) == (8192, 32768 + 16384 + 4096 + 4096)
    assert (r.macs, r.transpose_macs) == (0, 128 * 128 * 32)              # the identity matmul of [128, 32]
    assert (r.sbuf_high_water, r.psum_high_water) == (768 + 4, 128 * 2)   # the int32 index; [32, 128] bf16
    assert r.opcode_counts == {"dma_copy": 4, "dma_gather": 1, "transpose": 1}
    assert r.compulsory_bytes == 128 * 64 * 4 + 128 * 8 * 4               # the scratch tensor is not counted


def test_peak_rates_per_dtype_make_a_pe_bound_program_100_percent_efficient():
    r = simulate(program("""
pe    matmul dst=psum[0:128]+0:fp32[1,512] stationary=sbuf[0:128]+0:fp32[1,128] moving=sbuf[0:128]+512:fp32[1,512]
pe    matmul dst=psum[0:128]+2048:fp32[1,512] stationary=sbuf[0:128]+4096:fp8_e4m3[128,2][1,128] moving=sbuf[0:128]+8192:fp8_e4m3[512,2][1,512] double_row=1
"""))
    # fp32: 128 x 128 x 512 MACs at 16384 / 4 per cycle = 2048 cycles (the cost model's x4);
    # fp8 double-row: K = 2 x 128, 256 x 128 x 512 MACs at 2 x 16384 per cycle = 512 cycles.
    assert r.macs == 128 * 128 * 512 + 256 * 128 * 512
    assert r.total_ticks == (2048 + 512) * PE
    assert r.roofline.pe_seconds == pytest.approx(2560 / 2.4e9, rel=1e-12)
    assert (r.compulsory_bytes, r.roofline.hbm_seconds) == (0, 0.0)
    assert r.efficiency == pytest.approx(1.0, rel=1e-12)
    assert r.sbuf_high_water == 8192 + 1024


def test_repeated_field_tuples_on_other_queues_are_costed_on_their_own_queue():
    sb = AP(Mem.SBUF, DType.FP32, 128, ((1, 100),))
    dve = Instruction.make("tensor_scalar", Engine.DVE, dst=sb, src=sb, signals=(0,))
    pool = dve.replace(engine=Engine.POOL, waits=((0, 1),), signals=(1,))   # the same field tuple, object and all
    hbm = AP(Mem.HBM, DType.FP32, 128, ((1, 100),), tensor=0, partition_stride=100)
    load0 = Instruction.make("dma_copy", queue=0, dst=AP(Mem.SBUF, DType.FP32, 128, ((1, 100),), offset=512), src=hbm,
                             signals=(2,))
    load1 = load0.replace(queue=1, waits=((2, 1),), signals=())
    assert pool.args is dve.args and load1.args is load0.args
    instrs = (dve, pool, dve.replace(waits=((1, 1),), signals=()), load0, load1)
    p = Program((TensorDecl("a", TensorKind.INPUT, DType.FP32, (128, 100)),), instrs)
    r = simulate(p)
    # tensor_scalar: DVE max(64, 100) = 100 cycles; GpSimdE 150 + 100 = 250 cycles.
    assert (r.queues["dve"].busy_cycles, r.queues["pool"].busy_cycles) == (200, 250)
    assert r.queues["dma0"].instructions == r.queues["dma1"].instructions == 1
    assert r.opcode_counts == {"tensor_scalar": 3, "dma_copy": 2}


def test_report_dict_and_table():
    r = simulate(example("gemm.s"))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["pe.macs"] == 16777216 and d["opcode.matmul"] == 2 and d["dma.sbuf_to_hbm_bytes"] == 262144
    assert d["total.pe_cycles"] == 459608 / PE and d["total.ns"] == pytest.approx(19150 + 1 / 3)
    assert d["dma3.bytes"] == 131072 and d["pe.busy_cycles"] == 1024
    assert d["roofline.efficiency"] == r.efficiency
    table = r.table()
    assert all(name in table for name in ("pe", "act", "dma0", "dma3", "roofline", "efficiency"))


def test_empty_program():
    r = simulate(Program((), ()))
    assert (r.total_ticks, r.instructions, r.efficiency, r.macs) == (0, 0, 0.0, 0)
    assert chrome_trace(Program((), ()), r)["traceEvents"][0]["ph"] == "M"


def test_chrome_trace_of_the_overlap_example(tmp_path):
    p = example("overlap.s")
    r = simulate(p)
    path = tmp_path / "overlap.json"
    write_chrome_trace(path, p, r)
    trace = json.loads(path.read_text())
    assert trace == chrome_trace(p, r.timeline) == chrome_trace(p)        # report, timeline or a fresh replay
    events = trace["traceEvents"]
    assert events[0]["args"]["name"] == "NeuronCore (trn2)"
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == ["act", "dma0", "dma1", "dma2", "dma3", "pe"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(p.instructions)
    for e in slices:
        i = e["args"]["index"]
        ins = p.instructions[i]
        assert names[e["tid"]] == ins.queue_name and e["name"] == ins.opcode
        assert e["args"]["asm"] == format_instruction(ins, p)
        assert e["ts"] == pytest.approx(r.timeline.start[i] / NS / 1000, rel=1e-12)       # microseconds
        assert e["dur"] == pytest.approx((r.timeline.end[i] - r.timeline.start[i]) / NS / 1000, rel=1e-12)
    # The overlap the semaphores allow: mm1 (pe) runs while x2 loads on dma0.
    mm1, x2 = slices[7], slices[6]
    assert x2["ts"] <= mm1["ts"] < x2["ts"] + x2["dur"]
    counters = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append(e["args"]["bytes"])
    # Footprints at each start, in start order: w to 256 B and x slot 1 to 2304 at time 0; y slot 0 (act0) to
    # 3328 and y slot 1 (act1) to 4352. PSUM: none before mm0, bank 0 (2048) at mm0, bank 1 (4096) at mm1.
    assert counters["SBUF footprint"] == [256, 2304, 3328, 4352]
    assert counters["PSUM footprint"] == [0, 2048, 4096]


def test_serial_trace_has_no_overlap():
    p = example("serial.s")
    slices = sorted((e for e in chrome_trace(p)["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"])
    for a, b in zip(slices, slices[1:]):
        assert a["ts"] + a["dur"] == pytest.approx(b["ts"], rel=1e-12)


def test_racy_programs_are_refused():
    text = (EXAMPLES / "gemm.s").read_text().replace("func=copy wait=s4>=1", "func=copy")
    racy = parse_program(text)
    with pytest.raises(VerifyError, match="race"):
        simulate(racy)
    with pytest.raises(VerifyError, match="race"):
        chrome_trace(racy)
