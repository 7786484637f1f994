"""Planted bugs in the plugin's vLLM 0.19.x adapter (row vllm-0.19, GPT-OSS MXFP4), run in vLLM 0.19.0's and
0.19.1's thin venvs (`VLLM_VERSION=0.19.1 bash tools/vllm_env/setup.sh`) next to the path A = path B tests
every served release runs (test_release_rows.py).

vLLM 0.19.x differs from 0.20.0 for the plugin in two names only (adapters.py `_MXFP4_0_19`): its quant
method `Mxfp4MoEMethod` and its conversion function `convert_to_mxfp4_moe_kernel_format`; what it shares
with 0.20.0-0.24.0 but not with later releases (the TRITON conversion keeps the checkpoint scale
parameters) is the adapter's too. The planted bugs:

* one changed byte of an artifact tensor: refused by the checksums; with them off the plugin's checks
  pass and it loads, and path A = path B is what tells (the comparison sees the bytes vLLM runs);
* the vllm-0.19 adapter with 0.20.0's conversion name: the whole-model load through `--load-format
  mxconvert` is refused by name before any artifact file is read (no bypass of a function the release
  does not call);
* the vllm-0.19 adapter with 0.25.0's TRITON leftovers (`triton_keeps_checkpoint_scales=False`): vLLM
  0.19.x's own post-processing, which reads the scale parameters after the conversion
  (`Mxfp4MoEMethod.get_fused_moe_quant_config`), fails on the layer the plugin left.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct

import harness as H
import harness_rows as R
import pytest

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm import adapters

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.19.0", "0.19.1")

HOPPER = (9, 0)
ROW = "vllm-0.19"


@pytest.fixture(scope="module", autouse=True)
def cpu_platform():
    R.use_cpu_platform()


def planted(monkeypatch, **fields) -> None:
    """The vllm-0.19 adapter with `fields` replaced, for the rest of the test."""
    adapter = adapters.ADAPTERS[ROW]
    assert adapters.live_adapter("mxfp4") is adapter
    monkeypatch.setitem(adapters.ADAPTERS, ROW, dataclasses.replace(adapter, **fields))


def test_a_changed_artifact_byte_is_caught(artifacts, tmp_path):
    """Planted bug: one byte of a rank file's layer-1 w2 weight. Refused by the checksums; with them off
    it loads, and path B differs from path A in that layer's w2 weight."""
    art = tmp_path / "changed"
    shutil.copytree(artifacts.get("h100", "--tp", "1", *R.runtime_args()), art)
    rank_file = next((art / "rank-00000").glob("*.safetensors"))
    raw = bytearray(rank_file.read_bytes())
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    begin = 8 + header_len + header["model.layers.1.mlp.experts.w2_weight"]["data_offsets"][0]
    raw[begin + 7] ^= 0x01
    rank_file.write_bytes(bytes(raw))
    target = H.Target("TRITON", HOPPER, 1, 0)
    with pytest.raises(MismatchError, match="sha256|checksum|digest"):
        R.path_b(target, art)
    H.reset_opt_flags()
    state_a = H.state(R.path_a(target))
    H.reset_opt_flags()
    model_b, installer = R.path_b(target, art, verify_checksums=False)
    assert installer.target["runtime_revision"] == ROW
    assert installer.sources and not installer.reconverted  # the plugin's own checks pass
    state_b = H.state(model_b)
    assert state_a != state_b
    found = H.first_difference(state_a, state_b)
    assert "/layers/" in found and "/1/" in found and "w2_weight" in found, found


def test_a_conversion_name_the_release_lacks_is_refused_before_any_read(artifacts, opened, monkeypatch):
    """Planted bug: the vllm-0.19 adapter names 0.20.0's conversion function, which vLLM 0.19.x's
    quantization/mxfp4.py does not import: `--load-format mxconvert` refuses, naming the function, and
    reads no artifact tensor file."""
    art = artifacts.get("h100", "--tp", "1", *R.runtime_args())
    planted(monkeypatch, mxfp4_converter="convert_gpt_oss_weight_to_mxfp4_moe_kernel_format")
    with pytest.raises(MismatchError) as err:
        R.load_model(art, "mxconvert", H.Target("TRITON", HOPPER, 1, 0))
    message = str(err.value)
    assert (
        "vllm.model_executor.layers.quantization.mxfp4 has no convert_gpt_oss_weight_to_mxfp4_moe_kernel_format"
        in message
    )
    assert "vLLM 0.19." in message
    assert opened == []


def test_without_the_kept_checkpoint_scales_vllms_post_processing_fails(artifacts, monkeypatch):
    """Planted bug: the vllm-0.19 adapter says the TRITON conversion deletes the scale parameters (as from
    0.25.0). vLLM 0.19.x's own post-processing reads them after the conversion: it fails on the layer."""
    art = artifacts.get("h100", "--tp", "1", *R.runtime_args())
    assert adapters.ADAPTERS[ROW].triton_keeps_checkpoint_scales
    planted(monkeypatch, triton_keeps_checkpoint_scales=False)
    H.reset_opt_flags()
    with pytest.raises(AttributeError, match="has no attribute 'w13_weight_scale'"):
        R.path_b(H.Target("TRITON", HOPPER, 1, 0), art)
