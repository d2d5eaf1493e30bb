"""Benchmarks: the `trnc bench` harness (zoo.py, measure.py, report.py, plots.py, harness.py; installed as
trnc.bench, also run as `python -m benchmarks`) and the scripts that measure one issue's goal each (bench_*.py)."""
