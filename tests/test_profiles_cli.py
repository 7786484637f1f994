"""Device profiles (built-in and user files), `mxconvert profiles`, and `python -m mxconvert`."""

from __future__ import annotations

import json

import pytest
from helpers import EXAMPLE, run_cli, run_cli_subprocess

from mxconvert.core.errors import InputError
from mxconvert.target.profiles import BUILTIN_PROFILES, get_profile

REQUIRED = [
    "a100",
    "l40s",
    "h100",
    "h200",
    "b200",
    "gb200",
    "b300",
    "thor",
    "rtx-pro-6000",
    "rtx-5090",
    "gb10",
    "mi300x",
    "mi355x",
    "intel-xpu",
]


@pytest.mark.parametrize(
    "name, cap, platform",
    [
        ("a100", (8, 0), "cuda"),
        ("l40s", (8, 9), "cuda"),
        ("H200", (9, 0), "cuda"),
        ("gb200", (10, 0), "cuda"),
        ("b300", (10, 3), "cuda"),
        ("thor", (11, 0), "cuda"),
        ("RTX PRO 6000", (12, 0), "cuda"),
        ("gb10", (12, 1), "cuda"),
        ("mi355x", (9, 5), "rocm"),
        ("xpu", None, "xpu"),
    ],
)
def test_builtin_profiles_are_found_as_users_say_them(name, cap, platform):
    p = get_profile(name)
    assert p.capability == cap and p.platform == platform


def test_profiles_command_lists_every_required_profile():
    result = run_cli("profiles", "--json")
    assert result.exit_code == 0
    names = {p["name"] for p in json.loads(result.stdout)["profiles"]}
    assert set(REQUIRED) <= names and len(names) == len(BUILTIN_PROFILES)
    assert "rtx-pro-6000" in run_cli("profiles").stdout


def test_user_profile_files_json_and_toml(tmp_path):
    (tmp_path / "old-torch.toml").write_text('base = "h100"\nname = "h100-old-torch"\ntorch_geq_2_8_1 = false\n')
    (tmp_path / "custom.json").write_text(
        json.dumps({"name": "my-sm90", "platform": "cuda", "capability": "9.0", "has_triton_kernels": False})
    )
    p = get_profile(str(tmp_path / "old-torch.toml"))
    assert (p.name, p.capability, p.torch_geq_2_8_1) == ("h100-old-torch", (9, 0), False)
    # without triton_kernels an SM90 deployment falls back from TRITON to FlashInfer CUTLASS
    result = run_cli("select", EXAMPLE, "--profile", tmp_path / "custom.json", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["backend"] == "FLASHINFER_CUTLASS_MXFP4_BF16"
    # torch < 2.8.1 on SM90: triton_kernels falls back to strided layouts
    out = tmp_path / "out"
    assert run_cli("convert", EXAMPLE, "--profile", tmp_path / "old-torch.toml", "-o", out).exit_code == 0
    target = json.loads((out / "mxconvert.json").read_text())["target"]
    assert target["layout"]["value_layout"] == "StridedLayout" and target["device"]["name"] == "h100-old-torch"
    assert run_cli("verify", out).exit_code == 0  # the manifest carries the user profile


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"name": "x", "platform": "tpu"}', "platform 'tpu'"),
        ('{"name": "x", "platform": "cuda"}', "needs a capability"),
        ('{"name": "x", "platform": "cuda", "capability": "9.0", "colour": 1}', "unknown field(s) colour"),
        ("{not json", "cannot read it"),
    ],
)
def test_bad_user_profiles_are_refused(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_profile(str(path))
    result = run_cli("select", EXAMPLE, "--profile", path)
    assert result.exit_code == 2


def test_unknown_profile_lists_the_built_in_ones():
    result = run_cli("select", EXAMPLE, "--profile", "v100")
    assert result.exit_code == 2 and "unknown profile 'v100'" in result.stderr and "h100" in result.stderr


def test_python_dash_m_runs_the_cli():
    result = run_cli_subprocess("select", EXAMPLE, "--profile", "b200", "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["backend"] == "FLASHINFER_TRTLLM_MXFP4_BF16"
