"""Path A and path B over examples/tiny-nvfp4-ct-qwen3, for the SGLang loader's tests of each
compressed-tensors NVFP4 backend (test_nvfp4_ct.py MARLIN, test_nvfp4_ct_w4a4.py FLASHINFER_CUTLASS,
test_nvfp4_ct_w4a4_trtllm.py FLASHINFER_TRTLLM). Each test module says what its backend's layer state
is (`state`) and which live runtime it checks against; the two paths and the golden check are one:

* path A: SGLang's own `CompressedTensorsFusedMoEMethod` + scheme `create_weights`, `FusedMoE`'s
  per-expert loading of the checkpoint and `process_weights_after_loading`
  (tools/golden/sglang_nvfp4.py's `SglangNvfp4Ct`, compiled from the installed sglang);
* path B: the same `create_weights`, then the loader's installer on the artifact (the runtime and
  layer checks, `prepare`, `postprocess` in place of SGLang's post-processing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import pytest

from mxconvert.runtimes.sglang.checks import LiveSglang
from mxconvert.runtimes.sglang.install_nvfp4 import nvfp4_layer
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller

pytest.importorskip("flashinfer")  # .venv-sglang has FlashInfer 0.7.2 (conftest.py skips elsewhere)
import sglang_common  # noqa: E402 - tools/golden is on sys.path (harness.py)
import sglang_nvfp4 as golden  # noqa: E402

EXAMPLE = harness.REPO / "examples" / "tiny-nvfp4-ct-qwen3"
CONFIG = json.loads((EXAMPLE / "config.json").read_text())
HIDDEN, INTER, EXPERTS = CONFIG["hidden_size"], CONFIG["moe_intermediate_size"], CONFIG["num_experts"]
LAYERS = range(CONFIG["num_hidden_layers"])
RANKS = [(1, 0), (2, 0), (2, 1)]
#: The example quantizes activations too (input_activations): SGLang's W4A4 scheme on SM100, W4A16 below.
W4A4 = True

State = Callable[[Any], dict[str, object]]


def prefix(layer_id: int) -> str:
    return f"model.layers.{layer_id}.mlp.experts"


def path_a(code, state: State, tp: int, rank: int, ep: int = 1) -> dict[str, dict]:
    """SGLang's own loading and post-processing of every layer of the example, as `state` sees it (`ep` > 1:
    the EP rank `rank` at MoE TP 1)."""
    states = {}
    for layer_id in LAYERS:
        method, layer = code.build_ct(EXPERTS, HIDDEN, INTER, W4A4, tp, rank, ep)
        with golden.sglang_imports(code.ns):
            golden._ct_load(layer, golden.example_experts(EXAMPLE, layer_id))
            method.process_weights_after_loading(layer)
        states[prefix(layer_id)] = state(layer)
    return states


def path_b(
    code,
    state: State,
    live: LiveSglang,
    artifact: Path,
    tp: int,
    rank: int,
    verify_checksums: bool = True,
    marlin_workspace: Callable | None = None,
    ep: int = 1,
) -> dict[str, dict]:
    """The loader's install of `artifact` into the same layers, checked against `live`."""
    installer = SglangArtifactInstaller(artifact, verify_checksums, marlin_workspace, nvfp4_dispatch=lambda: False)
    installer.check_runtime(live)
    built = {prefix(i): code.build_ct(EXPERTS, HIDDEN, INTER, W4A4, tp, rank, ep) for i in LAYERS}
    installer.prepare([(p, layer, nvfp4_layer(p, method, layer)) for p, (method, layer) in built.items()])
    for method, layer in built.values():
        installer.postprocess(layer, method)
    return {p: state(layer) for p, (_method, layer) in built.items()}


def assert_path_a_is_the_golden(code, digests: str, tp: int, rank: int) -> None:
    """Path A reproduces tools/golden/sglang_nvfp4.py's recorded run of the example (`digests`: the
    file under tests/golden/sglang/; same code, same stand-ins)."""
    want = json.loads(sglang_common.OUT.joinpath(digests).read_text())
    for layer_id in LAYERS:
        got = golden.run_sglang_ct(code, golden.example_experts(EXAMPLE, layer_id), HIDDEN, INTER, tp, rank)
        for name, tensor in got.items():
            harness.assert_matches_digest(tensor, want["digests"][f"tp{tp}"][f"rank{rank}"][f"layer{layer_id}"][name],
                                          f"tp{tp} rank{rank} layer{layer_id} {name}")  # fmt: skip
