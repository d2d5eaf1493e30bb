"""The `trnc` logger: one place that sets its level from TRNC_LOG and gives it a handler on stderr.

Modules log through `get_logger(__name__)`; the level is read from the flag each time a logger is
asked for, so `TRNC_LOG=debug` in the environment (or `flags.override(TRNC_LOG="debug")`) takes
effect without any setup. A handler is added only when the application configured none, so
an application's own logging setup is left alone.
"""
from __future__ import annotations

import logging

from trnc import flags

_ROOT = logging.getLogger("trnc")


def get_logger(name: str) -> logging.Logger:
    """The logger for module `name` (a child of `trnc`), with the `trnc` level taken from TRNC_LOG."""
    _ROOT.setLevel(flags.get("TRNC_LOG").upper())
    if not _ROOT.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("trnc %(levelname)s: %(message)s"))
        _ROOT.addHandler(handler)
    return logging.getLogger(name if name.startswith("trnc") else f"trnc.{name}")


def debug_enabled() -> bool:
    """TRNC_LOG=debug: the CLI prints tracebacks and passes log their details."""
    return flags.get("TRNC_LOG") == "debug"
