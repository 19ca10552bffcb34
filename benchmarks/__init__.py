"""Benchmarks of tflms; run ``python benchmarks/run.py --help``."""
