"""The vLLM releases the plugin claims for GPT-OSS MXFP4 are exactly those a committed run showed.

`PLUGIN_PROVEN` (mxconvert/runtimes/vllm/dependency.py) decides which vLLM releases the plugin loads
into. For MXFP4 each of its releases must have a record in tests/golden/plugin/ (written by
tools/vllm_releases/plugin_check.py: tests_vllm/test_release_rows.py run in that release's own CPU
venv) in which every test of that module ran and passed; a release without one, or whose record did
not pass, must not be in the table. No vLLM is needed here: the records are the runs' evidence.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN
from mxconvert.target.releases import row_for_release

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "tests" / "golden" / "plugin"
MODULE = "tests_vllm/test_release_rows.py"


def records() -> dict[str, dict]:
    found = {}
    for path in sorted(RECORDS.glob("vllm-*-mxfp4.json")):
        doc = json.loads(path.read_text())
        assert path.name == f"vllm-{doc['release']}-mxfp4.json", path
        found[doc["release"]] = doc
    return found


def module_tests() -> set[str]:
    """The test functions of tests_vllm/test_release_rows.py (read, not imported: it needs vLLM)."""
    tree = ast.parse((REPO / MODULE).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


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
        counts = Counter(doc["tests"].values())
        assert {k: doc[k] for k in ("passed", "failed", "error", "skipped")} == {
            k: counts[k] for k in ("passed", "failed", "error", "skipped")
        }, release
        if doc["result"] != "passed":
            continue
        assert doc["pytest_exit"] == 0 and doc["failed"] == doc["error"] == doc["skipped"] == 0, release
        assert set(doc["tests"].values()) == {"passed"}, release
        assert {name.split("[", 1)[0] for name in doc["tests"]} == wanted, release
        names_by_release[release] = set(doc["tests"])
    # the same parametrised tests in every passing run (no release ran a subset)
    assert len({frozenset(names) for names in names_by_release.values()}) <= 1
