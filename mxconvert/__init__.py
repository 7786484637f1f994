"""mxconvert: offline pre-layout of FP4 MoE expert weights for the kernel a runtime will run.

`load_artifact` and `LoadedArtifact` are imported on first use (PEP 562), so that importing the
package (every CLI command does) does not pay for torch: `mxconvert --help`, `profiles` and
`select` start without it.
"""

from __future__ import annotations

from mxconvert.core.version import __version__

__all__ = ["LoadedArtifact", "load_artifact", "__version__"]


def __getattr__(name: str):
    """`load_artifact` and `LoadedArtifact` are imported on first use, so that the command line
    installs its signal handlers before torch is imported (mxconvert._entry)."""
    if name in ("LoadedArtifact", "load_artifact"):
        from mxconvert.artifact import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'mxconvert' has no attribute {name!r}")
