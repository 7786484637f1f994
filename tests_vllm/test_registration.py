"""The installed package registers the `mxconvert` load format through vLLM's own plugin loading."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

#: The vLLM releases these tests run against (conftest.py skips them in another release's venv).
VLLM_RELEASES = ("0.33.0", "0.26.0")


def test_entry_point_registers_the_load_format():
    assert "mxconvert" in {e.name for e in entry_points(group="vllm.general_plugins")}
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    from mxconvert.runtimes.vllm.loader import MxconvertModelLoader

    load_general_plugins()
    loader = get_model_loader(
        LoadConfig(
            load_format="mxconvert",
            model_loader_extra_config={"on_mismatch": "reconvert", "enable_multithread_load": False},
        )
    )
    assert isinstance(loader, MxconvertModelLoader)
    assert loader.on_mismatch == "reconvert" and loader.verify_checksums
    # vLLM's default loader sees only its own keys
    assert loader.load_config.model_loader_extra_config == {"enable_multithread_load": False}
    # registering twice (vLLM loads plugins in every process) is harmless
    from mxconvert.runtimes.vllm import register

    register()
    assert isinstance(get_model_loader(LoadConfig(load_format="mxconvert")), MxconvertModelLoader)


def test_unknown_on_mismatch_value_is_refused(artifacts):
    from mxconvert.core.errors import InputError
    from mxconvert.runtimes.vllm.adapters import live_adapter
    from mxconvert.runtimes.vllm.installer import ArtifactInstaller

    art = artifacts.get("h100", "--tp", "1", "--runtime", live_adapter().row)  # the row of this venv's vLLM
    with pytest.raises(InputError, match="on_mismatch='ignore'"):
        ArtifactInstaller(art, on_mismatch="ignore")
