"""Path A = path B for the SGLang loader's compressed-tensors NVFP4 install (runtimes/sglang/install_nvfp4.py
`install_nvfp4_ct_marlin`), on CPU: MARLIN, what SGLang 0.5.23 takes for a compressed-tensors NVFP4 MoE on
SM80-SM90 (`CompressedTensorsW4A16Nvfp4MoE`, the W4A4 checkpoint served weight-only), TP 1 and TP 2,
every rank and layer of examples/tiny-nvfp4-ct-qwen3:

* path A: SGLang's own `CompressedTensorsFusedMoEMethod` / `CompressedTensorsW4A16Nvfp4MoE`
  `create_weights`, `FusedMoE`'s per-expert loading of the checkpoint and `process_weights_after_loading`
  (tools/golden/sglang_nvfp4.py's `SglangNvfp4Ct`, compiled from the installed sglang; stand-ins named
  there: `gptq_marlin_repack` and `marlin_make_workspace` are tools/golden/sglang_mxfp4_marlin.py's);
* path B: the same `create_weights`, then the loader's installer on the artifact `convert --runtime
  sglang==0.5.23 --profile h100 --tp N` wrote: the runtime and layer checks (`nvfp4_layer`), `prepare`
  (layer set, dtypes / shapes, checksums, release of the parameters) and `postprocess` in place of
  SGLang's post-processing.

Compared: every parameter left on the layer (type, requires_grad, dtype, shape, device, bytes: SGLang
deletes compressed-tensors' own, so none is left out), which of the deleted ones remain (none), and
`workspace`. Planted bugs make the comparison fail or the loader refuse.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import harness
import pytest

from mxconvert.runtimes.common.mismatch import ArtifactMismatch
from mxconvert.runtimes.sglang import install_nvfp4
from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.install_nvfp4 import CT_DELETED, nvfp4_layer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller

flashinfer = pytest.importorskip("flashinfer")  # .venv-sglang has FlashInfer 0.7.2 (conftest.py skips elsewhere)
import ct_paths  # noqa: E402
import sglang_nvfp4 as golden  # noqa: E402
from ct_paths import EXAMPLE, EXPERTS, HIDDEN, INTER, RANKS, prefix  # noqa: E402

LIVE_H100 = LiveSglang("0.5.23", "cuda", [9, 0], flashinfer.__version__)
W4A4 = True  # the example quantizes activations too (input_activations); SGLang drops them below SM100


@pytest.fixture(scope="module")
def code() -> golden.SglangNvfp4Ct:
    return golden.SglangNvfp4Ct(harness.read_installed)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("sglang-nvfp4-ct-artifacts")
    return {
        tp: harness.convert(
            EXAMPLE, root / f"tp{tp}", "--runtime", "sglang==0.5.23", "--profile", "h100", "--tp", str(tp)
        )  # fmt: skip
        for tp in (1, 2)
    }


def state(layer: Any) -> dict[str, object]:
    """Every parameter left on the layer, which of compressed-tensors' deleted ones remain, and `workspace`."""
    out: dict[str, object] = {name: harness.parameter_state(p) for name, p in layer.named_parameters()}
    out["deleted parameters left"] = ("attribute", tuple(name for name in CT_DELETED if hasattr(layer, name)))
    workspace = layer.workspace
    out["workspace"] = ("attribute", workspace.dtype, tuple(workspace.shape), workspace.tolist())
    return out


def path_a(code, tp: int, rank: int) -> dict[str, dict]:
    return ct_paths.path_a(code, state, tp, rank)


def path_b(code, artifact: Path, tp: int, rank: int, verify_checksums: bool = True) -> dict[str, dict]:
    return ct_paths.path_b(
        code, state, LIVE_H100, artifact, tp, rank, verify_checksums, golden.marlin_tool.marlin_make_workspace
    )


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_ct_marlin_path_a_equals_path_b(code, artifacts, tp, rank):
    a = path_a(code, tp, rank)
    assert harness.all_differences(a, path_b(code, artifacts[tp], tp, rank)) == []
    first = next(iter(a.values()))
    assert set(first) == {
        "w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2",
        "workspace", "deleted parameters left",
    }  # fmt: skip
    assert first["deleted parameters left"] == ("attribute", ())


@pytest.mark.parametrize(("tp", "rank"), RANKS, ids=lambda v: str(v))
def test_path_a_is_the_committed_golden(code, tp, rank):
    """Path A reproduces tools/golden/sglang_nvfp4.py's recorded run (same code, same stand-ins)."""
    ct_paths.assert_path_a_is_the_golden(code, "nvfp4-ct-marlin_sglang-0.5.23_example_digests.json", tp, rank)


# ---- planted bugs ----------------------------------------------------------------------------------


def test_planted_flipped_byte_is_seen(code, artifacts, tmp_path):
    art = harness.flipped_copy(artifacts[1], tmp_path / "art")
    assert harness.all_differences(path_a(code, 1, 0), path_b(code, art, 1, 0, verify_checksums=False))
    with pytest.raises(Exception, match="sha256|checksum|size"):
        path_b(code, art, 1, 0)


def test_planted_install_that_keeps_compressed_tensors_parameters_is_seen(code, artifacts, monkeypatch):
    """An install that does not delete what SGLang's scheme deletes leaves the layer unlike SGLang's."""
    monkeypatch.setattr(install_nvfp4, "CT_DELETED", ())
    found = harness.all_differences(path_a(code, 1, 0), path_b(code, artifacts[1], 1, 0))
    assert found and any("w13_weight_packed" in line for line in found), found


def test_a_w4a4_scheme_layer_is_refused(code, artifacts):
    """On SM100 SGLang takes CompressedTensorsW4A4Nvfp4MoE (FLASHINFER_CUTLASS): not a MARLIN artifact's bytes."""
    installer = SglangArtifactInstaller(artifacts[1], nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE_H100)
    method, layer = code.build_ct(EXPERTS, HIDDEN, INTER, W4A4, 1, 0)
    layer.scheme = type("CompressedTensorsW4A4Nvfp4MoE", (), {"group_size": 16})()
    with pytest.raises(ArtifactMismatch, match="FLASHINFER_CUTLASS"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


def test_a_scheme_of_another_group_size_is_refused(code, artifacts):
    installer = SglangArtifactInstaller(artifacts[1], nvfp4_dispatch=lambda: False)
    installer.check_runtime(LIVE_H100)
    method, layer = code.build_ct(EXPERTS, HIDDEN, INTER, W4A4, 1, 0)
    layer.scheme.group_size = 32
    with pytest.raises(ArtifactMismatch, match="group_size"):
        installer.prepare([(prefix(0), layer, nvfp4_layer(prefix(0), method, layer))])


def test_a_tp2_artifact_in_a_tp1_process_is_refused(code, artifacts):
    with pytest.raises(ArtifactMismatch, match="tp_size"):
        path_b(code, artifacts[2], 1, 0)


def test_a_modelopt_layer_is_not_taken_for_a_compressed_tensors_one(code):
    """`nvfp4_ct_scheme` recognises the scheme by its class only (a ModelOpt FusedMoE has `scheme` None)."""
    assert install_nvfp4.nvfp4_ct_scheme(types.SimpleNamespace(scheme=None)) is None
    _method, layer = code.build_ct(EXPERTS, HIDDEN, INTER, W4A4, 1, 0)
    assert install_nvfp4.nvfp4_ct_backend(install_nvfp4.nvfp4_ct_scheme(layer)) == "MARLIN"
