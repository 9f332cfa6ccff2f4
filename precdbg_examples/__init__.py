"""Bundled example models (GPT-style) used by the demo, the tests and the benchmarks."""
__all__: list = []
