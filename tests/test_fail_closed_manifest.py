"""A manifest is trusted no further than it proves (issue "Fail closed, round 2", class 4, and the
manifest part of class 9). A fingerprint only proves the manifest was not edited after sealing,
so every case here is SEALED with the correct fingerprint: only the schema and derivation checks
(artifact/manifest_schema.py, artifact/loader.py `check_rank_layouts`) can refuse it.

Classes (the prefix of each test):
 a  chunked digests whose piece size hashes nothing (or not the whole file)
 b  kernel views that alias elements, leave their buffer, or are not the target's
 c  sizes that would make a reader allocate what the files do not hold (over-read, shapes, dtype)
 d  parts of split tensors moved to another layer or range (part keys are derived, not trusted)
 e  unsealed `provenance` is never used for a decision; what is printed from a manifest is escaped
 f  the copied files vLLM reads (config, tokenizer, chat template) are checked by load_artifact
 g  NaN / Infinity: never written into mxconvert.json, refused when read
 h  fuzz: every field mutated to wrong types and values gives InputError / MismatchError (exit 2 / 1)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import EXAMPLE, run_cli, tree_digest

from mxconvert.artifact.loader import check_copied_files, load_artifact
from mxconvert.artifact.manifest import MANIFEST_NAME, read_manifest, seal, write_manifest
from mxconvert.artifact.manifest_schema import check_view, shown
from mxconvert.core.dtypes import dtype_named
from mxconvert.core.errors import InputError, MismatchError

W13 = "model.layers.0.mlp.experts.w13_weight"
W13_SCALE = "model.layers.0.mlp.experts.w13_weight_scale"


# ---- helpers ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A TP-2 Hopper artifact (triton_kernels: transposed views) of the example."""
    out = tmp_path_factory.mktemp("fcm") / "art"
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "--tp", "2", "-o", out).exit_code == 0
    return out


@pytest.fixture(scope="module")
def built_020(tmp_path_factory) -> Path:
    """A vLLM 0.20 Hopper artifact: its scales carry `overread_bytes` 64."""
    out = tmp_path_factory.mktemp("fcm020") / "art"
    assert run_cli("convert", EXAMPLE, "--profile", "h100", "--runtime", "vllm-0.20", "-o", out).exit_code == 0
    return out


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    """An artifact whose largest expert tensors are stored in parts (--max-shard-size)."""
    base = tmp_path_factory.mktemp("fcm-split")
    assert run_cli("convert", EXAMPLE, "-p", "h100", "-o", base / "whole").exit_code == 0
    manifest = _manifest(base / "whole")

    def nbytes(t):
        count = 1
        for d in t["shape"]:
            count *= d
        return count * dtype_named(t["dtype"]).itemsize

    tensors = manifest["ranks"][0]["tensors"].values()
    per_expert = max(nbytes(t) // t["shape"][0] for t in tensors)
    shared = max(nbytes(t) for t in manifest["shared"]["tensors"].values())
    limit = max(2 * per_expert, shared) + 2048
    result = run_cli("convert", EXAMPLE, "-p", "h100", "-o", base / "split", "--max-shard-size", str(limit))
    assert result.exit_code == 0
    assert any("parts" in t for t in _manifest(base / "split")["ranks"][0]["tensors"].values())
    return base / "split"


def _copy(art: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "art"
    shutil.copytree(art, dst)
    return dst


def _manifest(art: Path) -> dict:
    return json.loads((art / MANIFEST_NAME).read_text())


def _reseal(art: Path, manifest: dict) -> None:
    """Write `manifest` sealed with its correct fingerprint, as a forger would."""
    manifest = {k: v for k, v in manifest.items() if k != "fingerprint"}
    (art / MANIFEST_NAME).write_text(json.dumps(seal(manifest)))


def _forged(art: Path, tmp_path: Path, edit) -> Path:
    copy = _copy(art, tmp_path)
    manifest = _manifest(copy)
    edit(manifest)
    _reseal(copy, manifest)
    return copy


def _tensor(manifest: dict, key: str = W13, rank: int = 0) -> dict:
    return manifest["ranks"][rank]["tensors"][key]


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _cli_refuses(art: Path, *words: str, code: int = 2) -> None:
    """`verify` and `inspect` refuse the artifact with `code`, one line naming `words`, no traceback."""
    for cmd in (("verify", art, "--source", EXAMPLE), ("inspect", art)):
        result = run_cli(*cmd)
        assert result.exit_code == code, (cmd, result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr
        for word in words:
            assert word in result.stderr, (cmd, word, result.stderr)


# ---- a chunked digests that hash nothing --------------------------------------------------------------
@pytest.mark.parametrize(
    "chunk_bytes", [-(4 << 20), 0, 3, 1 << 40, 4096.0], ids=["negative", "zero", "not-pow2", "huge", "float"]
)
def test_a_a_chunk_size_that_hashes_nothing_is_refused_and_the_file_is_never_taken_as_checked(
    built, tmp_path, chunk_bytes
):
    """A chunk size of 0 or below makes the chunked digest the digest of no piece at all; with it
    recorded (sealed), a changed rank file would load as "checked". It is refused by the schema."""
    empty = hashlib.sha256(b"").hexdigest()

    def edit(m):
        m["ranks"][0]["files"][0]["sha256_chunked"] = {"chunk_bytes": chunk_bytes, "digest": empty}

    art = _forged(built, tmp_path, edit)
    rel = _manifest(art)["ranks"][0]["files"][0]["file"]
    _flip_byte(art / rel, (art / rel).stat().st_size - 1)  # the bytes changed under the vacuous digest
    with pytest.raises(InputError, match="chunk_bytes"):
        read_manifest(art)
    with pytest.raises(InputError, match="chunk_bytes"):
        load_artifact(art, rank=0)
    _cli_refuses(art, "chunk_bytes")


def test_a_a_chunked_digest_with_extra_fields_or_a_bad_digest_is_refused(built, tmp_path):
    for chunked in (
        {"chunk_bytes": 4 << 20},
        {"chunk_bytes": 4 << 20, "digest": "zz"},
        {"chunk_bytes": 4 << 20, "digest": "0" * 64, "pieces": []},
        [],
    ):
        art = _forged(
            built,
            tmp_path / str(len(list(tmp_path.iterdir()))),
            lambda m, c=chunked: m["ranks"][0]["files"][0].__setitem__("sha256_chunked", c),
        )
        with pytest.raises(InputError, match="sha256_chunked"):
            load_artifact(art, rank=0)


# ---- b views ----------------------------------------------------------------------------------------
def test_b_a_view_whose_strides_alias_elements_is_refused(built, tmp_path):
    """Two view indices on one stored element: strides [E, 1, 1] over [4, 640, 96]."""

    def edit(m):
        layout = _tensor(m)["layout"]
        layout["view_stride"] = [layout["view_stride"][0], 1, 1]

    art = _forged(built, tmp_path, edit)
    with pytest.raises(InputError, match="aliased"):
        read_manifest(art)
    with pytest.raises(InputError, match="aliased"):
        load_artifact(art, rank=0)
    _cli_refuses(art, "aliased")


@pytest.mark.parametrize(
    "stride, words",
    [
        ([61440, 1, 10**6], "reaches past the end"),
        ([61440, 1], "strides for 3 dimensions"),
        ([61440, -1, 640], "negative"),
    ],
    ids=["past-the-end", "stride-count", "negative"],
)
def test_b_a_view_that_leaves_its_buffer_is_refused(built, tmp_path, stride, words):
    art = _forged(built, tmp_path, lambda m: _tensor(m)["layout"].__setitem__("view_stride", stride))
    with pytest.raises(InputError, match=words):
        read_manifest(art)
    with pytest.raises(InputError):
        load_artifact(art, rank=0)


def test_b_a_valid_view_the_target_does_not_give_is_refused_by_the_loader(built, tmp_path):
    """A contiguous view (no alias, inside the buffer) where the target's kernel holds `.mT`: the
    schema cannot know; the loader derives the descriptor from the sealed target and refuses."""

    def edit(m):
        layout = _tensor(m)["layout"]
        layout["view_shape"] = list(layout["buffer_shape"])
        e, r, c = layout["buffer_shape"]
        layout["view_stride"] = [r * c, c, 1]

    art = _forged(built, tmp_path, edit)
    read_manifest(art)  # well-formed
    with pytest.raises(MismatchError, match=f"{W13}: its layout descriptor differs .*view_shape, view_stride"):
        load_artifact(art, rank=0)
    result = run_cli("verify", art, "--source", EXAMPLE, "--json")
    assert result.exit_code == 1 and any(p["kind"] == "layout" for p in json.loads(result.stdout)["problems"])


def _cutedsl_mma_view(buffer):
    """CuteDSL's scale view in its MMA layout (mxconvert/layouts/cutedsl.py), built the same way."""
    from mxconvert.layouts.base import permuted_view

    return permuted_view(lambda s: (s[0], s[1] // 128, s[2] // 4, 32, 4, 4), (3, 4, 1, 5, 2, 0))(buffer)


@pytest.mark.parametrize(
    "numel, view",
    [
        (4 * 640 * 96, ((4, 640, 96), (61440, 1, 640))),  # triton_kernels .mT
        (2 * 256 * 16, _cutedsl_mma_view((2, 256, 16))),  # CuteDSL's 6-d MMA view of its scales
        (5, ((1, 5, 1), (0, 1, 7))),  # size-1 dimensions take any stride
        (0, ((3, 0, 2), (99, 99, 99))),  # an empty view reads nothing
    ],
    ids=["triton-mT", "cutedsl-mma", "unit-dims", "empty"],
)
def test_b_views_mxconvert_writes_pass_the_view_check(numel, view):
    shape, stride = view
    assert check_view(numel, list(shape), list(stride)) == ""


@pytest.mark.parametrize(
    "shape, stride",
    [
        ((4, 4), (1, 1)),
        ((2, 3, 4), (12, 4, 2)),  # the last dimension spans 8 elements, the middle one steps by 4
        ((8, 2), (1, 4)),
    ],
)
def test_b_aliased_views_fail_the_view_check(shape, stride):
    assert "aliased" in check_view(10**6, list(shape), list(stride))


# ---- c sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overread", [10**12, 65, -1, "64", 64.0], ids=["terabyte", "above-max", "negative", "string", "float"]
)
def test_c_an_over_read_no_kernel_has_is_refused_before_anything_is_allocated(built_020, tmp_path, overread):
    art = _forged(
        built_020, tmp_path, lambda m: _tensor(m, W13_SCALE)["layout"].__setitem__("overread_bytes", overread)
    )
    with pytest.raises(InputError, match="overread_bytes"):
        read_manifest(art)
    with pytest.raises(InputError, match="overread_bytes"):
        load_artifact(art)
    _cli_refuses(art, "overread_bytes")


def test_c_an_over_read_the_target_does_not_give_is_refused_by_the_loader(built_020, tmp_path):
    art = _forged(built_020, tmp_path, lambda m: _tensor(m, W13_SCALE)["layout"].__setitem__("overread_bytes", 32))
    read_manifest(art)  # within the schema's bound
    with pytest.raises(MismatchError, match="overread_bytes"):
        load_artifact(art)


def test_c_a_buffer_larger_than_its_file_is_refused(built, tmp_path):
    """A sealed shape of 1000x the experts (view consistent with it): refused from the recorded file
    size, before a buffer of that size is allocated."""

    def edit(m):
        info = _tensor(m)
        info["shape"][0] *= 1000
        info["layout"]["buffer_shape"][0] *= 1000
        info["layout"]["view_shape"][0] *= 1000

    art = _forged(built, tmp_path, edit)
    with pytest.raises(InputError, match="more than its file"):
        read_manifest(art)
    with pytest.raises(InputError, match="more than its file"):
        load_artifact(art, rank=0)


def test_c_a_recorded_file_size_larger_than_the_file_is_refused_before_allocation(built, tmp_path, monkeypatch):
    """The recorded size bounds the buffers: the loader compares it with the file before it
    allocates any buffer from the manifest's shapes."""
    import mxconvert.artifact.loader as loader

    def edit(m):
        m["ranks"][0]["files"][0]["size"] = 10**12
        info = _tensor(m)
        info["shape"][0] *= 1000
        info["layout"]["buffer_shape"][0] *= 1000
        info["layout"]["view_shape"][0] *= 1000

    art = _forged(built, tmp_path, edit)
    allocated = []
    monkeypatch.setattr(loader, "place_stored_tensor", lambda *a, **k: allocated.append(a) or None)
    monkeypatch.setattr(loader, "check_rank_layouts", lambda *a: None)  # only the size check stands
    with pytest.raises(MismatchError, match="size"):
        load_artifact(art, rank=0)
    assert allocated == []


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: _tensor(m)["layout"].__setitem__("dtype", "float128"), "not a dtype"),
        (lambda m: _tensor(m).__setitem__("dtype", "float32"), "its layout stores uint8"),
        (lambda m: _tensor(m).__setitem__("shape", [4, 1, 1]), "its layout's buffer"),
        (
            lambda m: next(iter(m["shared"]["tensors"].values())).__setitem__("shape", [10**9, 10**3]),
            "more than its file",
        ),
        (lambda m: next(iter(m["shared"]["tensors"].values())).__setitem__("dtype", "complex64"), "not a dtype"),
    ],
    ids=["unknown-dtype", "entry-dtype", "entry-shape", "shared-huge", "shared-dtype"],
)
def test_c_dtype_and_shape_fields_agree_with_each_other_and_the_files(built, tmp_path, edit, words):
    art = _forged(built, tmp_path, edit)
    with pytest.raises(InputError, match=words):
        load_artifact(art, rank=0)
    _cli_refuses(art, words)


# ---- d parts ----------------------------------------------------------------------------------------
def _split_keys(manifest: dict) -> list[str]:
    return [k for k, t in manifest["ranks"][0]["tensors"].items() if "parts" in t]


def test_d_parts_swapped_between_layers_are_refused(split, tmp_path):
    """Layer 0's and layer 1's parts exchanged (same files, same digests: every byte is real)."""
    keys = _split_keys(_manifest(split))
    a = next(k for k in keys if ".layers.0." in k)
    b = a.replace(".layers.0.", ".layers.1.")
    assert b in keys

    def edit(m):
        t = m["ranks"][0]["tensors"]
        t[a]["parts"], t[b]["parts"] = t[b]["parts"], t[a]["parts"]

    art = _forged(split, tmp_path, edit)
    with pytest.raises(InputError, match="is not the key of experts"):
        read_manifest(art)
    with pytest.raises(InputError, match="is not the key of experts"):
        load_artifact(art, rank=0)
    _cli_refuses(art, "is not the key of experts")


def test_d_part_keys_exchanged_within_a_tensor_are_refused(split, tmp_path):
    """Parts 0 and 1 keep their ranges but exchange keys (and digests): experts would load out of order."""
    key = _split_keys(_manifest(split))[0]

    def edit(m):
        p = m["ranks"][0]["tensors"][key]["parts"]
        for field in ("key", "sha256", "file"):
            p[0][field], p[1][field] = p[1][field], p[0][field]

    art = _forged(split, tmp_path, edit)
    with pytest.raises(InputError, match="is not the key of experts"):
        load_artifact(art, rank=0)


def test_d_the_unchanged_split_artifact_loads(split):
    assert load_artifact(split).tensors


# ---- e provenance and escaping ------------------------------------------------------------------------
def test_e_provenance_is_outside_the_seal_and_never_decides_anything(built, tmp_path):
    art = _copy(built, tmp_path)
    manifest = _manifest(art)
    reference = {k: v.clone() for k, v in load_artifact(art, rank=0).tensors.items()}
    for provenance in ({"source_path": "\x1b[31m/evil\n; rm -rf ~"}, ["x"], {"source_path": 7}, None):
        manifest["provenance"] = provenance  # not resealed: provenance is not sealed
        (art / MANIFEST_NAME).write_text(json.dumps(manifest))
        loaded = load_artifact(art, rank=0)  # the loader does not read it
        assert all(loaded.tensors[k].equal(v) for k, v in reference.items())
        result = run_cli("verify", art)  # verify only looks there for a default source: refused, escaped
        assert result.exit_code == 2 and "pass --source" in result.stderr, result.stderr
        assert "\x1b" not in result.stdout + result.stderr
        assert run_cli("verify", art, "--source", EXAMPLE).exit_code == 0


def test_e_names_with_control_characters_are_refused_and_printed_escaped(built, tmp_path):
    def edit(m):
        t = m["ranks"][0]["tensors"]
        t["model.layers.0.mlp.experts.\x1b[2Jw13"] = t.pop(W13)

    art = _forged(built, tmp_path, edit)
    with pytest.raises(InputError) as err:
        load_artifact(art, rank=0)
    assert "\x1b" not in str(err.value) and "\\x1b" in str(err.value)
    result = run_cli("verify", art)
    assert result.exit_code == 2 and "\x1b" not in result.stderr and "not a printable name" in result.stderr


def test_e_a_fingerprint_field_with_an_escape_sequence_is_shown_escaped(built, tmp_path):
    art = _copy(built, tmp_path)
    manifest = _manifest(art)
    manifest["fingerprint"] = "\x1b]0;owned\x07sha256:0"
    (art / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(MismatchError) as err:
        load_artifact(art)
    assert "\x1b" not in str(err.value) and "\x07" not in str(err.value) and "\\x1b]0;owned\\x07" in str(err.value)


def test_e_shown_escapes_only_what_cannot_be_printed():
    assert shown("model.layers.0 é ✓") == "model.layers.0 é ✓"
    assert shown("a\x1b[31mb\nc\x00\u2028") == "a\\x1b[31mb\\nc\\x00\\u2028"


# ---- f copied files ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "plant, words",
    [
        (lambda art: _flip_byte(art / "config.json", 10), "config.json: sha256"),
        (lambda art: (art / "tokenizer.json").unlink(), "tokenizer.json: missing"),
        (lambda art: (art / "chat_template.jinja").write_text("{{ evil }}"), "chat_template.jinja: size"),
    ],
    ids=["config-changed", "tokenizer-missing", "chat-template-replaced"],
)
def test_f_the_copied_files_vllm_reads_are_checked_by_load_artifact(built, tmp_path, plant, words):
    art = _copy(built, tmp_path)
    plant(art)
    with pytest.raises(MismatchError, match=words):
        load_artifact(art, rank=0)
    with pytest.raises(MismatchError, match=words):  # what the vLLM plugin calls
        check_copied_files(art, read_manifest(art))
    assert load_artifact(art, rank=0, verify_checksums=False).tensors  # as asked: no checksums at all


# ---- g NaN and Infinity -----------------------------------------------------------------------------
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_g_a_manifest_with_bare_nan_or_infinity_is_not_json_and_refused(built, tmp_path, token):
    art = _copy(built, tmp_path)
    manifest = _manifest(art)
    manifest["model"]["swiglu_limit"] = "@@TOKEN@@"
    (art / MANIFEST_NAME).write_text(json.dumps(manifest).replace('"@@TOKEN@@"', token))
    before = tree_digest(art)
    with pytest.raises(InputError, match=re.escape(f"model.swiglu_limit is {token}, not a JSON number (RFC 8259)")):
        read_manifest(art)
    with pytest.raises(InputError, match="RFC 8259"):
        load_artifact(art)
    _cli_refuses(art, "RFC 8259")
    assert tree_digest(art) == before


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_g_the_writer_refuses_non_finite_numbers_naming_the_field(tmp_path, value):
    manifest = {"schema": "x", "model": {"swiglu_limit": value}, "target": {"profile": {"limits": [1.0, value]}}}
    with pytest.raises(InputError, match=r"model\.swiglu_limit"):
        seal(manifest)
    with pytest.raises(InputError, match="RFC 8259"):
        write_manifest(tmp_path, {"target": {"profile": {"limits": [1.0, value]}}})
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_g_convert_of_a_config_with_infinity_is_exit_2_and_writes_nothing(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    config = json.loads((src / "config.json").read_text())
    config["swiglu_limit"] = "@@INF@@"
    (src / "config.json").write_text(json.dumps(config).replace('"@@INF@@"', "Infinity"))
    result = run_cli("convert", src, "--profile", "h100", "-o", tmp_path / "out")
    assert result.exit_code == 2 and "swiglu_limit" in result.stderr and "RFC 8259" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


# ---- h fuzz -----------------------------------------------------------------------------------------
_WRONG = [None, -1, 10**30, "x", [], {}, True, 0.5]


def _paths(value, at=()):
    """Every path into the sealed fields a reader uses (one entry of each list)."""
    yield at
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*at, key))
    elif isinstance(value, list) and value:
        yield from _paths(value[0], (*at, 0))


def _fuzz_paths(manifest: dict) -> list[tuple]:
    rank = manifest["ranks"][0]
    picked = {"model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.w2_bias"}
    out = [("schema",), ("ranks",), ("shared",), ("target",), ("model",), ("source",), ("aux_files",)]
    out += [("target", *p) for p in _paths(manifest["target"]) if len(p) <= 1 and p]
    out += [("model", *p) for p in _paths(manifest["model"]) if p and len(p) <= 1]
    out += [("source", *p) for p in _paths(manifest["source"]) if p and p[0] != "warnings"]
    out += [("ranks", 0, *p) for p in _paths({k: v for k, v in rank.items() if k != "tensors"}) if p]
    for key in picked:
        out += [("ranks", 0, "tensors", key, *p) for p in _paths(rank["tensors"][key])]
    shared_key = next(iter(manifest["shared"]["tensors"]))
    out += [("shared", "files", 0, *p) for p in _paths(manifest["shared"]["files"][0])]
    out += [("shared", "tensors", shared_key, *p) for p in _paths(manifest["shared"]["tensors"][shared_key])]
    out += [("aux_files", 0, *p) for p in _paths(manifest["aux_files"][0])]
    return list(dict.fromkeys(out))


def _mutated(manifest: dict, path: tuple, value) -> dict:
    m = json.loads(json.dumps(manifest))
    node = m
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return m


def test_h_every_field_mutated_to_a_wrong_type_or_value_is_an_mxconvert_error(built, tmp_path):
    """load_artifact raises only InputError / MismatchError (or loads, where the field is not read),
    never another exception; `verify` answers 0, 1 or 2, never 3 or a traceback."""
    manifest = _manifest(built)
    art = _copy(built, tmp_path)
    paths = _fuzz_paths(manifest)
    assert len(paths) > 60
    refused = 0
    for i, (path, value) in enumerate(itertools.product(paths, _WRONG)):
        _reseal(art, _mutated(manifest, path, value))
        try:
            load_artifact(art, rank=0)
        except (InputError, MismatchError):
            refused += 1
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{path} = {value!r}: load_artifact raised {type(exc).__name__}: {exc}")
        if i % len(_WRONG) == (i // len(_WRONG)) % len(_WRONG):  # verify once per field, a rotating value
            result = run_cli("verify", art, "--source", EXAMPLE, "--json")
            assert result.exit_code in (0, 1, 2), (path, value, result.exit_code, result.stdout, result.stderr)
            assert "Traceback" not in result.stderr and "internal error" not in result.stderr, (path, value)
    assert refused > len(paths) * len(_WRONG) * 3 // 4  # most wrong values are refused outright
    assert tree_digest(art).keys() == tree_digest(built).keys()


def test_h_the_fuzzed_base_manifest_itself_loads_and_verifies(built):
    assert load_artifact(built, rank=0).tensors
    assert run_cli("verify", built, "--source", EXAMPLE).exit_code == 0
