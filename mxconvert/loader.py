"""Loading an artifact: the kernel-format tensors exactly as the kernel holds them.

Fail-closed: the manifest's fingerprint must match its content and what the caller expects, and
every file of the rank must have the recorded size and sha256. Any mismatch names the field or
file. A tensor the kernel holds as a view (triton_kernels' transposed storage) is returned as that
view of its dense buffer; where a kernel reads past the end of a buffer, the buffer is placed so
that the recorded number of zero bytes follows it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checkpoint import sha256_file
from .errors import InputError, MismatchError
from .manifest import MANIFEST_NAME, check_fingerprint, read_manifest
from .safetensors_io import ShardReader

#: Keys a caller may pin with `expect=`; each maps to a manifest field.
EXPECTABLE = {
    "fingerprint": ("fingerprint",),
    "backend": ("target", "backend"),
    "kernel_class": ("target", "kernel_class"),
    "runtime_revision": ("target", "runtime_revision"),
    "revision": ("target", "runtime_revision"),
    "profile": ("target", "profile"),
    "platform": ("target", "platform"),
    "capability": ("target", "capability"),
    "gfx": ("target", "gfx"),
    "activation": ("target", "activation"),
    "tp_size": ("target", "tp_size"),
    "ep_size": ("target", "ep_size"),
    "hidden_size_padded": ("target", "hidden_size_padded"),
    "intermediate_size_padded": ("target", "intermediate_size_padded"),
    "triton_kernels": ("target", "runtime", "triton_kernels"),
    "flashinfer": ("target", "runtime", "flashinfer"),
    "num_experts": ("model", "num_experts"),
    "num_layers": ("model", "num_layers"),
    "schema": ("schema",),
}


@dataclass
class LoadedArtifact:
    """One rank of an artifact: kernel-format expert tensors and the pass-through tensors."""

    path: Path
    manifest: dict
    rank: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    layouts: dict[str, dict] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def target(self) -> dict:
        return self.manifest["target"]


def _lookup(manifest: dict, path: tuple[str, ...]):
    value = manifest
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def check_expectations(manifest: dict, expect: dict, where: Path) -> None:
    for key, wanted in expect.items():
        if key not in EXPECTABLE:
            raise InputError(f"cannot expect {key!r}; known fields: {', '.join(sorted(EXPECTABLE))}")
        actual = _lookup(manifest, EXPECTABLE[key])
        if isinstance(wanted, tuple):
            wanted = list(wanted)
        if key == "backend" and isinstance(wanted, str) and isinstance(actual, str):
            from .backends import backend_matches  # enum names in any case, and --moe-backend names
            if backend_matches(actual, wanted, _lookup(manifest, ("target", "format")) or "mxfp4"):
                continue
        if actual != wanted:
            raise MismatchError(
                f"{where}: field '{key}' is {actual!r} in the artifact, expected {wanted!r}"
            )


def check_files(artifact: Path, entries: list[dict]) -> None:
    """Size and sha256 of each listed file, against the manifest."""
    for entry in entries:
        path = artifact / entry["file"]
        if not path.is_file():
            raise MismatchError(f"{path}: missing (listed in {MANIFEST_NAME})")
        size = path.stat().st_size
        if size != entry["size"]:
            raise MismatchError(f"{path}: size {size} bytes, manifest says {entry['size']}")
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise MismatchError(f"{path}: sha256 {digest} does not match the manifest ({entry['sha256']})")


def rank_entry(manifest: dict, rank: int, where: Path) -> dict:
    for entry in manifest["ranks"]:
        if entry["rank"] == rank:
            return entry
    have = [e["rank"] for e in manifest["ranks"]]
    raise InputError(f"{where}: has no rank {rank} (ranks in this artifact: {have})")


def load_artifact(path: str | Path, rank: int = 0, expect: dict | None = None, *,
                  verify_checksums: bool = True, include_shared: bool = True,
                  device: str | torch.device = "cpu") -> LoadedArtifact:
    """Load rank `rank` of the artifact at `path`.

    `expect` pins target fields (e.g. `{"backend": "TRITON", "runtime_revision": "vllm-0.33",
    "capability": [9, 0], "tp_size": 1}` or `{"fingerprint": "sha256:..."}`); any difference
    raises `MismatchError` naming the field.
    """
    root = Path(path)
    manifest = read_manifest(root)
    check_fingerprint(manifest, root)
    check_expectations(manifest, expect or {}, root / MANIFEST_NAME)
    entry = rank_entry(manifest, rank, root)
    if verify_checksums:
        check_files(root, entry["files"] + (manifest["shared"]["files"] if include_shared else []))
    loaded = LoadedArtifact(root, manifest, rank)
    readers: dict[str, ShardReader] = {}

    def reader(rel: str) -> ShardReader:
        if rel not in readers:
            readers[rel] = ShardReader(root / rel)
        return readers[rel]

    for key, info in entry["tensors"].items():
        raw = reader(info["file"]).get(key)
        desc = info["layout"]
        if list(raw.shape) != desc["buffer_shape"] or str(raw.dtype).removeprefix("torch.") != desc["dtype"]:
            raise MismatchError(
                f"{root / info['file']}: tensor {key} is {raw.dtype} {list(raw.shape)}, manifest says "
                f"{desc['dtype']} {desc['buffer_shape']}"
            )
        loaded.tensors[key] = _place(raw, desc, device)
        loaded.layouts[key] = desc
    if include_shared:
        for key, info in manifest["shared"]["tensors"].items():
            loaded.tensors[key] = reader(info["file"]).get(key).to(device)
    return loaded


def _place(raw: torch.Tensor, desc: dict, device) -> torch.Tensor:
    """Copy the buffer to `device`, followed by `overread_bytes` zeros, and apply the view."""
    slack = int(desc.get("overread_bytes", 0))
    nbytes = raw.numel() * raw.element_size()
    backing = torch.zeros(nbytes + slack, dtype=torch.uint8, device=device)
    backing[:nbytes] = raw.contiguous().view(-1).view(torch.uint8).to(device)
    buffer = backing[:nbytes].view(raw.dtype)
    view = buffer.as_strided(desc["view_shape"], desc["view_stride"])
    if "kernel_dtype" in desc:  # e.g. AITER holds its weights as float4_e2m1fn_x2 (same bytes)
        view = view.view(getattr(torch, desc["kernel_dtype"]))
    return view
