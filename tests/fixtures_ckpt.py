"""Checkpoint fixtures for tests: tiny GPT-OSS variants, a local Hugging Face hub cache, fault planters.

The checkpoints come from `examples/make_tiny_gpt_oss.py` (loaded by path, since examples/ is not a
package); see its docstring for the on-disk format. Every function here is deterministic.

    EXAMPLE_DIR                                the committed examples/tiny-gpt-oss (read-only!)
    load_example_module()                      examples/make_tiny_gpt_oss.py as a module
    make_checkpoint(tmp_path, name=..., **kw)  -> Path   (a fresh copy; kw as write_tiny_gpt_oss)
    reference_tensors(**kw)                    -> TinyTensors (.hf, .original, .reference floats)
    make_hf_cache(tmp_path, repo_id=..., revision_sha=..., src=None, **kw) -> HfCache
    corrupt_header(path, mode="json")          a shard whose header is unreadable
    truncate(path, nbytes)                     a shard missing its last nbytes bytes
    drop_tensor(ckpt_dir, name)                a tensor absent (shard rewritten, index fixed)
    change_dtype(ckpt_dir, name, dtype)        a tensor with another dtype (values cast)
    change_shape(ckpt_dir, name, new_shape)    a tensor with another shape
    index_points_to_missing_shard(ckpt_dir)    the index names a shard file that is not there
    set_quant_method(ckpt_dir, value)          config.json quantization_config.quant_method changed
                                               (value None: that key removed, the block kept)
    drop_quantization_config(ckpt_dir)         config.json without its quantization_config block

`ckpt_dir` is a checkpoint root as written by `make_checkpoint`; tensor-level planters find the
tensor in the root (HF names) or in `original/` (OpenAI names) and keep every other byte, index
entry and the index's `metadata.total_size` consistent, so that each plants exactly one fault.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_SCRIPT = REPO_ROOT / "examples" / "make_tiny_gpt_oss.py"
#: The committed example (HF layout, 2 layers, 4 experts, H = I = 320, 2 shards, seed 0).
EXAMPLE_DIR = REPO_ROOT / "examples" / "tiny-gpt-oss"
#: A fixed, valid 40-hex commit sha for the fake hub cache.
DEFAULT_REVISION = "5b6e1a2c3d4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b"
INDEX_NAME = "model.safetensors.index.json"


def load_script(path: Path):
    """A script under examples/ as a module (imported once, by path; examples/ is no package)."""
    name = path.stem
    mod = sys.modules.get(name)
    if mod is not None and Path(getattr(mod, "__file__", "")).resolve() == path:
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def load_example_module():
    """The module `examples/make_tiny_gpt_oss.py`."""
    return load_script(EXAMPLE_SCRIPT)


# ----------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------

_BUILT: dict[tuple, Path] = {}
_BUILD_ROOT: Path | None = None


def _build_root() -> Path:
    global _BUILD_ROOT
    if _BUILD_ROOT is None:
        _BUILD_ROOT = Path(tempfile.mkdtemp(prefix="tiny-gpt-oss-"))
        atexit.register(shutil.rmtree, _BUILD_ROOT, True)
    return _BUILD_ROOT


def make_checkpoint(tmp_path: str | Path, name: str = "tiny-gpt-oss", **kw) -> Path:
    """A fresh copy of a tiny checkpoint at `tmp_path / name`; kw as `write_tiny_gpt_oss`
    (layout, num_layers, num_experts, hidden_size, intermediate_size, num_shards, seed, ...).

    Each distinct kw set is generated once per process and copied, so faults planted in one
    copy never leak into another."""
    key = tuple(sorted(kw.items()))
    src = _BUILT.get(key)
    if src is None or not src.is_dir():
        src = _build_root() / f"c{len(_BUILT)}"
        load_example_module().write_tiny_gpt_oss(src, **kw)
        _BUILT[key] = src
    dst = Path(tmp_path) / name
    shutil.copytree(src, dst)
    return dst


def reference_tensors(**kw):
    """`TinyTensors` (hf, original, reference float experts) for the same kw as make_checkpoint."""
    mod = load_example_module()
    fields = {k: v for k, v in kw.items() if k in mod.TinyConfig.__dataclass_fields__}
    return mod.build_tiny_gpt_oss_tensors(mod.TinyConfig(**fields))


# ----------------------------------------------------------------------------------------------
# Hugging Face hub cache
# ----------------------------------------------------------------------------------------------

_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")


@dataclass(frozen=True)
class HfCache:
    """A local hub cache holding one repo at one commit.

    cache_dir: pass as `cache_dir=` or set HF_HUB_CACHE to it (HF_HOME=cache_dir.parent works too).
    snapshot_dir: what `snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True)` returns.
    """

    cache_dir: Path
    repo_dir: Path
    snapshot_dir: Path
    repo_id: str
    revision: str
    ref: str

    def env(self, offline: bool = True) -> dict[str, str]:
        """Environment variables that point huggingface_hub at this cache."""
        env = {"HF_HUB_CACHE": str(self.cache_dir), "HF_HOME": str(self.cache_dir.parent)}
        if offline:
            env["HF_HUB_OFFLINE"] = "1"
        return env


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def make_hf_cache(
    tmp_path: str | Path,
    repo_id: str = "openai/gpt-oss-tiny",
    revision_sha: str = DEFAULT_REVISION,
    *,
    src: str | Path | None = None,
    ref: str = "main",
    write_tree_cache: bool = True,
    **ckpt_kw,
) -> HfCache:
    """Lay out `tmp_path/hub` exactly as huggingface_hub's cache holds a downloaded model repo:

        hub/models--{org}--{name}/blobs/<etag>            file contents (etag: sha256 for LFS files
                                                           such as *.safetensors, git blob sha1 else)
        hub/models--{org}--{name}/snapshots/<sha>/<path>  relative symlinks to ../../blobs/<etag>
        hub/models--{org}--{name}/refs/<ref>              the commit sha, no newline
        hub/models--{org}--{name}/trees/<sha>.json        tree listing (huggingface_hub >= 2.x)

    The files are those of `src` (a checkpoint folder) or of `make_checkpoint(**ckpt_kw)`.
    """
    if len(revision_sha) != 40 or any(ch not in "0123456789abcdef" for ch in revision_sha):
        raise ValueError("revision_sha must be 40 lowercase hex characters")
    tmp_path = Path(tmp_path)
    if src is None:
        src = make_checkpoint(tmp_path, name="_hf_cache_src", **ckpt_kw)
        cleanup = True
    else:
        src, cleanup = Path(src), False
    cache_dir = tmp_path / "hub"
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    blobs = repo_dir / "blobs"
    snap = repo_dir / "snapshots" / revision_sha
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    tree: dict[str, dict] = {}
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src).as_posix()
        data = f.read_bytes()
        if f.suffix in _LFS_SUFFIXES:
            sha256 = hashlib.sha256(data).hexdigest()
            etag = sha256
            pointer = _lfs_pointer(sha256, len(data))
            tree[rel] = {
                "size": len(data),
                "blob_id": _git_blob_sha1(pointer),
                "lfs_sha256": sha256,
                "lfs_size": len(data),
            }
        else:
            etag = _git_blob_sha1(data)
            tree[rel] = {"size": len(data), "blob_id": etag}
        blob = blobs / etag
        if not blob.exists():
            blob.write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / ref).write_text(revision_sha)
    if write_tree_cache:
        (repo_dir / "trees").mkdir(exist_ok=True)
        (repo_dir / "trees" / f"{revision_sha}.json").write_text(
            json.dumps({"format_version": 1, "files": {k: tree[k] for k in sorted(tree)}}, indent=1)
        )
    if cleanup:
        shutil.rmtree(src)
    return HfCache(
        cache_dir=cache_dir, repo_dir=repo_dir, snapshot_dir=snap, repo_id=repo_id, revision=revision_sha, ref=ref
    )


# ----------------------------------------------------------------------------------------------
# Fault planters
# ----------------------------------------------------------------------------------------------


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _header(path: Path) -> dict:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def _folders(ckpt_dir: Path) -> list[Path]:
    ckpt_dir = Path(ckpt_dir)
    return [d for d in (ckpt_dir, ckpt_dir / "original") if d.is_dir()]


def _locate(ckpt_dir: Path, name: str) -> tuple[Path, Path]:
    """(folder, shard path) holding tensor `name`; the index is trusted when it names it."""
    for folder in _folders(ckpt_dir):
        index = folder / INDEX_NAME
        if index.is_file():
            wm = json.loads(index.read_text())["weight_map"]
            if name in wm and (folder / wm[name]).is_file():
                return folder, folder / wm[name]
        for shard in sorted(folder.glob("*.safetensors")):
            if name in _header(shard):
                return folder, shard
    raise KeyError(f"tensor {name!r} not found under {ckpt_dir}")


_ST_NAMES = {
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def _replace_tensor(ckpt_dir: Path, name: str, new: torch.Tensor | None) -> tuple[Path, Path]:
    """Rewrite the shard holding `name` with `new` in its place (None: without it) and keep the
    index's total_size / weight_map and original/dtypes.json in step."""
    folder, shard = _locate(ckpt_dir, name)
    meta = _header(shard).get("__metadata__")
    tensors = load_file(str(shard))
    old = tensors.pop(name)
    if new is not None:
        tensors[name] = new.contiguous()
    real = shard.resolve()  # a hub-cache snapshot entry is a symlink: rewrite its blob
    save_file(tensors, str(real), metadata=meta)
    delta = (0 if new is None else new.numel() * new.element_size()) - old.numel() * old.element_size()
    index = folder / INDEX_NAME
    if index.is_file():
        idx = json.loads(index.read_text())
        idx.setdefault("metadata", {})
        if "total_size" in idx["metadata"]:
            idx["metadata"]["total_size"] += delta
        if new is None:
            idx["weight_map"].pop(name, None)
        _write_json(index, idx)
    dtypes = folder / "dtypes.json"
    if dtypes.is_file():
        d = json.loads(dtypes.read_text())
        if name in d:
            if new is None:
                del d[name]
            elif new.dtype != old.dtype:
                d[name] = _ST_NAMES[new.dtype]
            _write_json(dtypes, d)
    return folder, shard


def corrupt_header(path: str | Path, mode: str = "json") -> None:
    """Make a safetensors file's header unreadable, leaving every other byte as it was.

    mode="json": the header's first byte `{` becomes `#` (length field intact, JSON invalid).
    mode="length": the 8-byte header length is set past the end of the file.
    """
    path = Path(path).resolve()
    data = bytearray(path.read_bytes())
    if mode == "json":
        if data[8:9] != b"{":
            raise ValueError(f"{path} does not start with a JSON header")
        data[8:9] = b"#"
    elif mode == "length":
        data[0:8] = struct.pack("<Q", len(data) + 1024)
    else:
        raise ValueError("mode must be 'json' or 'length'")
    path.write_bytes(bytes(data))


def truncate(path: str | Path, nbytes: int) -> int:
    """Cut the last `nbytes` bytes off the file (an interrupted download); returns the new size."""
    path = Path(path).resolve()
    size = path.stat().st_size
    if not 0 < nbytes <= size:
        raise ValueError(f"nbytes must be in 1..{size}")
    os.truncate(path, size - nbytes)
    return size - nbytes


def drop_tensor(ckpt_dir: str | Path, name: str) -> Path:
    """Remove tensor `name`: its shard is rewritten without it and the index no longer lists it
    (total_size reduced; original/dtypes.json entry removed). Returns the shard path."""
    return _replace_tensor(Path(ckpt_dir), name, None)[1]


def change_dtype(ckpt_dir: str | Path, name: str, dtype: torch.dtype) -> Path:
    """Store tensor `name` as `dtype` (values cast with `.to(dtype)`, shape kept). Returns the shard."""
    folder, shard = _locate(Path(ckpt_dir), name)
    old = load_file(str(shard))[name]
    if old.dtype == dtype:
        raise ValueError(f"{name} is already {dtype}")
    return _replace_tensor(Path(ckpt_dir), name, old.to(dtype))[1]


def change_shape(ckpt_dir: str | Path, name: str, new_shape) -> Path:
    """Store tensor `name` with `new_shape`, same dtype: a reshape when the element count
    matches, else the flattened values cut or cycled to the new count. Returns the shard."""
    folder, shard = _locate(Path(ckpt_dir), name)
    old = load_file(str(shard))[name]
    new_shape = tuple(int(x) for x in new_shape)
    if new_shape == tuple(old.shape):
        raise ValueError(f"{name} already has shape {new_shape}")
    n = 1
    for x in new_shape:
        n *= x
    flat = old.reshape(-1)
    if flat.numel() == 0:
        new = torch.zeros(new_shape, dtype=old.dtype)
    else:
        reps = -(-n // flat.numel())
        new = flat.repeat(reps)[:n].reshape(new_shape).clone()
    return _replace_tensor(Path(ckpt_dir), name, new)[1]


def index_points_to_missing_shard(ckpt_dir: str | Path, shard: str | None = None) -> str:
    """Delete one shard file that the index names (default: the last one), index untouched.

    Uses the root index, or original/'s when the root has none. Returns the missing file name."""
    for folder in _folders(Path(ckpt_dir)):
        index = folder / INDEX_NAME
        if index.is_file():
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            target = shard or names[-1]
            if target not in names:
                raise ValueError(f"{target} is not named by {index}")
            (folder / target).unlink()
            return target
    raise FileNotFoundError(f"no {INDEX_NAME} under {ckpt_dir}")


def set_quant_method(ckpt_dir: str | Path, value: str | None) -> None:
    """Set config.json's quantization_config.quant_method to `value` (None removes the key;
    quantization_config is created if absent). The HF config.json at the root is the one edited."""
    cfg_path = Path(ckpt_dir) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    qc = cfg.setdefault("quantization_config", {})
    if value is None:
        qc.pop("quant_method", None)
    else:
        qc["quant_method"] = value
    _write_json(cfg_path, cfg)


def drop_quantization_config(ckpt_dir: str | Path) -> None:
    """Remove the whole quantization_config block from the root config.json (an unquantized
    model's config), everything else kept."""
    cfg_path = Path(ckpt_dir) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if "quantization_config" not in cfg:
        raise KeyError(f"{cfg_path} has no quantization_config")
    del cfg["quantization_config"]
    _write_json(cfg_path, cfg)
