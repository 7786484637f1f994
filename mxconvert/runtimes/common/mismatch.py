"""A difference between an artifact's target and a live worker, and the refusal that lists them.

Both runtime loaders (runtimes/vllm, runtimes/sglang) compare a manifest's `target` with facts read
from the running engine and turn every difference into a `Mismatch` naming the field, the artifact's
value and the live value; a refusal (`ArtifactMismatch`) carries them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from mxconvert.core.errors import MismatchError

#: The format of a manifest that records none: artifacts made before NVFP4 was added are GPT-OSS MXFP4.
LEGACY_FORMAT = "mxfp4"


@dataclass(frozen=True)
class Mismatch:
    field: str
    artifact: object
    live: object
    where: str = "worker"

    def line(self) -> str:
        return f"field '{self.field}': artifact has {self.artifact!r}, this {self.where} has {self.live!r}"


class ArtifactMismatch(MismatchError):
    """The artifact was made for another runtime than the live one (fail closed)."""

    def __init__(self, message: str, mismatches: list[Mismatch]):
        super().__init__(message)
        self.mismatches = mismatches


def artifact_format(target: dict) -> str:
    """The checkpoint format an artifact's target is for."""
    return target.get("format", LEGACY_FORMAT)


def expert_ids(ids: tuple[int, ...]) -> str:
    """`0..3` for a contiguous run, else the list."""
    ids = tuple(ids)
    if ids and ids == tuple(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return str(list(ids))


def check_layer_set(where: str, entry: dict, prefixes: list[str], engine: str) -> None:
    """The MoE layers the rank's manifest entry holds tensors for are exactly the layers the engine
    built (`prefixes`); `engine` ("vLLM", "SGLang") names the other side in the refusal."""
    held = {key.rsplit(".", 1)[0] for key in entry["tensors"]}
    live = set(prefixes)
    if held != live:
        raise ArtifactMismatch(
            f"{where}: MoE layers differ: only in the artifact {sorted(held - live)}, only in the "
            f"model {engine} built {sorted(live - held)}",
            [Mismatch("moe_layers", sorted(held), sorted(live))],
        )


def public_release(version: str) -> str:
    """`0.33.0+cpu` -> `0.33.0`: a local build label is the same release."""
    return version.split("+", 1)[0]
