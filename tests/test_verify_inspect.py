"""`verify` and `inspect`: planted faults are caught and named; diffs say what differs."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import EXAMPLE, rewrite_source_tensor, run_cli
from safetensors.torch import load_file, save_file

from mxconvert.artifact.manifest import seal
from mxconvert.core.digest import CHUNKED_KEY, file_digests
from mxconvert.storage.files import sha256_file

W13 = "model.layers.1.mlp.experts.w13_weight"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    for name, args in {
        "h100": ("--profile", "h100"),
        "b200-tp2": ("--profile", "b200", "--tp", "2"),
        "h100-020": ("--profile", "h100", "--runtime", "vllm-0.20"),
    }.items():
        assert run_cli("convert", EXAMPLE, *args, "-o", root / name).exit_code == 0
    return root


@pytest.fixture
def copy(built, tmp_path):
    def make(name):
        shutil.copytree(built / name, tmp_path / name)
        return tmp_path / name

    return make


def _manifest(art):
    return json.loads((art / "mxconvert.json").read_text())


def _rewrite_tensor(art, key, change, reseal=True):
    """Change one stored tensor; with reseal, update the manifest's checksums and fingerprint too,
    as a buggy converter would have written it (so only the content checks can catch it)."""
    manifest = _manifest(art)
    entry = next(r for r in manifest["ranks"] if key in r["tensors"])
    rel = entry["tensors"][key]["file"]
    tensors = load_file(art / rel)
    tensors[key] = change(tensors[key].clone())
    save_file(tensors, art / rel, metadata={"format": "pt"})
    if reseal:
        for f in entry["files"]:
            if f["file"] == rel:
                f["size"], f["sha256"] = (art / rel).stat().st_size, sha256_file(art / rel)
                if CHUNKED_KEY in f:  # every digest the manifest holds is consistent
                    f[CHUNKED_KEY] = file_digests(art / rel, f[CHUNKED_KEY]["chunk_bytes"])[1]
        manifest.pop("fingerprint")
        (art / "mxconvert.json").write_text(json.dumps(seal(manifest)))


def _verify(art, *extra):
    result = run_cli("verify", art, "--json", *extra)
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else result.stderr


def test_fresh_artifacts_verify_with_zero_dequantized_difference(built):
    for name in ("h100", "b200-tp2", "h100-020"):
        code, report = _verify(built / name)
        assert code == 0 and report["ok"], report
        assert report["tensors_checked"] > 0 and report["passthrough_checked"] == 29
        assert report["max_dequant_diff"] and set(report["max_dequant_diff"].values()) == {0.0}


def test_flipped_byte_in_a_shard_is_named(copy):
    art = copy("h100")
    rel = _manifest(art)["ranks"][0]["tensors"][W13]["file"]
    data = bytearray((art / rel).read_bytes())
    header = int.from_bytes(data[:8], "little")
    data[8 + header + 10] ^= 0x10  # first tensor in the file: layer 0 w13_weight
    (art / rel).write_bytes(bytes(data))
    code, report = _verify(art)
    assert code == 1
    kinds = {p["kind"] for p in report["problems"]}
    assert kinds == {"file", "tensor"}
    tensor_problem = next(p for p in report["problems"] if p["kind"] == "tensor")
    assert tensor_problem["file"] == rel and tensor_problem["tensor"] == "model.layers.0.mlp.experts.w13_weight"
    assert "expert 0" in tensor_problem["message"] and "differs from the source" in tensor_problem["message"]


def test_swapped_gate_up_rows_are_caught_even_with_a_consistent_manifest(copy):
    art = copy("b200-tp2")

    def swap_first_pair(buf):  # TRTLLM buffer: row 0 holds up_0 and row 8 gate_0 after the shuffle
        buf[2, [0, 8]] = buf[2, [8, 0]]  # exchange them, as a converter that skipped the swap would
        return buf

    _rewrite_tensor(art, W13, swap_first_pair)
    code, report = _verify(art)
    assert code == 1
    (problem,) = report["problems"]
    assert problem["tensor"] == W13 and problem["expert"] == 2
    assert "row 0 (gate_0)" in problem["message"]


def test_nonzero_padding_is_caught(copy):
    art = copy("b200-tp2")  # TRTLLM pads H 320 -> 512: byte columns 160.. of w13 are padding

    def dirty(buf):
        buf[1, 7, 200] = 0x11
        return buf

    _rewrite_tensor(art, W13, dirty)
    code, report = _verify(art)
    assert code == 1
    (problem,) = report["problems"]
    assert problem["kind"] == "padding" and problem["tensor"] == W13 and "padding is not zero" in problem["message"]


def test_manifest_claiming_another_backend_or_revision_is_caught(copy):
    art = copy("h100")
    manifest = _manifest(art)
    manifest["target"]["runtime_revision"] = "vllm-0.20"
    (art / "mxconvert.json").write_text(json.dumps(manifest))
    code, report = _verify(art)
    assert code == 1
    assert any(p["kind"] == "manifest" and "fingerprint" in p["message"] for p in report["problems"])
    # re-sealed: the fingerprint is consistent, but the 0.20 layout of these bytes is not the source
    manifest.pop("fingerprint")
    (art / "mxconvert.json").write_text(json.dumps(seal(manifest)))
    code, report = _verify(art)
    assert code == 1 and any(p["kind"] in ("layout", "tensor", "padding") for p in report["problems"])


def test_shard_from_another_rank_is_caught(copy):
    art = copy("b200-tp2")
    m = _manifest(art)
    r0, r1 = (m["ranks"][i]["files"][0]["file"] for i in (0, 1))
    shutil.copyfile(art / r1, art / r0)
    code, report = _verify(art)
    assert code == 1
    assert any(p["kind"] == "file" and p["file"] == r0 for p in report["problems"])
    assert any(p["kind"] == "tensor" and p.get("rank") == 0 for p in report["problems"])


def test_truncated_file_is_caught(copy):
    art = copy("h100")
    rel = _manifest(art)["ranks"][0]["files"][0]["file"]
    data = (art / rel).read_bytes()
    (art / rel).write_bytes(data[:-100])
    code, report = _verify(art)
    assert code == 1
    assert any(p["kind"] == "file" and "size" in p["message"] for p in report["problems"])


def test_verify_unusable_input_exits_2(tmp_path, built):
    assert run_cli("verify", tmp_path).exit_code == 2
    code, err = _verify(built / "h100", "--source", str(tmp_path))
    assert code == 2


def test_changed_source_is_reported(copy, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    art = tmp_path / "art"
    assert run_cli("convert", src, "--profile", "h100", "-o", art).exit_code == 0
    rewrite_source_tensor(src, "model.layers.0.mlp.experts.gate_up_proj_bias", lambda t: t + 1)
    code, report = _verify(art)
    assert code == 1
    assert any(p["kind"] == "source" for p in report["problems"])
    assert any(p["kind"] == "tensor" and "w13_bias" in p["tensor"] for p in report["problems"])


# ---- inspect ----------------------------------------------------------------------------------------
def test_inspect_json_describes_checkpoint_and_artifact(built):
    result = run_cli("inspect", EXAMPLE, "--json")
    assert result.exit_code == 0
    ck = json.loads(result.stdout)
    assert ck["kind"] == "checkpoint" and ck["model"]["num_experts"] == 4
    assert ck["tensors"]["model.layers.0.mlp.experts.w13_weight"]["shape"] == [4, 640, 160]
    result = run_cli("inspect", built / "h100-020", "--json", "--layer", "0", "--tensor", "w13_weight_scale")
    art = json.loads(result.stdout)
    assert art["kind"] == "artifact" and art["fingerprint"].startswith("sha256:")
    (desc,) = art["tensors"].values()
    assert desc["layout_class"] == "HopperMXScaleLayout" and desc["overread_bytes"] == 64
    # every file has its digest: written files their tree digest (schema /2), copied files their sha256
    assert art["target"]["runtime_revision"] == "vllm-0.20" and all(
        "sha256_chunked" in f or "sha256" in f for f in art["files"]
    )
    assert run_cli("inspect", built / "h100", "--tensor", "nope").exit_code == 2


def test_inspect_diff_same_is_exit_0_and_different_is_exit_1(built):
    same = run_cli("inspect", built / "h100", built / "h100", "--json")
    assert same.exit_code == 0 and json.loads(same.stdout)["same"]
    result = run_cli("inspect", EXAMPLE, built / "b200-tp2", "--json")
    assert result.exit_code == 1
    d = json.loads(result.stdout)
    texts = [c["text"] for t in d["descriptors"] for c in t["changes"]]
    assert (
        "layer 0 w13_weight row order: gate/up interleaved (g0,u0,g1,u1,...) vs up/gate interleaved "
        "(u0,g0,u1,g1,...), TRTLLM 32-row shuffle" in texts
    )
    assert "layer 0 w13_weight hidden padded to: 320 vs 512" in texts
    assert {"field": "backend", "a": None, "b": "FLASHINFER_TRTLLM_MXFP4_BF16"} in d["target"]
    human = run_cli("inspect", built / "h100", built / "h100-020")
    assert human.exit_code == 1 and "target runtime_revision: vllm-0.33 vs vllm-0.20" in human.stdout


def test_inspect_diff_of_an_artifact_with_itself_is_same(copy):
    art = copy("h100")

    def flip(buf):
        buf[3, 5, 7] ^= 0xFF
        return buf

    _rewrite_tensor(art, W13, flip)
    result = run_cli("inspect", art, art, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["same"]


def test_inspect_diff_bytes_between_two_artifacts(built, copy):
    art = copy("h100")

    def flip(buf):
        buf[3, 5, 7] ^= 0xFF
        return buf

    _rewrite_tensor(art, W13, flip)
    result = run_cli("inspect", built / "h100", art, "--json")
    assert result.exit_code == 1
    d = json.loads(result.stdout)
    assert not d["descriptors"] and not d["target"]
    (b,) = d["bytes"]
    assert b["tensor"] == W13 and b["expert"] == 3 and b["index"] == [3, 5, 7]
