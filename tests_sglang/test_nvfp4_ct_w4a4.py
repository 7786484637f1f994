"""Path A = path B for the SGLang loader's compressed-tensors NVFP4 W4A4 install (runtimes/sglang/install_nvfp4.py
`install_nvfp4_ct_cutlass`), on CPU: FLASHINFER_CUTLASS, what SGLang 0.5.23 takes for a compressed-tensors W4A4
NVFP4 MoE from capability 10.0 (`CompressedTensorsW4A4Nvfp4MoE`, its CUTLASS branch), TP 1 and TP 2, every rank
and layer of examples/tiny-nvfp4-ct-qwen3:

* path A: SGLang's own `CompressedTensorsFusedMoEMethod` / `CompressedTensorsW4A4Nvfp4MoE` `create_weights`,
  `FusedMoE`'s per-expert loading of the checkpoint and `process_weights_after_loading`
  (tools/golden/sglang_nvfp4.py's `SglangNvfp4Ct` with runner `flashinfer_cutlass`, compiled from the
  installed sglang);
* path B: the same `create_weights`, then the loader's installer on the artifact `convert --runtime
  sglang==0.5.23 --profile b200 --tp N` wrote: the runtime and layer checks (`nvfp4_layer`), `prepare`
  (layer set, dtypes / shapes, checksums, release of the parameters) and `postprocess` in place of
  SGLang's post-processing.

Compared: every parameter (type, requires_grad, dtype, shape, device, bytes) but the scheme's raw
`w13/w2_weight_global_scale` and `w13/w2_input_global_scale`, which the CUTLASS kernel does not read after
post-processing (not in the artifact: path B leaves them as `create_weights` made them), which of the
`_packed` weights remain (none), `_cutlass_swiglu_params` and the dispatcher's quant config. Planted bugs
make the comparison fail or the loader refuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness
import pytest

from mxconvert.runtimes.common.mismatch import ArtifactMismatch
from mxconvert.runtimes.sglang import install_nvfp4
from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_layer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller

flashinfer = pytest.importorskip("flashinfer")  # .venv-sglang has FlashInfer 0.7.2 (conftest.py skips elsewhere)
import ct_paths  # noqa: E402
import sglang_nvfp4 as golden  # noqa: E402
from ct_paths import EXAMPLE, EXPERTS, HIDDEN, INTER, RANKS, prefix  # noqa: E402

LIVE_B200 = LiveSglang("0.5.23", "cuda", [10, 0], flashinfer.__version__)
#: The scheme's raw parameters its CUTLASS kernel does not read after post-processing (not in the artifact).
RAW = {"w13_weight_global_scale", "w2_weight_global_scale", "w13_input_global_scale", "w2_input_global_scale"}


@pytest.fixture(scope="module")
def code() -> golden.SglangNvfp4Ct:
    return golden.SglangNvfp4Ct(harness.read_installed, "flashinfer_cutlass")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-nvfp4-ct-w4a4-artifacts")
    return {
        tp: harness.convert(
            EXAMPLE, root / f"tp{tp}", "--runtime", "sglang==0.5.23", "--profile", "b200", "--tp", str(tp)
        )  # fmt: skip
        for tp in (1, 2)
    }


def state(layer: Any) -> dict[str, object]:
    out: dict[str, object] = {
        name: harness.parameter_state(p)
        for name, p in layer.named_parameters(remove_duplicate=False)
        if name not in RAW
    }
    out["packed weights left"] = (
        "attribute",
        tuple(n for n in ("w13_weight_packed", "w2_weight_packed") if hasattr(layer, n)),
    )
    out["_cutlass_swiglu_params"] = ("attribute", repr(getattr(layer, "_cutlass_swiglu_params", "<unset>")))
    out["dispatcher"] = ("attribute", repr(layer.dispatcher.quant_config))
    return out


def path_a(code, tp: int, rank: int) -> dict[str, dict]:
    return ct_paths.path_a(code, state, tp, rank)


def path_b(code, artifact: Path, tp: int, rank: int, verify_checksums: bool = True) -> dict[str, dict]:
    return ct_paths.path_b(code, state, LIVE_B200, artifact, tp, rank, verify_checksums)


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_ct_w4a4_cutlass_path_a_equals_path_b(code, artifacts, tp, rank):
    a = path_a(code, tp, rank)
    assert harness.all_differences(a, path_b(code, artifacts[tp], tp, rank)) == []
    first = next(iter(a.values()))
    assert set(install_nvfp4.NVFP4_CT_CUTLASS_NAMES) <= set(first)
    assert first["packed weights left"] == ("attribute", ())


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_is_the_committed_golden(code, tp, rank):
    """Path A reproduces tools/golden/sglang_nvfp4.py's recorded run (same code, same stand-ins)."""
    ct_paths.assert_path_a_is_the_golden(code, "nvfp4-ct-cutlass_sglang-0.5.23_example_digests.json", tp, rank)


# ---- planted bugs ----------------------------------------------------------------------------------


def test_planted_flipped_byte_is_seen(code, artifacts, tmp_path):
    art = harness.flipped_copy(artifacts[1], tmp_path / "art")
    assert harness.all_differences(path_a(code, 1, 0), path_b(code, art, 1, 0, verify_checksums=False))
    with pytest.raises(Exception, match="sha256|checksum|size"):
        path_b(code, art, 1, 0)


def test_planted_install_that_skips_a_scalar_is_seen(code, artifacts, monkeypatch):
    """An install that leaves `w13_input_scale_quant` unset leaves the layer unlike SGLang's."""
    names = tuple(n for n in install_nvfp4.NVFP4_CT_CUTLASS_NAMES if n != "w13_input_scale_quant")
    monkeypatch.setattr(install_nvfp4, "NVFP4_CT_CUTLASS_NAMES", names)
    found = harness.all_differences(path_a(code, 1, 0), path_b(code, artifacts[1], 1, 0))
    assert found and any("w13_input_scale_quant" in line for line in found), found


def test_a_trtllm_scheme_layer_is_refused(code, artifacts):
    """The W4A4 scheme's TRT-LLM branch (`flashinfer_trtllm`, FLASHINFER_TRTLLM) makes other bytes: not a CUTLASS
    artifact's."""
    installer = SglangArtifactInstaller(artifacts[1], nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE_B200)
    method, layer = code.build_ct(EXPERTS, HIDDEN, INTER, True, 1, 0)
    layer.scheme.use_flashinfer_trtllm = True
    with pytest.raises(ArtifactMismatch, match="FLASHINFER_TRTLLM"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


def test_a_marlin_artifact_is_refused_in_a_w4a4_layer(code, tmp_path):
    """The h100 artifact (MARLIN, the W4A16 scheme's) in a layer SGLang gave the W4A4 scheme: refused."""
    artifact = harness.convert(EXAMPLE, tmp_path / "h100", "--runtime", "sglang==0.5.23", "--profile", "h100")
    installer = SglangArtifactInstaller(artifact, nvfp4_dispatch=lambda: False)
    installer.check_runtime(LiveSglang("0.5.23", "cuda", [9, 0], flashinfer.__version__))
    method, layer = code.build_ct(EXPERTS, HIDDEN, INTER, True, 1, 0)
    with pytest.raises(ArtifactMismatch, match="FLASHINFER_CUTLASS"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


def test_a_tp2_artifact_in_a_tp1_process_is_refused(code, artifacts):
    with pytest.raises(ArtifactMismatch, match="tp_size"):
        path_b(code, artifacts[2], 1, 0)
