"""Verification: run artifacts in real runtimes and compare them with the source model."""
