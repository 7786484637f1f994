"""Loading an artifact: the kernel-format tensors exactly as the kernel holds them.

Fail-closed: the manifest's fingerprint must match its content and what the caller expects, and
every file of the rank must have the recorded size and digest (artifact/checksums.py). Any mismatch names the field or
file. A tensor the kernel holds as a view (triton_kernels' transposed storage) is returned as that
view of its dense buffer; where a kernel reads past the end of a buffer, the buffer is placed so
that the recorded number of zero bytes follows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from mxconvert.artifact.checksums import check_files as check_files  # runtimes/sglang/installer.py imports it here
from mxconvert.artifact.checksums import checked_path, map_checked
from mxconvert.artifact.manifest import MANIFEST_NAME, artifact_file, check_fingerprint, read_manifest, target_format
from mxconvert.artifact.manifest_schema import refuse_ambiguous_parallel, shown
from mxconvert.artifact.parts import Fetch, expected_spec, read_stored, stored_files
from mxconvert.core.dtypes import torch_dtype
from mxconvert.core.errors import InputError, MismatchError, MxconvertError
from mxconvert.core.parallel import default_jobs
from mxconvert.formats.base import RankPlan
from mxconvert.storage.safetensors_header import read_header
from mxconvert.target.profiles import builtin_name

if TYPE_CHECKING:
    import torch
else:  # imported where a tensor is loaded: `verify` uses the manifest checks alone (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch

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
        if not isinstance(key, str):
            raise InputError(f"cannot expect {key!r}; known fields: {', '.join(sorted(EXPECTABLE))}")
        if key not in EXPECTABLE:
            raise InputError(f"cannot expect {key!r}; known fields: {', '.join(sorted(EXPECTABLE))}")
        actual = _lookup(manifest, EXPECTABLE[key])
        if isinstance(wanted, tuple):
            wanted = list(wanted)
        if key == "backend" and isinstance(wanted, str) and isinstance(actual, str):
            # enum names in any case, and --moe-backend names
            from mxconvert.selection.vocabulary import backend_matches

            if backend_matches(actual, wanted, target_format(manifest["target"])):
                continue
        if key == "profile" and isinstance(wanted, str) and builtin_name(wanted) == actual:
            continue  # a built-in profile's name or alias, in any case (`sm90`, `H100` for h100)
        if actual != wanted:
            raise MismatchError(f"{where}: field '{key}' is {actual!r} in the artifact, expected {wanted!r}")


def check_device(device) -> None:
    """Refuse (InputError), before anything is read, a non-device or a CUDA device torch lacks."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"device={device!r}: not a torch device (expected 'cpu', 'cuda' or 'cuda:N')") from None
    count = torch.cuda.device_count() if dev.type == "cuda" and torch.cuda.is_available() else 0
    if dev.type == "cuda" and (dev.index or 0) >= count:
        raise InputError(
            f"device={device!r}: torch {torch.__version__} sees {count} CUDA device(s)"
            + ("" if torch.version.cuda else " (it is built without CUDA)")
            + "; load with device='cpu' (the default: the same tensors, on the host) or on a machine with that GPU"
        )


def check_copied_files(artifact: str | Path, manifest: dict) -> None:
    """The files the artifact copied from the source (config.json, generation_config.json, the
    tokenizer files, the chat template: `aux_files`), each of the recorded size and sha256.

    vLLM reads these itself (the model's config and tokenizer), so whoever serves an artifact
    checks them as it checks the tensors: `load_artifact` does (with `verify_checksums`), and the
    vLLM plugin calls this with the manifest it read (`read_manifest`) before vLLM reads them.

    Raises:
        `MismatchError`: a file is missing, has another size or sha256.
        `InputError`: a file leaves the artifact or is not a regular file.
    """
    check_files(Path(artifact), manifest.get("aux_files", []))


def check_rank_layouts(manifest: dict, entry: dict, where: Path) -> None:
    """Each expert tensor's recorded layout descriptor (dtype, buffer shape, view shape and
    strides, over-read, kernel dtype, steps) is the one the recorded target's layout gives for the
    rank's plan: the fields a reader applies are derived from the sealed target, never taken on
    the manifest's word (verify reports the same difference as a `layout` problem).

    Raises:
        `InputError`: the target gives no layout (an unknown format, backend or revision).
        `MismatchError`: a tensor the target's layout does not hold, or a descriptor that differs.
    """
    from mxconvert.formats.registry import Geometry, format_named

    target = manifest["target"]
    try:
        layout = format_named(target_format(target)).layout_from_target(target)
        specs = Geometry.from_target(target).specs(RankPlan(**entry["plan"]).num_experts)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, MxconvertError) as exc:
        raise InputError(f"{where}: the recorded target cannot be resolved to a layout ({exc})") from None
    for key, info in entry["tensors"].items():
        name = info["name"]
        if name not in layout.tensors and name not in layout.derived:
            raise MismatchError(f"{where}: tensor {key}: the target's layout has no tensor {name}")
        try:
            expected = layout.describe_tensor(name, specs)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, AssertionError) as exc:
            raise InputError(f"{where}: tensor {key}: the target's layout cannot describe it ({exc})") from None
        recorded = info["layout"]
        if recorded != expected:
            fields = sorted(k for k in set(recorded) | set(expected) if recorded.get(k) != expected.get(k))
            raise MismatchError(
                f"{where}: tensor {key}: its layout descriptor differs from the one the target's layout gives "
                f"(fields {', '.join(shown(f) for f in fields)}); refusing a view or size the target does not imply"
            )


def rank_entry(manifest: dict, rank: int, where: Path) -> dict:
    for entry in manifest["ranks"]:
        if entry["rank"] == rank:
            return entry
    have = [e["rank"] for e in manifest["ranks"]]
    raise InputError(f"{where}: has no rank {rank} (ranks in this artifact: {have})")


def rank_plans_of(manifest: dict, where: Path) -> list[RankPlan]:
    """Every rank's plan, recomputed from the recorded model and target (TP/EP sizes)."""
    from mxconvert.formats.registry import format_named

    target, model = manifest["target"], manifest["model"]
    facts = SimpleNamespace(num_experts=model.get("num_experts"), intermediate_size=model.get("intermediate_size"))
    try:
        fmt = format_named(target_format(target))
        return fmt.plan_ranks(SimpleNamespace(facts=facts), target["tp_size"], target["ep_size"])
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, MxconvertError) as exc:
        raise InputError(f"{where}: the recorded model and target give no rank plan ({exc})") from None


def check_rank_entry(manifest: dict, entry: dict, where: Path) -> None:
    """The entry is what rank `entry['rank']` of the recorded target holds: its plan (experts and
    rows) is the one recomputed from the target, and its files lie in its own folder."""
    rank = entry["rank"]
    plans = rank_plans_of(manifest, where)
    if not 0 <= rank < len(plans):
        raise MismatchError(
            f"{where}: lists rank {rank}, but the target (tp {manifest['target']['tp_size']}, "
            f"ep {manifest['target']['ep_size']}) has ranks 0..{len(plans) - 1}"
        )
    if entry["plan"] != plans[rank].to_json():
        raise MismatchError(
            f"{where}: rank {rank}'s plan {entry['plan']} is not the plan of rank {rank} "
            f"of the target ({plans[rank].to_json()}); refusing another rank's slice"
        )
    folder = f"{rank_folder(rank)}/"
    for f in entry["files"]:
        if not f["file"].startswith(folder):
            raise MismatchError(f"{where}: rank {rank} lists {f['file']}, which is not in {folder}")


def rank_folder(rank: int) -> str:
    return f"rank-{rank:05d}"


def check_rank_metadata(path: Path, metadata: dict[str, str], rank: int) -> None:
    """A rank file records its rank in its safetensors metadata: it must be this rank."""
    recorded = metadata.get("rank")
    if recorded is not None and recorded != str(rank):
        raise MismatchError(f"{path}: holds rank {recorded}'s tensors, listed as rank {rank}")


def load_artifact(
    path: str | Path,
    rank: int = 0,
    expect: dict | None = None,
    *,
    verify_checksums: bool = True,
    include_shared: bool = True,
    device: str | torch.device = "cpu",
) -> LoadedArtifact:
    """Load rank `rank` of the artifact at `path`: its expert tensors exactly as the kernel holds
    them (views applied, over-read zeros placed) and, with `include_shared`, the other tensors.

    Nothing is returned unless everything checked matches: the manifest's strict schema and
    fingerprint, the caller's expectations, the rank's plan and each tensor's layout descriptor
    (derived from the sealed target), and with `verify_checksums` the size and digest of every
    file read and of the copied files vLLM reads (config, tokenizer, chat template).

    Args:
        path (`str` or `os.PathLike`):
            The artifact folder (the one holding `mxconvert.json`).
        rank (`int`, *optional*, defaults to 0):
            The rank to load (a TP rank, or the EP rank with expert parallelism).
        expect (`dict`, *optional*):
            Target fields to pin, e.g. `{"backend": "TRITON", "runtime_revision": "vllm-0.33",
            "capability": [9, 0], "tp_size": 1}`, `{"profile": "sm90"}` (a built-in profile's name
            or alias, in any case) or `{"fingerprint": "sha256:..."}` (`EXPECTABLE`).
        verify_checksums (`bool`, *optional*, defaults to True):
            Check every file's digest (computed in parallel while the tensors are copied out).
        include_shared (`bool`, *optional*, defaults to True):
            Also load the pass-through tensors (attention, norms, embeddings).
        device (`str` or `torch.device`, *optional*, defaults to `"cpu"`):
            Where the tensors are placed.

    Returns:
        `LoadedArtifact`: `tensors` (key -> tensor), `layouts` (key -> descriptor of each expert
        tensor), `manifest`, `fingerprint` and `target`.

    Raises:
        `InputError`: the artifact is unusable (no or a malformed manifest, an odd argument, a rank
            it does not hold, a file that leaves the folder, a `device="cuda"` torch does not have).
        `MismatchError`: it is not what the manifest or the caller says (an edited manifest, an
            expectation, another rank's plan, a layout the target does not give, a size or digest).
        Every problem raises one of these (`MxconvertError`), never another exception.

    Example:

    ```python
    from mxconvert import load_artifact

    art = load_artifact("gpt-oss-h100", rank=0, expect={"backend": "TRITON", "tp_size": 1})
    w13 = art.tensors["model.layers.0.mlp.experts.w13_weight"]  # the view the kernel holds
    ```
    """
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise InputError(f"rank must be a whole number, got {rank!r}")
    if expect is not None and not isinstance(expect, dict):
        raise InputError(f"expect must be a dict of field -> value, got {type(expect).__name__}")
    check_device(device)
    root = Path(path)
    manifest = refuse_ambiguous_parallel(read_manifest(root), str(root / MANIFEST_NAME))
    check_fingerprint(manifest, root)
    check_expectations(manifest, expect or {}, root / MANIFEST_NAME)
    entry = rank_entry(manifest, rank, root)
    check_rank_entry(manifest, entry, root / MANIFEST_NAME)
    check_rank_layouts(manifest, entry, root / MANIFEST_NAME)
    loaded = LoadedArtifact(root, manifest, rank)
    files = {f["file"]: f for f in entry["files"] + (manifest["shared"]["files"] if include_shared else [])}
    rank_files = {f["file"] for f in entry["files"]}
    wanted = [(key, info, info["layout"]) for key, info in entry["tensors"].items()]
    if include_shared:
        wanted += [(key, info, None) for key, info in manifest["shared"]["tensors"].items()]
    for key, info, _ in wanted:
        for rel in stored_files(info):
            if rel not in files:
                raise MismatchError(
                    f"{root / MANIFEST_NAME}: tensor {key} is in {rel}, which the manifest does not list"
                )
    for entry_of_file in files.values():  # sizes before any buffer is allocated from the manifest's shapes
        checked_path(root, entry_of_file)
    if verify_checksums:  # what vLLM reads beside the tensors: config, tokenizer, chat template
        check_copied_files(root, manifest)
    # Tensors in file order; each file is mapped when first read and dropped after its last
    # tensor (or part of a split tensor) is placed, so about one file is mapped at a time.
    file_index = {rel: i for i, rel in enumerate(files)}
    work = sorted(wanted, key=lambda w: min(file_index[rel] for rel in stored_files(w[1])))
    last_use = {rel: i for i, (_, info, _) in enumerate(work) for rel in stored_files(info)}
    mapped: dict[str, tuple[torch.Tensor, dict, int]] = {}
    placed: dict[str, torch.Tensor] = {}
    checks: list[Callable[[], None]] = []

    def open_file(rel: str, pool) -> tuple[torch.Tensor, dict, int]:
        data, check = map_checked(root, files[rel], verify_checksums, pool)
        checks.append(check)
        tensors, metadata = read_header(artifact_file(root, rel))
        if rel in rank_files:
            check_rank_metadata(root / rel, metadata, rank)
        return data, tensors, 8 + int.from_bytes(data[:8].numpy().tobytes(), "little")

    with ThreadPoolExecutor(default_jobs(), thread_name_prefix="mxconvert-load") as pool:

        def fetch(rel: str, key: str) -> torch.Tensor:  # copied out while the digests are computed
            if rel not in mapped:
                mapped[rel] = open_file(rel, pool)
            data, tensors, data_start = mapped[rel]
            if key not in tensors:
                raise MismatchError(f"{root / rel}: has no tensor {key} (listed in {MANIFEST_NAME})")
            info = tensors[key]
            return (
                data[data_start + info.begin : data_start + info.end].view(torch_dtype(info.dtype)).reshape(info.shape)
            )

        try:
            for i, (key, info, desc) in enumerate(work):
                if desc is None:
                    placed[key] = _copy_to(read_stored(info, key, fetch, where=f"{root}/"), device)
                else:
                    placed[key] = place_stored_tensor(info, key, fetch, device, root, check_digests=verify_checksums)
                    loaded.layouts[key] = desc
                for rel in stored_files(info):
                    if last_use[rel] == i:
                        mapped.pop(rel, None)
            if verify_checksums:  # files holding nothing asked for are checked all the same
                for rel in files:
                    if rel not in last_use:
                        open_file(rel, pool)
        except MxconvertError:  # a checksum mismatch explains a broken header or tensor best
            for check in checks:
                check()
            raise
        finally:
            mapped.clear()
        for check in checks:  # nothing is returned unless every file matched
            check()
        if str(device).startswith("cuda"):
            torch.cuda.synchronize(device)
    loaded.tensors = {key: placed[key] for key, _, _ in wanted}
    loaded.layouts = {key: loaded.layouts[key] for key, _, desc in wanted if desc is not None}
    return loaded


def place_stored_tensor(
    info: dict, key: str, fetch: Fetch, device, root: Path, *, check_digests: bool = True
) -> torch.Tensor:
    """A rank tensor of the manifest (whole, or assembled from its parts) read through `fetch`
    straight into one buffer on `device` followed by `overread_bytes` zeros, with the kernel's view
    applied: the one way every consumer places an expert tensor (mxconvert/parts.py)."""
    desc = info["layout"]
    where = root / stored_files(info)[0]
    try:
        dtype_name, shape = expected_spec(info)
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {dtype_name!r}")
        slack = int(desc.get("overread_bytes", 0))
        if slack < 0:
            raise ValueError("negative overread_bytes")
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        backing = torch.empty(nbytes + slack, dtype=torch.uint8, device=device)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise InputError(f"{where}: tensor {key}: the manifest's buffer cannot be allocated ({exc})") from None
    backing[nbytes:].zero_()
    buffer = backing[:nbytes].view(dtype).view(shape)
    read_stored(info, key, fetch, out=buffer, check_digests=check_digests, where=f"{root}/")
    return _apply_view(buffer, desc, where, key)


def place_kernel_tensor(raw: torch.Tensor, desc: dict, device, where: Path, key: str) -> torch.Tensor:
    """Copy the buffer to `device`, followed by `overread_bytes` zeros, and apply the view."""
    try:
        slack = int(desc.get("overread_bytes", 0))
        if slack < 0:
            raise ValueError("negative overread_bytes")
        nbytes = raw.numel() * raw.element_size()
        backing = torch.empty(nbytes + slack, dtype=torch.uint8, device=device)
        backing[nbytes:].zero_()
        backing[:nbytes].copy_(raw.contiguous().view(-1).view(torch.uint8))
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise InputError(f"{where}: tensor {key}: the manifest's view cannot be applied ({exc})") from None
    return _apply_view(backing[:nbytes].view(raw.dtype), desc, where, key)


def _apply_view(buffer: torch.Tensor, desc: dict, where: Path, key: str) -> torch.Tensor:
    """The kernel's view (`view_shape`, `view_stride`, `kernel_dtype`) of a dense buffer."""
    try:
        buffer = buffer.reshape(-1)
        if _view_extent(desc["view_shape"], desc["view_stride"]) > buffer.numel():
            raise ValueError("the view reaches past the end of the buffer")
        view = buffer.as_strided(desc["view_shape"], desc["view_stride"])
        if "kernel_dtype" in desc:  # e.g. AITER holds its weights as float4_e2m1fn_x2 (same bytes)
            kernel_dtype = getattr(torch, str(desc["kernel_dtype"]), None)
            if not isinstance(kernel_dtype, torch.dtype):
                raise ValueError(f"unknown kernel_dtype {desc['kernel_dtype']!r}")
            view = view.view(kernel_dtype)
        return view
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise InputError(f"{where}: tensor {key}: the manifest's view cannot be applied ({exc})") from None


def _view_extent(shape: list[int], stride: list[int]) -> int:
    """Elements a strided view spans (0 for an empty view)."""
    if len(shape) != len(stride) or any(d < 0 for d in shape) or any(s < 0 for s in stride):
        raise ValueError(f"view shape {shape} and strides {stride} do not fit together")
    if any(d == 0 for d in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, stride))


def _copy_to(raw: torch.Tensor, device) -> torch.Tensor:
    """A tensor of its own on `device` (not a view of the whole file's bytes)."""
    out = torch.empty(raw.shape, dtype=raw.dtype, device=device)
    out.copy_(raw)
    return out
