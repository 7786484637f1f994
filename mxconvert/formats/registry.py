"""The checkpoint formats by name, and opening a checkpoint of whichever format a source holds.

One pipeline, several formats: each format implements the `Format` protocol (formats/base.py) in
its own folder, and this module is the one place that lists them. `open_model` has storage resolve a
source (local folder or hub repo) and asks the formats, in `DETECTION_ORDER`, which one the
checkpoint is; for a hub repo the same question decides which files are fetched (`hub_file_chooser`).
docs/architecture.md, "Formats", says what a new format costs.
"""

from __future__ import annotations

from pathlib import Path

from mxconvert.formats.base import FORMATS, Ckpt, Format, Geometry, RankPlan, Specs, format_named
from mxconvert.formats.mxfp4.format import Mxfp4Format
from mxconvert.formats.nvfp4.format import Nvfp4Format
from mxconvert.storage.hub import ChooseFiles, folder_files
from mxconvert.storage.source import resolve_source

__all__ = [
    "DETECTION_ORDER",
    "FORMATS",
    "Format",
    "Geometry",
    "RankPlan",
    "Specs",
    "detect_format",
    "format_named",
    "format_of",
    "hub_file_chooser",
    "open_model",
]

FORMATS.update((f.name, f) for f in (Mxfp4Format(), Nvfp4Format()))

#: The order the formats are asked whether a folder holds one of their checkpoints: NVFP4's config
#: says so; GPT-OSS MXFP4, last, takes any other folder (its reader says what the folder lacks).
DETECTION_ORDER = ("nvfp4", "mxfp4")


def format_of(ckpt: Ckpt) -> Format:
    """The format of an opened checkpoint (each checkpoint class declares its `format_name`)."""
    return format_named(ckpt.format_name)


def detect_format(folder: Path) -> Format:
    """The format of the checkpoint in `folder`: the first in `DETECTION_ORDER` that recognizes it."""
    return next(FORMATS[name] for name in DETECTION_ORDER if FORMATS[name].recognizes(folder))


def hub_file_chooser(layout: str | None) -> ChooseFiles:
    """The files a hub fetch needs (storage/hub.py `fetch`): those of the checkpoint folder of the
    format the decision files show, honouring `--layout`."""

    def choose(snapshot: Path, repo_files: list[str]) -> list[str]:
        root = detect_format(snapshot).checkpoint_folder(snapshot, layout)
        return folder_files(snapshot, root, repo_files)

    return choose


def open_model(source: str, *, revision: str | None = None, cache_dir: str | None = None, layout: str | None = None):
    """Open a checkpoint of any supported format (local folder or hub repo id): an NVFP4 MoE
    checkpoint (ModelOpt or compressed-tensors) if its config says so, else GPT-OSS MXFP4."""
    resolved = resolve_source(source, hub_file_chooser(layout), revision=revision, cache_dir=cache_dir)
    ckpt = detect_format(resolved.folder).open_checkpoint(resolved.folder, resolved.identity, layout)
    ckpt.hub_snapshot = resolved.snapshot  # hub sha256 of the LFS files (describe_files), what was fetched
    return ckpt
