"""What a layout's inverse raises for a buffer that no canonical tensor lays out to."""

from __future__ import annotations

from mxconvert.core.errors import MismatchError


class InverseError(MismatchError):
    """A buffer is not the image of any canonical tensor (non-zero padding, inexact cast...)."""


class PaddingError(InverseError):
    """A buffer's padding does not hold the layout's pad value."""
