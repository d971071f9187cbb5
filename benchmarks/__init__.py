"""Benchmarks: scripts that print figures and ratios against an anchor measured in the same run."""
