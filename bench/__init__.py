"""Benchmark harness for hitl-gate: ``python -m bench.run`` (see bench/README.md)."""
