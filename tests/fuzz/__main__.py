"""`python -m tests.fuzz`: the long differential fuzzing run (from the repository root).

    python -m tests.fuzz --n 10000 --seed 1 --precision bf16 --via backend --jobs 2 --out /tmp/fuzz_repros

prints the outcome counts, the unsupported ops with their counts, and the distinct bugs with their
reproducer files; it exits 1 when a program failed (mismatch, error or crash), else 0.
"""
import argparse
import sys
import tempfile
from pathlib import Path

from .reference import PRECISIONS
from .run import VIAS, Config


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description="Differential fuzzing of trnc.")
    parser.add_argument("--n", type=int, default=100, help="programs to run; default 100.")
    parser.add_argument("--first", type=int, default=0,
                        help="index of the first program, to resume a stopped run; default 0.")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed (program i has seed*10**6+i); default 0.")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32 (auto_cast none) or bf16 (auto_cast all); default fp32.")
    parser.add_argument("--via", choices=VIAS, default="api",
                        help="api: trnc.compile; backend: torch.compile(backend='trnc'); default api.")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes; default 2.")
    out = Path(tempfile.gettempdir()) / "fuzz_repros"
    parser.add_argument("--out", type=Path, default=out, help=f"folder of the reproducers; default {out}.")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per program; default 300.")
    parser.add_argument("--shrink-budget", type=int, default=300, help="runs per shrink; default 300.")
    parser.add_argument("--shrink-limit", type=int, default=None,
                        help="failures shrunk per signature, e.g. 3 (the rest are written unshrunk); default all.")
    args = parser.parse_args(argv)

    import torch

    from .campaign import run_campaign
    torch.set_num_threads(1)
    config = Config(args.precision, args.via)
    report = run_campaign(args.n, args.seed, config, args.jobs, args.out, args.timeout, args.shrink_budget,
                          args.shrink_limit, log=lambda line: print(line, file=sys.stderr, flush=True),
                          first=args.first)
    print(report.text())
    return 1 if any(o.failed for o in report.outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
