"""vLLM's spellings of the parallel and backend options are accepted next to mxconvert's (issue 23,
item 1): `-tp` / `--tensor-parallel-size`, `-dp` / `--data-parallel-size`, `-ep` /
`--enable-expert-parallel` (vLLM's on/off flag), `--moe-backend`. Each plans exactly what the
mxconvert spelling plans. click takes a one-dash name of several letters as one option name
(`-tp 2` is never `-t -p 2`)."""

from __future__ import annotations

import json
import re

import pytest
from helpers import EXAMPLE, run_cli


def selection(*args: str) -> dict:
    done = run_cli("select", EXAMPLE, "--profile", "h100", *args, "--json")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def dry_run_target(tmp_path, *args: str) -> dict:
    done = run_cli("convert", EXAMPLE, "--profile", "h100", *args, "-o", tmp_path / "art", "--dry-run", "--json")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)["target"]


@pytest.mark.parametrize(
    "vllm_spelling, mxconvert_spelling",
    [
        (("-tp", "2"), ("--tp", "2")),
        (("--tensor-parallel-size", "2"), ("--tp", "2")),
        (("-tp=2",), ("--tp", "2")),
        (("-dp", "2"), ("--dp", "2")),
        (("--data-parallel-size", "2"), ("--dp", "2")),
        (("-tp", "2", "-dp", "2", "-ep"), ("--ep", "4", "--dp", "2")),
        (("--tp", "2", "--enable-expert-parallel"), ("--ep", "2")),
        (("--moe-backend", "marlin"), ("--backend", "marlin")),
        (("--moe-backend", "MARLIN"), ("-b", "MARLIN")),
    ],
)
def test_vllm_spelling_plans_what_mxconvert_spelling_plans(tmp_path, vllm_spelling, mxconvert_spelling):
    assert selection(*vllm_spelling) == selection(*mxconvert_spelling)
    assert dry_run_target(tmp_path, *vllm_spelling) == dry_run_target(tmp_path, *mxconvert_spelling)


def test_one_dash_names_are_whole_options(tmp_path):
    """`-tp 2` sets the TP size (it is not `-t`, nor `-p` with the value `2`); `-p` still is --profile."""
    target = dry_run_target(tmp_path, "-tp", "2")
    assert (target["profile"], target["serve"]["tensor_parallel_size"], target["tp_size"]) == ("h100", 2, 2)
    assert dry_run_target(tmp_path, "-ep", "-dp", "2")["ep_size"] == 2


def test_convert_repeats_vllm_spelling_for_several_targets(tmp_path):
    out = tmp_path / "multi"
    done = run_cli("convert", EXAMPLE, "-p", "h100", "-tp", "1", "--tensor-parallel-size", "2", "-o", out, "--dry-run")
    assert done.exit_code == 0, done.output
    assert "h100-tp1" in done.stdout and "h100-tp2" in done.stdout


@pytest.mark.parametrize("command", ["select", "convert"])
def test_help_lists_vllms_spellings(command):
    shown = run_cli(command, "--help", env={"COLUMNS": "200"}).stdout
    names = ("-tp", "--tensor-parallel-size", "-dp", "--data-parallel-size", "--enable-expert-parallel", "-ep")
    for name in (*names, "--moe-backend"):
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", shown), name


def test_enable_expert_parallel_is_a_flag_next_to_ep_size(tmp_path):
    """`--ep N` stays mxconvert's EP size; `-ep` is vLLM's switch; both agreeing is accepted."""
    assert dry_run_target(tmp_path, "--ep", "2", "-ep")["ep_size"] == 2
    refused = run_cli("select", EXAMPLE, "--profile", "h100", "--ep", "4", "-tp", "2", "-ep")
    assert refused.exit_code == 2
    assert "--ep 4 contradicts --tp 2 --dp 1" in refused.output
