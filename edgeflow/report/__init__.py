"""Build reports: metrics.json (the DVC metrics file) and a human-readable report.md."""
