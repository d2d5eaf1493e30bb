"""`python -m tests.golden [--only NAME ...]`: compile the golden programs again and rewrite their files."""
import argparse
import time

from trnc.bench.vision import torchvision

from . import GOLDENS, write


def main() -> None:
    names = [g.name for g in GOLDENS]
    parser = argparse.ArgumentParser(prog="python -m tests.golden", description=__doc__)
    parser.add_argument("--only", nargs="*", choices=names, default=names, help="goldens to rewrite; default all.")
    args = parser.parse_args()
    torchvision()     # transformers imports torchvision: benchmarks/vision.py
    for golden in GOLDENS:
        if golden.name in args.only:
            start = time.perf_counter()
            write(golden)
            print(f"{golden.name}: written in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
