"""The differential fuzzer of trnc (issue 11): random valid PyTorch programs, compiled and compared with eager.

Modules, in the order a program flows through them:

- program.py: a program as plain data (input specs, op records naming earlier values, outputs);
- ops.py: the op table (how each op reads in forward, its parameters, its float64 reference);
- generate.py: random programs over everything trnc lowers, drawn op by op against their reference;
- build.py, draw.py: the nn.Module, its parameters and inputs;
- reference.py: the float64 reference and the tolerance, from perturbed re-runs (the derivation is there);
- check.py: the verdict on one compiled run (structure, shapes, dtypes, values, JIT against reference);
- run.py: one program through trnc.compile or torch.compile(backend="trnc"), classified as an Outcome;
- pool.py: worker processes with a timeout, so a crash or a hang is counted rather than fatal;
- shrink.py, repro.py: a failure reduced to a minimal program, written as a standalone reproducer;
- campaign.py, __main__.py: `python -m tests.fuzz --n 10000 --seed S`, the long run.

tests/test_fuzz.py runs a quick, deterministic part of it in the suite.
"""
