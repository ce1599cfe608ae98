"""The benchmarks behind scripts/bench.py: one module each, and what they share (harness, load, results)."""
