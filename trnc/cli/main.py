"""Entry point of the `trnc` command: registers the subcommands and maps errors to exit codes.

Subcommands: compile (a model file to a .trnc artifact), run, profile, disasm (artifacts and ISA
programs), asm and verify (ISA programs), bench (the benchmark harness). Each `--help` ends with an example.

Exit codes: 0 ok, 1 usage (bad or missing arguments), 2 bad input (a TrncError or an unreadable
file), 3 an internal error (a bug in trnc; its traceback is printed). Bad input prints one line,
`error: ...`, on stderr, saying what is wrong and what to do; its traceback (with the exception
that caused it, e.g. the one a model file raised) only with -v or TRNC_LOG=debug.
"""
from __future__ import annotations

import argparse
import sys
import traceback

from trnc.cli import bench_cmds, model_cmds, program_cmds
from trnc.errors import TrncError
from trnc.log import debug_enabled

SUBCOMMANDS = (model_cmds, program_cmds, bench_cmds)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage mistake; trnc keeps 2 for bad input and uses 1 for usage."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(1, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trnc", description="trnc: compile PyTorch for a NeuronCore-like ISA.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print tracebacks of errors (as TRNC_LOG=debug does).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parsers(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    """A multi-line message (e.g. torch's reason, then trnc's hint) joined so stderr has one error line."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _debug() -> bool:
    """TRNC_LOG=debug; an invalid TRNC_LOG (itself the error being reported, maybe) counts as not debug."""
    try:
        return debug_enabled()
    except TrncError:
        return False


def run_cli(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:   # --help (0) or a usage error (1): return the code so tests can call run_cli
        return int(exit_.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 1
    try:
        return args.drive(args)
    except (TrncError, OSError) as exc:
        if args.verbose or _debug():
            traceback.print_exc()
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception:  # an internal error: a bug in trnc, not in the input
        traceback.print_exc()
        print("error: internal error (a bug in trnc; please report it with the traceback above)", file=sys.stderr)
        return 3


def main() -> None:
    sys.exit(run_cli())


if __name__ == "__main__":
    main()
