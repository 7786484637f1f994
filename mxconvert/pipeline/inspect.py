"""`inspect`: layout descriptors of a checkpoint or an artifact, and the diff of two.

Both kinds of input are described in the same vocabulary, keyed by the runtime parameter names
(`model.layers.L.mlp.experts.w13_weight`, ...), so a checkpoint can be diffed against an artifact
and two artifacts against each other: target fields, missing tensors, descriptor fields (row
order, padding, scale encoding and swizzle, view) and, where descriptors agree, the bytes.
Describing is mxconvert/pipeline/inspect_describe.py, diffing mxconvert/pipeline/inspect_diff.py.

Describing reads headers and manifests only, so it does not import torch (seconds on a GPU host,
bench/CHANGELOG.md "Session 6"); the diff's byte comparisons import it when they run.
"""

from __future__ import annotations

from mxconvert.pipeline.inspect_describe import CHECKPOINT_ROW_ORDER, Description, describe_input
from mxconvert.pipeline.inspect_diff import DIFF_FIELDS, TARGET_FIELDS, diff_descriptions

__all__ = ["CHECKPOINT_ROW_ORDER", "DIFF_FIELDS", "TARGET_FIELDS", "Description", "describe", "diff"]


def describe(
    path: str,
    *,
    rank: int | None = None,
    layer: int | None = None,
    tensor: str | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
) -> Description:
    """Describe the expert tensors of a checkpoint or an artifact: dtype, stored shape, the view the
    kernel holds (shape and strides), row order, padding, scale encoding and swizzle, layout steps.

    Reads headers and the manifest only (no tensor bytes, no torch). An artifact's manifest is
    checked as `load_artifact` checks it (a malformed or inconsistent one is refused).

    Args:
        path (`str`):
            An artifact folder (one holding `mxconvert.json`), a checkpoint folder, or a hub repo id.
        rank (`int`, *optional*):
            The rank of an artifact to describe (default: the first it holds).
        layer (`int`, *optional*):
            Only the tensors of this layer.
        tensor (`str`, *optional*):
            Only this tensor: its runtime name (`w13_weight_scale`) or full key.
        revision (`str`, *optional*):
            Hub revision of a checkpoint given as a repo id.
        cache_dir (`str`, *optional*):
            Hub cache folder.

    Returns:
        `Description`: `kind` (`"checkpoint"` or `"artifact"`), `path`, `summary`, `target`,
        `tensors` (key -> descriptor, in layer order) and `files`; `to_json()` is what
        `mxconvert inspect --json` prints. Pass two to `diff`.

    Raises:
        `InputError`: the path is neither a readable checkpoint nor an artifact with a valid
            manifest, the artifact has no rank `rank`, or no tensor matches `layer` / `tensor`.

    Example:

    ```python
    from mxconvert.pipeline.inspect import describe

    desc = describe("gpt-oss-h100", layer=0)
    for key, info in desc.tensors.items():
        print(key, info["dtype"], info["shape"], info["view_stride"])
    ```
    """
    return describe_input(path, rank, layer, tensor, revision, cache_dir)


def diff(a: Description, b: Description, *, progress=None) -> dict:
    """The differences between two described inputs (checkpoint or artifact, in any pairing).

    Compares the target fields, which expert tensors each holds, their descriptors (dtype, shape,
    view, row order, padding, scale encoding, swizzle, steps) and, where the descriptors agree,
    their bytes (first differing expert and index); then the non-expert tensors (presence, dtype,
    shape, bytes), the copied files (config, tokenizer) and the sources (identity, layout, hashes).

    Args:
        a (`Description`):
            The first input, from `describe`.
        b (`Description`):
            The second input, from `describe`.
        progress (*optional*):
            An object with `total` and `advance(nbytes, detail)` for the byte comparisons
            (`mxconvert.core.progress.Progress`).

    Returns:
        `dict`: `same` (True only when nothing differs), `a`, `b` (the paths) and one list per
        kind of difference: `target`, `only_in_a`, `only_in_b`, `descriptors`, `bytes`,
        `other_tensors`, `copied_files`, `source`; each entry has a `text` where it is shown.
        It is what `mxconvert inspect A B --json` prints.

    Raises:
        `InputError`: a tensor's bytes cannot be read from an artifact (a file that left its
            folder); `MismatchError`: a stored tensor is not what its manifest says.

    Example:

    ```python
    from mxconvert.pipeline.inspect import describe, diff

    result = diff(describe("art-vllm-0.33"), describe("art-vllm-0.34"))
    if not result["same"]:
        for change in result["descriptors"]:
            print(change["tensor"], [c["text"] for c in change["changes"]])
    ```
    """
    return diff_descriptions(a, b, progress)
