"""The plugin's digest check runs beside its reads (issue 26 item 4), without vLLM: `ArtifactInstaller`
on plain torch modules standing in for the layers vLLM builds, in the order vLLM's loader calls it
(runtimes/vllm/loader.py): `check_runtime`, then inside `conversion_bypass` (vLLM's `load_model`)
`prepare` and the shared tensors read as vLLM reads them (`load_weights`), then each layer's kernel
tensors taken from its source (vLLM's `process_weights_after_loading`).

Held: a good artifact installs what it installed before (and what `load_artifact` returns); a flipped
byte in a tensor, in a rank file's header and in a shared/ file each make the load raise the file's
digest `MismatchError` (exit 1) and return nothing, with every hashing and reading thread joined;
the hashing runs while the tensors are handed out (the digests are submitted before the first tensor
is handed out, and a digest blocked until then still completes: an order of events, no timing);
every digest is checked before the load returns and before `on_mismatch=reconvert` reads the
artifact; sizes are still checked before any file is opened; `verify_checksums: false` hashes nothing;
the hashing threads run at a lower CPU priority than the loading thread (Linux).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import threading

import pytest
import torch
from helpers import EXAMPLE, flip_stored_bits, rank_tensor, run_cli

import mxconvert.artifact.checksums as checksums_module
import mxconvert.runtimes.vllm.installer as installer_module
import mxconvert.storage.safetensors_io as sio
from mxconvert import load_artifact
from mxconvert.artifact.prefetch import Prefetcher
from mxconvert.core.errors import InputError, MismatchError
from mxconvert.runtimes.vllm.checks import LiveLayer, LiveRuntime
from mxconvert.runtimes.vllm.install import EXPERT_NAMES
from mxconvert.runtimes.vllm.installer import ArtifactInstaller, iter_shared

H100 = LiveRuntime("0.33.0", "cuda", [9, 0], None, "3.5.1")
PREFIXES = ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
#: the threads the installer starts (artifact/checksums.py, artifact/prefetch.py)
OUR_THREADS = ("mxconvert-leaf", "mxconvert-tree", "mxconvert-sha256", "mxconvert-prefetch")
#: how long a blocked digest waits for the first tensor to be handed out; a correct load hands it
#: out at once, an install that waited for the digests before reading never does
HAND_OUT_WAIT_S = 120


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("overlapped") / "h100"
    result = run_cli("convert", EXAMPLE, "--profile", "h100", "-o", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def art(made, tmp_path):
    copy = tmp_path / "art"
    shutil.copytree(made, copy)
    return copy


@pytest.fixture(autouse=True)
def no_vllm_bypass(monkeypatch):
    """vLLM's conversion is not there to bypass: the test body stands in for its post-processing."""
    row = installer_module.INSTALLS["mxfp4"]
    plain = dataclasses.replace(row, bypass=lambda sources: contextlib.nullcontext())
    monkeypatch.setitem(installer_module.INSTALLS, "mxfp4", plain)


def layers(art, backend: str | None = None) -> list[tuple[str, torch.nn.Module, LiveLayer]]:
    target = json.loads((art / "mxconvert.json").read_text())["target"]
    out = []
    for prefix in PREFIXES:
        module = torch.nn.Module()
        for name in EXPERT_NAMES:
            module.register_parameter(name, torch.nn.Parameter(torch.ones(4, 8, 16), requires_grad=False))
        live = LiveLayer(
            prefix=prefix,
            backend=backend or target["backend"],
            hidden_size_padded=target["hidden_size_padded"],
            intermediate_size_padded=target["intermediate_size_padded"],
            tp_size=1,
            ep_size=1,
            rank=0,
            num_experts=4,
        )
        out.append((prefix, module, live))
    return out


def load(art, events: list[str] | None = None, backend: str | None = None, **options) -> dict[str, torch.Tensor]:
    """The plugin's load in vLLM's order; returns what the layers were given (the model vLLM gets)."""
    events = [] if events is None else events
    installer = ArtifactInstaller(art, **options)
    installer.check_runtime(H100)
    found = layers(art, backend)
    installed: dict[str, torch.Tensor] = {}
    with installer.conversion_bypass():  # vLLM's load_model
        installer.prepare(found)  # load_weights: the checks, then vLLM reads shared/ itself
        shared = dict(iter_shared(installer.shared_files()))
        assert shared
        for prefix, module, _ in found:  # process_weights_after_loading, layer by layer
            source = installer.source_for(module)
            if source is not None:
                for name, tensor in source.read(torch.device("cpu")).items():
                    installed[f"{prefix}.{name}"] = tensor
        events.append("post-processed")
    events.append("returned")
    return installed


def our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(OUR_THREADS)]


def refused(art, match: str, events: list[str] | None = None, **options) -> MismatchError:
    returned = None
    with pytest.raises(MismatchError, match=match) as err:
        returned = load(art, events, **options)
    assert returned is None  # no model for vLLM
    assert err.value.exit_code == 1
    assert our_threads() == []  # hashing and read-ahead stopped and joined
    return err.value


def rank_file_header_flip(art) -> tuple:
    _, file = rank_tensor(art, "w13_weight")
    data = bytearray(file.read_bytes())
    data[8] ^= 0x01  # the header's opening "{": no longer JSON
    file.write_bytes(bytes(data))
    return file


def shared_file(art):
    manifest = json.loads((art / "mxconvert.json").read_text())
    return art / manifest["shared"]["files"][0]["file"]


# ---- a good artifact ------------------------------------------------------------------------------------
def test_a_good_artifact_installs_what_load_artifact_returns(art):
    events: list[str] = []
    installed = load(art, events)
    assert events == ["post-processed", "returned"]
    reference = load_artifact(art, rank=0, include_shared=False).tensors
    assert sorted(installed) == sorted(reference)
    for key, tensor in installed.items():
        assert tensor.shape == reference[key].shape and tensor.stride() == reference[key].stride(), key
        assert torch.equal(tensor.view(torch.uint8), reference[key].view(torch.uint8)), key
    assert installed.keys() == load(art, verify_checksums=False).keys()
    assert our_threads() == []


# ---- a flipped byte: tensor, header, shared/ --------------------------------------------------------------
def test_a_flipped_tensor_byte_is_refused_when_the_load_ends(art):
    key, file = rank_tensor(art, "w13_weight")
    flip_stored_bits(file, key, 0, 0x01)
    events: list[str] = []
    refused(art, f"{file}: sha256 tree digest .* does not match the manifest", events)
    assert events == ["post-processed"]  # read and installed meanwhile; refused before load_model returned


def test_a_flipped_header_byte_is_reported_as_the_files_digest(art):
    file = rank_file_header_flip(art)
    err = refused(art, f"{file}: sha256 tree digest .* does not match the manifest")
    assert isinstance(err.__cause__, InputError) and str(file) in str(err.__cause__)  # the header it broke


def test_a_flipped_byte_in_a_shared_file_vllm_reads_is_refused(art):
    file = shared_file(art)
    key = next(iter(json.loads((art / "mxconvert.json").read_text())["shared"]["tensors"]))
    flip_stored_bits(file, key, 0, 0x01)
    refused(art, f"{file}: sha256 tree digest .* does not match the manifest")


def test_a_broken_shared_header_vllm_cannot_parse_is_reported_as_the_files_digest(art):
    file = shared_file(art)
    data = bytearray(file.read_bytes())
    data[8] ^= 0x01
    file.write_bytes(bytes(data))
    err = refused(art, f"{file}: sha256 tree digest .* does not match the manifest")
    assert err.__cause__ is not None  # what vLLM's (here safetensors') reader raised


def test_mutation_without_the_final_check_loads_the_flipped_byte(art, monkeypatch):
    key, file = rank_tensor(art, "w13_weight")
    flip_stored_bits(file, key, 0, 0x01)
    monkeypatch.setattr(installer_module.FileChecks, "check", lambda self: None)
    assert load(art)[key].numel() > 0


def test_verify_checksums_false_hashes_nothing(art, monkeypatch):
    key, file = rank_tensor(art, "w13_weight")
    flip_stored_bits(file, key, 0, 0x01)

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed with verify_checksums false")

    monkeypatch.setattr(installer_module, "FileChecks", no_hashing)
    assert key in load(art, verify_checksums=False)


# ---- the order of events ----------------------------------------------------------------------------------
def watch(monkeypatch, events: list[str], block_until_handed_out: bool = False) -> None:
    """Record when the digests are submitted (on the loading thread), when each tree digest starts
    and ends, when the digests are checked and when the first tensor is handed out; with
    `block_until_handed_out` the first digest computed waits for the first tensor to be handed out."""
    handed_out = threading.Event()
    first = threading.Lock()
    tree_digest_file = checksums_module.tree_digest_file
    original_init = checksums_module.FileChecks.__init__
    original_check = checksums_module.FileChecks.check
    original_hand_out = Prefetcher._handed_out

    def weight_files(checks) -> bool:  # not the copied files' check (config, tokenizer)
        return any(entry["file"].endswith(".safetensors") for entry in checks.entries)

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if weight_files(self):
            events.append("digests submitted")

    def digest(path, *args):
        events.append("hash started")
        if block_until_handed_out and str(path).endswith(".safetensors") and first.acquire(blocking=False):
            events.append("first digest waited" if handed_out.wait(HAND_OUT_WAIT_S) else "never")
        out = tree_digest_file(path, *args)
        events.append("hash done")
        return out

    def check(self):
        original_check(self)
        if weight_files(self):
            events.append("checked")

    def hand_out(self, tensor):
        if not handed_out.is_set():
            events.append("first tensor handed out")
            handed_out.set()
        return original_hand_out(self, tensor)

    monkeypatch.setattr(checksums_module, "tree_digest_file", digest)
    monkeypatch.setattr(checksums_module.FileChecks, "__init__", init)
    monkeypatch.setattr(checksums_module.FileChecks, "check", check)
    monkeypatch.setattr(Prefetcher, "_handed_out", hand_out)


@pytest.mark.parametrize("prefetch_bytes", [installer_module.PREFETCH_BYTES, 0])
def test_the_hashing_runs_while_the_tensors_are_handed_out(art, monkeypatch, prefetch_bytes):
    """The first digest computed cannot end before a tensor is handed out: the load completes only
    because the reads do not wait for the digests (an install that checked every digest before
    reading would never hand a tensor out to it)."""
    events: list[str] = []
    watch(monkeypatch, events, block_until_handed_out=True)
    load(art, events, prefetch_bytes=prefetch_bytes)
    assert "never" not in events and "first digest waited" in events
    assert events.index("digests submitted") < events.index("first tensor handed out") < events.index("hash done")
    assert events[-2:] == ["checked", "returned"]  # every digest checked before the load returns
    assert events.index("post-processed") < events.index("checked")
    assert events.count("hash done") == events.count("hash started") == len(rank_and_shared_files(art))
    assert max(i for i, e in enumerate(events) if e == "hash done") < events.index("checked")


def test_the_digests_are_submitted_before_the_first_tensor_is_handed_out(art, monkeypatch):
    events: list[str] = []
    watch(monkeypatch, events)
    load(art, events)
    assert events.index("digests submitted") < events.index("first tensor handed out") < events.index("checked")


def rank_and_shared_files(art) -> list[str]:
    manifest = json.loads((art / "mxconvert.json").read_text())
    return [f["file"] for f in manifest["ranks"][0]["files"] + manifest["shared"]["files"]]


# ---- reconvert reads only checked bytes ------------------------------------------------------------------------
def test_reconvert_waits_for_the_digests_before_reading(art, monkeypatch):
    events: list[str] = []
    watch(monkeypatch, events)

    def canonical(*args):
        events.append("reconvert read")
        return {}

    monkeypatch.setattr(installer_module, "canonical_tensors", canonical)
    load(art, events, backend="MARLIN", on_mismatch="reconvert")
    assert events.index("checked") < events.index("reconvert read")


def test_reconvert_of_a_flipped_byte_is_refused_before_reading(art, monkeypatch):
    key, file = rank_tensor(art, "w13_weight")
    flip_stored_bits(file, key, 0, 0x01)
    events: list[str] = []
    monkeypatch.setattr(installer_module, "canonical_tensors", lambda *args: events.append("reconvert read"))
    refused(art, f"{file}: sha256 tree digest", events, backend="MARLIN", on_mismatch="reconvert")
    assert events == []


# ---- sizes before any read ---------------------------------------------------------------------------------------
def test_a_truncated_file_is_refused_before_any_file_is_opened(art, monkeypatch):
    _, file = rank_tensor(art, "w13_weight")
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size - 1)
    opened: list[str] = []
    original = sio.ShardReader.__init__

    def spy(self, path, *args, **kwargs):
        opened.append(str(path))
        original(self, path, *args, **kwargs)

    monkeypatch.setattr(sio.ShardReader, "__init__", spy)
    monkeypatch.setattr(checksums_module, "tree_digest_file", lambda *args: opened.append("hashed"))
    refused(art, f"{file}: size .* bytes, manifest says")
    assert opened == []


# ---- the hashing threads' priority ------------------------------------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_the_hashing_threads_run_niced_and_the_loading_thread_does_not(art, monkeypatch):
    """Tree and leaf threads at the loading thread's nice value + CHECK_NICE (the leaf threads are
    started by the tree thread, whose raised value they inherit: they still get exactly that)."""
    seen: dict[str, set[int]] = {"tree": set(), "leaf": set()}
    tree_digest_file = checksums_module.tree_digest_file

    def nice_of_this_thread(*_) -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def digest(path, pool, *args):
        seen["tree"].add(nice_of_this_thread())
        seen["leaf"].update(pool.map(nice_of_this_thread, range(4)))
        return tree_digest_file(path, pool, *args)

    monkeypatch.setattr(checksums_module, "tree_digest_file", digest)
    before = nice_of_this_thread()
    load(art)
    expected = min(19, before + installer_module.CHECK_NICE)
    assert seen == {"tree": {expected}, "leaf": {expected}}
    assert nice_of_this_thread() == before
