"""Typed process flags read from TRNC_* environment variables: the only reader of os.environ in trnc.

Each flag has a type, a default and a doc line; docs/env_vars.md lists exactly these flags (a test
checks it). A flag is read from the environment each time it is asked for, so a test that sets a
variable sees its effect; `override` sets flags for a scope without touching the environment, and
wins over it. A value that does not parse raises FlagError naming the variable and the values it takes.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trnc.errors import TrncError


class FlagError(TrncError):
    """An environment variable (or an override) holds a value its flag cannot take."""


def _bool(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("expected 0 or 1")
    return text == "1"


def _path(text: str) -> Path:
    if not text:
        raise ValueError("expected a directory path, got an empty string")
    return Path(text).expanduser()


def _level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
    return text.lower()


LOG_LEVELS = ("debug", "info", "warning", "error")


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("expected a whole number >= 1")
    return int(text)


def _torch_threads() -> int:
    import torch
    return torch.get_num_threads()


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trnc"


@dataclass(frozen=True)
class Flag:
    name: str                      # the environment variable
    parse: Callable[[str], object]  # text -> value; raises ValueError on a bad value
    default: Callable[[], object]  # the value when the variable is unset
    doc: str                       # one line: what it does, its values and default (docs/env_vars.md)


FLAGS: dict[str, Flag] = {f.name: f for f in (
    Flag("TRNC_CACHE_DIR", _path, _default_cache_dir,
         "directory of the JIT's disk cache of compiled kernels; default $XDG_CACHE_HOME/trnc or ~/.cache/trnc"),
    Flag("TRNC_CACHE", _bool, lambda: True,
         "1 (default): compiled kernels and compiled models are kept on disk and reused; 0: memory only"),
    Flag("TRNC_COMPILE_CACHE", _bool, lambda: True,
         "1 (default): trnc.compile reuses compiled models from disk (unless TRNC_CACHE=0); 0: it always compiles"),
    Flag("TRNC_LOG", _level, lambda: "warning",
         "log level of the `trnc` logger: debug, info, warning (default) or error; debug also shows tracebacks"),
    Flag("TRNC_PRINT_AFTER", _names, tuple,
         "comma-separated pass names (or all): print the IR, tile program or assembly after each; default none"),
    Flag("TRNC_DEBUG", _bool, lambda: False,
         "1: debug mode: the tile-level verifier runs after every tile pass too (the suite sets it); default 0"),
    Flag("TRNC_THREADS", _count, _torch_threads,
         "host threads a JIT run uses for the program's queues (and the verifier for its race walk); default "
         "torch's thread count; 1: the serial driver"),
    Flag("TRNC_ASSERT_CACHED", _bool, lambda: False,
         "1: any JIT compile (a kernel missing from the caches) raises an error, to check a warm run; default 0"),
)}

_overrides: dict[str, object] = {}


def get(name: str):
    """The typed value of flag `name`: an override, else the environment variable, else the default."""
    flag = _flag(name)
    if name in _overrides:
        return _overrides[name]
    text = os.environ.get(name)
    if text is None:
        return flag.default()
    return _parse(flag, text)


@contextlib.contextmanager
def override(**values) -> Iterator[None]:
    """Set flags for the scope of a `with` block, e.g. `override(TRNC_CACHE=False)`; text values are parsed."""
    parsed = {}
    for name, value in values.items():
        flag = _flag(name)
        parsed[name] = _parse(flag, value) if isinstance(value, str) else value
    saved = dict(_overrides)
    _overrides.update(parsed)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def _flag(name: str) -> Flag:
    try:
        return FLAGS[name]
    except KeyError:
        raise FlagError(f"unknown flag '{name}'; flags are {', '.join(FLAGS)}") from None


def _parse(flag: Flag, text: str):
    try:
        return flag.parse(text)
    except ValueError as e:
        raise FlagError(f"{flag.name}={text!r} is not valid: {e}") from None
