"""The tile-level verifier: what a TileProgram promises, checked after each tile-level pass in debug mode.

The ISA verifier sees only the emitted program, where a slip of the tile pass, of a kernel or of
allocate shows up far from its cause, or not at all (a read of an SBUF buffer nothing wrote is a
legal program that computes garbage). So between tile, allocate and schedule this checks:
- instructions: the opcode is a row of the table, the fields are the row's and its required operands
  are there, the allowed engines are the row's, and every engine allowed reaches each on-chip operand's
  memory (the scheduler may pick any of them); elementwise rows get operands of equal shape;
- tiles: the buffer is declared, the tile lies within its bytes and the 128 partitions, and, once
  allocate has run, within the memory; HBM operands name a declared tensor, in its dtype, within it;
- order: every buffer is written before it is read;
- hand-overs: a kept tile or transposed copy is an SBUF tile of the tensor's shape, written by one
  kernel whose plan asked for it, read only by the next; a kept tensor (and a transposed one whose
  norm keeps it, storing nothing) is never accessed in HBM; a resident
  image likewise, read only by the kernels that read the producer's result;
- schedule: every tile instruction was scheduled once.
"""
from __future__ import annotations

import math
import re

from trnc import ir
from trnc.errors import VerifyError
from trnc.isa.ap import AP, Mem
from trnc.isa.config import PARTITIONS
from trnc.isa.opcodes import BY_NAME, Role
from trnc.passes.tile.tiles import Buffer, Tile, TileInstr, TileProgram

ERROR_LIMIT = 10
MEMORY_BYTES = {Mem.SBUF: "sbuf_bytes_per_partition", Mem.PSUM: "psum_bytes_per_partition"}


def _tile_bytes(t: Tile) -> tuple[int, int]:
    """[lo, hi) bytes of each partition the tile touches within its buffer."""
    reach = [(count - 1) * stride for stride, count in t.dims]
    lo, hi = sum(r for r in reach if r < 0), sum(r for r in reach if r > 0)
    return t.offset + lo * t.dtype.itemsize, t.offset + (hi + 1) * t.dtype.itemsize


class _OpcodeRows:
    """Per (opcode, allowed engines): the row, its AP fields, and the memories every allowed engine reaches
    for each of them (computed once: a program repeats a few hundred signatures)."""

    def __init__(self):
        self.cache: dict[tuple, tuple] = {}

    def get(self, ins: TileInstr):
        key = (ins.opcode, ins.engines)
        if key not in self.cache:
            spec = BY_NAME.get(ins.opcode)
            aps = spec.aps if spec else ()
            reach = {f.name: frozenset.intersection(*(spec.memories(f, e) for e in ins.engines))
                     for f in aps} if spec and ins.engines else {}
            self.cache[key] = spec, aps, reach
        return self.cache[key]


def _operand_problems(tp: TileProgram, declared: set, rows: _OpcodeRows, ins: TileInstr) -> list[str]:
    spec, aps, reach = rows.get(ins)
    if spec is None:
        return [f"unknown opcode {ins.opcode!r}"]
    names = {f.name for f in spec.fields}
    problems = [f"field {name!r} is not one of {ins.opcode}'s" for name in ins.fields if name not in names]
    if not ins.engines or not set(ins.engines) <= set(spec.engines):
        return problems + [f"engines {[e.text for e in ins.engines]} are not among {ins.opcode}'s"]
    for f in aps:
        v = ins.fields.get(f.name)
        if v is None:
            problems += [] if f.optional else [f"operand {f.name} is missing"]
        elif isinstance(v, Tile):
            problems += _tile_problems(tp, declared, f.name, v, reach[f.name])
        elif isinstance(v, AP) and v.mem is Mem.HBM:
            problems += _hbm_problems(tp, f.name, v)
        else:
            problems.append(f"operand {f.name} is {type(v).__name__}, not a Tile or an HBM AP")
    if spec.elementwise and not problems:
        problems += _shape_problems(aps, ins)
    return problems


def _tile_problems(tp: TileProgram, declared: set, name: str, t: Tile, reach: frozenset) -> list[str]:
    buf = t.buffer
    if buf not in declared:
        return [f"{name} is a tile of {buf}, which the program does not declare"]
    problems = []
    lo, hi = _tile_bytes(t)
    if t.start_partition < 0 or t.start_partition + t.partitions > PARTITIONS:
        problems.append(f"{name} covers partitions [{t.start_partition}, +{t.partitions}) beyond {PARTITIONS}")
    if lo < 0 or hi > buf.nbytes:
        problems.append(f"{name} touches bytes [{lo}, {hi}) of {buf}")
    if buf.mem not in reach:
        problems.append(f"{name} in {buf.mem.name} is out of reach of some of the engines allowed")
    limit = getattr(tp.hw, MEMORY_BYTES[buf.mem])
    if buf.offset is not None and not 0 <= buf.offset <= buf.offset + buf.nbytes <= limit:
        problems.append(f"{buf} lies outside {buf.mem.name}'s {limit} bytes per partition")
    return problems


def _hbm_problems(tp: TileProgram, name: str, ap: AP) -> list[str]:
    if not 0 <= ap.tensor < len(tp.tensors):
        return [f"{name} names tensor {ap.tensor} of {len(tp.tensors)}"]
    decl = tp.tensors[ap.tensor]
    lo, hi = ap.byte_range()
    if ap.dtype != decl.dtype:
        return [f"{name} reads tensor {decl.name} ({decl.dtype.text}) as {ap.dtype.text}"]
    return [] if 0 <= lo and hi <= decl.num_bytes else [f"{name} touches bytes [{lo}, {hi}) of {decl.name} "
                                                        f"({decl.num_bytes} bytes)"]


def _shape(v) -> tuple[int, int]:
    return v.partitions, math.prod(c for _, c in v.dims)


def _shape_problems(aps, ins: TileInstr) -> list[str]:
    """An elementwise row's data operands correspond element by element: equal partitions and free sizes."""
    data = [(f.name, _shape(ins.fields[f.name])) for f in aps if f.role is Role.DATA and f.name in ins.fields]
    return [f"{name} is {shape[0]} x {shape[1]}, {data[0][0]} {data[0][1][0]} x {data[0][1][1]}"
            for name, shape in data[1:] if shape != data[0][1]]


def _order_problems(tp: TileProgram, rows: _OpcodeRows) -> list[tuple[int, str]]:
    """Reads of a buffer that no earlier instruction wrote."""
    written: set[Buffer] = set()
    problems = []
    for i, ins in enumerate(tp.instrs):
        _, fields, _ = rows.get(ins)
        for f in fields:
            v = ins.fields.get(f.name)
            if isinstance(v, Tile) and not f.out and v.buffer not in written:
                problems.append((i, f"{f.name} reads {v.buffer} before any instruction writes it"))
        written |= {ins.fields[f.name].buffer for f in fields if f.out and isinstance(ins.fields.get(f.name), Tile)}
    return problems


def _kernel_index(ins: TileInstr) -> int | None:
    match = re.fullmatch(r"k(\d+)", ins.kernel)
    return int(match.group(1)) if match else None


def _hand_over_problems(tp: TileProgram, graph: ir.Graph | None) -> list[str]:
    """Kept tiles, transposed copies and resident images: their shape, their kernels, and no HBM access to a kept
    tensor or a resident image."""
    if not tp.kept and not tp.transposed and not tp.resident:
        return []
    problems = []
    readers = graph.users() if graph is not None else {}
    touched, kernels_of = set(), {}
    for ins in tp.instrs:
        for v in ins.fields.values():
            if isinstance(v, AP) and v.mem is Mem.HBM:
                touched.add(v.tensor)
            elif isinstance(v, Tile):
                kernels_of.setdefault(v.buffer, set()).add(_kernel_index(ins))
    for what, tiles in (("kept", tp.kept), ("transposed", tp.transposed)):
        for tensor, t in tiles.items():
            decl = tp.tensors[tensor]
            rows, cols = math.prod(decl.shape[:-1]), decl.shape[-1]
            want = (PARTITIONS, rows // PARTITIONS, cols) if what == "kept" else (PARTITIONS, cols // PARTITIONS, rows)
            if t.buffer.mem is not Mem.SBUF or t.shape != want or t.dtype != decl.dtype:
                problems.append(f"{what} tile {t.buffer} of {decl.name} is {t.dtype.text}{list(t.shape)}, not "
                                f"{decl.dtype.text}{list(want)} in SBUF")
            if tensor in touched and (what == "kept" or _owner_keeps(graph, kernels_of.get(t.buffer, set()))):
                problems.append(f"{decl.name} is kept in SBUF but instructions access it in HBM")
            if graph is not None:
                problems += _kernel_problems(graph, readers, what, t.buffer, kernels_of.get(t.buffer, set()))
    for tensor, t in tp.resident.items():
        decl = tp.tensors[tensor]
        batch, channels, height, width = decl.shape
        want = (min(channels, PARTITIONS), math.ceil(channels / PARTITIONS), batch, height, width)
        if t.buffer.mem is not Mem.SBUF or t.shape != want or t.dtype != decl.dtype:
            problems.append(f"resident image {t.buffer} of {decl.name} is {t.dtype.text}{list(t.shape)}, not "
                            f"{decl.dtype.text}{list(want)} in SBUF")
        if tensor in touched:
            problems.append(f"{decl.name} is a resident image but instructions access it in HBM")
        if graph is not None:
            problems += _reader_problems(graph, readers, t.buffer, kernels_of.get(t.buffer, set()))
    return problems


def _owner(kernels: set) -> int | None:
    """The kernel that writes a hand-over's buffer: the first of the kernels that use it."""
    return min((k for k in kernels if k is not None), default=None)


def _owner_keeps(graph: ir.Graph | None, kernels: set) -> bool:
    """Whether the kernel that writes a transposed copy keeps its result on chip only (no HBM store to read)."""
    owner = _owner(kernels)
    return graph is not None and owner is not None and graph.kernels[owner].plan.keep


def _reader_problems(graph: ir.Graph, readers: dict, buf: Buffer, kernels: set) -> list[str]:
    """The kernel that writes a resident image planned it, and only the kernels reading its result also use it."""
    owner = _owner(kernels)
    if owner is None or not graph.kernels[owner].plan.keep:
        return [f"resident image {buf} of kernel k{owner}, whose plan does not ask for it"]
    kernel_of = {n: i for i, k in enumerate(graph.kernels) for n in k.nodes}
    reading = {kernel_of[u] for u in readers[graph.kernels[owner].output]}
    strangers = set(kernels) - reading - {owner}
    return [f"resident image {buf} of kernel k{owner} is used by kernels {sorted(strangers, key=str)}, which do "
            "not read it"] if strangers else []


def _kernel_problems(graph: ir.Graph, readers: dict, what: str, buf: Buffer, kernels: set) -> list[str]:
    """The kernel that writes a hand-over's buffer planned it, and only the kernel it hands over to also reads it."""
    owner = _owner(kernels)
    if owner is None or set(kernels) - {owner, ir.hand_over_reader(graph, owner, readers)[0]}:
        return [f"{what} tile {buf} is used by kernels {sorted(kernels, key=str)}, not one kernel and its reader"]
    plan = graph.kernels[owner].plan
    asked = plan is not None and (plan.keep if what == "kept" else plan.transposed)
    return [] if asked else [f"{what} tile {buf} of kernel k{owner}, whose plan does not ask for it"]


def check_tiles(tp: TileProgram, graph: ir.Graph | None = None, instructions: list | None = None) -> list[str]:
    """Every broken rule of the tile program, as text (see the module docstring)."""
    declared, rows = set(tp.buffers), _OpcodeRows()
    found = [f"{i} [{ins.kernel}] {ins.text()}: {p}" for i, ins in enumerate(tp.instrs)
             for p in _operand_problems(tp, declared, rows, ins)]
    found += [f"{i} [{tp.instrs[i].kernel}] {tp.instrs[i].text()}: {p}" for i, p in _order_problems(tp, rows)]
    found += _hand_over_problems(tp, graph)
    if instructions is not None and len(instructions) != len(tp.instrs):
        found.append(f"{len(instructions)} instructions scheduled for {len(tp.instrs)} tile instructions")
    return found


def verify_tiles(tp: TileProgram, graph: ir.Graph | None = None, instructions: list | None = None) -> None:
    """Raise VerifyError listing the broken rules of the tile program (the first ERROR_LIMIT); return if none."""
    found = check_tiles(tp, graph, instructions)
    if found:
        more = f"\n... and {len(found) - ERROR_LIMIT} more" if len(found) > ERROR_LIMIT else ""
        raise VerifyError("tile program: " + "\n".join(found[:ERROR_LIMIT]) + more)
