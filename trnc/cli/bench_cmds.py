"""`trnc bench`: the benchmark harness (benchmarks/harness.py, installed as trnc.bench), over its model zoo."""
from __future__ import annotations

import argparse

from trnc.bench import harness


def drive_bench(args) -> int:
    harness.run(args)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("bench", help="benchmark the zoo: compile time against Inductor, modeled time against the "
                                     "roofline, host run against eager, SQNR per precision; writes a report.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=harness.epilog())
    harness.add_arguments(p)
    p.set_defaults(drive=drive_bench)
