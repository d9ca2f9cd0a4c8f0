"""The package version: the single source (setup.py reads it from this file without importing
the package; ``neuron_sift.__version__`` re-exports it)."""

__version__ = "0.8.0"
