import os
import sys

# Test helpers shared across folders (strategies.py) are imported by name: `import strategies`.
sys.path.insert(0, os.path.dirname(__file__))

# Every test runs the compiler's passes: a compiled model from an earlier run's disk cache would skip them.
# The JIT's kernel cache stays on. Tests of the compile cache turn it on in their own folders.
os.environ["TRNC_COMPILE_CACHE"] = "0"
