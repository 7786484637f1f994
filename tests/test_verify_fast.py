"""verify's fast paths (session 5) prove what the slow ones did: the int64 byte comparison, the
parallel piece digests and the chunked pass-through comparison each still fail, with the same exit
code and message, on a flipped byte, a wrong checksum, a truncated file and a changed source."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import EXAMPLE, flip_stored_bits, rank_tensor, rewrite_source_tensor, run_cli
from safetensors.torch import load_file, save_file

from mxconvert.artifact.manifest import seal
from mxconvert.core.bits import from_torch
from mxconvert.core.digest import CHUNKED_KEY, ChunkedSha256, file_digests, sha256_stream
from mxconvert.pipeline.verify import _first_difference, _same_bytes, verify_artifact

# ---- the byte comparison --------------------------------------------------------------------------
#: The host path compares numpy arrays of bits (mxconvert/bits.py), a device tensors: both forms.
FORMS = {"torch": lambda t: t, "bits": lambda t: from_torch(t)}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("numel", [0, 1, 7, 8, 9, 64, 1001])
def test_same_bytes_finds_a_difference_at_every_position(numel, form):
    f = FORMS[form]
    a = torch.arange(numel, dtype=torch.int32).to(torch.uint8)
    assert _same_bytes(f(a), f(a.clone()))
    for at in range(numel):  # head (compared as int64) and tail (byte by byte) alike
        b = a.clone()
        b[at] ^= 0x01
        assert not _same_bytes(f(a), f(b)), at
        if form == "bits":
            assert _first_difference(f(b), f(a)) == [at]


def test_first_difference_finds_the_first_without_listing_every_difference():
    """A chunk whose every byte differs (an artifact checked against the wrong source) must not
    cost an index per differing byte: listing them all (argwhere / nonzero) took 8 bytes per
    dimension per byte of the chunk, ~1.4 GB for a 57 MB chunk of 3-d experts, on each worker."""
    import tracemalloc

    import numpy as np

    expected = np.zeros((8, 64, 4096), dtype=np.int16)  # 4 MiB of bf16 bits, 3-d as an expert chunk
    actual = np.full_like(expected, 0x3F80)
    actual[0, 0, 0] = 0  # the first element equal: the difference starts at its neighbour
    tracemalloc.start()
    try:
        assert _first_difference(actual, expected) == [0, 0, 1]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * expected.nbytes, peak  # a byte mask, not 24 bytes per differing byte
    one = expected.copy()
    one[5, 17, 300] = 7
    assert _first_difference(one, expected) == [5, 17, 300]


@pytest.mark.parametrize("form", FORMS)
def test_same_bytes_unaligned_storage_nan_payloads_and_shapes(form):
    f = FORMS[form]
    base = torch.arange(1000, dtype=torch.int32).to(torch.uint8)
    x, y = base[3:], base.clone()[3:]  # storage offset 3: not 8-byte aligned
    assert _same_bytes(f(x), f(y))
    y[500] ^= 0x80
    assert not _same_bytes(f(x), f(y))
    nan = torch.tensor([float("nan"), 1.0, -0.0])
    assert _same_bytes(f(nan), f(nan.clone()))  # bitwise: the same NaN is equal
    assert not _same_bytes(f(torch.tensor([0.0])), f(torch.tensor([-0.0])))  # bitwise: +0 and -0 differ
    assert not _same_bytes(f(torch.zeros(2, 4, dtype=torch.uint8)), f(torch.zeros(4, 2, dtype=torch.uint8)))
    assert not _same_bytes(f(torch.zeros(4, dtype=torch.uint8)), f(torch.zeros(4, dtype=torch.int16)))
    assert _same_bytes(f(torch.tensor(3.5)), f(torch.tensor(3.5)))
    assert not _same_bytes(f(torch.tensor(3.5)), f(torch.tensor(2.0)))
    strided = torch.arange(64, dtype=torch.int64).reshape(8, 8).t()  # not contiguous
    assert _same_bytes(f(strided), f(strided.contiguous()))


# ---- the digests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096, 3 * 4096 + 5])
def test_parallel_piece_digests_equal_the_streaming_ones(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    with ThreadPoolExecutor(3) as pool:
        for chunk in (4096, 1000, 1 << 20):
            chunked = ChunkedSha256(chunk)
            chunked.update(data)
            expected = (hashlib.sha256(data).hexdigest(), chunked.result())
            assert file_digests(path, chunk) == expected
            assert file_digests(path, chunk, pool) == expected
            assert sha256_stream(path, chunk) == expected[0]


def test_a_failing_whole_file_digest_update_is_raised_not_swallowed(tmp_path, monkeypatch):
    """file_digests runs the whole-file sha256 on a thread of its own; an update that fails there
    (on any piece, the last ones included) must fail the call, never leave a digest of part of
    the file (the read-ahead ring waits on the last pieces' futures without reading their result)."""
    import mxconvert.core.digest as digest_mod

    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * 4096))
    real = hashlib.sha256

    class FailingAt:
        def __init__(self, bad: int) -> None:
            self.inner, self.calls, self.bad = real(), 0, bad

        def update(self, data) -> None:
            self.calls += 1
            if self.calls == self.bad:
                raise MemoryError("whole-file update failed")
            self.inner.update(data)

        def hexdigest(self) -> str:
            return self.inner.hexdigest()

    for bad in (1, 3):  # the first piece and the last
        # the whole-file digest is the one made without data (a piece's is `sha256(piece)`)
        monkeypatch.setattr(digest_mod.hashlib, "sha256", lambda *a, bad=bad: real(*a) if a else FailingAt(bad))
        with ThreadPoolExecutor(2) as pool, pytest.raises(MemoryError):
            file_digests(path, 4096, pool)
    monkeypatch.undo()


# ---- verify, end to end -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    art = tmp_path_factory.mktemp("fast") / "b200"
    # both digests recorded (--file-sha256), so the whole-file sha256 path stays covered here;
    # tests/test_tree_digest.py covers the default artifact (tree digest only)
    assert run_cli("convert", EXAMPLE, "--profile", "b200", "-o", art, "--file-sha256").exit_code == 0
    return art


@pytest.fixture
def art(built, tmp_path):
    shutil.copytree(built, tmp_path / "art")
    return tmp_path / "art"


def _manifest(art):
    return json.loads((art / "mxconvert.json").read_text())


def _reseal(art, manifest):
    manifest.pop("fingerprint", None)
    (art / "mxconvert.json").write_text(json.dumps(seal(manifest)))


def _verify(art, *extra):
    result = run_cli("verify", art, "--json", *extra)
    return result.exit_code, json.loads(result.stdout)


def _rank_file(manifest):
    return manifest["ranks"][0]["files"][0]


def test_small_pieces_are_hashed_in_parallel_and_a_wrong_piece_is_named(art):
    """A manifest whose chunked digest uses 64 KiB pieces (many per file): verified on the piece
    pool; one wrong byte of the recorded digest fails as before."""
    manifest = _manifest(art)
    entry = _rank_file(manifest)
    entry[CHUNKED_KEY] = file_digests(art / entry["file"], 64 << 10)[1]
    _reseal(art, manifest)
    code, report = _verify(art)
    assert code == 0 and report["ok"], report
    digest = entry[CHUNKED_KEY]["digest"]
    entry[CHUNKED_KEY]["digest"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    _reseal(art, manifest)
    code, report = _verify(art)
    assert code == 1
    assert [(p["kind"], p["message"]) for p in report["problems"]] == [
        ("file", f"{entry['file']}: chunked sha256 differs from the manifest (load_artifact would refuse it)")
    ]


def test_wrong_manifest_sha256_is_the_only_problem(art):
    manifest = _manifest(art)
    entry = _rank_file(manifest)
    entry["sha256"] = "0" * 64
    _reseal(art, manifest)
    code, report = _verify(art)
    assert code == 1
    assert [(p["kind"], p["message"]) for p in report["problems"]] == [
        ("file", f"{entry['file']}: sha256 differs from the manifest")
    ]


def test_flipped_byte_fails_the_checksum_and_the_tensor(art):
    entry = _rank_file(_manifest(art))
    path = art / entry["file"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x04  # the last bytes of the file: the int64 comparison's tail included
    path.write_bytes(bytes(data))
    code, report = _verify(art)
    assert code == 1
    messages = [p["message"] for p in report["problems"]]
    assert f"{entry['file']}: sha256 differs from the manifest" in messages
    assert any(p["kind"] in ("tensor", "padding") for p in report["problems"]), messages


def test_truncated_file_fails(art):
    entry = _rank_file(_manifest(art))
    path = art / entry["file"]
    path.write_bytes(path.read_bytes()[:-64])
    code, report = _verify(art)
    assert code == 1
    assert f"{entry['file']}: size {entry['size'] - 64} bytes, manifest says {entry['size']}" in [
        p["message"] for p in report["problems"]
    ]


def test_a_verify_that_stops_early_leaves_no_plan_thread_running(art, monkeypatch):
    """verify builds the layout plans on a thread beside the checks; one whose rank file is broken
    needs none of them and returns early: the thread is joined before verify returns."""
    import threading
    import time

    import mxconvert.pipeline.verify as verify_mod

    real = verify_mod.prepare_all

    def slow_prepare_all(*args):
        time.sleep(0.5)  # still building when the broken file has been reported
        real(*args)

    monkeypatch.setattr(verify_mod, "prepare_all", slow_prepare_all)
    entry = _rank_file(_manifest(art))
    (art / entry["file"]).write_bytes((art / entry["file"]).read_bytes()[:-64])
    report = verify_artifact(art)
    assert not report.ok
    assert [t.name for t in threading.enumerate() if t.name.startswith("mxconvert-plans")] == []


def test_changed_passthrough_tensor_in_the_source_is_found_in_its_last_chunk(built, tmp_path):
    """The pass-through comparison runs in row chunks: a change in the last row of a tensor read
    in several chunks is found (and the source's checksum fails too)."""
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    art = tmp_path / "art"
    assert run_cli("convert", src, "--profile", "b200", "-o", art).exit_code == 0
    key = "model.embed_tokens.weight"

    def last_element_plus_one(t):
        t[-1, -1] += 1
        return t

    changed = rewrite_source_tensor(src, key, last_element_plus_one)
    rows, row_bytes = changed.shape[0], changed[0].numel() * changed.element_size()
    assert rows > 4
    for jobs in (1, 3):
        report = verify_artifact(art, chunk_bytes=2 * row_bytes, jobs=jobs)  # rows/2 chunks
        kinds = [(p.kind, p.tensor) for p in report.problems]
        assert ("passthrough", key) in kinds and any(k == "source" for k, _ in kinds), kinds
        assert next(p for p in report.problems if p.kind == "passthrough").message.endswith(
            f"{key} is not byte-identical to the source"
        )


def test_problems_are_reported_in_the_same_order_with_1_and_4_threads(art):
    manifest = _manifest(art)
    _rank_file(manifest)["sha256"] = "0" * 64
    _reseal(art, manifest)
    entry = manifest["shared"]["files"][0]
    path = art / entry["file"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    one = [p.to_json() for p in verify_artifact(art, jobs=1).problems]
    four = [p.to_json() for p in verify_artifact(art, jobs=4).problems]
    assert one == four and len(one) >= 3, one


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The paths verify reads for a checksum, in call order (its two digest functions recorded)."""
    import mxconvert.pipeline.verify as verify

    paths: list[str] = []

    def counting(fn):
        def wrapper(path, *args, **kwargs):
            paths.append(str(path))
            return fn(path, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(verify, "sha256_file", counting(verify.sha256_file))
    monkeypatch.setattr(verify, "file_digests", counting(verify.file_digests))
    return paths


def test_every_file_is_hashed_once(built, hashed):
    """The source files and the artifact files are each read for their checksum exactly once
    (the source's sha256 recorded in the manifest is recomputed once, not twice)."""
    report = verify_artifact(built, jobs=2)
    assert report.ok, report.problems
    manifest = _manifest(built)
    artifact = (
        [f["file"] for r in manifest["ranks"] for f in r["files"]]
        + [f["file"] for f in manifest["shared"]["files"]]
        + [f["file"] for f in manifest["aux_files"]]
    )
    source = [str(EXAMPLE / f["file"]) for f in manifest["source"]["files"]]
    assert sorted(hashed) == sorted([str(built / f) for f in artifact] + source)


def test_changed_0dim_passthrough_scale_is_found(tmp_path):
    """0-dim pass-through tensors (a shared expert's global scale) are compared too, in one read."""
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE.parent / "tiny-nvfp4-modelopt-deepseek", src)
    art = tmp_path / "art"
    assert run_cli("convert", src, "--profile", "b200", "-o", art).exit_code == 0
    assert verify_artifact(art, jobs=2).ok
    index = json.loads((src / "model.safetensors.index.json").read_text())
    key = next(k for k in index["weight_map"] if k.endswith("shared_experts.down_proj.weight_scale_2"))
    shard = src / index["weight_map"][key]
    tensors = load_file(shard)
    assert tensors[key].dim() == 0
    tensors[key] = tensors[key] * 2
    save_file(tensors, shard, metadata={"format": "pt"})
    problems = verify_artifact(art, jobs=2).problems
    rel = _manifest(art)["shared"]["tensors"][key]["file"]
    assert [(p.file, p.message) for p in problems if p.kind == "passthrough"] == [
        (rel, f"{rel}: {key} is not byte-identical to the source")
    ], problems
    assert any(p.kind == "source" for p in problems)


def test_a_file_that_resolves_outside_the_artifact_is_reported_and_never_read(art, tmp_path, hashed):
    """A file of the artifact replaced by a symlink to a file outside the folder: verify reports
    it and reads nothing outside (the checksum threads hash only files that stay inside)."""
    rel = _manifest(art)["ranks"][0]["files"][0]["file"]
    outside = tmp_path / "outside.safetensors"
    shutil.move(art / rel, outside)
    (art / rel).symlink_to(outside)
    report = verify_artifact(art, jobs=2)
    assert [p for p in report.problems if p.kind == "file" and p.file == rel and "outside" in p.message]
    assert hashed and str(art / rel) not in hashed


def test_a_widened_bias_no_bf16_gives_is_a_tensor_problem_not_padding(tmp_path):
    """TRTLLM stores the bf16 biases as float32: a stored value whose low 16 bits are not zero is
    no bf16 of the source. verify reports it as a tensor problem naming the cast (the inverse
    refuses it), not as padding."""
    out = tmp_path / "a"
    assert run_cli("convert", EXAMPLE, "--profile", "b200", "-o", out).exit_code == 0
    key, file = rank_tensor(out, "w13_bias")
    flip_stored_bits(file, key, 0, 0x01)  # lowest mantissa bit of expert 0's first float32 bias
    report = verify_artifact(out, str(EXAMPLE), jobs=2)
    found = [p for p in report.problems if p.tensor == key]
    assert found and all(p.kind == "tensor" for p in found), report.problems
    assert "not exactly representable" in found[0].message
