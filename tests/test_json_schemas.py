"""Every `--json` document the command line prints validates against its JSON Schema in docs/schemas/
(issue 23 item 2): real output of every command, in several variants each (MXFP4 and NVFP4, dry run,
written, up to date, several targets, a mismatch, errors and usage errors), so that a renamed,
missing or unrecorded field fails here before it reaches a CI script. The schemas are strict
(`additionalProperties: false` wherever the document is closed); a mutated document must fail.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
from helpers import ROOT, run_cli
from referencing import Registry, Resource

SCHEMAS = ROOT / "docs" / "schemas"
EXAMPLES = ROOT / "examples"
MXFP4 = EXAMPLES / "tiny-gpt-oss"
NVFP4 = EXAMPLES / "tiny-nvfp4-modelopt-qwen3"
NVFP4_CT = EXAMPLES / "tiny-nvfp4-ct-deepseek"

#: Each document's schema file (docs/schemas/<file>) by its "schema" name.
SCHEMA_FILES = {
    "mxconvert.profiles/1": "profiles.schema.json",
    "mxconvert.backends/1": "backends.schema.json",
    "mxconvert.runtimes/1": "runtimes.schema.json",
    "mxconvert.select/1": "select.schema.json",
    "mxconvert.convert/1": "convert.schema.json",
    "mxconvert.convert-multi/1": "convert-multi.schema.json",
    "mxconvert.verify/1": "verify.schema.json",
    "mxconvert.inspect/1": "inspect.schema.json",
    "mxconvert.inspect-diff/1": "inspect-diff.schema.json",
    "mxconvert.error/1": "error.schema.json",
}


def _registry() -> Registry:
    """Every schema file under its file name: `"$ref": "common.schema.json#/$defs/..."` resolves
    here as it does for a tool that reads the files from docs/schemas/."""
    resources = [
        (path.name, Resource.from_contents(json.loads(path.read_text()))) for path in sorted(SCHEMAS.glob("*.json"))
    ]
    return Registry().with_resources(resources)


REGISTRY = _registry()


def _validator(schema_name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / SCHEMA_FILES[schema_name]).read_text())
    return jsonschema.Draft202012Validator(schema, registry=REGISTRY)


def _errors(document: dict, schema: str | None = None) -> list[str]:
    """What is wrong with `document` for `schema` (default: the one it names); empty: it validates."""
    validator = _validator(schema or document["schema"])
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    """Artifacts the documents are about: MXFP4 for H100 and B200, NVFP4 (ModelOpt with EP 2,
    compressed-tensors with TP 2), a copy of the H100 one with a flipped byte, a user profile file."""
    root = tmp_path_factory.mktemp("schemas")
    paths = {"root": root}
    for name, model, args in (
        ("mx_h100", MXFP4, ("-p", "h100")),
        ("mx_b200", MXFP4, ("-p", "b200")),
        ("nv_b200_ep2", NVFP4, ("-p", "b200", "--ep", "2")),
        ("ct_h100_tp2", NVFP4_CT, ("-p", "h100", "--tp", "2")),
    ):
        result = run_cli("convert", model, *args, "-o", root / name)
        assert result.exit_code == 0, result.output
        paths[name] = root / name
    broken = root / "mx_h100_broken"
    shutil.copytree(paths["mx_h100"], broken)
    shard = next(broken.glob("rank-00000/*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    paths["mx_h100_broken"] = broken
    profile = root / "h100-old-torch.toml"
    profile.write_text('base = "h100"\nname = "h100-old-torch"\ntorch_geq_2_8_1 = false\n')
    paths["profile_file"] = profile
    return paths


#: (id, arguments with {placeholders} from `work` and the examples, exit code, schema name).
CASES = [
    ("profiles", ("profiles",), 0, "mxconvert.profiles/1"),
    ("backends", ("backends",), 0, "mxconvert.backends/1"),
    ("runtimes", ("runtimes",), 0, "mxconvert.runtimes/1"),
    ("select-mxfp4-h100", ("select", "{MXFP4}", "-p", "h100"), 0, "mxconvert.select/1"),
    ("select-mxfp4-b200-env", ("select", "{MXFP4}", "-p", "b200", "--env", "VLLM_ROCM_USE_AITER=1"), 0,
     "mxconvert.select/1"),
    ("select-mxfp4-vllm-0.20", ("select", "{MXFP4}", "-p", "h100", "--runtime", "vllm-0.20", "--tp", "2"), 0,
     "mxconvert.select/1"),
    ("select-mxfp4-profile-file", ("select", "{MXFP4}", "-p", "{profile_file}"), 0, "mxconvert.select/1"),
    ("select-nvfp4-b200", ("select", "{NVFP4}", "-p", "b200"), 0, "mxconvert.select/1"),
    ("select-nvfp4-ct-a100", ("select", "{NVFP4_CT}", "-p", "a100", "--env", "VLLM_ROCM_USE_AITER=1"), 0,
     "mxconvert.select/1"),
    ("convert-dry-run", ("convert", "{MXFP4}", "-p", "h100", "-o", "{root}/dry", "--dry-run"), 0,
     "mxconvert.convert/1"),
    ("convert-up-to-date", ("convert", "{MXFP4}", "-p", "h100", "-o", "{mx_h100}"), 0, "mxconvert.convert/1"),
    ("convert-written-mxfp4-rank", ("convert", "{MXFP4}", "-p", "mi355x", "--tp", "2", "--rank", "1", "-o",
                                    "{root}/rank1"), 0, "mxconvert.convert/1"),
    ("convert-written-nvfp4", ("convert", "{NVFP4}", "-p", "h100", "-o", "{root}/nv_h100"), 0,
     "mxconvert.convert/1"),
    ("convert-multi", ("convert", "{MXFP4}", "-p", "h100", "-p", "b200", "--tp", "1", "--tp", "2", "-o",
                       "{root}/multi"), 0, "mxconvert.convert-multi/1"),
    ("convert-multi-dry-run", ("convert", "{NVFP4_CT}", "-p", "h100", "-p", "b200", "-o", "{root}/multi-dry",
                               "--dry-run"), 0, "mxconvert.convert-multi/1"),
    ("verify-mxfp4", ("verify", "{mx_h100}"), 0, "mxconvert.verify/1"),
    ("verify-nvfp4-ep", ("verify", "{nv_b200_ep2}", "--source", "{NVFP4}"), 0, "mxconvert.verify/1"),
    ("verify-mismatch", ("verify", "{mx_h100_broken}"), 1, "mxconvert.verify/1"),
    ("inspect-checkpoint-mxfp4", ("inspect", "{MXFP4}"), 0, "mxconvert.inspect/1"),
    ("inspect-checkpoint-nvfp4", ("inspect", "{NVFP4_CT}", "--layer", "1"), 0, "mxconvert.inspect/1"),
    ("inspect-artifact-mxfp4", ("inspect", "{mx_b200}", "--tensor", "w13_weight_scale"), 0, "mxconvert.inspect/1"),
    ("inspect-artifact-nvfp4", ("inspect", "{ct_h100_tp2}", "--rank", "1"), 0, "mxconvert.inspect/1"),
    ("inspect-diff-same", ("inspect", "{mx_h100}", "{mx_h100}"), 0, "mxconvert.inspect-diff/1"),
    ("inspect-diff-different", ("inspect", "{mx_h100}", "{mx_b200}"), 1, "mxconvert.inspect-diff/1"),
    ("inspect-diff-bytes", ("inspect", "{mx_h100}", "{mx_h100_broken}"), 1, "mxconvert.inspect-diff/1"),
    ("inspect-diff-checkpoints", ("inspect", "{MXFP4}", "{NVFP4}"), 1, "mxconvert.inspect-diff/1"),
    ("error-input", ("select", "{root}/no-such-checkpoint", "-p", "h100"), 2, "mxconvert.error/1"),
    ("error-refused", ("convert", "{MXFP4}", "-p", "h100", "-o", "{mx_b200}"), 2, "mxconvert.error/1"),
    ("error-unknown-profile", ("select", "{MXFP4}", "-p", "h1000"), 2, "mxconvert.error/1"),
    ("usage-missing-option", ("convert", "{MXFP4}", "-p", "h100"), 2, "mxconvert.error/1"),
    ("usage-missing-argument", ("select",), 2, "mxconvert.error/1"),
    ("usage-bad-value", ("select", "{MXFP4}", "-p", "h100", "--tp", "two"), 2, "mxconvert.error/1"),
    ("usage-out-of-range", ("verify", "{mx_h100}", "--jobs", "0"), 2, "mxconvert.error/1"),
    ("usage-unknown-option", ("select", "{MXFP4}", "-p", "h100", "--tensor-parallel"), 2, "mxconvert.error/1"),
    ("usage-extra-argument", ("profiles", "extra"), 2, "mxconvert.error/1"),
    ("usage-unknown-command", ("selekt", "{MXFP4}"), 2, "mxconvert.error/1"),
]  # fmt: skip


def _run_json(work: dict[str, Path], args: tuple[str, ...]):
    values = {k: str(v) for k, v in work.items()} | {"MXFP4": MXFP4, "NVFP4": NVFP4, "NVFP4_CT": NVFP4_CT}
    result = run_cli(*(a.format(**values) for a in args), "--json")
    return result, json.loads(result.stdout)


@pytest.mark.parametrize(("args", "code", "schema"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_json_document_validates_against_its_schema(work, args, code, schema):
    result, document = _run_json(work, args)
    assert result.exit_code == code, result.output
    assert document["schema"] == schema
    assert _errors(document) == []
    if schema == "mxconvert.error/1":  # the document says what stderr says, and the exit code
        assert document["error"]["exit_code"] == code
        message = document["error"]["message"]
        if document["error"]["kind"] == "UsageError":  # click's message, after the command it was for
            message = message.split(": ", 1)[1]
        assert message[:20] in result.stderr


def test_usage_errors_under_json_are_the_error_document(work):
    result, document = _run_json(work, ("select", "{MXFP4}", "-p", "h100", "--tp", "two"))
    assert result.exit_code == 2
    assert document["ok"] is False and document["error"]["kind"] == "UsageError"
    assert "Invalid value for '--tp'" in document["error"]["message"]
    missing = run_cli("convert", MXFP4, "-p", "h100", "--json")
    assert missing.exit_code == 2 and "'--out'" in json.loads(missing.stdout)["error"]["message"]
    # without --json a usage error prints nothing on stdout (the message is on stderr), as before
    plain = run_cli("select", MXFP4, "-p", "h100", "--tp", "two")
    assert plain.exit_code == 2 and plain.stdout == "" and "--tp" in plain.stderr
    # `--json` after `--` is not the option (an argument named so): the line is not asked for JSON
    after = run_cli("inspect", "--", "--json")
    assert after.exit_code == 2 and after.stdout == ""


def test_each_document_names_its_schema_and_each_schema_has_a_file():
    """The "schema" names the code prints are exactly the schema files, each a valid 2020-12 schema
    whose `schema` property is that name, and docs/exit-codes-and-json.md lists each one."""
    from mxconvert.cli.main import ERROR_JSON_SCHEMA
    from mxconvert.cli.render import JSON_SCHEMAS
    from mxconvert.pipeline.results import CONVERT_JSON_SCHEMA, MULTI_JSON_SCHEMA
    from mxconvert.target.releases import RUNTIMES_JSON_SCHEMA

    printed = {*JSON_SCHEMAS.values(), CONVERT_JSON_SCHEMA, MULTI_JSON_SCHEMA, RUNTIMES_JSON_SCHEMA, ERROR_JSON_SCHEMA}
    assert printed == set(SCHEMA_FILES)
    assert {c[3] for c in CASES} == printed  # every document is exercised above
    on_disk = {p.name for p in SCHEMAS.glob("*.schema.json")}
    assert set(SCHEMA_FILES.values()) | {"common.schema.json"} == on_disk
    doc = (ROOT / "docs" / "exit-codes-and-json.md").read_text()
    for name, file in SCHEMA_FILES.items():
        schema = json.loads((SCHEMAS / file).read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["properties"]["schema"] == {"const": name}
        assert schema["additionalProperties"] is False and "schema" in schema["required"]
        assert f"`{name}`" in doc and f"schemas/{file}" in doc


def _mutations(document: dict):
    """Documents that a strict schema must refuse: a renamed field, a missing one, an unknown one,
    a wrong type, a wrong schema version, and the same inside a nested record."""
    key = next(k for k in sorted(document) if k != "schema")
    renamed = copy.deepcopy(document)
    renamed[key + "_renamed"] = renamed.pop(key)
    yield f"renamed {key}", renamed
    missing = copy.deepcopy(document)
    del missing[key]
    yield f"missing {key}", missing
    yield "unknown field", {**copy.deepcopy(document), "surprise": 1}
    yield "other version", {**copy.deepcopy(document), "schema": re.sub(r"/\d+$", "/999", document["schema"])}
    wrong = copy.deepcopy(document)
    wrong[key] = {"not": "what it is"} if not isinstance(document[key], dict) else "a string"
    yield f"wrong type of {key}", wrong


@pytest.mark.parametrize(
    "case",
    ["convert-written-nvfp4", "select-mxfp4-h100", "verify-mismatch", "inspect-artifact-mxfp4", "usage-bad-value"],
)
def test_a_mutated_document_fails_validation(work, case):
    (args, _, schema) = next(c[1:] for c in CASES if c[0] == case)
    document = _run_json(work, args)[1]
    assert _errors(document, schema) == []
    for what, mutated in _mutations(document):
        assert _errors(mutated, schema), f"{case}: the schema accepts a document with a {what}"


def test_nested_records_are_closed_too(work):
    """A renamed field deep inside (a considered backend, a rank's file, a target's field, a verify
    problem) fails as well: the schemas are closed below the top level."""
    convert = _run_json(work, CASES[[c[0] for c in CASES].index("convert-written-nvfp4")][1])[1]
    for path in (("selection", "considered", 0), ("ranks", 0, "files", 0), ("target",), ("model",), ("source",)):
        mutated = copy.deepcopy(convert)
        record = mutated
        for step in path:
            record = record[step]
        field = sorted(record)[0]
        record[field + "_renamed"] = record.pop(field)
        assert _errors(mutated), f"a renamed {'/'.join(map(str, path))}/{field} validates"
    verify = _run_json(work, ("verify", "{mx_h100_broken}"))[1]
    assert verify["problems"]
    verify["problems"][0]["kind"] = "not-a-kind"
    assert _errors(verify)
    error = _run_json(work, ("profiles", "extra"))[1]
    error["error"]["code"] = error["error"].pop("exit_code")
    assert _errors(error)
