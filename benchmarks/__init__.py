"""Benchmark scripts: each prints one table, figure beside baseline."""
