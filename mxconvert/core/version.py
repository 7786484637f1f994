"""The package's version: recorded in every manifest (the up-to-date check compares it) and
printed by `mxconvert --version`. The package face re-exports it as `mxconvert.__version__`."""

__version__ = "0.1.0"
