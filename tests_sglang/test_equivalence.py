"""Path A = path B for the SGLang loader, on CPU, for the backend mxconvert writes for SGLang 0.5.23
(FLASHINFER_TRTLLM_MXFP4_MXFP8, profile b200), TP 1 and TP 2, every rank and layer of
examples/tiny-gpt-oss:

* path A: SGLang's own `create_weights`, `_load_mxfp4_experts_weights` of the checkpoint and
  `process_weights_after_loading` (harness.py; stand-ins named there);
* path B: the same `create_weights`, then the loader's installer on the artifact `convert --runtime
  sglang==0.5.23 --profile b200 --tp N` wrote: the runtime and layer checks against the facts read
  from SGLang's layer and method (layer_state.py), `prepare` (layer set, dtypes / shapes, checksums,
  release of the checkpoint-shaped parameters) and `postprocess` in place of SGLang's
  post-processing (install.py); also as the loader runs it, the digests beside the reads and the
  tensors read ahead (`prepare(..., overlapped=True)`, `finish`).

The whole layer state must be equal: every parameter's type, requires_grad, dtype, shape, device and
bytes, and the plain attributes SGLang sets. Planted bugs (a flipped byte with checksums off, a wrong
gemm1 default, an artifact of another runtime row let through) make the comparison fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import harness
import pytest

from mxconvert.runtimes.common.load_overlap import PREFETCH_BYTES
from mxconvert.runtimes.sglang import checks, install
from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller
from mxconvert.runtimes.sglang.layer_state import sglang_layer

flashinfer = pytest.importorskip("flashinfer")  # .venv-sglang has FlashInfer 0.7.2 (conftest.py skips elsewhere)

#: The B200 scheduler process SGLang 0.5.23 would be (the facts check_runtime compares).
LIVE = LiveSglang("0.5.23", "cuda", [10, 0], flashinfer.__version__)
LAYERS = range(harness.config()["num_hidden_layers"])
RANKS = [(1, 0), (2, 0), (2, 1)]
DIGESTS = harness.REPO / "tests" / "golden" / "sglang" / "trtllm-sm100_sglang-0.5.23_example_digests.json"


def convert(out: Path, *args: str) -> Path:
    return harness.convert(harness.EXAMPLE, out, "--profile", "b200", *args)


@pytest.fixture(scope="module")
def code() -> harness.SglangCode:
    return harness.SglangCode()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-artifacts")
    return {tp: convert(root / f"tp{tp}", "--runtime", "sglang==0.5.23", "--tp", str(tp)) for tp in (1, 2)}


def path_a(code: harness.SglangCode, tp: int, rank: int) -> dict[str, dict]:
    states = {}
    for layer_id in LAYERS:
        built = harness.build_layer(code, layer_id, tp, rank)
        harness.load_checkpoint(code, built)
        built.method.process_weights_after_loading(built.layer)
        states[built.prefix] = harness.layer_state(built.layer)
    return states


def path_b(
    code: harness.SglangCode,
    artifact: Path,
    tp: int,
    rank: int,
    verify_checksums: bool = True,
    prefetch_bytes: int | None = None,
) -> dict[str, dict]:
    """With `prefetch_bytes`, as the loader runs it: the digests beside the reads, read ahead, `finish`."""
    overlapped = prefetch_bytes is not None
    installer = SglangArtifactInstaller(artifact, verify_checksums=verify_checksums, prefetch_bytes=prefetch_bytes or 0)
    installer.check_runtime(LIVE)
    built = [harness.build_layer(code, layer_id, tp, rank) for layer_id in LAYERS]
    installer.prepare([(b.prefix, b.layer, sglang_layer(b.prefix, b.method, b.layer)) for b in built], overlapped)
    assert all(installer.holds(b.layer) for b in built)
    for b in built:
        installer.postprocess(b.layer, b.method)
    installer.finish()
    assert not overlapped or installer.reads is not None and installer.reads.taken > 0
    return {b.prefix: harness.layer_state(b.layer) for b in built}


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_equals_path_b(code, artifacts, tp, rank):
    a = path_a(code, tp, rank)
    b = path_b(code, artifacts[tp], tp, rank)
    assert harness.all_differences(a, b) == []
    # the state compared is the TRT-LLM kernel's: its nine parameters and the routing-bias attribute
    names = set(next(iter(a.values())))
    assert names == set(install.SGLANG_NAMES) | {"gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit", *harness.ATTRIBUTES}


@pytest.mark.parametrize("prefetch_bytes", [PREFETCH_BYTES, 1, 0], ids=["default", "one-tensor", "each-when-asked"])
def test_path_a_equals_path_b_read_ahead(code, artifacts, prefetch_bytes):
    """The loader's overlapped load (digests beside the reads, tensors read ahead) installs the same state."""
    assert harness.all_differences(path_a(code, 2, 1), path_b(code, artifacts[2], 2, 1, True, prefetch_bytes)) == []


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_is_the_committed_golden(code, tp, rank):
    """Path A here is the run tools/golden/sglang_mxfp4_example.py recorded (so both tests
    read the same SGLang code the same way)."""
    golden = json.loads(DIGESTS.read_text())["digests"][f"tp{tp}"][f"rank{rank}"]
    for layer_id in LAYERS:
        built = harness.build_layer(code, layer_id, tp, rank)
        harness.load_checkpoint(code, built)
        built.method.process_weights_after_loading(built.layer)
        for name, want in golden[f"layer{layer_id}"].items():
            harness.assert_matches_digest(getattr(built.layer, name).data, want, f"layer{layer_id}.{name}")


# ---- planted bugs: each must make path A != path B --------------------------------------------


def test_planted_flipped_byte_is_seen(code, artifacts, tmp_path):
    """One byte of a rank file changed, the checksums switched off: the states differ (and with
    checksums on, prepare refuses the file)."""
    art = harness.flipped_copy(artifacts[1], tmp_path / "art")
    found = harness.all_differences(path_a(code, 1, 0), path_b(code, art, 1, 0, verify_checksums=False))
    assert found, "a flipped byte went unseen"
    with pytest.raises(Exception, match="sha256|checksum|size"):
        path_b(code, art, 1, 0)


def test_planted_wrong_gemm1_default_is_seen(code, artifacts, monkeypatch):
    monkeypatch.setattr(install, "GEMM1_ALPHA_DEFAULT", 1.7)
    found = harness.all_differences(path_a(code, 2, 1), path_b(code, artifacts[2], 2, 1))
    assert any("gemm1_alpha" in line for line in found), found


def test_planted_other_runtime_row_is_seen(code, tmp_path, monkeypatch):
    """A vLLM 0.33 artifact of the same backend has SGLang's shapes but zero scale padding: with the
    runtime check planted away it installs, and the scales differ; with the check, it is refused."""
    vllm_art = convert(tmp_path / "vllm", "--runtime", "vllm==0.33.0", "--backend", "FLASHINFER_TRTLLM_MXFP4_MXFP8")
    with pytest.raises(checks.ArtifactMismatch, match="runtime_revision"):
        path_b(code, vllm_art, 1, 0)
    monkeypatch.setattr("mxconvert.runtimes.sglang.installer.runtime_mismatches", lambda target, live: [])
    found = harness.all_differences(path_a(code, 1, 0), path_b(code, vllm_art, 1, 0))
    assert found and all("weight_scale" in line for line in found), found
