"""`register()`: the SGLang general plugin (entry point group `sglang.srt.plugins`, pyproject.toml).

SGLang's `load_plugins()` (sglang/srt/plugins/__init__.py) calls it in every process (launcher,
engine, each scheduler) and then applies the registered hooks (hook.py says what they do).
"""

from __future__ import annotations

from mxconvert.runtimes.sglang.dependency import LOAD_FORMAT, missing_sglang


def register() -> None:
    """Add "mxconvert" to SGLang's `--load-format` choices and hook `LoadConfig._verify_load_format`
    (hook.py) through SGLang's plugin hook registry (idempotent). SGLang's `load_plugins()` applies
    the hook after running every plugin; a caller outside it calls `HookRegistry.apply_hooks()`."""
    try:
        from sglang.srt.arg_groups.choices import LOAD_FORMAT_CHOICES, add_load_format_choices
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from mxconvert.runtimes.sglang.hook import VERIFY_TARGET, is_registered, resolve_load_format
    except ImportError as exc:  # SGLang (or a module it needs) is missing: say what to install
        raise missing_sglang(exc) from exc

    if LOAD_FORMAT not in LOAD_FORMAT_CHOICES:
        add_load_format_choices([LOAD_FORMAT])
    if not is_registered(HookRegistry._hooks):
        HookRegistry.register(VERIFY_TARGET, resolve_load_format, HookType.AROUND)
