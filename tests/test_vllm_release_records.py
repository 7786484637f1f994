"""The committed vLLM release records (tools/vllm_releases/, docs/releases.md) and the tool that makes them.

Runs from the committed records only: no download, no vLLM. Holds
- every record well-formed and consistent with the tool's symbol tables;
- groups.json equal to the grouping the records give;
- mxconvert's runtime rows: every release a row claims has its decision record and both behavioural
  records (selection and tensors; tests/test_selection_records.py and tests/test_tensor_records.py
  hold the row to them);
- the normaliser (docstrings / comments / formatting do not count, code does) and diff.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "vllm_releases"
sys.path.insert(0, str(TOOL))

import decision_symbols  # noqa: E402
import release_records as rr  # noqa: E402


def _cli(name: str) -> ModuleType:
    """A command-line module of the tool, under a name that cannot clash with other modules."""
    spec = importlib.util.spec_from_file_location(f"vllm_releases_{name}", TOOL / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Every vLLM release on the package index from 0.15.0 to 0.33.0 (`pip index versions vllm`).
EXPECTED_RELEASES = [
    "0.15.0",
    "0.15.1",
    "0.16.0",
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
]

SHA = re.compile(r"[0-9a-f]{64}")


def _records() -> dict[str, rr.Record]:
    return {p.stem.removeprefix("vllm-"): rr.load_record(p) for p in sorted((TOOL / "records").glob("*.json"))}


RECORDS = _records()
#: The recorded releases in order. Sorted here, not inside `parametrize(...)`: there mypy infers
#: `sorted` against parametrize's `Iterable[... | object]` argument, makes its item type `object`
#: and refuses the `str` key (seen once `release_records` resolves, e.g. when mypy is also given
#: a file of tools/vllm_releases, which puts that folder on its search path).
RELEASES = sorted(RECORDS, key=rr.version_key)


# ---------------------------------------------------------------------------------------------
# The committed records


def test_every_release_has_a_record() -> None:
    assert sorted(RECORDS, key=rr.version_key) == EXPECTED_RELEASES


@pytest.mark.parametrize("release", RELEASES)
def test_record_is_well_formed(release: str) -> None:
    rec = RECORDS[release]
    assert set(rec) == {
        "schema",
        "release",
        "wheel",
        "wheel_sha256",
        "normaliser",
        "pins",
        "triton_kernels",
        "formats",
    }
    assert rec["schema"] == rr.SCHEMA
    assert rec["release"] == release
    assert rec["wheel"].startswith(f"vllm-{release}-") and rec["wheel"].endswith(".whl")
    assert SHA.fullmatch(rec["wheel_sha256"])
    # All records made by one normaliser, so their digests compare.
    assert rec["normaliser"] == {"version": rr.NORMALISER_VERSION, "python": "3.11"}
    assert tuple(rec["pins"]) == decision_symbols.RECORDED_PINS
    assert rec["pins"]["torch"] is not None and rec["pins"]["flashinfer-python"] is not None
    tk = rec["triton_kernels"]
    assert tk["generation"] in {"3.5.1", "3.6", "3.8"} and tk["files"] > 0 and SHA.fullmatch(tk["sha256"])
    assert tuple(rec["formats"]) == rr.FORMATS
    for fmt, entry in rec["formats"].items():
        assert set(entry) == {"sha256", "symbols"}
        assert entry["sha256"] == rr.format_digest(entry["symbols"]), f"{release} {fmt}: stale format digest"
        assert entry["symbols"], f"{release} {fmt}: no decision symbol found"
        table = decision_symbols.TABLES[fmt]
        for path, syms in entry["symbols"].items():
            assert path.startswith("vllm/") and path.endswith(".py")
            for name, sha in syms.items():
                assert SHA.fullmatch(sha), (release, fmt, name)
                # Every recorded symbol is one the table asks for, in a file the table names for it.
                assert any(rr._matches(path, d.files) and rr._matches(name, d.names) for d in table), (
                    f"{release} {fmt}: {path}::{name} is not in decision_symbols.{fmt.upper()}"
                )


@pytest.mark.parametrize(
    "release, fmt, name",
    [
        ("0.15.0", "mxfp4", "get_mxfp4_backend"),
        ("0.19.0", "mxfp4", "select_mxfp4_moe_backend"),
        ("0.20.0", "mxfp4", "select_gpt_oss_mxfp4_moe_backend"),
        ("0.33.0", "mxfp4", "mxfp4_round_up_hidden_size_and_intermediate_size"),
        ("0.33.0", "mxfp4", "_swizzle_mxfp4"),
        ("0.15.0", "nvfp4", "select_nvfp4_moe_backend"),
        ("0.33.0", "nvfp4", "prepare_nvfp4_moe_layer_for_fi_or_cutlass"),
        ("0.33.0", "nvfp4", "ModelOptNvFp4FusedMoE.process_weights_after_loading"),
        ("0.15.0", "nvfp4", "CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading"),
        ("0.33.0", "nvfp4", "CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading"),
    ],
)
def test_records_hold_the_central_symbols(release: str, fmt: str, name: str) -> None:
    """The selectors and weight preparations are found in whichever file holds them that release."""
    names = {n for syms in RECORDS[release]["formats"][fmt]["symbols"].values() for n in syms}
    assert name in names


def test_records_agree_with_known_boundaries() -> None:
    """Facts about the releases (docs/releases.md) that the records must show."""
    tk = {rel: rec["triton_kernels"]["generation"] for rel, rec in RECORDS.items()}
    assert {rel for rel, gen in tk.items() if gen == "3.6"} == {
        "0.17.0",
        "0.17.1",
        "0.18.0",
        "0.18.1",
        "0.19.0",
        "0.19.1",
        "0.20.0",
        "0.20.1",
        "0.20.2",
        "0.21.0",
    }
    # 0.22.0 went back to the very files 0.15.0 vendored.
    assert RECORDS["0.22.0"]["triton_kernels"] == RECORDS["0.15.0"]["triton_kernels"]
    assert RECORDS["0.26.0"]["pins"]["torch"] == "==2.11.0"
    assert RECORDS["0.33.0"]["pins"]["flashinfer-python"] == "==0.7.2.post1"

    def sha(release: str, name: str) -> str:
        (found,) = [
            s for syms in RECORDS[release]["formats"]["mxfp4"]["symbols"].values() for n, s in syms.items() if n == name
        ]
        return found

    # 0.27.0 changed the TRTLLM round-up (256 -> 128); 0.26.0 the SM90 Triton scale padding.
    round_up = "mxfp4_round_up_hidden_size_and_intermediate_size"
    assert sha("0.26.0", round_up) != sha("0.27.0", round_up)
    assert sha("0.25.1", "_swizzle_mxfp4") != sha("0.26.0", "_swizzle_mxfp4")


# ---------------------------------------------------------------------------------------------
# Groups


def test_groups_json_matches_the_records() -> None:
    table = _cli("table")
    committed = json.loads((TOOL / "groups.json").read_text())
    assert committed == table.groups_document(list(RECORDS.values())), "run tools/vllm_releases/table.py --write-groups"


@pytest.mark.parametrize("fmt", rr.FORMATS)
def test_groups_partition_the_releases_by_digest_and_pins(fmt: str) -> None:
    committed = json.loads((TOOL / "groups.json").read_text())["groups"][fmt]
    flat = [rel for group in committed for rel in group]
    assert sorted(flat, key=rr.version_key) == EXPECTED_RELEASES and len(flat) == len(set(flat))
    keys = []
    for group in committed:
        group_keys = {rr.group_key(RECORDS[rel], fmt) for rel in group}
        assert len(group_keys) == 1, f"{fmt}: releases {group} do not share digest and pins"
        keys.append(group_keys.pop())
    assert len(set(keys)) == len(keys), f"{fmt}: two groups have the same digest and pins"
    # The key is the format digest plus the pins GROUP_KEYS names: FlashInfer for both formats.
    for group in committed:
        pins = {RECORDS[rel]["pins"]["flashinfer-python"] for rel in group}
        digests = {RECORDS[rel]["formats"][fmt]["sha256"] for rel in group}
        assert len(pins) == 1 and len(digests) == 1
        if fmt == "mxfp4":
            assert len({RECORDS[rel]["triton_kernels"]["sha256"] for rel in group}) == 1


# ---------------------------------------------------------------------------------------------
# mxconvert's rows held to the records


def _rows_with_releases() -> list[object]:
    from mxconvert.target.revisions import REVISIONS

    return [row for row in REVISIONS.values() if hasattr(row, "releases")]


GOLDEN = Path(__file__).resolve().parent / "golden"


def _behavioural_records() -> set[tuple[str, str]]:
    """(format, release) of every release that has both a selection record and a tensor record."""

    def keys(folder: str) -> set[tuple[str, str]]:
        stems = (p.stem.split("-") for p in (GOLDEN / folder).glob("vllm-*-*.json"))
        return {(parts[2], parts[1]) for parts in stems}

    return keys("selection") & keys("tensors")


def check_rows(rows: list[object], records: dict[str, rr.Record], behavioural: set[tuple[str, str]]) -> None:
    """Each row's releases per format (row.releases: dict[str, tuple[str, ...]]) all have a decision
    record (tools/vllm_releases/records) and both behavioural records: the release's own selection,
    run (tests/golden/selection/) and its own weight processing, run (tests/golden/tensors/). The row
    reproduces both for every claimed release: tests/test_selection_records.py and
    tests/test_tensor_records.py hold that, entry for entry and tensor for tensor. Releases of
    different decision-record groups may share a row (their code differs where it changes nothing
    the records show). No release is claimed by two rows for one format."""
    claimed: dict[tuple[str, str], str] = {}
    for row in rows:
        name = row.name  # type: ignore[attr-defined]
        formats = row.formats  # type: ignore[attr-defined]
        releases: dict[str, tuple[str, ...]] = row.releases  # type: ignore[attr-defined]
        for fmt, covered in releases.items():
            assert fmt in rr.FORMATS, f"row {name}: unknown format {fmt!r}"
            assert fmt in formats, f"row {name}: lists releases for {fmt} but not the format"
            missing = [rel for rel in covered if rel not in records]
            assert not missing, f"row {name} ({fmt}): no record for {missing}; run tools/vllm_releases/record.py"
            unshown = [rel for rel in covered if (fmt, rel) not in behavioural]
            assert not unshown, (
                f"row {name} ({fmt}): {unshown} lack a selection or tensor record "
                "(tools/vllm_releases/record_selection.py, record_tensors.py)"
            )
            for rel in covered:
                other = claimed.setdefault((fmt, rel), name)
                assert other == name, f"vLLM {rel} ({fmt}) is claimed by rows {other} and {name}"


def test_rows_cover_only_releases_with_both_behavioural_records() -> None:
    rows = _rows_with_releases()
    assert rows, "no row of mxconvert.target.revisions.REVISIONS lists releases"
    check_rows(rows, RECORDS, _behavioural_records())


class _Row:
    def __init__(self, name: str, releases: dict[str, tuple[str, ...]]) -> None:
        self.name, self.releases, self.formats = name, releases, frozenset(releases)


def test_row_check_accepts_recorded_releases_and_refuses_unrecorded_or_twice_claimed_ones() -> None:
    """The check above, on stand-in rows, so it is known to fail where it must."""
    shown = _behavioural_records()
    check_rows([_Row("ok", {"mxfp4": ("0.20.0", "0.20.1", "0.20.2"), "nvfp4": ("0.27.0", "0.27.1")})], RECORDS, shown)
    # releases of two decision-record groups may share a row now (0.19.x and 0.20.0 differ in code only)
    check_rows([_Row("mixed", {"mxfp4": ("0.19.0", "0.19.1", "0.20.0")})], RECORDS, shown)
    with pytest.raises(AssertionError, match="no record for"):
        check_rows([_Row("unrecorded", {"nvfp4": ("0.33.0", "0.34.0")})], RECORDS, shown)
    with pytest.raises(AssertionError, match="lack a selection or tensor record"):
        check_rows([_Row("unshown", {"mxfp4": ("0.18.0",)})], RECORDS, shown)
    with pytest.raises(AssertionError, match="claimed by rows a and b"):
        check_rows([_Row("a", {"nvfp4": ("0.33.0",)}), _Row("b", {"nvfp4": ("0.33.0",)})], RECORDS, shown)


# ---------------------------------------------------------------------------------------------
# The normaliser and the symbol finder

_BASE = '''
"""Module docstring."""
import os

LIMIT = 64  # a comment


class Chooser(Base):
    """Class docstring."""

    ORDER = ("a", "b")

    def pick(self, x):
        """Method docstring."""
        return x + LIMIT


def round_up(x, a):
    return -(-x // a) * a


if os.environ.get("X"):
    def maybe():
        return 1
'''

_REFORMATTED = '''
import os
LIMIT = 64


class Chooser(Base):
    ORDER = (
        "a",
        "b",
    )
    # changed comment

    def pick(self, x):
        """Another docstring."""
        return (x
                + LIMIT)


def round_up(x, a):
    """Now with a docstring."""
    # and a comment
    return -(-x // a) * a


if os.environ.get("X"):
    def maybe():
        return 1
'''


def _digests(source: str) -> dict[str, str]:
    return {name: rr._sha256(text) for name, text in rr.symbols_of(source).items()}


def test_symbols_of_names_functions_classes_methods_and_conditionals() -> None:
    found = rr.symbols_of(_BASE)
    assert {"LIMIT", "Chooser", "Chooser.pick", "round_up", "maybe"} <= set(found)
    assert "def pick" not in found["Chooser"], "a class's own symbol holds no methods"
    assert "ORDER" in found["Chooser"]
    env = rr.symbols_of("environment_variables = {'VLLM_A': lambda: 1, 'VLLM_B': lambda: 2}\n")
    assert env["environment_variables[VLLM_A]"] == "lambda: 1"


def test_normaliser_ignores_docstrings_comments_and_formatting() -> None:
    assert _digests(_BASE) == _digests(_REFORMATTED)
    assert rr.normalise(_BASE) == rr.normalise(_REFORMATTED)


@pytest.mark.parametrize(
    "old, new, changed",
    [
        ("return x + LIMIT", "return x - LIMIT", "Chooser.pick"),
        ("LIMIT = 64", "LIMIT = 128", "LIMIT"),
        ('ORDER = ("a", "b")', 'ORDER = ("b", "a")', "Chooser"),
        ("class Chooser(Base):", "class Chooser(Other):", "Chooser"),
        ("return -(-x // a) * a", "return -(-x // a) * a + 0", "round_up"),
        ("return 1", "return 2", "maybe"),
    ],
)
def test_normaliser_sees_code_changes(old: str, new: str, changed: str) -> None:
    assert old in _BASE
    before, after = _digests(_BASE), _digests(_BASE.replace(old, new, 1))
    assert {name for name in before if before[name] != after.get(name)} == {changed}


def test_format_symbols_finds_symbols_by_name_in_any_listed_file() -> None:
    src = "def select_mxfp4_moe_backend(cfg):\n    return 'TRITON'\n\ndef unrelated():\n    return 0\n"
    old_home = "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"
    found = rr.format_symbols({old_home: src, "vllm/elsewhere.py": src}, "mxfp4")
    assert found == {old_home: {"select_mxfp4_moe_backend": rr._sha256(rr.symbols_of(src)["select_mxfp4_moe_backend"])}}
    # A pure move keeps the format digest.
    moved = {
        "vllm/model_executor/layers/fused_moe/gpt_oss_triton_kernels_moe.py": {
            "OAITritonExperts._supports_activation": "1"
        }
    }
    moved_b = {
        "vllm/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py": {
            "OAITritonExperts._supports_activation": "1"
        }
    }
    assert rr.format_digest(moved) == rr.format_digest(moved_b)


def test_patterns_treat_only_star_as_special() -> None:
    assert rr._matches("environment_variables[VLLM_X]", ["environment_variables[VLLM_*]"])
    assert not rr._matches("environment_variables[X]", ["environment_variables[VLLM_*]"])
    assert rr._matches("A.b._supports_x", ["A.b._supports_*"])
    assert not rr._matches("select_deepseek_v4_mxfp4_moe_backend", ["select_mxfp4_moe_backend"])


def test_parse_pins_and_triton_kernels_generation() -> None:
    metadata = (
        "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n"
        "Requires-Dist: torch==2.11.0\nRequires-Dist: flashinfer_python==0.6.14\n"
        "Requires-Dist: humming-kernels[cu13]==0.1.10\nRequires-Dist: torchaudio==2.11.0\n"
    )
    pins = rr.parse_pins(metadata)
    assert pins["torch"] == "==2.11.0"
    assert pins["flashinfer-python"] == "==0.6.14"
    assert pins["humming-kernels"] == "[cu13]==0.1.10"
    assert pins["triton"] is None
    older = {"matmul_ogs.py": "x = 1\n", "tensor.py": "class Tensor:\n    pass\n"}
    newer = {"matmul_ogs.py": "x = 1\n", "tensor.py": "class SparseMatrix:\n    pass\n"}
    assert rr.triton_kernels_summary(older)["generation"] == "3.5.1"
    assert rr.triton_kernels_summary(newer)["generation"] == "3.6"
    assert rr.triton_kernels_summary({"matmul.py": "x = 1\n"})["generation"] == "3.8"
    assert rr.triton_kernels_summary(older)["sha256"] != rr.triton_kernels_summary(newer)["sha256"]


# ---------------------------------------------------------------------------------------------
# record.py on a synthetic wheel, and diff.py

_ORACLE = "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"
_NV_ORACLE = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py"


def _wheel(folder: Path, version: str, select_body: str, flashinfer: str) -> Path:
    path = folder / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(
            f"vllm-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
            f"Requires-Dist: torch==2.11.0\nRequires-Dist: flashinfer-python=={flashinfer}\n",
        )
        whl.writestr(_ORACLE, f'def select_mxfp4_moe_backend(cfg):\n    """Doc."""\n    {select_body}\n')
        whl.writestr(_NV_ORACLE, "def select_nvfp4_moe_backend(cfg):\n    return 'MARLIN'\n")
        whl.writestr("vllm/third_party/triton_kernels/matmul_ogs.py", "x = 1\n")
        whl.writestr("vllm/third_party/triton_kernels/tensor.py", "class Tensor:\n    pass\n")
        whl.writestr("vllm/unrelated.py", "def select_mxfp4_moe_backend():\n    return 0\n")
    return path


def test_record_py_reads_a_cached_wheel_and_diff_py_reports_the_change(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "records"
    cache.mkdir()
    _wheel(cache, "9.9.0", "return 'TRITON'", "0.7.0")
    _wheel(cache, "9.9.1", "return 'MARLIN'", "0.7.2")
    record = _cli("record")
    assert record.main(["9.9.0", "9.9.1", "--wheel-cache", str(cache), "--out", str(out)]) == 0
    a, b = rr.load_record(out / "vllm-9.9.0.json"), rr.load_record(out / "vllm-9.9.1.json")
    assert a["triton_kernels"]["generation"] == "3.5.1"
    expected_sha = rr._sha256("def select_mxfp4_moe_backend(cfg):\n    return 'TRITON'")
    assert a["formats"]["mxfp4"]["symbols"] == {_ORACLE: {"select_mxfp4_moe_backend": expected_sha}}
    assert a["formats"]["nvfp4"]["sha256"] == b["formats"]["nvfp4"]["sha256"]

    lines = rr.diff_records(a, b)
    assert f"    ~ select_mxfp4_moe_backend  ({_ORACLE})" in lines
    assert "  nvfp4: same decision symbols" in lines
    assert "    flashinfer-python: ==0.7.0 -> ==0.7.2" in lines
    assert (
        "  mxfp4: different rows (format digest + pin:flashinfer-python, triton_kernels:generation, "
        "triton_kernels:sha256)"
    ) in lines
    assert "  nvfp4: different rows (format digest + pin:flashinfer-python)" in lines

    # The command line: exit 1 when the releases cannot share a row, 0 when they can.
    diff = TOOL / "diff.py"
    run = subprocess.run(
        [sys.executable, str(diff), "9.9.0", "9.9.1", "--records", str(out)], capture_output=True, text=True
    )
    assert run.returncode == 1 and "~ select_mxfp4_moe_backend" in run.stdout
    same = subprocess.run(
        [sys.executable, str(diff), "9.9.1", "9.9.1", "--records", str(out)], capture_output=True, text=True
    )
    assert same.returncode == 0 and "~" not in same.stdout
    nearest = subprocess.run(
        [sys.executable, str(diff), "--nearest", "9.9.1", "--records", str(out)], capture_output=True, text=True
    )
    assert nearest.returncode == 1 and nearest.stdout.startswith("vLLM 9.9.0 -> 9.9.1")


def test_diff_reports_moves_additions_and_removals() -> None:
    base = RECORDS["0.33.0"]
    a = json.loads(json.dumps(base))
    b = json.loads(json.dumps(base))
    syms = b["formats"]["nvfp4"]["symbols"]
    path = next(p for p, s in syms.items() if "select_nvfp4_moe_backend" in s)
    sha = syms[path].pop("select_nvfp4_moe_backend")
    syms.setdefault("vllm/somewhere_new.py", {})["select_nvfp4_moe_backend"] = sha
    syms.setdefault("vllm/somewhere_new.py", {})["brand_new"] = "0" * 64
    first = next(iter(a["formats"]["nvfp4"]["symbols"]))
    removed = next(iter(b["formats"]["nvfp4"]["symbols"][first]))
    del b["formats"]["nvfp4"]["symbols"][first][removed]
    for rec in (a, b):
        rec["formats"]["nvfp4"]["sha256"] = rr.format_digest(rec["formats"]["nvfp4"]["symbols"])
    lines = rr.diff_records(a, b)
    assert f"    moved select_nvfp4_moe_backend: {path} -> vllm/somewhere_new.py" in lines
    assert "    + brand_new  (vllm/somewhere_new.py)" in lines
    assert any(line.startswith(f"    - {removed}  ") for line in lines)
    assert "  mxfp4: same decision symbols" in lines


def test_record_refuses_a_wheel_of_another_version(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "9.9.0", "return 1", "0.7.0")
    renamed = wheel.with_name(wheel.name.replace("9.9.0", "9.9.5"))
    wheel.rename(renamed)
    with pytest.raises(SystemExit, match="METADATA says version 9.9.0, expected 9.9.5"):
        rr.build_record("9.9.5", renamed)
