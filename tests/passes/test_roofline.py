"""passes/roofline.py: the model's MACs and roofline, and the stats dict of a compiled model, on small graphs."""
from pathlib import Path

import pytest

from trnc import ir
from trnc.isa import cost
from trnc.isa.asm import parse_program
from trnc.isa.config import get_target
from trnc.isa.dtypes import DType
from trnc.passes import roofline
from trnc.runtime.perf import simulate

TRN2 = get_target("trn2")
GEMM = Path(__file__).resolve().parents[2] / "examples" / "gemm.s"
F32, BF16 = DType.FP32, DType.BF16


# Every node is named: an unnamed one takes the next of the process's value numbers, which the golden
# programs' scratch tensors are named by (tests/test_golden.py may run next in this process).
def _input(shape, dtype, index):
    return ir.Node("input", (), shape, dtype, {"index": index}, name=f"i{index}")


def _matmul(batch_m_k, n, dtype):
    *batch, m, k = batch_m_k
    a, b = _input(batch_m_k, dtype, 0), _input((k, n), dtype, 1)
    return a, b, ir.Node("matmul", (a, b), (*batch, m, n), dtype, name="mm")


def _graph():
    """A bf16 matmul [2, 64, 32] @ [32, 48], an fp32 attention of 16 queries over 20 keys, a relu."""
    a, b, mm = _matmul((2, 64, 32), 48, BF16)
    q, k, v = _input((1, 4, 16, 8), F32, 2), _input((1, 4, 20, 8), F32, 3), _input((1, 4, 20, 8), F32, 4)
    attn = ir.Node("attention", (q, k, v), (1, 4, 16, 8), F32, name="attn")
    relu = ir.Node("relu", (attn,), attn.shape, F32, name="relu")
    kernels = [ir.Kernel("matmul", [mm], compute_dtype=BF16), ir.Kernel("attention", [attn], compute_dtype=F32),
               ir.Kernel("elementwise", [relu])]
    return ir.Graph([a, b, q, k, v, mm, attn, relu], [a, b, q, k, v], [mm, relu], kernels=kernels)


def test_model_pe_cycles_at_each_kernels_peak_rate():
    macs, cycles = roofline.model_pe_cycles(_graph(), TRN2)
    assert macs == 2 * 64 * 48 * 32 + 4 * 16 * 20 * (8 + 8)     # the attention's Q @ K^T, then P @ V; no relu
    # bf16 at 128 x 128 MACs per cycle, fp32 at a quarter of that (neuroncore.md 1.2)
    assert cycles == 2 * 64 * 48 * 32 / 16384 + 4 * 16 * 20 * 16 / 4096


def test_stats_of_a_program_and_of_a_compiled_model():
    report = simulate(parse_program(GEMM.read_text()))    # c[128, 512] = a[256, 128].T @ b[256, 512], bf16
    program = roofline.program_stats(report, TRN2)
    assert program["efficiency"] == program["executed_macs_efficiency"] == report.efficiency
    assert program["roofline_seconds"] == report.roofline.seconds
    assert (program["macs"], program["instructions"]) == (report.macs, report.instructions)
    assert program["engine_busy"]["dma"] == sum(q.busy_cycles / q.clock_hz for n, q in report.queues.items()
                                                if n.startswith("dma"))
    # the same GEMM as the model asks for it, in fp32: 4 x 1024 cycles at the fp32 rate, longer than the
    # program's HBM time, so the model's roofline is TensorE-bound; the executed MACs' efficiency stays beside it
    a, b, mm = _matmul((128, 256), 512, F32)
    graph = ir.Graph([a, b, mm], [a, b], [mm], kernels=[ir.Kernel("matmul", [mm], compute_dtype=F32)])
    stats = roofline.compiled_stats(graph, TRN2, report, {"sbuf_peak_bytes": 4608})
    assert stats["model_macs"] == report.macs == 128 * 512 * 256
    want = cost.Roofline(4 * report.roofline.pe_seconds, report.roofline.hbm_seconds)
    assert stats["roofline_seconds"] == pytest.approx(want.pe_seconds, rel=1e-12) == 4096 / 2.4e9
    assert stats["efficiency"] == pytest.approx(want.efficiency(report.total_seconds), rel=1e-12)
    assert stats["executed_macs_efficiency"] == report.efficiency
    assert stats["roofline_cycles"] == pytest.approx(want.seconds * 2.4e9, rel=1e-12)
    assert (stats["sbuf_peak_bytes"], stats["psum_peak_bytes"], stats["kernels"]) == (4608, 0, 1)
    assert {k: stats[k] for k in program if k not in ("roofline_seconds", "roofline_cycles", "efficiency")} == \
        {k: v for k, v in program.items() if k not in ("roofline_seconds", "roofline_cycles", "efficiency")}
