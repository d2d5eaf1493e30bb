"""The OpInfo sweep in the suite: the first sample of every op of torch's op_db that takes float32 on CPU.

Each op is its own test id (`test_first_sample[nn.functional.gelu]`), run by tests/opinfo_sweep.py's
run_sample: compiled with fallback=False, and again with fallback=True when that raises. A test fails when its
op is wrong (structure, shape, dtype or value differs from eager), when a compile raises anything but an
UnsupportedOpError (and aot_eager does not raise it too), or when the UnsupportedOpError does not name the op.

Crashes: the tests run in the pytest process, so a segfault or an abort ends it. Under pytest-xdist (`pytest
-n 2 tests/test_opinfo.py`, as CI runs the suite) that is one worker, which xdist reports as a failure of the
test it was running and replaces, and the sweep goes on; a hang is made a crash by a faulthandler watchdog
(HANG_SECONDS). Child processes per op would cost a torch import each; the long run
(`python tests/opinfo_sweep.py --all-samples`) uses them.

docs/coverage.md: every test leaves its op's result in a folder the xdist workers of one run share (named by
xdist's run id); the test that finds every op's result there writes coverage.md from them, and the session's
summary (tests/conftest.py) prints its on-device share. A run of part of the ops (`-k`) leaves coverage.md
alone.
"""
import faulthandler
import json
import os
import tempfile
import uuid
from dataclasses import asdict
from pathlib import Path

import opinfo_sweep as sweep
import pytest

OPS = list(sweep.float32_ops())
HANG_SECONDS = 300   # a first sample takes under a second; the longest well under ten
RUN = Path(tempfile.gettempdir()) / f"trnc-opinfo-{os.environ.get('PYTEST_XDIST_TESTRUNUID') or uuid.uuid4().hex}"


def _put(path: Path, text: str) -> None:
    """Write whole or not at all: the other worker may be reading the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_coverage_when_all_done() -> None:
    """docs/coverage.md from every op's result, by the test that leaves the last one (a run whose worker crashed
    leaves an op without one: its failure is reported, and coverage.md stays as it was)."""
    done = [RUN / f"{name}.json" for name in OPS]
    if not all(path.exists() for path in done):
        return
    sweep.write_coverage([sweep.Result(**json.loads(path.read_text())) for path in done], all_samples=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", OPS)
def test_first_sample(name):
    op = sweep.float32_ops()[name]
    sample = sweep.samples(op)[0]
    RUN.mkdir(exist_ok=True)
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        result = sweep.run_sample(op, sample)
    finally:
        faulthandler.cancel_dump_traceback_later()
    _put(RUN / f"{name}.json", json.dumps(asdict(result)))
    _write_coverage_when_all_done()
    assert result.outcome not in sweep.FAILURES, f"{name}({result.inputs}): {result.outcome}: {result.detail}"
