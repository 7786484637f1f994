"""The target options travel as one `TargetRequest` (pipeline/plan.py): the command line builds it
once from its options and hands it to `plan_targets` / `convert_targets` (pipeline/targets.py); the
public `plan` / `convert` keep their keyword signatures and build it from them. These tests hold
the signatures, the request's fields and the forwarding equal, so an option cannot be dropped or
defaulted on the way.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from helpers import EXAMPLE, run_cli

from mxconvert.core.errors import InputError
from mxconvert.pipeline import targets
from mxconvert.pipeline.plan import TargetRequest

FIELDS = [f.name for f in dataclasses.fields(TargetRequest)]

#: A value for each public keyword that differs from its default, so that a keyword the public
#: function failed to forward shows as a default in the captured request.
NON_DEFAULT = {
    "profile": ["h100", "b200"],
    "runtime": "vllm-0.20",
    "backend": "triton",
    "tp": [1, 2],
    "ep": 4,
    "dp": 2,
    "enable_expert_parallel": True,
    "rank": 3,
    "activation": "mxfp8",
    "lora": True,
    "batched": True,
    "all2all": "deepep_low_latency",
    "eplb": True,
    "env": {"VLLM_A": "1"},
    "marlin_input_dtype": "fp8",
    "revision": "main",
    "cache_dir": "/nowhere/cache",
    "layout": "hf",
    "max_shard_size": "1GB",
}
#: The request those keywords make.
EXPECTED = TargetRequest(
    profile=("h100", "b200"),
    tp=(1, 2),
    runtime="vllm-0.20",
    backend="triton",
    ep=4,
    dp=2,
    enable_expert_parallel=True,
    rank=3,
    activation="mxfp8",
    lora=True,
    batched=True,
    all2all="deepep_low_latency",
    eplb=True,
    env={"VLLM_A": "1"},
    marlin_input_dtype="fp8",
    revision="main",
    cache_dir="/nowhere/cache",
    layout="hf",
    max_shard_size="1GB",
)


class Stop(InputError):
    """Raised by the stand-ins below once they have captured their arguments (exit 2 on the CLI)."""


def _capture(monkeypatch, name: str) -> list[tuple[tuple, dict]]:
    """Replace `targets.<name>` by a stand-in that records its arguments and stops the call."""
    calls: list[tuple[tuple, dict]] = []

    def stand_in(*args, **kwargs):
        calls.append((args, kwargs))
        raise Stop("captured")

    monkeypatch.setattr(targets, name, stand_in)
    return calls


def test_non_default_values_differ_from_every_default():
    """The premise of the forwarding tests: each field of EXPECTED is off its default."""
    assert set(NON_DEFAULT) == set(FIELDS)
    default = TargetRequest(profile=("h100",))
    same = [name for name in FIELDS if name != "profile" and getattr(EXPECTED, name) == getattr(default, name)]
    assert same == []


@pytest.mark.parametrize("function", [targets.plan, targets.convert], ids=["plan", "convert"])
def test_public_signature_lists_every_field_with_its_default(function):
    """`from_keywords(locals())` relies on it: each field is a keyword-only parameter of the same
    name, and the parameters' defaults make the request's defaults."""
    params = inspect.signature(function).parameters
    keyword_only = [name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [name for name in FIELDS if name not in keyword_only] == []
    defaults = {name: params[name].default for name in FIELDS if name != "profile"}
    assert TargetRequest.from_keywords(defaults | {"profile": "h100"}) == TargetRequest(profile=("h100",))


def test_public_plan_forwards_every_option(monkeypatch):
    calls = _capture(monkeypatch, "plan_targets")

    def warn(text: str) -> None:
        pass

    with pytest.raises(Stop):
        targets.plan("MODEL", **NON_DEFAULT, warn=warn)
    assert calls == [(("MODEL", EXPECTED), {"warn": warn})]


def test_public_convert_forwards_every_option(monkeypatch):
    calls = _capture(monkeypatch, "convert_targets")
    writing = {
        "dry_run": True,
        "force": True,
        "jobs": 3,
        "device": "cuda:1",
        "file_sha256": True,
        "write_mode": "direct",
        "progress": object(),
        "on_target": object(),
        "warn": object(),
    }
    with pytest.raises(Stop):
        targets.convert("MODEL", "OUT", **NON_DEFAULT, **writing)
    assert calls == [(("MODEL", "OUT", EXPECTED), writing)]


#: The target options on the command line, spelled as a user would, and the request they make.
CLI_OPTIONS = (
    "--backend", "triton", "--runtime", "vllm-0.20", "--ep", "4", "-ep", "--dp", "2", "--activation", "mxfp8",
    "--lora", "--batched", "--all2all", "deepep_low_latency", "--eplb", "--env", "VLLM_A=1", "--env", "VLLM_B=2",
    "--marlin-input-dtype", "fp8", "--revision", "main", "--cache-dir", "/nowhere/cache", "--layout", "hf",
)  # fmt: skip
CLI_REQUEST = dataclasses.replace(EXPECTED, env=("VLLM_A=1", "VLLM_B=2"))


def test_cli_select_builds_one_request_from_its_options(monkeypatch):
    """`select` takes no --rank nor --max-shard-size: its one target keeps their defaults."""
    from mxconvert.cli.console import warn_line

    calls = _capture(monkeypatch, "plan_targets")
    result = run_cli("select", "MODEL", "-p", "h100", "--tp", "2", *CLI_OPTIONS)
    assert result.exit_code == 2 and "captured" in result.output
    expected = dataclasses.replace(CLI_REQUEST, profile=("h100",), tp=(2,), rank=None, max_shard_size="4GB")
    assert calls == [(("MODEL", expected), {"warn": warn_line})]


def test_cli_convert_builds_one_request_from_its_options(monkeypatch, tmp_path):
    calls = _capture(monkeypatch, "convert_targets")
    out = tmp_path / "out"
    args = ("-p", "h100", "-p", "b200", "--tp", "1", "--tp", "2", "--rank", "3", "--max-shard-size", "1GB")
    result = run_cli("convert", "MODEL", "-o", out, *args, *CLI_OPTIONS, "--dry-run", "-j", "3")
    assert result.exit_code == 2 and "captured" in result.output
    ((positional, keywords),) = calls
    assert positional == ("MODEL", out, CLI_REQUEST)
    assert (keywords["dry_run"], keywords["force"], keywords["jobs"], keywords["device"]) == (True, False, 3, "cpu")


def test_cli_convert_without_tp_is_one_target_of_tp_1(monkeypatch, tmp_path):
    calls = _capture(monkeypatch, "convert_targets")
    result = run_cli("convert", "MODEL", "-o", tmp_path / "out", "-p", "h100")
    assert result.exit_code == 2
    ((positional, _),) = calls
    assert positional[2] == TargetRequest(profile=("h100",))


def test_request_is_frozen_and_holds_copies():
    """A caller's list or dict changed after the call does not change the request."""
    env, profiles, sizes = ["VLLM_A=1"], ["h100"], [1]
    request = TargetRequest.from_keywords({"profile": profiles, "tp": sizes, "env": env})
    env.append("VLLM_B=2")
    profiles.append("b200")
    sizes.append(2)
    assert (request.profile, request.tp, request.env) == (("h100",), (1,), ("VLLM_A=1",))
    mapping = {"VLLM_A": "1"}
    held = TargetRequest.from_keywords({"profile": "h100", "env": mapping})
    mapping["VLLM_B"] = "2"
    assert held.env == {"VLLM_A": "1"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.tp = (2,)


def test_env_overrides_parse_and_refuse_as_before():
    request = TargetRequest(profile=("h100",), env=(" VLLM_A = 1 ", "VLLM_B=x=y"))
    assert request.env_overrides() == {"VLLM_A": "1", "VLLM_B": "x=y"}
    assert TargetRequest(profile=("h100",), env={" VLLM_A": 2}).env_overrides() == {"VLLM_A": "2"}
    with pytest.raises(InputError, match=r"^--env 'BAD': expected KEY=VALUE$"):
        TargetRequest(profile=("h100",), env=("BAD",)).env_overrides()


def test_keywords_and_request_plan_the_same():
    """The public keywords and a request built directly make the same plan (headers only, no write)."""
    env = "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1"
    (by_keywords,) = targets.plan(str(EXAMPLE), profile="b200", tp=2, runtime="vllm-0.20", env=[env])
    request = TargetRequest(profile=("b200",), tp=(2,), runtime="vllm-0.20", env=(env,))
    (by_request,) = targets.plan_targets(str(EXAMPLE), request)
    assert by_keywords.plan.summary() == by_request.plan.summary()
    assert by_keywords.environment == by_request.environment and by_keywords.warnings == by_request.warnings
