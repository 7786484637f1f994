"""`--load-format mxconvert` through SGLang 0.5.23's own plugin machinery, on CPU.

What runs of SGLang is its source (importing `sglang` needs its serving stack): the plugin hook
registry (sglang/srt/plugins/hook_registry.py) and the CLI choices (srt/arg_groups/choices.py),
each loaded as the module of its own name; `LoadFormat` and `LoadConfig._verify_load_format`
(srt/configs/load_config.py) and `get_model_loader` (srt/model_loader/loader.py) compiled from
their source. Stood in: the parent packages (empty), `LoadConfig` (a class holding SGLang's
`_verify_load_format`; `is_hip()` -> False), the loader class (loader.py imports SGLang's CUDA
stack) and the `get_model_loader` names it never reaches (`DummyModelLoader`).

Shown: `register()` adds "mxconvert" to SGLang's `--load-format` choices and registers an AROUND
hook that SGLang's `HookRegistry.apply_hooks()` applies; after it "mxconvert" (any case) becomes the
loader class and `get_model_loader` returns an instance of it; every other format still goes
through SGLang's own check; register is idempotent.
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import sys
import types
from pathlib import Path

import harness
import pytest

from mxconvert.runtimes.sglang import hook
from mxconvert.runtimes.sglang.plugin import register


def _module_from_file(monkeypatch, name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def _nodes(rel: str, names: set[str], cls: str | None = None) -> list[ast.stmt]:
    tree = ast.parse((harness.sglang_root() / rel).read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    found: list[ast.stmt] = [n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in names]
    named = {n.name for n in found if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert named == names, f"sglang/{rel} lacks {names - named}"
    return found


def _exec(nodes: list[ast.stmt], rel: str, namespace: dict) -> None:
    module = ast.Module(body=nodes, type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), f"sglang/{rel}", "exec"), namespace)  # noqa: S102


class StandInLoader:
    """The loader class `get_model_loader` instantiates (loader.py needs SGLang's CUDA stack)."""

    def __init__(self, load_config):
        self.load_config = load_config


@pytest.fixture
def sglang(monkeypatch):
    """SGLang's registry, choices and load-config check as the modules of their names."""
    root = harness.sglang_root()  # found before the stand-in packages hide the real one
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.arg_groups", "sglang.srt.configs"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    registry = _module_from_file(monkeypatch, "sglang.srt.plugins.hook_registry", root / "srt/plugins/hook_registry.py")
    choices = _module_from_file(monkeypatch, "sglang.srt.arg_groups.choices", root / "srt/arg_groups/choices.py")
    namespace: dict = {"enum": enum, "List": list, "is_hip": lambda: False}
    _exec(_nodes("srt/configs/load_config.py", {"LoadFormat"}), "srt/configs/load_config.py", namespace)
    _exec(
        _nodes("srt/configs/load_config.py", {"_verify_load_format"}, cls="LoadConfig"),
        "srt/configs/load_config.py",
        namespace,
    )
    load_config = types.ModuleType("sglang.srt.configs.load_config")

    class LoadConfig:
        _verify_load_format = namespace["_verify_load_format"]

        def __init__(self, load_format):
            self.load_format = load_format
            self._verify_load_format()  # what LoadConfig.__post_init__ does first

    load_config.LoadConfig = LoadConfig
    load_config.LoadFormat = namespace["LoadFormat"]
    monkeypatch.setitem(sys.modules, "sglang.srt.configs.load_config", load_config)
    _exec(_nodes("srt/model_loader/loader.py", {"get_model_loader"}), "srt/model_loader/loader.py", namespace)
    monkeypatch.setattr(hook, "loader_class", lambda: StandInLoader)
    yield types.SimpleNamespace(
        registry=registry.HookRegistry,
        choices=choices.LOAD_FORMAT_CHOICES,
        LoadConfig=LoadConfig,
        LoadFormat=namespace["LoadFormat"],
        get_model_loader=namespace["get_model_loader"],
    )
    registry.HookRegistry.reset()


def test_sglang_refuses_mxconvert_without_the_plugin(sglang):
    assert "mxconvert" not in sglang.choices
    with pytest.raises(ValueError, match="mxconvert"):
        sglang.LoadConfig("mxconvert")


def test_register_makes_mxconvert_a_load_format_of_sglang(sglang):
    register()
    register()  # idempotent
    assert sglang.choices.count("mxconvert") == 1
    assert len(sglang.registry._hooks[hook.VERIFY_TARGET]) == 1
    sglang.registry.apply_hooks()  # what load_plugins() does after running the plugins
    for value in ("mxconvert", "MXConvert"):
        config = sglang.LoadConfig(value)
        assert config.load_format is StandInLoader
        loader = sglang.get_model_loader(config)
        assert isinstance(loader, StandInLoader) and loader.load_config is config
    assert sglang.LoadConfig("safetensors").load_format is sglang.LoadFormat.SAFETENSORS
    with pytest.raises(ValueError, match="bogus"):
        sglang.LoadConfig("bogus")
