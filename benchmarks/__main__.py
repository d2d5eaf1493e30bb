"""python -m benchmarks: the same as `trnc bench`."""
from .harness import main

main()
