"""Process replay of a campaign: a hash of what trnc emits for each fuzz program, so that two commits compare.

A long campaign (`python -m tests.fuzz`) takes hours and judges the commit it ran on. A later change that leaves
the emitted program and the constants of every one of those programs byte for byte alone cannot change any of
their outcomes, so the campaign's verdict carries over to it; a change that alters some shows which. Only trnc's
compile runs here (the programs are generated, with their float64 lanes, exactly as the campaign generates
them), through trnc.compile at the campaign's precision:

    python -m tests.fuzz.replay --n 2000 --seed 5555 --precision fp32 --out before.json
    python -m tests.fuzz.replay --compare before.json after.json

--compare prints the seeds whose hash differs, and exits 1 if any does.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

import trnc
from trnc.errors import TrncError

from .campaign import SEED_STRIDE
from .generate import generate
from .reference import PRECISIONS
from .run import AUTO_CAST


def fingerprint(seed: int, precision: str) -> str:
    """sha256 of the program's assembly, its unnamed values renumbered as the golden programs are (node names
    count up through a process, so they depend on what ran before), and of its constants in declaration order;
    or the error's type and message."""
    from ..golden import assembly
    case = generate(seed, precision)
    try:
        with torch.no_grad():
            compiled = trnc.compile(case.module, tuple(case.inputs), precision=precision,
                                    auto_cast=AUTO_CAST[precision], cache=False)
    except TrncError as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    digest = hashlib.sha256(assembly(compiled).encode())
    for tensor in compiled.program.tensors:
        if tensor.name in compiled.constants:
            digest.update(compiled.constants[tensor.name].tobytes())
    return digest.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.replay", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="programs; default 1000.")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed, as in python -m tests.fuzz; default 0.")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="default fp32.")
    parser.add_argument("--out", type=Path, help="write the hashes here (JSON), e.g. before.json.")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="compare two files of hashes instead.")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        differ = sorted(s for s in before.keys() & after.keys() if before[s] != after[s])
        print(f"{len(before.keys() & after.keys())} programs in both, {len(differ)} differ"
              + (": " + ", ".join(differ[:50]) if differ else ""))
        return 1 if differ else 0
    torch.set_num_threads(1)
    hashes = {}
    for i in range(args.n):
        seed = args.seed * SEED_STRIDE + i
        hashes[str(seed)] = fingerprint(seed, args.precision)
        if (i + 1) % 100 == 0:
            print(f"{i + 1}/{args.n}", file=sys.stderr, flush=True)
    text = json.dumps(hashes, indent=0)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
