"""precdbg's version, written into every run.json and step file."""

__all__ = ["__version__"]

__version__ = "0.1.0"
