"""docs/coverage.md's Core ATen section: each op of torch's Core ATen set (the overloads tagged `torch.Tag.core`)
marked on device, fallback (with the reason) or not applicable, from the OpInfo sweep's evidence.

An op is judged by what the sweep's samples did with it (tests/opinfo_sweep.py records the aten ops of each
sample's device regions and those that fell back): on device when some sample ran it on the device and none
fell back on it; partly when both happened (the fallback's reason given); fallback when only that happened. A
sample where the op went to eager only beside others (its region's compile failed with an error that does not
name it) does not count against it. An
op no sample reaches is marked by what trnc has for it: a legalize rule (named by its module; not exercised by
the sweep), torch's own decomposition (trnc.capture's table turns it into other ops before legalize sees it),
nothing (fallback: no legalize rule), or not applicable, with why (NOT_APPLICABLE).
"""
from __future__ import annotations

import functools

import torch

from trnc.partition import CONSTANT, NO_RULE

# ops that cannot reach a device region of an inference graph of float32 tensors, and why
NOT_APPLICABLE = {
    "aten._local_scalar_dense.default": "Tensor.item(): a Python number; dynamo breaks the graph there",
    "aten.sym_numel.default": "a symbolic size query, answered at trace time",
    "aten.sym_size.int": "a symbolic size query, answered at trace time",
    "aten.sym_storage_offset.default": "a symbolic layout query, answered at trace time",
    "aten.sym_stride.int": "a symbolic layout query, answered at trace time",
    "aten.nonzero.default": "its output shape depends on the data: stays in eager (dynamo breaks the graph)",
    "aten.atan2.out": "an out= variant: functionalized graphs call aten.atan2.default instead",
    "aten.resize_.default": "resizes a tensor in place: dynamo does not trace Tensor.resize_ (a graph break)",
    "aten._native_batch_norm_legit.default": ("updates its running stats in place: functionalized graphs call "
                                              "_native_batch_norm_legit_functional (lowered) instead"),
}
BACKWARD = "a gradient op: trnc compiles inference graphs (torch.compile's backward runs in eager)"


@functools.cache
def core_aten_ops() -> tuple[str, ...]:
    """Every overload of torch.ops.aten tagged core, sorted by name: from the registered schemas (dir(torch.ops.aten)
    lists only the packets the process has touched)."""
    ops = set()
    for schema in torch._C._jit_get_all_schemas():
        packet = getattr(torch.ops.aten, schema.name[len("aten::"):], None) if schema.name.startswith("aten::") else None
        op = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
        if op is not None and torch.Tag.core in op.tags:
            ops.add(str(op))
    return tuple(sorted(ops))


def _unreached(op: str, rules: dict, decomposed: set[str]) -> tuple[str, str]:
    """(status, why) of an op no sample reached."""
    if op in NOT_APPLICABLE:
        return "not applicable", NOT_APPLICABLE[op]
    if op.split(".")[1].endswith("_backward"):
        return "not applicable", BACKWARD
    if op in rules:
        module = rules[op].__module__.rsplit(".", 1)[-1]
        return "has a rule", f"lowered by passes/graph/{module}.py; no OpInfo sample reaches it"
    if op in decomposed:
        return "decomposed", "torch's decomposition (trnc.capture's table) replaces it before legalize"
    return "fallback", "no legalize rule"


# trnc/partition.py's reasons for one node on its own (its op, its dtypes); any other reason is a region compile's
# error, which is the op's own only when it names the op (else the whole region went to eager with it)
NODE_REASONS = (NO_RULE, CONSTANT, "not an aten operator", "tensors of ", "float64 values computed from inputs")


def _own_reason(op: str, result) -> str | None:
    """Why `op` ran in eager in this sample, or None when it went only beside others: its region's compile failed
    on another op or as a whole."""
    reason = result.fallback_reasons[result.fallback_ops.index(op)]
    return reason if reason.startswith((op, *NODE_REASONS)) else None


def _samples(n: int) -> str:
    return f"{n} sample" if n == 1 else f"{n} samples"


def core_aten_rows(results) -> list[tuple[str, str, str]]:
    """(op, status, evidence or reason) of every Core ATen op, from the sweep's results."""
    from trnc.capture import decomposition_table
    from trnc.passes.graph.legalize_rules import pm_legalize
    decomposed = {str(op) for op in decomposition_table()}
    rows = []
    for op in core_aten_ops():
        device = sum(op in r.device_ops and op not in r.fallback_ops for r in results)
        reasons = [_own_reason(op, r) for r in results if op in r.fallback_ops]
        fell = [why for why in reasons if why is not None]
        reason = fell[0] if fell else ""
        if device and fell:
            rows.append((op, "partly", f"on device in {_samples(device)}; in eager in {_samples(len(fell))}: {reason}"))
        elif device:
            rows.append((op, "on device", _samples(device)))
        elif fell:
            rows.append((op, "fallback", f"{_samples(len(fell))}: {reason}"))
        else:
            rows.append((op, *_unreached(op, pm_legalize, decomposed)))
    return rows


def core_aten_lines(results, cell) -> list[str]:
    """The section's markdown lines; `cell` escapes a table cell."""
    rows = core_aten_rows(results)
    statuses = ("on device", "partly", "has a rule", "decomposed", "fallback", "not applicable")
    tally = ", ".join(f"{sum(s == status for _, s, _ in rows)} {status}" for status in statuses)
    return ["", "## Core ATen", "",
            f"The {len(rows)} overloads of torch's Core ATen set (tagged `torch.Tag.core`), judged by the samples "
            "above: on device when some sample ran the op in a device region and none ran it in eager; partly when "
            "both; fallback when only eager (not counting samples where it went to eager only beside others: its "
            "region's compile failed on another op, or as a whole). An op no sample reaches is marked by what trnc has for it: a legalize "
            "rule, torch's decomposition into other ops, nothing (fallback), or not applicable (why given). "
            f"{tally}.", "",
            "| op | status | evidence or reason |", "| --- | --- | --- |",
            *(f"| {op} | {status} | {cell(why)} |" for op, status, why in rows)]
