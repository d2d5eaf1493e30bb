"""The JIT's cache of compiled kernels: object code in memory and on disk, keyed by everything that shapes it.

The key is sha256 over the trnc version, the Codegen's identity (host triple, CPU, features, LLVM and
llvmlite versions), a digest of the sources that generate kernel IR (every module of trnc.runtime and
trnc.isa) and the kernel's name: its signature's text, which with those sources determines its IR. So a
change to any of them, including a change to trnc's lowering, misses, and a hit never builds the IR (the
IR text as key cost about 4 ms of Python per kernel: 0.9 s of a warm load of 200 kernels). Lookups go
memory, then disk (`TRNC_CACHE_DIR/kernels/<key>.o` unless
`TRNC_CACHE=0`), then compile. A disk entry is `MAGIC + sha256(payload) + payload`; one whose magic or
hash does not match (a torn or tampered file) is deleted and rebuilt, never loaded. Writes go to a temp
file in the same directory and `os.replace` it, so readers see either no entry or a whole one.
`TRNC_ASSERT_CACHED=1` turns a compile into an error, to check that a warm run compiles nothing.
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trnc.isa
import trnc.runtime
from trnc import flags, version
from trnc.errors import TrncError
from trnc.runtime.jit.codegen import Codegen

MAGIC = b"TRNCOBJ1"
DIGEST = 32   # bytes of a sha256


@dataclass
class CacheStats:
    """Lookup counters: memory hits, disk hits, compiles (misses) and corrupt disk entries discarded."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    discarded: int = 0


def source_digest(roots: Sequence[Path] | None = None) -> str:
    """sha256 over the path and bytes of every .py file under `roots` (default: the trnc.runtime and trnc.isa
    packages, computed once per process)."""
    if roots is None:
        return _package_digest()
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def _package_digest() -> str:
    return source_digest([Path(trnc.runtime.__file__).parent, Path(trnc.isa.__file__).parent])


class KernelCache:
    """Object code by key, in memory for the process and on disk across processes."""

    def __init__(self, codegen: Codegen):
        self.codegen = codegen
        self.stats = CacheStats()
        self._memory: dict[str, bytes] = {}
        self._salt = f"trnc {version.__version__}|{codegen.identity}|{source_digest()}|".encode()

    def key(self, name: str) -> str:
        return hashlib.sha256(self._salt + name.encode()).hexdigest()

    def object_code(self, name: str, build: Callable[[], str]) -> bytes:
        """The object code of the module named `name` ("kernel " and its signature's text, "driver" or "parallel
        driver"; with the sources, the name determines the module), from `build`'s IR text on a miss."""
        key = self.key(name)
        obj = self._memory.get(key)
        if obj is not None:
            self.stats.memory_hits += 1
            return obj
        path = self.path(key)
        obj = self._read(path) if path is not None else None
        if obj is not None:
            self.stats.disk_hits += 1
        else:
            if flags.get("TRNC_ASSERT_CACHED"):
                raise TrncError(f"TRNC_ASSERT_CACHED=1 but {name} (cache key {key[:16]}) is in neither the memory "
                                "nor the disk cache; run once with TRNC_ASSERT_CACHED=0 to fill the cache")
            self.stats.misses += 1
            obj = self.codegen.compile(build())
            if path is not None:
                _write_atomic(path, MAGIC + hashlib.sha256(obj).digest() + obj)
        self._memory[key] = obj
        return obj

    def path(self, key: str) -> Path | None:
        """Where the disk entry of `key` lives, or None when the disk cache is off."""
        if not flags.get("TRNC_CACHE"):
            return None
        return flags.get("TRNC_CACHE_DIR") / "kernels" / f"{key}.o"

    def _read(self, path: Path) -> bytes | None:
        """The payload of a disk entry, or None when absent; a corrupt entry is deleted and counted."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return None   # unreadable: treated as absent, and the rebuilt entry replaces it
        payload = data[len(MAGIC) + DIGEST:]
        if data[:len(MAGIC)] == MAGIC and data[len(MAGIC):len(MAGIC) + DIGEST] == hashlib.sha256(payload).digest():
            return payload
        self.stats.discarded += 1
        try:
            path.unlink()
        except OSError:
            pass   # another process removed or replaced it already
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file and os.replace; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".o")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return   # a read-only or full cache directory only costs recompiles
