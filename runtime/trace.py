"""Chrome trace export of a performance-model timeline (runtime/perf.py), for Perfetto or chrome://tracing.

The file is the Trace Event Format (JSON object form): one process for the NeuronCore, one thread (track)
per queue in use, named by "M" metadata events and sorted as in perf.QUEUE_NAMES; one "X" complete event
per instruction, named by its opcode, with its assembly text and index in `args`; and "C" counter events
for the SBUF and PSUM footprints. Times are microseconds, as the format requires.

The footprint counters are cumulative: at each instruction's start, the highest byte per partition that
any instruction started so far touches. They show how the program's footprint grows, not liveness.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trnc.errors import TrncError
from trnc.isa.asm import format_instruction
from trnc.isa.config import HwConfig
from trnc.isa.program import Program
from trnc.runtime.perf import QUEUE_NAMES, PerfReport, Timeline, simulate

PID = 1
COUNTERS = (("sbuf_top", "SBUF footprint"), ("psum_top", "PSUM footprint"))


def chrome_trace(program: Program, report_or_timeline: PerfReport | Timeline | None = None,
                 hw: HwConfig | None = None) -> dict:
    """The trace of `program` as a JSON-able dict; without a report or timeline, `simulate(program, hw)`."""
    timeline, target = _timeline_of(program, report_or_timeline, hw)
    if len(timeline.start) != len(program.instructions):
        raise TrncError(f"the timeline has {len(timeline.start)} instructions and the program "
                        f"{len(program.instructions)}: it must be the replay of this program")
    us = 1e6 / timeline.ticks_per_second
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": PID, "args": {"name": f"NeuronCore ({target})"}}]
    for q in np.unique(timeline.queue).tolist():
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": q, "args": {"name": QUEUE_NAMES[q]}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": q, "args": {"sort_index": q}})
    queue, start, end = timeline.queue.tolist(), timeline.start.tolist(), timeline.end.tolist()
    for i, ins in enumerate(program.instructions):
        events.append({"ph": "X", "name": ins.opcode, "pid": PID, "tid": queue[i], "ts": start[i] * us,
                       "dur": (end[i] - start[i]) * us,
                       "args": {"index": i, "asm": format_instruction(ins, program)}})
    order = np.argsort(timeline.start, kind="stable")
    for column, name in COUNTERS:
        footprint = np.maximum.accumulate(getattr(timeline, column)[order]) if len(order) else order
        last = None
        for t, value in zip(timeline.start[order].tolist(), footprint.tolist()):
            if value != last:
                events.append({"ph": "C", "name": name, "pid": PID, "ts": t * us, "args": {"bytes": value}})
                last = value
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_chrome_trace(path: str | Path, program: Program, report_or_timeline: PerfReport | Timeline | None = None,
                       hw: HwConfig | None = None) -> None:
    """Write `chrome_trace(program, report_or_timeline, hw)` to `path` as JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(program, report_or_timeline, hw), f)


def _timeline_of(program: Program, report_or_timeline, hw: HwConfig | None) -> tuple[Timeline, str]:
    """The timeline to draw and the name of the machine it ran on."""
    report = simulate(program, hw) if report_or_timeline is None else report_or_timeline
    if isinstance(report, PerfReport):
        return report.timeline, report.target
    return report, hw.name if hw is not None else program.target
