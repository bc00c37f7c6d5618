"""The foreign-files benchmark's parts: the files (files.py) and one build as a row (build.py)."""
