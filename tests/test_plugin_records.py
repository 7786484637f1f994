"""The vLLM releases the plugin claims, per format, are exactly those a committed run showed.

`PLUGIN_PROVEN` (mxconvert/runtimes/vllm/dependency.py) decides which vLLM releases the plugin loads
into, per checkpoint format. For each format each of its releases must have a record in
tests/golden/plugin/ (vllm-X.Y.Z-FORMAT.json, written by tools/vllm_releases/plugin_check.py: the
format's test module, tests_vllm/test_release_rows.py for GPT-OSS MXFP4 and
tests_vllm/test_release_rows_nvfp4.py for NVFP4, run in that release's own CPU venv) in which every test
of that module ran and passed; a release without one, or whose record did not pass, must not be in the
table for that format. No vLLM is needed here: the records are the runs' evidence.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN
from mxconvert.target.releases import row_for_release
from mxconvert.target.revisions import REVISIONS

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "tests" / "golden" / "plugin"
#: format -> the test module its records ran
MODULES = {"mxfp4": "tests_vllm/test_release_rows.py", "nvfp4": "tests_vllm/test_release_rows_nvfp4.py"}
MODULE = MODULES["mxfp4"]


def records(fmt: str = "mxfp4") -> dict[str, dict]:
    found = {}
    for path in sorted(RECORDS.glob(f"vllm-*-{fmt}.json")):
        doc = json.loads(path.read_text())
        assert path.name == f"vllm-{doc['release']}-{fmt}.json", path
        found[doc["release"]] = doc
    return found


def module_tests(module: str = MODULE) -> set[str]:
    """The test functions of a tests_vllm module (read, not imported: it needs vLLM)."""
    tree = ast.parse((REPO / module).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def counts_match(run: dict) -> bool:
    """Whether a run's (a record's, or its `backends` section's) counts are those of its tests' outcomes."""
    counts = Counter(run["tests"].values())
    return all(run[k] == counts[k] for k in ("passed", "failed", "error", "skipped"))


def passed_every_test(doc: dict, wanted: set[str]) -> bool:
    """Whether a passing record ran every test function in `wanted` (each parametrisation), skipped
    none and failed none."""
    clean = doc["pytest_exit"] == 0 and doc["failed"] == doc["error"] == doc["skipped"] == 0
    return clean and set(doc["tests"].values()) == {"passed"} and {n.split("[", 1)[0] for n in doc["tests"]} == wanted


def test_the_mxfp4_releases_the_plugin_serves_are_those_with_a_passing_record():
    proven = {release for formats in PLUGIN_PROVEN.values() for release in formats.get("mxfp4", ())}
    passing = {release for release, doc in records().items() if doc["result"] == "passed"}
    assert proven == passing, (
        f"in PLUGIN_PROVEN without a passing record: {sorted(proven - passing)}; with a passing record but "
        f"not in PLUGIN_PROVEN: {sorted(passing - proven)} (run tools/vllm_releases/plugin_check.py)"
    )


def test_each_release_is_proven_under_the_row_that_covers_it():
    """A release's plugin row is the row `convert --runtime vllm==X.Y.Z` writes, in the table and in its record."""
    for row, formats in PLUGIN_PROVEN.items():
        for release in formats.get("mxfp4", ()):
            assert row_for_release(release, "mxfp4").name == row, release
    for release, doc in records().items():
        assert doc["row"] == row_for_release(release, "mxfp4").name, release


def test_a_passing_record_ran_every_test_of_the_module_and_nothing_else():
    wanted = module_tests()
    assert len(wanted) >= 5
    names_by_release = {}
    for release, doc in records().items():
        assert doc["format"] == "mxfp4" and doc["test_module"] == MODULE, release
        assert counts_match(doc), release
        if doc["result"] != "passed":
            continue
        assert passed_every_test(doc, wanted), release
        names_by_release[release] = set(doc["tests"])
    # the same parametrised tests in every passing run (no release ran a subset)
    assert len({frozenset(names) for names in names_by_release.values()}) <= 1


# ---- NVFP4 (tests_vllm/test_release_rows_nvfp4.py) --------------------------------------------------
def test_the_nvfp4_releases_the_plugin_serves_are_those_with_a_passing_record():
    proven = {release for formats in PLUGIN_PROVEN.values() for release in formats.get("nvfp4", ())}
    passing = {release for release, doc in records("nvfp4").items() if doc["result"] == "passed"}
    assert proven == passing, (
        f"in PLUGIN_PROVEN without a passing NVFP4 record: {sorted(proven - passing)}; with a passing record "
        f"but not in PLUGIN_PROVEN: {sorted(passing - proven)} (run tools/vllm_releases/plugin_check.py "
        "--format nvfp4)"
    )


def test_each_nvfp4_release_is_proven_under_the_row_that_covers_it():
    """For NVFP4 too: the row `convert --runtime vllm==X.Y.Z` writes for an NVFP4 checkpoint."""
    for row, formats in PLUGIN_PROVEN.items():
        for release in formats.get("nvfp4", ()):
            assert row_for_release(release, "nvfp4").name == row, release
    for release, doc in records("nvfp4").items():
        assert doc["row"] == row_for_release(release, "nvfp4").name, release


def test_a_passing_nvfp4_record_ran_every_test_of_the_module():
    """Every test function of the NVFP4 module ran and passed. The parametrised cases are the backends the
    release's row writes (rows leave different backends unproven), so their number may differ by row, but
    not between the releases of one row, and MARLIN ran in each release whose row writes it."""
    fmt, module = "nvfp4", MODULES["nvfp4"]
    wanted = module_tests(module)
    assert len(wanted) >= 5
    names_by_row: dict[str, set[frozenset[str]]] = {}
    for release, doc in records(fmt).items():
        assert doc["format"] == fmt and doc["test_module"] == module, release
        assert counts_match(doc), release
        if doc["result"] != "passed":
            continue
        assert passed_every_test(doc, wanted), release
        unproven = {backend for backend, _ in REVISIONS[doc["row"]].unproven_layouts}
        assert any("-MARLIN-tp1]" in name for name in doc["tests"]) == ("MARLIN" not in unproven), release
        names_by_row.setdefault(doc["row"], set()).add(frozenset(doc["tests"]))
    assert all(len(runs) == 1 for runs in names_by_row.values()), names_by_row


#: The test module each MXFP4 record's `backends` section ran (plugin_check.py): every other MXFP4
#: backend the CPU harness stands in, and EP 2, in that release.
BACKENDS_MODULE = "tests_vllm/test_release_rows_backends.py"


def allowed_skip(test: str, row: str) -> bool:
    """Whether the backends module may skip `test` under `row`, each for the reason its skip says:
    AITER_TRITON_MXFP4_BF16 where no `--moe-backend` name reaches it (vLLM adds it in 0.30.0: the row does
    not write it);
    TRITON_UNFUSED where no `--moe-backend` name reaches it (only a LoRA worker picks it)."""
    from mxconvert.selection.vocabulary import moe_backend_name_for

    name, _, params = test.partition("[")
    revision = REVISIONS[row]
    if params.startswith("AITER_TRITON_MXFP4_BF16-"):
        return moe_backend_name_for("AITER_TRITON_MXFP4_BF16", "mxfp4", revision.selection) is None
    if params.startswith("TRITON_UNFUSED-"):
        return moe_backend_name_for("TRITON_UNFUSED", "mxfp4", revision.selection) is None
    return False


def test_a_passing_mxfp4_record_ran_every_backend_test_and_skipped_only_what_its_row_explains():
    wanted = module_tests(BACKENDS_MODULE)
    assert len(wanted) >= 3
    for release, doc in records().items():
        if doc["result"] != "passed":
            continue
        section = doc["backends"]
        assert section["test_module"] == BACKENDS_MODULE, release
        assert counts_match(section), release
        assert section["result"] == "passed" and section["pytest_exit"] == 0, release
        assert section["failed"] == section["error"] == 0 and section["passed"] > 0, release
        assert {name.split("[", 1)[0] for name in section["tests"]} == wanted, release
        unexplained = [t for t, v in section["tests"].items() if v == "skipped" and not allowed_skip(t, doc["row"])]
        assert not unexplained, (release, unexplained)
