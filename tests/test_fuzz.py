"""The quick, deterministic run of the differential fuzzer (tests/fuzz): fixed seeds at fp32 and bf16, through
trnc.compile and torch.compile(backend="trnc"), in chunks that pytest-xdist spreads over its workers.

Every program must match eager within the tolerance reference.py derives (no mismatch, no error), and where
the JIT also runs on the reference interpreter the two must agree bit for bit. A failure prints each failing
program's source; `python -m tests.fuzz --seed 11 --n 80 --precision P --via V` shrinks it to a reproducer.
A last test checks that a reproducer file decides on its own as the fuzzer did.
"""
import subprocess
import sys

import numpy as np
import pytest
import torch

from fuzz import repro
from fuzz.build import Invalid, module_source, resolve
from fuzz.reference import prepare
from fuzz.regressions import PROGRAMS as PINNED
from fuzz.run import Config, run_program, run_seed

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


@pytest.mark.parametrize("seed", [202006905, 202009763, 111001791, 2222005245, 12002002341])
def test_the_tolerance_reaches_across_a_clamp_up_exp_and_through_attention(seed, one_thread):
    """Programs the long campaigns called mismatches, where the tolerance fell short and trnc was right:
    202006905 clamps a linear whose dot products cancel, 202009763 takes exp(8 tanh(a layer norm of near-equal
    bf16 values)) (reference.py, "magnified" ops); 111001791 is bf16 attention over three keys whose outputs
    cancel, where trnc rounds the normalized probabilities to bf16 and the lanes the unnormalized ones (eager's
    own error there is larger than trnc's; ops.py, _sdpa_reference); 2222005245 is the bf16 mean of 87 squares
    of grid values, whose roundings all go one way (reference.py, the rounding lane); 12002002341 feeds a bf16
    gelu of 2.03 to a linear whose bias cancels it, where every noisy lane's operand had snapped to the
    deterministic lane's grid point (reference.py, Lane.operand). All are matches now. The programs are pinned
    (fuzz/regressions.py): the generator's seeds draw others once its families change."""
    precision, _, program = PINNED[seed]
    outcome = run_program(program, Config(precision, "api"))
    assert outcome.kind == "match", outcome.message


def test_a_layer_norm_whose_rounding_decides_its_direction_is_redrawn(one_thread):
    """12002001450 normalizes two features 0.005 apart at 3.8, a third of a bf16 ulp: trnc rounded them to one
    value and returned 0.37 for a reference of 0.97 (eager in bf16: 0.17). No tolerance can judge that; the
    generator re-draws it (reference.py, OpDef.nats)."""
    precision, _, program = PINNED[12002001450]
    with pytest.raises(Invalid, match=r"node 9 \(layer_norm\): rounding errors of 1 / SAFETY nats"):
        prepare(program, precision)


@pytest.mark.parametrize("seed", [222001033, 222005423])
def test_bf16_programs_the_long_campaign_found_wrong_match(seed, one_thread):
    """Two bf16 programs of the campaign of 2026-12-01, wrong in trnc: 222001033 a linear with K = 3 whose bias
    was added after its outer products were rounded to bf16 (test_wrong_answers.py has the minimal form),
    222005423 a matvec that torch's table spells as a product and a sum in fp32, narrowed to bf16 products
    (passes/graph/legalize_matmul.py keeps aten.mv whole). Pinned programs, as above."""
    precision, _, program = PINNED[seed]
    outcome = run_program(program, Config(precision, "api"))
    assert outcome.kind == "match", outcome.message


def test_a_parallel_run_that_differs_from_the_serial_one_is_a_mismatch(monkeypatch, one_thread):
    """The api's run on the parallel driver is checked against a serial run, bit for bit: here a parallel run that
    flips the last bit of its outputs."""
    from trnc import flags
    from trnc.runtime.jit.executor import JitProgram
    run = JitProgram.run

    def off_by_one_ulp(self, inputs, **kw):
        outputs = run(self, inputs, **kw)
        if flags.get("TRNC_THREADS") > 1:
            for array in outputs.values():
                array.reshape(-1).view(np.uint8)[:1] ^= 1     # a view of the output, 0-d ones too
        return outputs

    monkeypatch.setattr(JitProgram, "run", off_by_one_ulp)
    outcome = run_seed(CAMPAIGN_SEED * 10 ** 6, Config("fp32", "api"))
    assert outcome.signature == "mismatch:threads", outcome.message
