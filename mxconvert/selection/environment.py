"""The runtime's variables of the environment (`VLLM_*`, `SGLANG_*`), read as the runtime would read
them on the target.

A CI job often sets the runtime's variables once for both the serving step and the conversion
step. vLLM reads some of them during MoE backend selection; mxconvert reads the same ones (per
runtime revision: the variables its selection style lists; for an SGLang row the `SGLANG_*` ones of
selection/sglang/environment.py) and reports each in the plan with where it came from. `--env
KEY=VALUE` wins over the environment. A variable that this revision's selection does not read (the
other runtime's among them) is reported as ignored with the reason; on a vLLM row one that
contradicts the device profile (`VLLM_ROCM_USE_AITER` against a profile without AITER) is refused.
On an SGLang row a profile with AITER on stands for `SGLANG_USE_AITER=1` unless the variable is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mxconvert.core.errors import InputError
from mxconvert.selection.sglang.environment import AITER_SWITCH, SGLANG_ENV_READ
from mxconvert.selection.vocabulary import styles_of

#: Variables the device profile or an option carries, not the selection style.
MARLIN_INPUT_DTYPE = "VLLM_MARLIN_INPUT_DTYPE"
AITER_VARS = {"VLLM_ROCM_USE_AITER": "rocm_use_aiter", "VLLM_ROCM_USE_AITER_MOE": "rocm_use_aiter_moe"}


def _style_vars(fmt: str, selection: str):
    style = styles_of(fmt).get(selection)
    if style is None:
        return "vLLM", (), {}
    known = tuple(o.var for o in style.env_overrides) + tuple(style.env_choices) + tuple(style.env_flags)
    return style.runtime, known, dict(style.env_removed)


def _vllm_bool(value: str) -> bool:
    """vLLM's `os.getenv(name, "False").lower() in ("true", "1")`."""
    return value.strip().lower() in ("true", "1")


def _aiter_report(key: str, value: str, profile, source: str) -> dict:
    """The report of an AITER switch set in the environment or with `--env` (`source`): ignored off
    ROCm; on ROCm it must agree with the profile, which carries it (refused otherwise, saying which
    profile or profile field does what the variable asks)."""
    field = AITER_VARS[key]
    if profile.platform != "rocm":
        return {"ignored": f"vLLM reads it on ROCm only; profile {profile.name} is {profile.platform}"}
    on = _vllm_bool(value)
    if on != getattr(profile, field):
        hint = (
            f"use the {profile.name}-aiter profile"
            if field == "rocm_use_aiter" and on and not profile.name.endswith("-aiter")
            else f"set {field} in a profile file"
        )
        where, undo = (
            ("in the environment", f"unset {key}")
            if source == "environment"
            else ("with --env", f"drop --env {key}={value}")
        )
        raise InputError(
            f"{key}={value} is set {where}, but profile {profile.name} has "
            f"{field} = {getattr(profile, field)}: {hint}, or {undo}"
        )
    return {"agrees_with_profile": True}


def resolve_environment(
    fmt: str,
    selection: str,
    profile,
    explicit: Mapping[str, str],
    marlin_input_dtype: str | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], str | None, dict[str, dict]]:
    """(env overrides for the selection, marlin input dtype, report by variable name)."""
    environ = os.environ if environ is None else environ
    if selection in SGLANG_ENV_READ:
        return _resolve_sglang(selection, profile, explicit, marlin_input_dtype, environ)
    runtime, known, removed = _style_vars(fmt, selection)
    env = dict(explicit)
    report: dict[str, dict] = {k: {"value": v, "from": "--env"} for k, v in explicit.items()}
    marlin = marlin_input_dtype
    if marlin is not None:
        report[MARLIN_INPUT_DTYPE] = {"value": marlin, "from": "--marlin-input-dtype"}
    for key in sorted(k for k in explicit if k in AITER_VARS and k not in known):
        # the profile carries it, as for the environment: checked against the profile, not passed on
        del env[key]
        report[key] |= _aiter_report(key, explicit[key], profile, "--env")
    for key in sorted(k for k in environ if k.startswith(("VLLM_", "SGLANG_"))):
        value = environ[key]
        if key.startswith("SGLANG_"):
            if key in explicit:
                report[key]["environment_value"] = value
            else:
                report[key] = {
                    "value": value,
                    "from": "environment",
                    "ignored": f"{runtime} does not read SGLang's variables",
                }
            continue
        if key in explicit or (key == MARLIN_INPUT_DTYPE and marlin_input_dtype is not None):
            report[key]["environment_value"] = value  # the option wins; say so
            continue
        if key in known:
            env[key] = value
            report[key] = {"value": value, "from": "environment"}
        elif key == MARLIN_INPUT_DTYPE:
            marlin = value
            report[key] = {"value": value, "from": "environment"}
        elif key in AITER_VARS:
            report[key] = {"value": value, "from": "environment", **_aiter_report(key, value, profile, "environment")}
        else:
            why = removed.get(key) or f"not read by the MoE backend selection of {runtime}"
            report[key] = {"value": value, "from": "environment", "ignored": why}
    return env, marlin, report


def _resolve_sglang(
    selection: str,
    profile,
    explicit: Mapping[str, str],
    marlin_input_dtype: str | None,
    environ: Mapping[str, str],
) -> tuple[dict[str, str], str | None, dict[str, dict]]:
    """`resolve_environment` for an SGLang row: the `SGLANG_*` variables the release reads
    (`SGLANG_ENV_READ`), from `--env` or the environment; a profile with AITER on gives
    `SGLANG_USE_AITER=1` where neither sets it; vLLM's variables are reported as ignored (SGLang reads
    none of them: VLLM_MARLIN_INPUT_DTYPE is passed on as read, for pipeline/plan.py
    `sglang_marlin_input` to refuse or report)."""
    read = SGLANG_ENV_READ[selection]
    env = dict(explicit)
    report: dict[str, dict] = {k: {"value": v, "from": "--env"} for k, v in explicit.items()}
    marlin = marlin_input_dtype
    if marlin is not None:
        report[MARLIN_INPUT_DTYPE] = {"value": marlin, "from": "--marlin-input-dtype"}
    for key in sorted(k for k in environ if k.startswith(("VLLM_", "SGLANG_"))):
        value = environ[key]
        if key in explicit or (key == MARLIN_INPUT_DTYPE and marlin_input_dtype is not None):
            report[key]["environment_value"] = value  # the option wins; say so
        elif key in read:
            env[key] = value
            report[key] = {"value": value, "from": "environment"}
        elif key == MARLIN_INPUT_DTYPE:
            marlin = value
            report[key] = {"value": value, "from": "environment"}
        else:
            report[key] = {"value": value, "from": "environment", "ignored": f"not read by {selection}"}
    if profile.platform == "rocm" and profile.rocm_use_aiter and AITER_SWITCH not in env:
        env[AITER_SWITCH] = "1"
        report[AITER_SWITCH] = {"value": "1", "from": f"profile {profile.name} (AITER on)"}
    return env, marlin, report
