"""`--tp T --dp D [--enable-expert-parallel]` plan what `vllm serve --tensor-parallel-size T
--data-parallel-size D [--enable-expert-parallel]` runs (issue 23, item 1).

vLLM 0.33.0 (and 0.26.0) fused_moe/config.py `FusedMoEParallelConfig.make`: without expert
parallelism the MoE layer's TP group is the TP x DP ranks flattened (TP size T*D, TP rank
dp_rank*T + tp_rank), with it the EP group is those ranks and the MoE's TP size is 1; attention TP
stays T. `Deployment` (selection/deployment.py) derives the MoE sizes the same way; the manifest's
`target.serve` records vLLM's options, and readers refuse a manifest an older mxconvert wrote with
DP > 1 (its --tp then named the MoE group). tests_vllm/test_dp.py loads a TP=2 x DP=2 artifact
into vLLM's own layers.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from helpers import EXAMPLE, ROOT, run_cli

from mxconvert.artifact.manifest import MANIFEST_NAME, seal
from mxconvert.core.errors import InputError
from mxconvert.selection import Deployment

NVFP4 = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
#: The two formats' example checkpoints (4 experts each) and a profile that converts each.
EXAMPLES = [pytest.param(EXAMPLE, "h100", id="mxfp4"), pytest.param(NVFP4, "b200", id="nvfp4")]


def vllm_moe_parallel(tp: int, dp: int, enable_ep: bool, tp_rank: int = 0, dp_rank: int = 0) -> dict:
    """vLLM 0.33.0 `FusedMoEParallelConfig.make` (pcp 1), written out: the MoE layer's sizes and rank."""
    use_ep = dp * tp > 1 and enable_ep
    flat_size, flat_rank = dp * tp, dp_rank * tp + tp_rank  # flatten_tp_across_dp_and_pcp
    if not use_ep:
        return {"tp_size": flat_size, "tp_rank": flat_rank, "ep_size": 1, "ep_rank": 0}
    return {"tp_size": 1, "tp_rank": 0, "ep_size": flat_size, "ep_rank": flat_rank}


def manifest_of(art: Path) -> dict:
    return json.loads((art / MANIFEST_NAME).read_text())


def convert(tmp_path: Path, model: Path, profile: str, *args: str, name: str = "art") -> dict:
    out = tmp_path / name
    made = run_cli("convert", model, "--profile", profile, *args, "-o", out)
    assert made.exit_code == 0, made.output
    return manifest_of(out)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("dp", [1, 2, 4])
@pytest.mark.parametrize("enable_ep", [False, True])
def test_deployment_derives_the_moe_sizes_as_vllm(tp, dp, enable_ep):
    d = Deployment(tp=tp, dp=dp, expert_parallel=enable_ep)
    want = vllm_moe_parallel(tp, dp, enable_ep)
    assert (d.moe_tp, d.moe_ep) == (want["tp_size"], want["ep_size"])
    assert d.attention_tp == tp and d.ranks == tp * dp
    assert d.expert_parallel == (want["ep_size"] > 1)
    # mxconvert's `--ep N` is the EP group's size: alone it gives TP = N / DP, the same deployment
    if want["ep_size"] > 1:
        assert Deployment(ep=tp * dp, dp=dp) == d
        assert Deployment(tp=tp, ep=tp * dp, dp=dp, expert_parallel=True) == d


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(tp=2, ep=4, expert_parallel=True), "--ep 4 contradicts --tp 2 --dp 1"),
        (dict(tp=2, dp=2, ep=2), "--ep 2 contradicts --tp 2 --dp 2"),
        (dict(ep=2, dp=4), "--ep must be a multiple of --dp"),
    ],
)
def test_contradicting_parallel_sizes_are_refused(kw, message):
    with pytest.raises(InputError, match=message):
        Deployment(**kw)


@pytest.mark.parametrize("model, profile", EXAMPLES)
def test_tp2_dp2_plans_vllms_flattened_moe_group(tmp_path, model, profile):
    """`--tp 2 --dp 2`: four ranks, each the MoE TP rank vLLM gives worker (dp_rank, tp_rank), holding
    the slice `--tp 4` holds at that rank (the same bytes: vLLM slices the same way); verify passes."""
    manifest = convert(tmp_path, model, profile, "--tp", "2", "--dp", "2")
    target = manifest["target"]
    assert (target["tp_size"], target["ep_size"], target["dp_size"]) == (4, 1, 2)
    assert target["serve"] == {
        "tensor_parallel_size": 2,
        "data_parallel_size": 2,
        "enable_expert_parallel": False,
        "all2all_backend": None,
        "enable_lora": False,
        "env": {},
    }
    plans = {entry["rank"]: entry["plan"] for entry in manifest["ranks"]}
    for dp_rank in range(2):
        for tp_rank in range(2):
            want = vllm_moe_parallel(2, 2, False, tp_rank, dp_rank)
            plan = plans[want["tp_rank"]]
            assert (plan["tp_size"], plan["tp_rank"], plan["ep_size"]) == (4, want["tp_rank"], 1)
    tp4 = convert(tmp_path, model, profile, "--tp", "4", name="tp4")
    assert [e["plan"] for e in tp4["ranks"]] == [e["plan"] for e in manifest["ranks"]]
    assert [e["files"] for e in tp4["ranks"]] == [e["files"] for e in manifest["ranks"]]
    checked = run_cli("verify", tmp_path / "art", "--json")
    assert checked.exit_code == 0, checked.output


@pytest.mark.parametrize("model, profile", EXAMPLES)
@pytest.mark.parametrize(
    "args",
    [
        ("--tp", "2", "--dp", "2", "--enable-expert-parallel"),
        ("--ep", "4", "--dp", "2"),
        ("-tp", "2", "-dp", "2", "-ep"),
    ],
)
def test_expert_parallel_over_tp_x_dp(tmp_path, model, profile, args):
    """With --enable-expert-parallel the EP group is TP x DP ranks, each holding whole experts."""
    manifest = convert(tmp_path, model, profile, *args)
    target = manifest["target"]
    assert (target["tp_size"], target["ep_size"], target["dp_size"]) == (1, 4, 2)
    assert target["serve"]["tensor_parallel_size"] == 2 and target["serve"]["enable_expert_parallel"] is True
    assert [(e["plan"]["ep_rank"], e["plan"]["expert_start"], e["plan"]["expert_end"]) for e in manifest["ranks"]] == [
        (r, r, r + 1) for r in range(4)
    ]


def test_dp_alone_is_tp1_dp2(tmp_path):
    """`--dp 2` alone is `vllm serve -dp 2`: TP 1, the MoE's TP group the 2 DP ranks (it was refused)."""
    target = convert(tmp_path, EXAMPLE, "h100", "--dp", "2")["target"]
    assert (target["tp_size"], target["ep_size"], target["serve"]["tensor_parallel_size"]) == (2, 1, 1)


@pytest.mark.parametrize("command", ["select", "convert"])
@pytest.mark.parametrize(
    "args, message",
    [
        (("--ep", "4", "--tp", "2", "--enable-expert-parallel"), "--ep 4 contradicts --tp 2 --dp 1"),
        (("--ep", "4", "--tp", "2", "--dp", "1"), "--ep 4 contradicts --tp 2 --dp 1"),
        (("--ep", "2", "--dp", "4"), "must be a multiple of --dp"),
    ],
)
def test_contradictions_exit_2_and_write_nothing(tmp_path, command, args, message):
    out = tmp_path / "art"
    extra = ("-o", out) if command == "convert" else ()
    result = run_cli(command, EXAMPLE, "--profile", "h100", *args, *extra)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_moe_tp_that_does_not_divide_names_tp_and_dp(tmp_path):
    """The MoE's TP size is T x D: a refusal names both options, not a size the user never typed."""
    result = run_cli("select", EXAMPLE, "--profile", "h100", "--tp", "3", "--dp", "2")
    assert result.exit_code == 2, result.output
    assert "the MoE's tp 6 does not divide intermediate_size 320 (--tp 3 x --dp 2" in result.output


def test_library_plan_and_convert_take_vllms_sizes(tmp_path):
    from mxconvert.pipeline.targets import convert as convert_targets
    from mxconvert.pipeline.targets import plan

    (planned,) = plan(str(EXAMPLE), profile="h100", tp=2, dp=2)
    assert (planned.plan.target()["tp_size"], len(planned.plan.ranks)) == (4, 4)
    (planned,) = plan(str(EXAMPLE), profile="h100", tp=2, dp=2, enable_expert_parallel=True)
    assert (planned.plan.target()["ep_size"], planned.plan.target()["tp_size"]) == (4, 1)
    result = convert_targets(str(EXAMPLE), tmp_path / "lib", profile="h100", tp=2, dp=2, dry_run=True)
    doc = result.to_json()
    assert doc["target"]["serve"]["data_parallel_size"] == 2
    assert (
        doc["serve_command"] == f"vllm serve {shlex.quote(str(tmp_path / 'lib'))} --load-format mxconvert -tp 2 -dp 2"
    )


# ---- manifests written before --tp/--dp took vLLM's meaning -------------------------------------------
def as_older_mxconvert(art: Path) -> None:
    """Rewrite the manifest as an mxconvert before `target.serve` wrote it (resealed)."""
    manifest = manifest_of(art)
    del manifest["target"]["serve"]
    del manifest["fingerprint"]
    (art / MANIFEST_NAME).write_text(json.dumps(seal(manifest)))


def test_old_manifest_with_dp_is_refused_by_every_reader(tmp_path):
    from mxconvert.artifact.loader import load_artifact
    from mxconvert.runtimes.vllm.installer import ArtifactInstaller

    convert(tmp_path, EXAMPLE, "h100", "--tp", "1", "--dp", "2")
    art = tmp_path / "art"
    as_older_mxconvert(art)
    checked = run_cli("verify", art, "--json")
    assert checked.exit_code == 2, checked.output
    error = json.loads(checked.stdout)["error"]["message"]
    assert "made by an older mxconvert" in error and "reconvert it with this mxconvert" in error
    assert "--tp T --dp 2" in error
    with pytest.raises(InputError, match="made by an older mxconvert"):
        load_artifact(art, rank=0)
    with pytest.raises(InputError, match="made by an older mxconvert"):
        ArtifactInstaller(art)
    # inspect still describes it, but names no serve command
    shown = run_cli("inspect", art, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["serve_command"] is None
    assert "serve with: unknown" in run_cli("inspect", art).stdout
    # and reconverting over it (--force) replaces it: OUT is still recognised as ours
    again = run_cli("convert", EXAMPLE, "--profile", "h100", "--tp", "1", "--dp", "2", "-o", art, "--force")
    assert again.exit_code == 0, again.output
    assert run_cli("verify", art).exit_code == 0


@pytest.mark.parametrize("args, serve", [(("--tp", "2"), "-tp 2"), (("--ep", "2"), "-tp 2 --enable-expert-parallel")])
def test_old_manifest_without_dp_stays_valid(tmp_path, args, serve):
    """Without DP the old and new meanings agree (`--ep N`: vLLM TP N with EP): still loads and verifies."""
    from mxconvert.artifact.loader import load_artifact

    convert(tmp_path, EXAMPLE, "h100", *args)
    art = tmp_path / "art"
    as_older_mxconvert(art)
    assert run_cli("verify", art).exit_code == 0
    load_artifact(art, rank=1)
    shown = json.loads(run_cli("inspect", art, "--json").stdout)
    assert shown["serve_command"] == f"vllm serve {shlex.quote(str(art))} --load-format mxconvert {serve}"


def edit_serve(art: Path, change) -> None:
    manifest = manifest_of(art)
    change(manifest["target"]["serve"])
    del manifest["fingerprint"]
    (art / MANIFEST_NAME).write_text(json.dumps(seal(manifest)))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(tensor_parallel_size=4), "implies tp_size 8, but the target has 4"),
        (lambda s: s.update(enable_expert_parallel=True), "implies tp_size 1, but the target has 4"),
        (lambda s: s.update(data_parallel_size=1), "implies tp_size 2, but the target has 4"),
    ],
)
def test_serve_that_contradicts_the_moe_sizes_is_a_mismatch(tmp_path, change, message):
    """A resealed manifest whose vLLM options do not give its ranks' sizes: verify's completeness
    check reports it (exit 1), and no serve line is shown for it."""
    convert(tmp_path, EXAMPLE, "h100", "--tp", "2", "--dp", "2")
    art = tmp_path / "art"
    edit_serve(art, change)
    result = run_cli("verify", art, "--json")
    assert result.exit_code == 1, result.output
    problems = json.loads(result.stdout)["problems"]
    assert any(p["kind"] == "completeness" and message in p["message"] for p in problems), problems
    assert json.loads(run_cli("inspect", art, "--json").stdout)["serve_command"] is None


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(env={"VLLM_X": 1}), "expected printable text"),
        (lambda s: s.pop("enable_lora"), "missing field 'enable_lora'"),
        (lambda s: s.update(data_parallel_size="2"), "field 'data_parallel_size' is str"),
        (lambda s: s.update(tensor_parallel_size=1, data_parallel_size=1, enable_expert_parallel=True), "one rank"),
    ],
)
def test_serve_of_the_wrong_type_is_refused(tmp_path, change, message):
    convert(tmp_path, EXAMPLE, "h100", "--tp", "2", "--dp", "2")
    art = tmp_path / "art"
    edit_serve(art, change)
    result = run_cli("verify", art)
    assert result.exit_code == 2, result.output
    assert message in result.output


# ---- the vllm serve line -------------------------------------------------------------------------------
def test_select_convert_and_inspect_show_the_same_serve_command(tmp_path):
    args = ("--profile", "mi300x-aiter", "-tp", "2", "-dp", "2", "--moe-backend", "triton")
    selected = run_cli("select", EXAMPLE, *args, "--json")
    assert selected.exit_code == 0, selected.output
    want = "VLLM_ROCM_USE_AITER=1 vllm serve {} --load-format mxconvert -tp 2 -dp 2 --moe-backend triton"
    assert json.loads(selected.stdout)["serve_command"] == want.format("ART")
    assert f"serve with: {want.format('ART')}" in run_cli("select", EXAMPLE, *args).stdout
    out = tmp_path / "art"
    made = run_cli("convert", EXAMPLE, *args, "-o", out, "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["serve_command"] == want.format(out)
    assert json.loads(run_cli("inspect", out, "--json").stdout)["serve_command"] == want.format(out)
    assert f"serve with: {want.format(out)}" in run_cli("inspect", out).stdout
    again = run_cli("convert", EXAMPLE, *args, "-o", out)  # up to date: still says how to serve it
    assert f"serve with: {want.format(out)}" in again.stdout


def test_serve_command_carries_the_selection_env(tmp_path):
    """The VLLM_* variables the selection read go on the line (here vllm-0.20's FlashInfer switch and
    Marlin's input dtype), with EP and the all2all backend."""
    doc = run_cli("select", EXAMPLE, "--profile", "l40s", "--marlin-input-dtype", "fp8", "--json")
    assert doc.exit_code == 0, doc.output
    command = json.loads(doc.stdout)["serve_command"]
    assert command.startswith("VLLM_MARLIN_INPUT_DTYPE=fp8 vllm serve ART --load-format mxconvert -tp 1")
    doc = run_cli(
        "select", EXAMPLE, "--profile", "b200", "--runtime", "vllm-0.20", "--env",
        "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1", "--json",
    )  # fmt: skip
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout)["serve_command"].startswith("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 vllm serve ART")
    doc = run_cli(
        "select", EXAMPLE, "--profile", "h100", "--dp", "2", "-ep", "--all2all", "allgather_reducescatter", "--json"
    )
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout)["serve_command"] == (
        "vllm serve ART --load-format mxconvert -tp 1 -dp 2 --enable-expert-parallel "
        "--all2all-backend allgather_reducescatter"
    )


def test_multi_target_convert_lists_each_serve_command(tmp_path):
    out = tmp_path / "multi"
    made = run_cli("convert", EXAMPLE, "--profile", "h100", "--tp", "1", "--tp", "2", "--dp", "2", "-o", out, "--json")
    assert made.exit_code == 0, made.output
    targets = json.loads(made.stdout)["targets"]
    assert [t["serve_command"].split(" --load-format ")[1] for t in targets] == [
        "mxconvert -tp 1 -dp 2",
        "mxconvert -tp 2 -dp 2",
    ]
    assert [t["target"]["tp_size"] for t in targets] == [2, 4]


@pytest.mark.parametrize(
    "tp_size, ep_size, dp_size, expected",
    [
        (4, 1, 2, ["--tp", "2", "--dp", "2"]),
        (2, 1, 2, ["--tp", "1", "--dp", "2"]),
        (1, 4, 2, ["--ep", "4", "--dp", "2"]),
        (2, 1, 1, ["--tp", "2"]),
    ],
)
def test_plugin_refusal_names_vllms_sizes(tp_size, ep_size, dp_size, expected):
    """The plugin's live layer has the MoE's sizes; its refusal's command gives vLLM's (TP = MoE TP / DP)."""
    from mxconvert.runtimes.vllm.checks import LiveLayer, serve_parallel_options

    layer = LiveLayer("p", "TRITON", 0, 0, tp_size, ep_size, 0, 4, dp_size=dp_size)
    options = serve_parallel_options(layer)
    assert options == expected
    given = dict(zip(options[::2], map(int, options[1::2]), strict=True))
    d = Deployment(tp=given.get("--tp", 1), ep=given.get("--ep", 1), dp=given.get("--dp", 1))
    assert (d.moe_tp, d.moe_ep, d.dp) == (tp_size, ep_size, dp_size)


def test_text_names_the_moe_sizes_beside_the_serve_line(tmp_path):
    """The target line gives the MoE's sizes as such, so `-tp 2 -dp 2` next to them does not read as a contradiction."""
    out = tmp_path / "art"
    made = run_cli("convert", EXAMPLE, "--profile", "h100", "--tp", "2", "--dp", "2", "-o", out)
    assert made.exit_code == 0, made.output
    assert (
        "MoE tp 4 ep 1" in made.stdout
        and f"serve with: vllm serve {out} --load-format mxconvert -tp 2 -dp 2" in made.stdout
    )
    assert "MoE tp 4 ep 1" in run_cli("inspect", out).stdout
