"""The quick, deterministic run of the differential fuzzer (tests/fuzz): fixed seeds at fp32 and bf16, through
trnc.compile and torch.compile(backend="trnc"), in chunks that pytest-xdist spreads over its workers.

Every program must match eager within the tolerance reference.py derives (no mismatch, no error), and where
the JIT also runs on the reference interpreter the two must agree bit for bit. A failure prints each failing
program's source; `python -m tests.fuzz --seed 11 --n 80 --precision P --via V` shrinks it to a reproducer.
A last test checks that a reproducer file decides on its own as the fuzzer did.
"""
import subprocess
import sys

import pytest
import torch

from fuzz import repro
from fuzz.build import module_source, resolve
from fuzz.reference import prepare
from fuzz.run import Config, run_seed

CAMPAIGN_SEED = 11          # program i has seed CAMPAIGN_SEED * 10**6 + i, as in `python -m tests.fuzz`
PROGRAMS = 80               # per configuration: 320 in all
CHUNK = 10
CONFIGS = [Config(p, v) for v in ("api", "backend") for p in ("fp32", "bf16")]
CHUNKS = [(c, start) for c in CONFIGS for start in range(0, PROGRAMS, CHUNK)]


@pytest.fixture
def one_thread():
    """One torch thread: the float64 lanes of the reference contend in more, on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("config,start", CHUNKS, ids=[f"{c.precision}-{c.via}-{s}" for c, s in CHUNKS])
def test_random_programs_match_eager(config, start, one_thread):
    outcomes = [run_seed(CAMPAIGN_SEED * 10 ** 6 + i, config) for i in range(start, start + CHUNK)]
    failed = [o for o in outcomes if o.kind in ("mismatch", "error")]
    report = []
    for o in failed:
        report.append(f"{o.signature}: {o.message.strip()[:600]}\n{module_source(o.program, resolve(o.program)[1])}")
    assert not failed, f"{len(failed)} of {len(outcomes)} programs failed at {config.name}:\n" + "\n".join(report)
    assert all(o.kind in ("match", "unsupported") for o in outcomes)
    if config.via == "api":
        assert any(o.reference_run for o in outcomes), "no program was small enough for the reference interpreter"


def test_a_reproducer_decides_on_its_own_as_the_fuzzer_did(tmp_path, one_thread):
    """The reproducer file of a program that matches exits 0: its own float64 reference (check.Float64Casts) and
    the packed tolerances agree with the fuzzer's lanes."""
    config = Config("bf16", "api")
    outcome = run_seed(CAMPAIGN_SEED * 10 ** 6 + 1, config)
    assert outcome.kind == "match", outcome.message
    path = tmp_path / "reproducer.py"
    path.write_text(repro.source(outcome.program, config, outcome, prepare(outcome.program, "bf16"), path.name, "test"))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("seed", [202006905, 202009763])
def test_the_tolerance_reaches_across_a_clamp_and_up_exp(seed, one_thread):
    """Two bf16 programs the long campaign called mismatches, where the tolerance fell short and trnc was right
    (reference.py, "magnified" ops): 202006905 clamps a linear whose dot products cancel, 202009763 takes
    exp(8 tanh(a layer norm of near-equal bf16 values)). Both are matches now."""
    outcome = run_seed(seed, Config("bf16", "api"))
    assert outcome.kind == "match", outcome.message
