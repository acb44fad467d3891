"""Benchmarks behind `imaging-ai bench`; each prints a table ending in a headline: line."""
