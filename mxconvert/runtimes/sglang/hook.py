"""How `--load-format mxconvert` reaches SGLang 0.5.23's model loader (no SGLang import here).

SGLang's load formats are the fixed enum `LoadFormat` (sglang/srt/configs/load_config.py): every
`LoadConfig` turns its string `load_format` into a member in `__post_init__` ->
`_verify_load_format`, so an unknown string raises there. But `_verify_load_format` leaves a
non-string alone, and `get_model_loader` (model_loader/loader.py) returns
`load_config.load_format(load_config)` when `load_format` is a class. The plugin therefore wraps
`_verify_load_format` (an AROUND hook through SGLang's own plugin hook registry,
sglang/srt/plugins/hook_registry.py) so that the string "mxconvert" becomes the loader class, and
adds "mxconvert" to the CLI's `--load-format` choices through the extension point SGLang declares
for plugins (`add_load_format_choices`, sglang/srt/arg_groups/choices.py). Both run in every
SGLang process that calls `load_plugins()` (the launcher, the engine, each scheduler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mxconvert.runtimes.sglang.dependency import LOAD_FORMAT

#: The method the hook wraps (a dotted path, as SGLang's `HookRegistry.register` takes it).
VERIFY_TARGET = "sglang.srt.configs.load_config.LoadConfig._verify_load_format"
#: The entry point group SGLang's `load_plugins()` runs (sglang/srt/plugins/__init__.py).
PLUGIN_GROUP = "sglang.srt.plugins"
#: The entry point mxconvert declares in that group (pyproject.toml).
PLUGIN_VALUE = "mxconvert.runtimes.sglang:register"


def loader_class() -> type:
    """The loader class (imports SGLang; only called inside an SGLang process)."""
    from mxconvert.runtimes.sglang.loader import MxconvertSglangLoader

    return MxconvertSglangLoader


def resolve_load_format(original: Callable[..., Any], config: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of `LoadConfig._verify_load_format`: "mxconvert" (any case) becomes the loader
    class, which `get_model_loader` instantiates; every other value goes through SGLang's check."""
    fmt = config.load_format
    if isinstance(fmt, str) and fmt.lower() == LOAD_FORMAT:
        config.load_format = loader_class()
        return None
    return original(config, *args, **kwargs)


def is_registered(hooks: dict[str, list]) -> bool:
    """`resolve_load_format` is among the hooks registered on `VERIFY_TARGET` (`HookRegistry._hooks`)."""
    return any(entry[1] is resolve_load_format for entry in hooks.get(VERIFY_TARGET, ()))


def plugin_installed(entry_points: Any) -> bool:
    """mxconvert's entry point is among those `load_plugins()` finds (`importlib.metadata.entry_points`)."""
    return any(ep.value == PLUGIN_VALUE for ep in entry_points(group=PLUGIN_GROUP))
