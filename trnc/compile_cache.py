"""The compile cache: compiled models on disk by a key of the captured graph, so recompiling skips the passes.

It sits between capture and the pass pipeline (trnc/api.py). The key is sha256 over a canonical
serialization of the captured ir.Graph (every node's op, operand positions, shape, dtype and attrs, the
names of inputs and constants, and the sha256 of every constant's bytes: other weights miss), the
Options, trnc's version, the artifact and ISA encoding format versions, and a fingerprint of the
compiler's own source (every .py file of trnc, trnc.isa, trnc.passes, trnc.runtime), so an edited
compiler in a development checkout misses instead of returning a program the new code would not emit.
The user's source lines are not part of the key: moving a model's code does not change its program.

An entry is one artifact.Record as a file, `TRNC_CACHE_DIR/models/<key>.trnc` (trnc/artifact.py: it keeps
the compile stats in its header, and is checked on load like any artifact), written to a temp file and
renamed, so a reader sees a whole entry or none. An entry that fails to load is deleted, logged at
WARNING and compiled again. The folder is bounded: after each store the least recently used entries (a
hit touches its entry) are deleted until at most MAX_ENTRIES entries and MAX_BYTES bytes remain; a model
whose constants alone exceed MAX_BYTES is not stored. `TRNC_CACHE=0` turns the cache off.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import importlib.util
import os
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from trnc import artifact, flags, ir, version
from trnc.errors import ArtifactError
from trnc.ir import TensorArg
from trnc.isa import encoding
from trnc.isa.dtypes import DType
from trnc.log import get_logger

MAX_ENTRIES = 32
MAX_BYTES = 4 * 2**30          # a BERT-base in fp32 is 0.44 GB: about nine of them
STALE_SECONDS = 3600           # temp files older than this are leftovers of a crashed store
_PACKAGES = ("trnc", "trnc.isa", "trnc.passes", "trnc.runtime")


class Uncacheable(Exception):
    """The graph holds an attribute value the key cannot serialize stably; the model is compiled uncached."""


# -- the key -------------------------------------------------------------------------------------------

@functools.cache
def compiler_fingerprint() -> str:
    """sha256 of the compiler's source files: computed once per process (a few ms)."""
    h = hashlib.sha256()
    for package in _PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in spec.submodule_search_locations or ():
            for path in sorted(Path(root).rglob("*.py")):
                h.update(f"{package}/{path.relative_to(root)}\0".encode())
                h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _array_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _digests(arrays: list[np.ndarray]) -> dict[int, bytes]:
    """sha256 of each array's bytes by id(); two threads, since hashlib releases the GIL on large buffers."""
    def digest(a):
        return id(a), hashlib.sha256(_array_bytes(a)).digest()
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(digest, arrays))


def _encode(value, out: list[bytes], digests: dict[int, bytes]) -> None:
    """Append a canonical, type-tagged byte form of an attribute value to `out`."""
    if value is None or isinstance(value, (bool, str)):
        out.append(f"{type(value).__name__}:{value}\0".encode())
    elif isinstance(value, int) and not isinstance(value, enum.Enum):
        out.append(f"int:{value}\0".encode())
    elif isinstance(value, float):
        out.append(b"float:" + struct.pack("<d", value))
    elif isinstance(value, (list, tuple)):
        out.append(f"seq:{len(value)}\0".encode())
        for v in value:
            _encode(v, out, digests)
    elif isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        out.append(f"dict:{len(items)}\0".encode())
        for k, v in items:
            _encode(k, out, digests)
            _encode(v, out, digests)
    elif isinstance(value, np.ndarray):
        out.append(f"array:{value.dtype.str}:{value.shape}\0".encode() + digests[id(value)])
    elif isinstance(value, DType):
        out.append(f"DType:{value.text}\0".encode())
    elif isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        out.append(f"{type(value).__name__}:{value}\0".encode())
    elif isinstance(value, enum.Enum):
        out.append(f"enum:{type(value).__qualname__}.{value.name}\0".encode())
    elif isinstance(value, slice):
        _encode(("slice", value.start, value.stop, value.step), out, digests)
    elif isinstance(value, np.generic):
        out.append(f"scalar:{value.dtype.str}:".encode() + value.tobytes())
    elif isinstance(value, TensorArg):
        _encode(("TensorArg", value.index, value.dtype), out, digests)
    else:
        raise Uncacheable(f"attribute value of type {type(value).__qualname__}")


def graph_key(graph: ir.Graph, options) -> str:
    """The cache key of compiling `graph` with `options` (hex sha256); raises Uncacheable."""
    arrays = [v for n in graph.nodes for v in n.attrs.values() if isinstance(v, np.ndarray)]
    digests = _digests(arrays)
    position = {n: i for i, n in enumerate(graph.nodes)}
    out = [f"trnc-model-cache|{version.__version__}|artifact {artifact.FORMAT_VERSION}|isa {encoding.FORMAT_VERSION}|"
           f"{compiler_fingerprint()}\0".encode()]
    _encode(sorted(vars(options).items()), out, digests)
    for n in graph.nodes:
        name = n.name if n.op in ir.OPS_SOURCE else ""
        out.append(f"node:{n.op}:{name}:{[position[i] for i in n.inputs]}:{n.shape}:{n.dtype.text}:{n.module}\0"
                   .encode())   # the module path: keep_precision matches it
        _encode(n.attrs, out, digests)
    out.append(f"inputs:{[position[n] for n in graph.inputs]} outputs:{[position[n] for n in graph.outputs]}".encode())
    return hashlib.sha256(b"".join(out)).hexdigest()


# -- the store -----------------------------------------------------------------------------------------

class ModelCache:
    """Compiled models in one folder, by key; every failure to read or write costs a compile, never an error."""

    def __init__(self, root: Path, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES):
        self.root = Path(root)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.log = get_logger(__name__)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.trnc"

    def has(self, key: str) -> bool:
        return self.path(key).exists()

    def lookup(self, key: str) -> artifact.Record | None:
        """The Record of entry `key`, or None; a broken entry is deleted with a WARNING."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            record = artifact.load(path, trusted=True)   # written by this compiler after verifying
        except ArtifactError as e:
            self.log.warning("compile cache entry %s is unreadable (%s); it was deleted and the model is compiled "
                             "again", path, e)
            self._delete(path)
            return None
        try:
            os.utime(path)          # the most recently used entry is the last evicted
        except OSError:
            pass
        return record

    def store(self, key: str, record: artifact.Record) -> bool:
        """Write entry `key` atomically, then evict beyond the bounds; True when stored."""
        size = sum(a.nbytes for a in record.constants.values())
        if size > self.max_bytes:
            self.log.debug("compile cache: not storing %s: its constants (%d bytes) exceed the cache's %d bytes",
                           key, size, self.max_bytes)
            return False
        path = self.path(key)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            try:
                artifact.save(record, Path(tmp))
                os.replace(tmp, path)
            finally:
                Path(tmp).unlink(missing_ok=True)
        except (OSError, ArtifactError) as e:
            self.log.warning("compile cache: could not store %s (%s); compiles of this model are not cached", path, e)
            return False
        self.evict(keep=key)
        return True

    def _delete(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass   # another process holds or removed it

    def entries(self) -> list[tuple[Path, float, int]]:
        """(path, last use, bytes) of every entry, most recently used first."""
        found = []
        for path in self.root.glob("*.trnc"):
            try:
                st = path.stat()
            except OSError:
                continue   # evicted by another process right now
            found.append((path, st.st_mtime, st.st_size))
        return sorted(found, key=lambda e: -e[1])

    def evict(self, keep: str | None = None) -> list[Path]:
        """Delete the least recently used entries beyond the bounds (never `keep`) and stale temp files."""
        evicted, count, total = [], 0, 0
        for path, _, size in self.entries():
            count, total = count + 1, total + size
            if path.stem != keep and (count > self.max_entries or total > self.max_bytes):
                self._delete(path)
                evicted.append(path)
                count, total = count - 1, total - size
        now = time.time()
        for tmp in self.root.glob(".*.tmp"):
            try:
                if now - tmp.stat().st_mtime > STALE_SECONDS:
                    tmp.unlink()
            except OSError:
                continue
        if evicted:
            self.log.debug("compile cache: evicted %d entries from %s", len(evicted), self.root)
        return evicted


def open_cache(enabled: bool = True) -> ModelCache | None:
    """The model cache in TRNC_CACHE_DIR/models, or None when `enabled` is False, TRNC_CACHE=0 or
    TRNC_COMPILE_CACHE=0."""
    if not enabled or not flags.get("TRNC_CACHE") or not flags.get("TRNC_COMPILE_CACHE"):
        return None
    return ModelCache(flags.get("TRNC_CACHE_DIR") / "models", MAX_ENTRIES, MAX_BYTES)
