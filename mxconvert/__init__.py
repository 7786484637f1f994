"""mxconvert: offline pre-layout of FP4 MoE expert weights for the kernel a runtime will run."""
from __future__ import annotations

__version__ = "0.1.0"

from .loader import LoadedArtifact, load_artifact  # noqa: E402

__all__ = ["LoadedArtifact", "load_artifact", "__version__"]
