"""A differential fuzzer for polyad: random well-formed kernels, each checked
against an independent pure-Python translation (values), finite differences
and JAX (gradients), the deterministic build at 1 and 2 threads, and ASan.

``python -m tests.fuzz --cases N --seed S`` runs cases S .. S+N-1 and prints
a summary; ``tests/test_fuzz.py`` runs a fixed-seed slice in the test suite.
"""
