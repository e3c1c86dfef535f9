"""Benchmark scripts (not tests): each prints a table and writes JSON to benchmarks/results/."""
