"""SGLang's variables read as vLLM's are (selection/environment.py, selection/sglang/environment.py):
`SGLANG_*` from the environment or `--env`, a profile with AITER on standing for SGLANG_USE_AITER=1 on
an SGLang row, each runtime's variables ignored (and said so) under the other's row, and the serve
command carrying the SGLANG_* variables the artifact was made for."""

from __future__ import annotations

import json

from helpers import EXAMPLE, run_cli

from mxconvert.selection.environment import resolve_environment
from mxconvert.target.profiles import get_profile

SGLANG = ("--runtime", "sglang==0.5.23")


def _select(*args: str, env: dict | None = None) -> dict:
    result = run_cli("select", EXAMPLE, *args, "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_an_aiter_profile_is_sglang_use_aiter_on_an_sglang_row():
    data = _select("--profile", "mi355x-aiter", *SGLANG)
    assert data["backend"] == "AITER_MXFP4_BF16"
    assert data["environment"]["SGLANG_USE_AITER"] == {"value": "1", "from": "profile mi355x-aiter (AITER on)"}
    assert data["serve_command"].startswith("SGLANG_USE_AITER=1 sglang serve ")


def test_sglang_use_aiter_from_the_environment_is_read():
    data = _select("--profile", "mi355x", *SGLANG, env={"SGLANG_USE_AITER": "1"})
    assert data["backend"] == "AITER_MXFP4_BF16"
    assert data["environment"]["SGLANG_USE_AITER"] == {"value": "1", "from": "environment"}
    off = run_cli(
        "select", EXAMPLE, "--profile", "mi355x", *SGLANG, "--backend", "aiter", env={"SGLANG_USE_AITER": "0"}
    )
    assert off.exit_code == 2 and "needs SGLANG_USE_AITER=1" in off.output


def test_env_option_wins_over_the_profile_and_the_environment():
    profile = get_profile("mi355x-aiter")
    env, _, report = resolve_environment(
        "mxfp4", "sglang-0.5.23", profile, {"SGLANG_USE_AITER": "0"}, None, environ={"SGLANG_USE_AITER": "1"}
    )
    assert env == {"SGLANG_USE_AITER": "0"}
    assert report["SGLANG_USE_AITER"] == {"value": "0", "from": "--env", "environment_value": "1"}


def test_vllm_variables_are_ignored_on_an_sglang_row_not_checked_against_the_profile():
    # VLLM_ROCM_USE_AITER=1 against a profile without AITER is refused on a vLLM row; SGLang reads none of it
    profile = get_profile("mi355x")
    env, _, report = resolve_environment(
        "mxfp4", "sglang-0.5.23", profile, {}, None, environ={"VLLM_ROCM_USE_AITER": "1", "HOME": "/root"}
    )
    assert env == {}
    assert report == {
        "VLLM_ROCM_USE_AITER": {"value": "1", "from": "environment", "ignored": "not read by sglang-0.5.23"}
    }


def test_sglang_variables_are_ignored_on_a_vllm_row():
    env, _, report = resolve_environment(
        "mxfp4", "vllm-0.33", get_profile("mi355x"), {}, None, environ={"SGLANG_USE_AITER": "1"}
    )
    assert "SGLANG_USE_AITER" not in env
    assert "ignored" in report["SGLANG_USE_AITER"]


def test_the_aiter_profile_converts_the_bytes_of_the_env_switch(tmp_path):
    """`--profile mi355x-aiter` and `--profile mi355x --env SGLANG_USE_AITER=1` write the same tensors."""
    digests = []
    for name, extra in (
        ("profile", ("--profile", "mi355x-aiter")),
        ("env", ("--profile", "mi355x", "--env", "SGLANG_USE_AITER=1")),
    ):
        out = tmp_path / name
        result = run_cli("convert", EXAMPLE, *extra, *SGLANG, "-o", out)
        assert result.exit_code == 0, result.output
        manifest = json.loads((out / "mxconvert.json").read_text())
        assert manifest["target"]["backend"] == "AITER_MXFP4_BF16"
        assert manifest["target"]["serve"]["env"] == {"SGLANG_USE_AITER": "1"}
        digests.append([(f["file"], f["sha256_chunked"]["digest"]) for r in manifest["ranks"] for f in r["files"]])
    assert digests[0] == digests[1] and digests[0]
