"""Hand-written reference scripts for benchmarks/timings.py.

Each makes the same tool calls as one edgeflow build, in one process, written out by hand:
no edgeflow stage code, only edgeflow's model zoo and datasets for the model and the data.
"""
