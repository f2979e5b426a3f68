"""The polyad version, written here only: ``pyproject.toml`` reads it (a dynamic
version), and the package, the CLI, the emitted C and the build metadata import it."""

__version__ = "0.1.0"
