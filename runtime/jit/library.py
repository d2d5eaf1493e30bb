"""One loaded program's native code: an MCJIT engine of its own, holding the object code of its kernels.

Why one engine per program (as numba's CodeLibrary is one per unit): MCJIT maps the sections of every object
it loads (code, read-only and writable data, each its own memory mapping once protected) and frees them only
with its engine. A single process-wide engine grew by about fifteen mappings per distinct program and
aborted the process ('LLVM ERROR: Unable to allocate section memory') past the kernel's per-process limit
(vm.max_map_count, 65530 by default), after some four thousand programs compiled in one process. A
Library's mappings go when the last reference to it does: the JitProgram whose driver table points into
it. Object code is shared between Libraries through runtime/jit/cache.py, so a kernel compiles once per
process (and once per machine with the disk cache); loading it into another engine only relocates it.
"""
from __future__ import annotations

import llvmlite.binding as llvm

from trnc.errors import TrncError
from trnc.runtime.jit.codegen import Codegen


class Library:
    """The engine of one program and the address of each symbol loaded into it."""

    def __init__(self, codegen: Codegen):
        self._engine = codegen.engine()
        self._addresses: dict[str, int] = {}

    def __len__(self) -> int:
        """The symbols loaded so far."""
        return len(self._addresses)

    def address(self, symbol: str, obj: bytes) -> int:
        """The address of `symbol`, loading the object code that defines it the first time it is asked for."""
        address = self._addresses.get(symbol)
        if address is not None:
            return address
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._engine.finalize_object()
        address = self._engine.get_function_address(symbol)
        if not address:
            raise TrncError(f"JIT: object code does not define '{symbol}'")
        self._addresses[symbol] = address
        return address
