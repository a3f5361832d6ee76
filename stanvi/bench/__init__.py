"""Benchmarks that print their figures (`stanvi bench ...`); tests check correctness, not time."""
