"""The parts of benchmarks/reliability.py, one module each, and what they share.

common (rows, the table, started edgeflow processes), demo (the demo build, cache contents),
recipe_tree, mutations and fuzz (the fuzz cases), fuzz_run (the fuzz part), kill, signals,
concurrent, untrusted, and inputs (small model and dataset files).
"""
