"""The JIT's cache of compiled kernels: object code in memory and on disk, keyed by everything that shapes it.

The key is sha256 over the trnc version, the Codegen's identity (host triple, CPU, features, LLVM and
llvmlite versions) and the kernel module's LLVM IR text, so a change to any of them, including a change
to trnc's lowering, misses. Lookups go memory, then disk (`TRNC_CACHE_DIR/kernels/<key>.o` unless
`TRNC_CACHE=0`), then compile. A disk entry is `MAGIC + sha256(payload) + payload`; one whose magic or
hash does not match (a torn or tampered file) is deleted and rebuilt, never loaded. Writes go to a temp
file in the same directory and `os.replace` it, so readers see either no entry or a whole one.
`TRNC_ASSERT_CACHED=1` turns a compile into an error, to check that a warm run compiles nothing.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

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


class KernelCache:
    """Object code by key, in memory for the process and on disk across processes."""

    def __init__(self, codegen: Codegen):
        self.codegen = codegen
        self.stats = CacheStats()
        self._memory: dict[str, bytes] = {}
        self._salt = f"trnc {version.__version__}|{codegen.identity}|".encode()

    def key(self, ir_text: str) -> str:
        return hashlib.sha256(self._salt + ir_text.encode()).hexdigest()

    def object_code(self, ir_text: str, what: str = "kernel") -> bytes:
        """The object code of the module `ir_text`; `what` names it in a TRNC_ASSERT_CACHED error."""
        key = self.key(ir_text)
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
                raise TrncError(f"TRNC_ASSERT_CACHED=1 but {what} (cache key {key[:16]}) is in neither the memory "
                                "nor the disk cache; run once with TRNC_ASSERT_CACHED=0 to fill the cache")
            self.stats.misses += 1
            obj = self.codegen.compile(ir_text)
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
