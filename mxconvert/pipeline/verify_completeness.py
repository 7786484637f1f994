"""`verify`'s completeness check: from the source and the recorded target it recomputes which
ranks (with which experts and rows), expert tensors, pass-through tensors and source files the
artifact must hold, and compares all of it with the manifest and the files' headers, so an edited
and re-sealed manifest (a rank relabelled, a layer or a pass-through tensor removed) fails."""

from __future__ import annotations

from pathlib import Path

from mxconvert.artifact.loader import check_rank_entry, check_rank_metadata
from mxconvert.artifact.manifest import MANIFEST_NAME, artifact_file
from mxconvert.artifact.manifest_schema import serve_mismatch
from mxconvert.artifact.parts import stored_keys
from mxconvert.core.errors import MxconvertError
from mxconvert.pipeline.plan import expert_key
from mxconvert.pipeline.verify_report import Problem, VerifyReport
from mxconvert.storage.safetensors_io import ShardReader


def check_completeness(root: Path, manifest: dict, ckpt, fmt, layout, broken: set[str], report: VerifyReport) -> None:
    """What the artifact must hold, recomputed from the source and the recorded target, against
    what the manifest and the files' headers say it holds."""

    def problem(message: str, file: str | None = None, tensor: str | None = None, rank: int | None = None):
        report.problems.append(Problem("completeness", message, file, tensor, rank))

    target = manifest["target"]
    if (why := serve_mismatch(target)) is not None:  # vLLM's options must give the sizes the ranks have
        problem(why)
    if manifest["model"] != ckpt.facts.to_json():
        problem("the manifest's model facts are not those of the source checkpoint")
    recorded = sorted(f["file"] for f in manifest["source"].get("files", []))
    actual = sorted(str(p.relative_to(ckpt.root)) for p in ckpt.source_files())
    if recorded != actual:
        problem(f"the manifest records source files {recorded}, the source has {actual}")
    try:
        plans = fmt.plan_ranks(ckpt, target["tp_size"], target["ep_size"])
    except MxconvertError as exc:
        problem(f"the recorded target's TP/EP sizes give no rank plan for this source ({exc})")
        return
    present = sorted(entry["rank"] for entry in manifest["ranks"])
    if present != list(range(len(plans))) and not (len(present) == 1 and 0 <= present[0] < len(plans)):
        problem(
            f"the artifact holds ranks {present}; tp {target['tp_size']} x ep {target['ep_size']} has "
            f"{len(plans)} ranks, so it must hold all of them (or one, written with --rank)"
        )
    expected_keys = {
        expert_key(layer, name): (layer, name) for layer in ckpt.moe_layers for name in layout.kernel_names
    }
    for entry in manifest["ranks"]:
        rank = entry["rank"]
        try:
            check_rank_entry(manifest, entry, root / MANIFEST_NAME)
        except MxconvertError as exc:
            problem(str(exc), rank=rank)
        tensors = entry["tensors"]
        for key in sorted(set(expected_keys) - set(tensors)):
            problem(f"rank {rank}: expert tensor {key} is missing", tensor=key, rank=rank)
        for key in sorted(set(tensors) - set(expected_keys)):
            problem(f"rank {rank}: {key} is not an expert tensor the source and target give", tensor=key, rank=rank)
        for key in sorted(set(tensors) & set(expected_keys)):
            if (tensors[key]["layer"], tensors[key]["name"]) != expected_keys[key]:
                problem(
                    f"rank {rank}: {key} is recorded as layer {tensors[key]['layer']} {tensors[key]['name']}",
                    tensor=key,
                    rank=rank,
                )
        _check_headers(root, entry["files"], tensors, broken, problem, rank)
    shared = manifest["shared"]
    expected_shared = set(ckpt.other_tensor_names())
    for key in sorted(expected_shared - set(shared["tensors"])):
        problem(f"pass-through tensor {key} of the source is missing", tensor=key)
    for key in sorted(set(shared["tensors"]) - expected_shared):
        problem(f"shared tensor {key} is not a pass-through tensor of the source", tensor=key)
    _check_headers(root, shared["files"], shared["tensors"], broken, problem, None)


def _check_headers(root: Path, files: list[dict], tensors: dict, broken: set[str], problem, rank: int | None) -> None:
    """Each file holds exactly the tensors the manifest places in it (and a rank file, its rank)."""
    for entry in files:
        rel = entry["file"]
        if rel in broken:
            continue
        try:
            reader = ShardReader(artifact_file(root, rel))
            if rank is not None:
                check_rank_metadata(reader.path, reader.metadata, rank)
        except MxconvertError as exc:
            problem(str(exc), rel, rank=rank)
            continue
        listed = stored_keys(tensors, rel)
        if set(reader.tensors) != listed:
            extra = sorted(set(reader.tensors) - listed)
            missing = sorted(listed - set(reader.tensors))
            problem(
                f"{rel} holds tensors the manifest does not place there ({extra[:3]}) or lacks listed "
                f"ones ({missing[:3]})",
                rel,
                rank=rank,
            )
