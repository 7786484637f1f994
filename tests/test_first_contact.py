"""Issue 23 items 3 and 4: errors that say what to do, and OUT the way CI scripts make it.

Item 3: hub errors name the repo, the revision asked for, the cache folder and the cause; a MODEL
that looks like a path and does not exist is refused, never looked up on the hub; an unquantized
or FP8 checkpoint is told which formats are read; `--env VLLM_ROCM_USE_AITER=1` is checked against
the profile as the environment variable is; unknown profiles and backends get "did you mean";
`inspect --layer/--tensor` name what they take; `load_artifact` takes profile aliases in `expect`
and refuses a CUDA device torch does not have.

Item 4: an existing empty folder is a valid OUT; a refusal names --force only where it works;
`--max-shard-size` takes the sizes the tools around it write.

No test touches the network: the hub is an empty cache with HF_HUB_OFFLINE=1, or huggingface_hub's
own exceptions raised by a replaced `_snapshot_download` (storage/hub.py's seam, as in test_hub.py).
"""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import EXAMPLE, ROOT, run_cli, run_cli_subprocess, tree_digest
from huggingface_hub import errors as hf_errors

from mxconvert.core.errors import InputError
from mxconvert.pipeline.targets import parse_size
from mxconvert.storage import hub

try:  # the HTTP client huggingface_hub is built on (httpx2 from huggingface_hub 2.x, httpx before)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older huggingface_hub
    import httpx  # type: ignore[no-redef]

REPO = "someorg/some-model"


def _response(status: int):
    return httpx.Response(status, request=httpx.Request("GET", f"https://huggingface.co/api/models/{REPO}"))


def _refused(result, *texts: str) -> str:
    """The stderr of a run refused with exit 2 (no traceback), holding every text."""
    stderr = result.stderr
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in stderr
    for text in texts:
        assert text in stderr, (text, stderr)
    return stderr


# ---- item 3: hub errors --------------------------------------------------------------------------------
def test_offline_hub_miss_names_repo_revision_cache_folder_and_cause(tmp_path):
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    for extra, revision in (((), "main (the default)"), (("--revision", "v2"), "v2")):
        result = run_cli_subprocess("select", REPO, "-p", "h100", *extra, env=env)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        for text in (
            REPO,
            f"at revision {revision}",
            "cause: offline",
            str(cache / "models--someorg--some-model"),
            "HF_HUB_OFFLINE",
        ):
            assert text in result.stderr, (text, result.stderr)


@pytest.fixture
def online(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _raising(exc: BaseException):
    def download(repo_id, **kwargs):
        raise exc

    return download


@pytest.mark.parametrize(
    "make, cause, todo",
    [
        (
            lambda: hf_errors.RepositoryNotFoundError("404 Client Error", response=_response(404)),
            "not found",
            "repo id",
        ),
        (
            lambda: hf_errors.RevisionNotFoundError("404 Client Error", response=_response(404)),
            "not found",
            "--revision",
        ),
        (lambda: hf_errors.GatedRepoError("403 Client Error", response=_response(403)), "access", "HF_TOKEN"),
        (lambda: hf_errors.HfHubHTTPError("503 Server Error", response=_response(503)), "network", "network"),
        (lambda: _network_miss(), "network", "check the network connection"),
        (lambda: httpx.ConnectError("connection refused"), "network", "check the network connection"),
    ],
    ids=["repo-not-found", "revision-not-found", "gated", "server-error", "unreachable-not-cached", "connect-error"],
)
def test_each_hub_failure_names_its_cause(tmp_path, monkeypatch, online, make, cause, todo):
    monkeypatch.setattr(hub, "_snapshot_download", _raising(make()))
    result = run_cli("select", REPO, "-p", "h100", "--revision", "v3", "--cache-dir", tmp_path / "c")
    _refused(
        result,
        f"{REPO} at revision v3",
        f"(cause: {cause})",
        str((tmp_path / "c" / "models--someorg--some-model").absolute()),
        todo,
    )


def _network_miss() -> Exception:
    """What snapshot_download raises online when the hub cannot be reached and the cache lacks the repo."""
    try:
        try:
            raise httpx.ConnectError("[Errno 111] Connection refused")
        except httpx.ConnectError as err:
            raise hf_errors.LocalEntryNotFoundError("An error happened while trying to locate the files") from err
    except hf_errors.LocalEntryNotFoundError as exc:
        return exc


# ---- item 3: a missing path is not a repo id ---------------------------------------------------------------
@pytest.mark.parametrize(
    "model",
    [
        "./nowhere/model",
        "../nowhere",
        "~/nowhere-mxconvert-test",
        "/nowhere/model",
        "a/b/c",
        "trailing/",
        "models/gpt-oss",
    ],
)
def test_a_missing_path_is_refused_as_no_such_folder_not_looked_up_on_the_hub(tmp_path, monkeypatch, model):
    (tmp_path / "models").mkdir()  # `models/gpt-oss`: its first part is a folder here, so it is a path
    monkeypatch.chdir(tmp_path)
    asked: list[str] = []
    monkeypatch.setattr(hub, "_snapshot_download", lambda repo_id, **kw: asked.append(repo_id) or "")
    result = run_cli("select", model, "-p", "h100")
    _refused(result, f"{model}: no such folder", "not looked up on the Hugging Face hub")
    assert asked == []


def test_a_repo_id_still_goes_to_the_hub(tmp_path, monkeypatch, online):
    monkeypatch.chdir(tmp_path)
    asked: list[str] = []

    def download(repo_id, **kwargs):
        asked.append(repo_id)
        raise hf_errors.RepositoryNotFoundError("404", response=_response(404))

    monkeypatch.setattr(hub, "_snapshot_download", download)
    _refused(run_cli("select", REPO, "-p", "h100"), "cause: not found")
    assert asked == [REPO]


# ---- item 3: which formats are read ------------------------------------------------------------------------
READS = "mxconvert reads GPT-OSS MXFP4 checkpoints (quant_method mxfp4 or gpt_oss_mxfp4) and NVFP4 MoE checkpoints"


@pytest.mark.parametrize(
    "quant, shown",
    [
        (None, "(quantization_config: none)"),
        ({"quant_method": "fp8", "fmt": "e4m3"}, "(quantization_config: quant_method 'fp8', fmt 'e4m3')"),
        (
            {"quant_method": "compressed-tensors", "format": "float-quantized"},
            "(quantization_config: quant_method 'compressed-tensors', format 'float-quantized')",
        ),
    ],
    ids=["unquantized", "fp8", "compressed-tensors-fp8"],
)
def test_a_checkpoint_that_is_not_fp4_is_told_which_formats_are_read(tmp_path, quant, shown):
    ckpt = tmp_path / "qwen3"
    shutil.copytree(ROOT / "examples" / "tiny-nvfp4-ct-qwen3", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config.pop("quantization_config", None)
    if quant is not None:
        config["quantization_config"] = quant
    (ckpt / "config.json").write_text(json.dumps(config))
    stderr = _refused(run_cli("select", ckpt, "-p", "h100"), "a qwen3_moe checkpoint without FP4 quantization", shown)
    assert READS in stderr and "(ModelOpt, compressed-tensors)" in stderr
    assert "expected 'gpt_oss'" not in stderr


def test_a_modelopt_fp8_checkpoint_is_told_which_formats_are_read(tmp_path):
    ckpt = tmp_path / "modelopt"
    shutil.copytree(ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "modelopt":
        quant["quant_algo"] = "FP8"
    else:
        legacy = json.loads((ckpt / "hf_quant_config.json").read_text())
        legacy["quantization"]["quant_algo"] = "FP8"
        (ckpt / "hf_quant_config.json").write_text(json.dumps(legacy))
    (ckpt / "config.json").write_text(json.dumps(config))
    _refused(run_cli("select", ckpt, "-p", "h100"), "'FP8' is not NVFP4", READS)


# ---- item 3: --env VLLM_ROCM_USE_AITER is the environment variable's twin ---------------------------------
def test_env_option_aiter_contradicting_the_profile_gets_the_environment_message():
    by_env = run_cli("select", EXAMPLE, "-p", "mi355x", env={"VLLM_ROCM_USE_AITER": "1"})
    by_option = run_cli("select", EXAMPLE, "-p", "mi355x", "--env", "VLLM_ROCM_USE_AITER=1")
    common = (
        "VLLM_ROCM_USE_AITER=1 is set {}, but profile mi355x has rocm_use_aiter = False: use the mi355x-aiter profile"
    )
    _refused(by_env, common.format("in the environment"), "or unset VLLM_ROCM_USE_AITER")
    _refused(by_option, common.format("with --env"), "or drop --env VLLM_ROCM_USE_AITER=1")


def test_env_option_aiter_is_reported_as_the_environment_variable_is():
    agree = run_cli("select", EXAMPLE, "-p", "mi355x-aiter", "--env", "VLLM_ROCM_USE_AITER=1", "--json")
    assert agree.exit_code == 0, agree.output
    report = json.loads(agree.stdout)["environment"]["VLLM_ROCM_USE_AITER"]
    assert report == {"value": "1", "from": "--env", "agrees_with_profile": True}
    off_rocm = run_cli("select", EXAMPLE, "-p", "h100", "--env", "VLLM_ROCM_USE_AITER=1", "--json")
    assert off_rocm.exit_code == 0, off_rocm.output
    assert "ROCm only" in json.loads(off_rocm.stdout)["environment"]["VLLM_ROCM_USE_AITER"]["ignored"]


# ---- item 3: did you mean ------------------------------------------------------------------------------------
def test_unknown_profile_or_backend_gets_did_you_mean():
    cases = [
        (("-p", "H10"), ("unknown profile 'H10' (did you mean h100", "built-in profiles:")),
        (("-p", "B2000"), ("(did you mean b200",)),
        (("-p", "h100", "--backend", "trton"), ("unknown backend 'trton' for MXFP4 (did you mean triton", "valid:")),
        (("-p", "h100", "--backend", "MARLINN"), ("(did you mean marlin",)),
    ]
    for args, texts in cases:
        _refused(run_cli("select", EXAMPLE, *args), *texts)
    # nothing close: no suggestion, the message as before
    stderr = _refused(run_cli("select", EXAMPLE, "-p", "zzzzzz"), "unknown profile 'zzzzzz'; built-in profiles:")
    assert "did you mean" not in stderr


# ---- item 3: inspect names the valid range ---------------------------------------------------------------------
def test_inspect_layer_out_of_range_names_the_valid_range():
    stderr = _refused(run_cli("inspect", EXAMPLE, "--layer", "7"), "no layer 7", "--layer takes 0-1")
    assert "None" not in stderr
    stderr = _refused(run_cli("inspect", EXAMPLE, "--tensor", "w99"), "no tensor 'w99'", "w13_weight_scale")
    assert "None" not in stderr


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("first-contact") / "art"
    result = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out)
    assert result.exit_code == 0, result.output
    return out


def test_inspect_rank_and_layer_of_an_artifact_name_what_exists(artifact):
    _refused(run_cli("inspect", artifact, "--rank", "3"), "has no rank 3", "[0]")
    stderr = _refused(run_cli("inspect", artifact, "--layer", "-1"), "--layer takes 0-1")
    assert "None" not in stderr


# ---- item 3: load_artifact -------------------------------------------------------------------------------------
def test_load_artifact_expect_takes_profile_aliases(artifact):
    from mxconvert import load_artifact
    from mxconvert.core.errors import MismatchError

    for name in ("sm90", "H100", "h800", "h100"):
        assert load_artifact(artifact, expect={"profile": name}, include_shared=False).target["profile"] == "h100"
    with pytest.raises(MismatchError, match="expected 'b200'"):  # another profile is still refused
        load_artifact(artifact, expect={"profile": "b200"})


def test_load_artifact_on_a_cuda_device_torch_lacks_is_an_input_error(artifact):
    import torch

    from mxconvert import load_artifact

    if torch.cuda.is_available():  # pragma: no cover - the check is for machines without one
        pytest.skip("this machine has CUDA")
    for device in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(InputError, match="load with device='cpu'"):
            load_artifact(artifact, device=device)


# ---- item 4: OUT as CI scripts make it ---------------------------------------------------------------------------
def test_an_empty_folder_is_a_valid_out_for_dry_run_convert_and_force(tmp_path):
    out = tmp_path / "art"
    out.mkdir()  # mkdir -p $ART
    dry = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert out.is_dir() and not any(out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # no lock, no staging left
    written = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out)
    assert written.exit_code == 0, written.output
    assert run_cli("verify", out).exit_code == 0
    again = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out)
    assert again.exit_code == 0 and "up to date" in again.stdout
    forced = tmp_path / "forced"
    forced.mkdir()
    assert run_cli("convert", EXAMPLE, "-p", "h100", "-o", forced, "--force").exit_code == 0
    assert tree_digest(forced) == tree_digest(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "forced"]


def test_an_empty_folder_is_a_valid_out_of_a_subprocess_run(tmp_path):
    out = tmp_path / "art"
    out.mkdir()
    result = run_cli_subprocess("convert", EXAMPLE, "-p", "h100", "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "written"


@pytest.mark.parametrize("force", [False, True])
def test_a_folder_of_other_files_is_refused_without_pointing_at_force(tmp_path, force):
    out = tmp_path / "art"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = tree_digest(tmp_path)
    for extra in ((), ("--dry-run",)):
        result = run_cli("convert", EXAMPLE, "-p", "h100", "-o", out, *extra, *(["--force"] if force else []))
        stderr = _refused(result, "not an intact mxconvert artifact", "choose another -o", "nothing was touched")
        assert "pass --force" not in stderr
    assert tree_digest(tmp_path) == before


def test_a_file_at_out_is_refused_without_pointing_at_force(tmp_path, artifact):
    out = tmp_path / "art"
    out.write_text("a file")
    for extra in ((), ("--force",)):
        stderr = _refused(run_cli("convert", EXAMPLE, "-p", "h100", "-o", out, *extra), "not a folder", "another -o")
        assert "pass --force" not in stderr
    assert out.read_text() == "a file"
    # an artifact of ours, where --force works, is still refused without it and told to pass it
    ours = tmp_path / "ours"
    shutil.copytree(artifact, ours)
    _refused(run_cli("convert", EXAMPLE, "-p", "h100", "--tp", "2", "-o", ours), "already exists; pass --force")
    assert run_cli("convert", EXAMPLE, "-p", "h100", "--tp", "2", "-o", ours, "--force").exit_code == 0


# ---- item 4: --max-shard-size ------------------------------------------------------------------------------------
#: Sizes as the tools around mxconvert write them, and their bytes (docs/usage.md, "Output files").
SIZES = {
    "5G": 5 * 10**9,
    "500M": 500 * 10**6,
    "5GiB": 5 * 2**30,
    "500MiB": 500 * 2**20,
    "4GB": 4 * 10**9,
    "1.5G": 1_500_000_000,
    "123456": 123456,
    "5g": 5 * 10**9,
    "500mib": 500 * 2**20,
    "5Gi": 5 * 2**30,
    "400KB": 400_000,
    "2kib": 2048,
    "1T": 10**12,
    "7B": 7,
    "0.6MiB": 629145,
    "1.5": 1,
}


def test_max_shard_size_accepts_the_sizes_tools_write():
    assert {text: parse_size(text) for text in SIZES} == SIZES


def test_max_shard_size_refuses_anything_else_naming_the_forms():
    for text in ("5X", "5 gigs", "1e3", "-1", "G", "", "nan", "0x10", "5GB5"):
        with pytest.raises(InputError, match="--max-shard-size") as err:
            parse_size(text)
        assert "5GiB" in str(err.value) and "powers of 1024" in str(err.value), (text, str(err.value))
    for text in ("0", "0.5B", "0.0001K"):  # below one byte (a fraction of a byte is rounded down)
        with pytest.raises(InputError, match="--max-shard-size must be positive"):
            parse_size(text)


def test_max_shard_size_on_the_command_line(tmp_path):
    ok = run_cli("convert", EXAMPLE, "-p", "h100", "-o", tmp_path / "a", "--dry-run", "--max-shard-size", "1.5M")
    assert ok.exit_code == 0, ok.output
    bad = run_cli("convert", EXAMPLE, "-p", "h100", "-o", tmp_path / "a", "--dry-run", "--max-shard-size", "5X")
    _refused(bad, "--max-shard-size '5X'", "5G", "500M", "5GiB", "powers of 1000", "powers of 1024")
    assert not (tmp_path / "a").exists()


def test_max_shard_size_help_says_the_rule():
    result = run_cli_subprocess("convert", "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0
    assert "powers of 1000" in result.stdout and "powers of 1024" in result.stdout
    assert "5GiB" in result.stdout
