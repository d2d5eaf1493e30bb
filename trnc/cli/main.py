"""Entry point of the `trnc` command: registers the subcommands and maps errors to exit codes.

Exit codes: 0 ok, 1 usage, 2 a TrncError (bad input), 3 an internal error. Errors print
`error: ...` on stderr; the traceback only with -v.
"""
from __future__ import annotations

import argparse
import sys
import traceback

from trnc.cli import program_cmds
from trnc.errors import TrncError

SUBCOMMANDS = (program_cmds,)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trnc", description="trnc: compile PyTorch for a NeuronCore-like ISA.")
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of errors.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parsers(sub)
    return parser


def run_cli(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 1
    try:
        return args.drive(args)
    except TrncError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception:  # an internal error: a bug in trnc, not in the input
        traceback.print_exc()
        print("error: internal error (a bug in trnc; please report it with the traceback above)", file=sys.stderr)
        return 3


def main() -> None:
    sys.exit(run_cli())


if __name__ == "__main__":
    main()
