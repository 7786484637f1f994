"""The parallel streaming engine: no torch at CLI start, the same bytes for 1 and N threads,
explicit reads equal to safetensors' own, and the streaming writer equal to safetensors' writer."""

from __future__ import annotations

import pytest
import torch
from helpers import EXAMPLE, modules_after, tree_digest
from safetensors import safe_open
from safetensors.torch import save_file

from mxconvert.formats.registry import format_of, open_model
from mxconvert.pipeline import convert as convert_mod
from mxconvert.pipeline import plan as plan_mod
from mxconvert.pipeline.verify import verify_artifact
from mxconvert.selection import Deployment
from mxconvert.storage.safetensors_io import ShardReader, StreamingWriter
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import get_revision

HEAVY = ("torch", "numpy", "safetensors", "mxconvert.layouts", "mxconvert.artifact.loader")


def test_importing_the_cli_does_not_import_torch():
    loaded = modules_after("import mxconvert.cli.main, mxconvert")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_profiles_backends_version_and_help_do_not_import_torch():
    code = (
        "from mxconvert.cli.main import app\n"
        "for args in (['profiles'], ['--help'], ['--version'], ['backends'], ['convert', '--help'],\n"
        "             ['select', '--help'], ['verify', '--help'], ['inspect', '--help']):\n"
        "    try:\n        app(args)\n    except SystemExit as e:\n        assert e.code == 0, args\n"
    )
    loaded = modules_after(code)
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_package_attributes_are_still_there():
    import mxconvert

    assert callable(mxconvert.load_artifact) and mxconvert.LoadedArtifact.__name__ == "LoadedArtifact"
    with pytest.raises(AttributeError):
        mxconvert.no_such_thing  # noqa: B018


EXAMPLES = [
    ("tiny-gpt-oss", "h100", "vllm-0.33", 1),  # TRITON Hopper (fp4 pack)
    ("tiny-gpt-oss", "b200", "vllm-0.33", 2),  # TRTLLM, two TP ranks
    ("tiny-gpt-oss", "a100", "vllm-0.33", 1),  # MARLIN (nibble moves)
    ("tiny-nvfp4-modelopt-qwen3", "b200", None, 1),  # NVFP4 with derived tensors
]


@pytest.mark.parametrize("example, profile, runtime, tp", EXAMPLES)
def test_one_and_several_threads_write_the_same_bytes(tmp_path, example, profile, runtime, tp):
    ckpt = open_model(str(EXAMPLE.parent / example))
    plan = plan_mod.make_plan(
        ckpt, get_profile(profile), get_revision(runtime, format_of(ckpt).name), Deployment(tp=tp), "auto"
    )
    # small chunks, so each layer is cut into several pieces that the workers share
    convert_mod.execute(plan, tmp_path / "one", jobs=1, chunk_bytes=8 << 10)
    convert_mod.execute(plan, tmp_path / "many", jobs=3, chunk_bytes=8 << 10)
    convert_mod.execute(plan, tmp_path / "default", jobs=2)
    one, many, default = (tree_digest(tmp_path / n) for n in ("one", "many", "default"))
    one.pop("mxconvert.json"), many.pop("mxconvert.json"), default.pop("mxconvert.json")  # paths differ
    assert one == many == default
    for jobs in (1, 3):
        report = verify_artifact(tmp_path / "many", str(EXAMPLE.parent / example), jobs=jobs, chunk_bytes=8 << 10)
        assert report.ok, report.problems


@pytest.mark.parametrize(
    "example, profile, tp, shard",
    [("tiny-gpt-oss", "b200", 2, 400_000), ("tiny-nvfp4-modelopt-qwen3", "b200", 1, 200_000)],
)
def test_files_written_at_once_hold_the_bytes_of_files_written_one_by_one(
    tmp_path, monkeypatch, example, profile, tp, shard
):
    """A machine with many cores writes several files of the artifact at once (their sha256
    streams run side by side: convert.files_at_once); small shards (several files per rank,
    tensors split into parts across files) and small chunks, written 1, 2 and 5 files at a time:
    every file and the manifest's entries are the same (the manifest differs in its paths only)."""
    import json

    ckpt = open_model(str(EXAMPLE.parent / example))
    plan = plan_mod.make_plan(
        ckpt,
        get_profile(profile),
        get_revision(None, format_of(ckpt).name),
        Deployment(tp=tp),
        "auto",
        max_shard_bytes=shard,
    )
    assert max(len(files) for files in plan.rank_files.values()) >= 3
    digests, manifests = [], []
    for width in (1, 2, 5):
        monkeypatch.setattr(convert_mod, "files_at_once", lambda jobs, width=width: width)
        out = tmp_path / f"w{width}"
        convert_mod.execute(plan, out, jobs=3, chunk_bytes=8 << 10)
        manifest = json.loads((out / "mxconvert.json").read_text())
        digests.append({k: v for k, v in tree_digest(out).items() if k != "mxconvert.json"})
        manifests.append(json.dumps(manifest["ranks"]))
    assert digests[0] == digests[1] == digests[2] and manifests[0] == manifests[1] == manifests[2]
    if example == "tiny-gpt-oss":  # its w13 tensors are larger than a shard: split into parts
        assert any("parts" in t for r in json.loads(manifests[0]) for t in r["tensors"].values())
    assert verify_artifact(tmp_path / "w5", str(EXAMPLE.parent / example), jobs=2).ok


def test_explicit_reads_equal_safetensors_slices(tmp_path):
    path = tmp_path / "t.safetensors"
    tensors = {
        "a": torch.arange(5 * 6 * 7, dtype=torch.int16).reshape(5, 6, 7),
        "b": torch.randn(4, 9).to(torch.bfloat16),
        "s": torch.tensor(3.5),
    }
    save_file(tensors, str(path))
    reader = ShardReader(path)
    with safe_open(str(path), "pt") as f:
        for key in (
            slice(1, 4),
            (slice(0, 5), slice(2, 4)),
            (slice(1, 3), slice(None), slice(3, 6)),
            (slice(2, 3), slice(1, 5), slice(0, 7)),
            (slice(4, 2),),
        ):
            assert torch.equal(reader.get_slice("a")[key], f.get_slice("a")[key]), key
        assert torch.equal(reader.get_slice("b")[1:3, 4:9], f.get_slice("b")[1:3, 4:9])
        for name in tensors:
            assert torch.equal(reader.get(name), f.get_tensor(name))


def test_streaming_writer_equals_safetensors_save_file(tmp_path):
    a = torch.randn(6, 8).to(torch.bfloat16)
    b = torch.arange(24, dtype=torch.uint8).reshape(4, 6).t()  # non-contiguous piece
    save_file({"a": a, "b": b.contiguous()}, str(tmp_path / "ref.safetensors"))
    writer = StreamingWriter(tmp_path / "ours.safetensors", [("a", a.dtype, (6, 8)), ("b", b.dtype, (6, 4))])
    writer.write("a", a[:2])
    writer.write("a", a[2:])
    writer.write("b", b)
    writer.close()
    with safe_open(str(tmp_path / "ours.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("a"), a) and torch.equal(f.get_tensor("b"), b)
    import hashlib

    assert writer.sha256 == hashlib.sha256((tmp_path / "ours.safetensors").read_bytes()).hexdigest()


def test_verify_reports_the_dequantized_difference_of_a_changed_weight(tmp_path):
    ckpt = open_model(str(EXAMPLE))
    plan = plan_mod.make_plan(ckpt, get_profile("b200"), get_revision(None), Deployment(), "auto")
    out = tmp_path / "out"
    manifest = convert_mod.execute(plan, out, jobs=2)
    info = manifest["ranks"][0]["tensors"]["model.layers.0.mlp.experts.w2_weight"]
    path = out / info["file"]
    reader = ShardReader(path)
    meta = reader.tensors["model.layers.0.mlp.experts.w2_weight"]
    reader.close()
    data = bytearray(path.read_bytes())
    at = reader._data_start + meta.begin + (meta.end - meta.begin) // 2
    data[at] ^= 0x77  # two fp4 codes of one expert change
    path.write_bytes(bytes(data))
    report = verify_artifact(out, str(EXAMPLE), jobs=2)
    assert not report.ok
    assert {p.kind for p in report.problems} >= {"file", "tensor"}
    assert report.problems[0].kind == "file"  # compared last (hashing overlaps), still reported first
    assert report.max_dequant_diff["rank 0 layer 0 w2_weight"] > 0
    assert report.max_dequant_diff["rank 0 layer 0 w13_weight"] == 0.0


@pytest.mark.parametrize("chunked", [True, False])
def test_load_artifact_checks_the_chunked_digest_or_else_sha256(tmp_path, chunked):
    import json

    import mxconvert
    from mxconvert.artifact.manifest import seal, write_manifest
    from mxconvert.core.digest import CHUNKED_KEY
    from mxconvert.core.errors import MismatchError

    ckpt = open_model(str(EXAMPLE))
    plan = plan_mod.make_plan(ckpt, get_profile("h100"), get_revision(None), Deployment(), "auto")
    out = tmp_path / "out"
    manifest = convert_mod.execute(plan, out, jobs=2)
    files = manifest["ranks"][0]["files"] + manifest["shared"]["files"]
    assert all(CHUNKED_KEY in f for f in files)
    if not chunked:  # an artifact written before the chunked digest existed (schema /1: sha256 only)
        from mxconvert.artifact.manifest import SCHEMA_V1
        from mxconvert.storage.files import sha256_file

        manifest["schema"] = SCHEMA_V1
        for f in files:
            f["sha256"] = sha256_file(out / f["file"])
            del f[CHUNKED_KEY]
        manifest.pop("fingerprint")
        write_manifest(out, seal(manifest))
    reference = {k: v.clone() for k, v in mxconvert.load_artifact(out, 0, verify_checksums=False).tensors.items()}
    loaded = mxconvert.load_artifact(out, 0)
    assert reference.keys() == loaded.tensors.keys()
    assert all(torch.equal(reference[k], loaded.tensors[k]) for k in reference)
    path = out / files[0]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(MismatchError, match="chunked sha256" if chunked else "sha256"):
        mxconvert.load_artifact(out, 0)
    assert json.loads((out / "mxconvert.json").read_text())["fingerprint"]


def test_verify_checks_the_chunked_digest_too(tmp_path):
    from mxconvert.artifact.manifest import seal, write_manifest
    from mxconvert.core.digest import CHUNKED_KEY

    ckpt = open_model(str(EXAMPLE))
    plan = plan_mod.make_plan(ckpt, get_profile("b200"), get_revision(None), Deployment(), "auto")
    manifest = convert_mod.execute(plan, tmp_path / "out", jobs=2)
    assert verify_artifact(tmp_path / "out", str(EXAMPLE), jobs=2).ok
    manifest["ranks"][0]["files"][0][CHUNKED_KEY]["digest"] = "0" * 64  # a wrong claim, resealed
    manifest.pop("fingerprint")
    write_manifest(tmp_path / "out", seal(manifest))
    report = verify_artifact(tmp_path / "out", str(EXAMPLE), jobs=2)
    assert [p.kind for p in report.problems] == ["file"] and "chunked sha256" in report.problems[0].message


def test_a_failing_chunk_on_a_worker_leaves_nothing_behind(tmp_path, monkeypatch):
    ckpt = open_model(str(EXAMPLE))
    plan = plan_mod.make_plan(ckpt, get_profile("h100"), get_revision(None), Deployment(), "auto")
    real, calls = convert_mod._run_step, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("disk on fire")
        return real(*args)

    monkeypatch.setattr(convert_mod, "_run_step", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert_mod.execute(plan, tmp_path / "out", jobs=3, chunk_bytes=8 << 10)
    assert list(tmp_path.iterdir()) == []  # neither the artifact nor its staging folder


def test_sha256_streams_keep_a_core_each_only_where_cores_are_left_for_the_chunks():
    from mxconvert.core.parallel import chunk_workers

    assert chunk_workers(16, 3) == 13 and chunk_workers(8, 3) == 5 and chunk_workers(16, 2) == 14
    assert chunk_workers(4, 3) == 4 and chunk_workers(2, 2) == 2 and chunk_workers(1, 3) == 1  # small: all share
