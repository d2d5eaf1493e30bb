import hashlib
import os
import random
import sys

import numpy as np
import pytest
import torch

# Test helpers shared across folders (strategies.py) are imported by name: `import strategies`.
sys.path.insert(0, os.path.dirname(__file__))

# torchvision (and transformers' vision models, which import it) beside torch's CPU build: benchmarks/vision.py says
# why.
from trnc.bench.vision import torchvision  # noqa: E402

torchvision()

# Every test runs the compiler's passes: a compiled model from an earlier run's disk cache would skip them.
# The JIT's kernel cache stays on. Tests of the compile cache turn it on in their own folders.
os.environ["TRNC_COMPILE_CACHE"] = "0"
os.environ["TRNC_DEBUG"] = "1"   # the tile-level verifier after every tile pass


@pytest.fixture(autouse=True)
def seeded_rngs(request):
    """Every test starts from the same RNG state whatever ran before it in its worker: torch, numpy and random are
    seeded from the test's own id, and so is a module's own generator (a numpy Generator named RNG, which the
    module's helpers draw from), so a test's draws depend neither on import nor on test order."""
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:4], "little")
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    if isinstance(getattr(request.module, "RNG", None), np.random.Generator):
        request.module.RNG = np.random.default_rng(seed)


def pytest_terminal_summary(terminalreporter):
    """After a run that swept the OpInfo ops (tests/test_opinfo.py), the on-device share docs/coverage.md now holds."""
    reports = [r for outcome in ("passed", "failed") for r in terminalreporter.stats.get(outcome, [])]
    if not any("test_opinfo.py::" in getattr(r, "nodeid", "") for r in reports):
        return
    coverage = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "coverage.md")
    for line in open(coverage).read().splitlines():
        if "on device:" in line and line.startswith("An op counts"):
            terminalreporter.write_line("OpInfo sweep: " + line.split("; ", 1)[1].rstrip("."))
