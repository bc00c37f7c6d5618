"""edgeflow: declarative, verified conversion of trained models to edge runtimes."""

__version__ = "0.1.0"
