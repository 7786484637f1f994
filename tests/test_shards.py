"""`--max-shard-size` is honoured exactly: an expert tensor larger than the limit is stored as parts
of whole experts (docs/artifact.md, "Tensors split into parts"), and every reader (load_artifact,
verify, inspect, the vLLM plugin's layer source) gives the same tensors as the unsplit artifact."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import ROOT, flip_stored_bits, run_cli

from mxconvert.artifact.loader import load_artifact
from mxconvert.artifact.manifest import MANIFEST_NAME, read_manifest, seal
from mxconvert.artifact.parts import read_stored
from mxconvert.core.errors import InputError, MismatchError
from mxconvert.formats.registry import format_of, open_model
from mxconvert.pipeline.convert import execute
from mxconvert.pipeline.plan import TensorPlan, _expert_rows, _pack_files, make_plan
from mxconvert.runtimes.common.layer_source import LayerSource
from mxconvert.runtimes.vllm.install import EXPERT_NAMES
from mxconvert.selection import Deployment
from mxconvert.storage.safetensors_io import ShardReader
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision

EXAMPLES = ROOT / "examples"

#: (example, profile): TRITON with its transposed view (h100) and with the Blackwell scale view that
#: spans experts (thor), AITER's flat scale view, TRTLLM, and NVFP4 with computed scales.
CASES = [
    ("tiny-gpt-oss", "h100"),
    ("tiny-gpt-oss", "thor"),
    ("tiny-gpt-oss", "mi355x-aiter"),
    ("tiny-gpt-oss", "b200"),
    ("tiny-nvfp4-modelopt-qwen3", "b200"),
    ("tiny-nvfp4-ct-deepseek", "a100"),
]


def _bytes(dtype: str, shape: list[int]) -> int:
    return math.prod(shape) * getattr(torch, dtype).itemsize


def _limit(manifest: dict, with_shared: bool = True) -> int:
    """A limit that splits the largest expert tensor while one expert (and, `with_shared`, every
    pass-through tensor: those are never split) still fits."""
    tensors = manifest["ranks"][0]["tensors"].values()
    per_expert = max(_bytes(t["dtype"], t["shape"]) // t["shape"][0] for t in tensors)
    shared = max(_bytes(t["dtype"], t["shape"]) for t in manifest["shared"]["tensors"].values())
    limit = max(2 * per_expert, shared if with_shared else 0) + 2048
    assert max(_bytes(t["dtype"], t["shape"]) for t in tensors) > limit, "nothing would be split"
    return limit


def _convert_with_split_ranks(example: str, profile: str, out: Path, limit: int) -> None:
    """The NVFP4 examples' pass-through tensors (never split) are larger than their expert tensors,
    so no --max-shard-size splits their experts: plan with the default limit and pack the rank
    files with `limit`, the writer's own packing."""
    ckpt = open_model(str(EXAMPLES / example))
    plan = make_plan(ckpt, get_profile(profile), get_revision(None, format_of(ckpt).name), Deployment())
    for rp in plan.ranks:
        tensors = [t for f in plan.rank_files[rp.rank] for t in f.tensors]
        plan.rank_files[rp.rank] = _pack_files(f"rank-{rp.rank:05d}", tensors, limit, _expert_rows(rp))
    execute(plan, out, jobs=2)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()) and torch.equal(_as_bytes(a), _as_bytes(b))


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def pair(request, tmp_path_factory) -> tuple[Path, Path, int]:
    example, profile = request.param
    base = tmp_path_factory.mktemp("shards")
    whole, split = base / "whole", base / "split"
    assert run_cli("convert", EXAMPLES / example, "-p", profile, "-o", whole).exit_code == 0
    manifest = json.loads((whole / MANIFEST_NAME).read_text())
    if example.startswith("tiny-nvfp4"):
        limit = _limit(manifest, with_shared=False)
        _convert_with_split_ranks(example, profile, split, limit)
        return whole, split, limit
    limit = _limit(manifest)
    result = run_cli("convert", EXAMPLES / example, "-p", profile, "-o", split, "--max-shard-size", str(limit))
    assert result.exit_code == 0, result.output
    return whole, split, limit


def test_split_artifact_respects_the_limit_and_records_parts(pair):
    whole, split, limit = pair
    sizes = [p.stat().st_size for p in split.glob("rank-*/*.safetensors")]
    if "tiny-gpt-oss" in str(read_manifest(split)["provenance"]["source_path"]):  # written by the CLI
        sizes += [p.stat().st_size for p in split.glob("shared/*.safetensors")]
    assert sizes and max(sizes) <= limit
    manifest = read_manifest(split)
    entries = manifest["ranks"][0]["tensors"]
    parted = {k: e for k, e in entries.items() if "parts" in e}
    assert parted, "no tensor was split"
    for entry in parted.values():
        assert "file" not in entry and len(entry["parts"]) >= 2
        starts = [p["experts"][0] for p in entry["parts"]]
        stops = [p["experts"][1] for p in entry["parts"]]
        assert starts[0] == 0 and stops[-1] == entry["shape"][0] and starts[1:] == stops[:-1]
    # the tensors' descriptors are those of the unsplit artifact; only where the bytes are differs
    unsplit = read_manifest(whole)["ranks"][0]["tensors"]
    strip = lambda e: {k: v for k, v in e.items() if k not in ("file", "parts")}  # noqa: E731
    assert {k: strip(e) for k, e in entries.items()} == {k: strip(e) for k, e in unsplit.items()}


def test_every_reader_gives_the_tensors_of_the_unsplit_artifact(pair):
    whole, split, _ = pair
    a, b = load_artifact(whole), load_artifact(split)
    assert a.tensors.keys() == b.tensors.keys()
    for key in a.tensors:
        assert _same(a.tensors[key], b.tensors[key]), key
    verified = run_cli("verify", split, "--json")
    assert verified.exit_code == 0, verified.output
    report = json.loads(verified.stdout)
    assert report["ok"] and report["tensors_checked"] == len(read_manifest(split)["ranks"][0]["tensors"])
    compared = run_cli("inspect", whole, split, "--json")
    assert compared.exit_code == 0 and json.loads(compared.stdout)["same"] is True, compared.output
    manifest = read_manifest(split)
    entry = manifest["ranks"][0]
    prefix = next(k for k, e in entry["tensors"].items() if "parts" in e).rsplit(".", 1)[0]
    source = LayerSource(split, entry, prefix, manifest["target"], EXPERT_NAMES)
    for name, tensor in source.read(torch.device("cpu")).items():
        assert _same(tensor, a.tensors[f"{prefix}.{name}"]), name


def _tamper_first_part(split: Path) -> tuple[dict, str]:
    manifest = read_manifest(split)
    key, entry = next((k, e) for k, e in manifest["ranks"][0]["tensors"].items() if "parts" in e)
    part = entry["parts"][1]
    flip_stored_bits(split / part["file"], part["key"], 0, 0x01)
    return manifest, key


@pytest.fixture(scope="module")
def split_h100(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("split-h100")
    assert run_cli("convert", EXAMPLES / "tiny-gpt-oss", "-p", "h100", "-o", base / "whole").exit_code == 0
    limit = _limit(json.loads((base / "whole" / MANIFEST_NAME).read_text()))
    assert (
        run_cli(
            "convert", EXAMPLES / "tiny-gpt-oss", "-p", "h100", "-o", base / "split", "--max-shard-size", str(limit)
        ).exit_code
        == 0
    )
    return base / "split"


def test_a_tampered_part_is_caught(tmp_path, split_h100):
    split = tmp_path / "split"
    shutil.copytree(split_h100, split)
    manifest, key = _tamper_first_part(split)
    with pytest.raises(MismatchError, match="sha256"):
        load_artifact(split)
    result = run_cli("verify", split, "--json")
    assert result.exit_code == 1 and not json.loads(result.stdout)["ok"]
    # the part's own digest catches it where no file digest is checked (the vLLM plugin's reads)
    info = manifest["ranks"][0]["tensors"][key]
    with pytest.raises(MismatchError, match=r"experts .* has sha256"):
        read_stored(info, key, lambda rel, k: ShardReader(split / rel).get(k))
    source = LayerSource(split, manifest["ranks"][0], key.rsplit(".", 1)[0], manifest["target"], EXPERT_NAMES)
    with pytest.raises(MismatchError, match=r"experts .* has sha256"):
        source.read(torch.device("cpu"))


def _edited(split: Path, edit) -> Path:
    manifest = json.loads((split / MANIFEST_NAME).read_text())
    entry = next(e for e in manifest["ranks"][0]["tensors"].values() if "parts" in e)
    edit(entry)
    (split / MANIFEST_NAME).write_text(json.dumps(seal({k: v for k, v in manifest.items() if k != "fingerprint"})))
    return split


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda e: e["parts"][1]["experts"].__setitem__(0, e["parts"][1]["experts"][0] + 1), "do not continue"),
        (
            lambda e: e["parts"][-1]["experts"].__setitem__(1, e["parts"][-1]["experts"][1] - 1),
            "cover experts|do not continue",
        ),
        (lambda e: e["parts"].pop(), "cover experts"),
        (lambda e: e["parts"][0].__setitem__("file", "rank-00000/elsewhere.safetensors"), "not among the rank's files"),
        (lambda e: e["parts"][1].__setitem__("key", e["parts"][0]["key"]), "used twice"),
        (lambda e: e["parts"][0].pop("sha256"), "sha256"),
        (lambda e: e.__setitem__("file", e["parts"][0]["file"]), "both 'file' and 'parts'"),
        (lambda e: e.__setitem__("parts", []), "parts"),
    ],
    ids=["gap", "short", "missing", "file", "key", "digest", "both", "empty"],
)
def test_manifest_structure_checks_cover_parts(tmp_path, split_h100, edit, words):
    split = tmp_path / "split"
    shutil.copytree(split_h100, split)
    _edited(split, edit)
    with pytest.raises(InputError, match=words):
        read_manifest(split)
    result = run_cli("verify", split)
    assert result.exit_code == 2 and re.search(words, result.stderr)


def test_a_shared_tensor_with_parts_is_refused(tmp_path, split_h100):
    split = tmp_path / "split"
    shutil.copytree(split_h100, split)
    manifest = json.loads((split / MANIFEST_NAME).read_text())
    info = manifest["shared"]["tensors"]["lm_head.weight"]
    info["parts"] = [{"file": info["file"], "key": "lm_head.weight", "experts": [0, info["shape"][0]], "sha256": "0"}]
    (split / MANIFEST_NAME).write_text(json.dumps(seal({k: v for k, v in manifest.items() if k != "fingerprint"})))
    with pytest.raises(InputError, match="never split"):
        read_manifest(split)


def test_one_expert_above_the_limit_is_refused_with_the_smallest_limit_that_works(tmp_path):
    refused = run_cli(
        "convert",
        EXAMPLES / "tiny-gpt-oss",
        "-p",
        "h100",
        "-o",
        tmp_path / "a",
        "--max-shard-size",
        "50KB",
        "--dry-run",
    )
    assert refused.exit_code == 2 and "one expert of tensor" in refused.stderr
    smallest = int(refused.stderr.split("use --max-shard-size ")[1].split()[0])
    # a pass-through tensor larger than that is never split: it gives its own smallest size
    shared = run_cli(
        "convert",
        EXAMPLES / "tiny-gpt-oss",
        "-p",
        "h100",
        "-o",
        tmp_path / "b",
        "--max-shard-size",
        str(smallest),
        "--dry-run",
    )
    assert shared.exit_code == 2 and "pass-through tensors are not split" in shared.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("experts", [4, 128])
def test_the_smallest_limit_named_is_exact(experts):
    t = TensorPlan("model.layers.0.mlp.experts.w13_weight", 0, "w13_weight", torch.uint8, (experts, 100, 100))
    with pytest.raises(InputError, match="one expert") as err:
        _pack_files("rank-00000", [t], 10_000, lambda _: None)
    smallest = int(str(err.value).split("use --max-shard-size ")[1].split()[0])
    files = _pack_files("rank-00000", [t], smallest, lambda _: None)
    assert [f.tensors[0].rows for f in files] == [(e, e + 1) for e in range(experts)]
    with pytest.raises(InputError):
        _pack_files("rank-00000", [t], smallest - 1, lambda _: None)


def test_a_tensor_whose_buffer_is_not_expert_separable_is_refused():
    t = TensorPlan("model.layers.0.mlp.experts.w13_weight", 0, "w13_weight", torch.uint8, (4, 100, 100))
    with pytest.raises(InputError) as err:
        _pack_files("rank-00000", [t], 20_000, lambda _: "its buffer does not hold the experts along dim 0")
    text = str(err.value)
    assert "model.layers.0.mlp.experts.w13_weight" in text and "40000 bytes" in text and "dim 0" in text
    smallest = int(text.split("use --max-shard-size ")[1].split()[0])
    assert len(_pack_files("rank-00000", [t], smallest, lambda _: "x")) == 1


# ---- several targets: the source is hashed once -------------------------------------------------------------
def test_several_targets_hash_the_source_once(tmp_path, monkeypatch):
    import mxconvert.storage.hub as hub

    hashed: list[int] = []
    real = hub.describe_source_files
    monkeypatch.setattr(hub, "describe_source_files", lambda *a, **k: hashed.append(1) or real(*a, **k))
    out = tmp_path / "out"
    args = ("convert", EXAMPLES / "tiny-gpt-oss", "-p", "h100", "-p", "b200", "--tp", "1", "--tp", "2", "-o", out)
    assert run_cli(*args).exit_code == 0
    manifests = [json.loads(p.read_text()) for p in sorted(out.glob("*/" + MANIFEST_NAME))]
    assert len(manifests) == 4 and len(hashed) == 1
    assert all(m["source"]["files"] == manifests[0]["source"]["files"] for m in manifests)
    assert run_cli(*args).exit_code == 0  # a second run: every target up to date, one more hashing pass
    assert len(hashed) == 2


def test_a_source_file_that_changed_is_hashed_again():
    ckpt = open_model(str(EXAMPLES / "tiny-gpt-oss"))
    first = ckpt.describe_files()
    first[0]["sha256"] = "edited by the caller"  # callers get a copy
    config = ckpt.config_path
    stat = config.stat()
    try:
        import os

        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        ckpt._described = (ckpt._described[0], [dict(f, sha256="stale") for f in ckpt._described[1]])
        again = ckpt.describe_files()
    finally:
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert "stale" not in {f["sha256"] for f in again} and "edited by the caller" not in {f["sha256"] for f in again}
