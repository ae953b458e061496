"""The package version (one place: the package, its checkpoints and run summaries)."""

__version__ = "0.1.0"
