"""The plugin's digest check beside its reads (issue 26 item 4), through vLLM 0.33.0's own model loading:
`get_model_loader(LoadConfig(load_format="mxconvert")).load_model(...)` (MxconvertModelLoader: checks,
vLLM's create_model, shared/ through vLLM's weight iterator and `load_weights`, post-processing with the
MoE conversion bypassed), stand-ins as in test_full_model.py.

Held: a good artifact loads the state vLLM's default loader gives (test_full_model.py holds every
tensor) with the digests checked; a flipped byte in an expert tensor, in a rank file's safetensors
header (parsed by the read-ahead before its digest is known) and in a shared/ tensor or header (read by
vLLM itself) each make `load_model` raise the file's digest `MismatchError` (exit 1) instead of
returning the model, and leave no hashing or reading thread behind; the digests are submitted before
the first expert tensor is handed out, and the first one cannot end before it is (an order of events,
not a timing).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading

import harness as H
import pytest
from test_full_model import load as load_through_vllm

import mxconvert.artifact.checksums as checksums_module
from mxconvert.artifact.prefetch import Prefetcher
from mxconvert.core.errors import MismatchError

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0",)

sys.path.insert(0, str(H.REPO / "tests"))
from helpers import flip_stored_bits, rank_tensor  # noqa: E402  (tests/helpers.py)

HOPPER = H.Target("TRITON", (9, 0), 1, 0)
OUR_THREADS = ("mxconvert-leaf", "mxconvert-tree", "mxconvert-sha256", "mxconvert-prefetch")
#: a correct load hands the first tensor out at once; one that hashed before reading never would
HAND_OUT_WAIT_S = 120


@pytest.fixture
def art(artifacts, tmp_path):
    out = tmp_path / "art"
    shutil.copytree(artifacts.get("h100", "--tp", "1"), out)
    return out


def our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(OUR_THREADS)]


def refused(art, match: str) -> MismatchError:
    model = None
    with pytest.raises(MismatchError, match=match) as err:
        model, _ = load_through_vllm(art, "mxconvert", HOPPER)
    assert model is None and err.value.exit_code == 1  # vLLM gets no model: its load fails
    assert our_threads() == []
    return err.value


def flip_header(file) -> None:
    data = bytearray(file.read_bytes())
    data[8] ^= 0x01  # the header's opening "{": no longer JSON
    file.write_bytes(bytes(data))


def shared_file_and_key(art):
    manifest = json.loads((art / "mxconvert.json").read_text())
    return art / manifest["shared"]["files"][0]["file"], next(iter(manifest["shared"]["tensors"]))


def test_a_good_artifact_loads_with_its_digests_checked(art, monkeypatch):
    events: list[str] = []
    original_check = checksums_module.FileChecks.check

    def check(self):
        original_check(self)
        events.append(f"checked {len(self.entries)} files")

    monkeypatch.setattr(checksums_module.FileChecks, "check", check)
    model, loader = load_through_vllm(art, "mxconvert", HOPPER)
    assert model is not None and len(loader.installer.sources) == H.NUM_LAYERS
    manifest = json.loads((art / "mxconvert.json").read_text())
    listed = len(manifest["ranks"][0]["files"]) + len(manifest["shared"]["files"])
    assert f"checked {listed} files" in events and loader.installer.checks is None  # checked and closed
    assert our_threads() == []


def test_a_flipped_expert_byte_is_refused(art):
    key, file = rank_tensor(art, "w13_weight")
    flip_stored_bits(file, key, 0, 0x01)
    refused(art, f"{file}: sha256 tree digest .* does not match the manifest")


def test_a_flipped_rank_header_byte_is_refused_by_its_digest(art):
    _, file = rank_tensor(art, "w13_weight")
    flip_header(file)
    err = refused(art, f"{file}: sha256 tree digest .* does not match the manifest")
    assert err.__cause__ is not None and str(file) in str(err.__cause__)  # the reader's own refusal


def test_a_flipped_shared_byte_vllm_reads_is_refused(art):
    file, key = shared_file_and_key(art)
    flip_stored_bits(file, key, 0, 0x01)
    refused(art, f"{file}: sha256 tree digest .* does not match the manifest")


def test_a_shared_header_vllm_cannot_parse_is_refused_by_its_digest(art):
    file, _ = shared_file_and_key(art)
    flip_header(file)
    err = refused(art, f"{file}: sha256 tree digest .* does not match the manifest")
    assert err.__cause__ is not None  # what vLLM's weight iterator raised


def test_the_first_digest_cannot_end_before_the_first_tensor_is_handed_out(art, monkeypatch):
    """The first digest computed waits for the first tensor vLLM takes: the load completes only
    because the reads do not wait for the digests (an order of events, not a timing)."""
    events: list[str] = []
    handed_out = threading.Event()
    first = threading.Lock()
    tree_digest_file = checksums_module.tree_digest_file
    original_init = checksums_module.FileChecks.__init__
    original_hand_out = Prefetcher._handed_out

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if any(entry["file"].endswith(".safetensors") for entry in self.entries):  # not the copied files'
            events.append("digests submitted")

    def digest(path, *args):
        if str(path).endswith(".safetensors") and first.acquire(blocking=False):
            waited = handed_out.wait(HAND_OUT_WAIT_S)
            out = tree_digest_file(path, *args)
            events.append("first digest done" if waited else "never")
            return out
        return tree_digest_file(path, *args)

    def hand_out(self, tensor):
        if not handed_out.is_set():
            events.append("first tensor handed out")
            handed_out.set()
        return original_hand_out(self, tensor)

    monkeypatch.setattr(checksums_module.FileChecks, "__init__", init)
    monkeypatch.setattr(checksums_module, "tree_digest_file", digest)
    monkeypatch.setattr(Prefetcher, "_handed_out", hand_out)
    model, _ = load_through_vllm(art, "mxconvert", HOPPER)
    assert model is not None
    assert events == ["digests submitted", "first tensor handed out", "first digest done"]
