"""Which vLLM release the plugin serves as which runtime row (adapters.py), and that a release it does
not serve is refused by name before anything is built. Runs in every plugin venv."""

from __future__ import annotations

import harness as H
import pytest

from mxconvert.core.errors import MismatchError
from mxconvert.runtimes.vllm import adapters
from mxconvert.runtimes.vllm.dependency import PLUGIN_ROWS, served_releases

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0", "0.26.0")


@pytest.mark.parametrize(
    "version, row",
    [
        ("0.33.0", "vllm-0.33"),
        ("0.33.0+cpu", "vllm-0.33"),
        ("0.26.0", "vllm-0.26"),
        ("0.26.0+cu130", "vllm-0.26"),
        # releases served through the row that covers them (dependency.PLUGIN_PROVEN)
        ("0.25.1", "vllm-0.25"),
        ("0.28.0", "vllm-0.27"),
        ("0.32.0", "vllm-0.32"),
        ("0.20.1", "vllm-0.20"),
        ("0.19.0", "vllm-0.19"),
        ("0.19.1", "vllm-0.19"),
        # served for NVFP4 only (no MXFP4 row lists them): the NVFP4 row
        ("0.18.1", "vllm-0.18"),
        ("0.17.1", "vllm-0.17"),
        ("0.15.0", "vllm-0.15"),
        # releases no row covers, which the plugin does not serve
        ("0.14.1", None),
        ("0.34.0", None),
        ("0.33", None),
        ("main", None),
    ],
)
def test_each_release_maps_to_one_row_or_none(version, row):
    found = adapters.serving_row(version)
    assert (found.name if found is not None else None) == row


def test_every_plugin_row_has_one_adapter():
    assert tuple(adapters.ADAPTERS) == PLUGIN_ROWS
    assert PLUGIN_ROWS[0] == "vllm-0.33" and {"vllm-0.26", "vllm-0.25-nvfp4", "vllm-0.20", "vllm-0.19"} <= set(
        PLUGIN_ROWS
    )
    assert served_releases() == "0.15.0-0.33.0"
    assert served_releases("mxfp4") == "0.19.0-0.33.0"


def test_an_installed_release_the_plugin_does_not_serve_is_refused(artifacts, opened, monkeypatch):
    """vLLM 0.34.0 installed (package metadata and `vllm.__version__`): the runtime check refuses it,
    naming the releases the plugin loads into, before any layer is built or file read; the steps
    that would need an adapter refuse too."""
    import vllm

    from mxconvert.runtimes.vllm.installer import ArtifactInstaller
    from mxconvert.runtimes.vllm.loader import live_runtime

    row = adapters.installed_adapter().row
    art = artifacts.get("h100", "--tp", "1", "--runtime", row)
    monkeypatch.setattr(adapters, "installed_vllm", lambda: "0.34.0")
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    with H.cuda_device((9, 0)):
        live = live_runtime()
    assert live.triton_kernels is None
    with pytest.raises(MismatchError) as err:
        ArtifactInstaller(art).check_runtime(live)
    message = str(err.value)
    assert "field 'vllm_version': artifact has '0.15.0-0.33.0 (the vLLM this plugin installs into)'" in message
    assert "this worker has '0.34.0'" in message
    assert opened == []
    with pytest.raises(MismatchError, match=r"loads into vLLM 0\.15\.0-0\.33\.0; the installed vLLM is 0\.34\.0"):
        adapters.live_adapter()
