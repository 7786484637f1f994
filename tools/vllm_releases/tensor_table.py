#!/usr/bin/env python3
"""Which revision row's bytes each recorded vLLM release has, backend by backend.

    PYTHONPATH=. .venv/bin/python tools/vllm_releases/tensor_table.py            # the table (markdown)
    PYTHONPATH=. .venv/bin/python tools/vllm_releases/tensor_table.py --write    # + expected_rows.json
    PYTHONPATH=. .venv/bin/python tools/vllm_releases/tensor_table.py --check    # exit 1 when stale

Reads every tensor record tests/golden/tensors/vllm-X.Y.Z-<format>.json (made by record_tensors.py
from the release's own weight processing), lays out each recorded case with mxconvert under every
revision row of that format (mxconvert/target/revisions.py) and compares: a case equals a row when
the row's round-up gives the recorded padded sizes and every laid-out tensor has the recorded
dtype, sha256 (and, where the kernel reads a strided view, view shape and stride). A backend of a
release equals a row when every recorded case of it does. tests/test_tensor_records.py holds
mxconvert to tests/golden/tensors/expected_rows.json, which this tool writes.

Cell legend: `= vllm-0.33` (every recorded case equals that row's bytes), `!= vllm-0.33: w13_weight
x3, ...` (the nearest row and the tensors that differ, with the number of cases), `refused` (every
row refuses the backend, e.g. `unproven_layouts`), `unrecorded` (a CUDA op result missing), `-`
(the release has no such backend).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TENSORS = REPO / "tests" / "golden" / "tensors"
EXPECTED = TENSORS / "expected_rows.json"
sys.path.insert(0, str(REPO / "tests" / "golden"))
sys.path.insert(0, str(REPO))


def records(fmt: str | None = None) -> list[Path]:
    """Every committed tensor record (of `fmt`), oldest release first."""
    paths = TENSORS.glob(f"vllm-*-{fmt}.json" if fmt else "vllm-*-*.json")

    def order(p: Path):
        release = p.stem.split("-")[1]
        return (p.stem.split("-")[2], tuple(int(x) for x in release.split(".")))

    return sorted(paths, key=order)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def _raw(t) -> bytes:
    import torch

    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _digest(t) -> str:
    return hashlib.sha256(_raw(t)).hexdigest()


def _profile(target: dict):
    from mxconvert.target.profiles import ROCM_CAPABILITY, DeviceProfile

    if target["platform"] == "rocm":
        return DeviceProfile("record", "tensor record target", "rocm", ROCM_CAPABILITY[target["gfx"]], target["gfx"])
    return DeviceProfile(
        "record",
        "tensor record target",
        "cuda",
        tuple(target["capability"]),
        torch_geq_2_8_1=target.get("torch_geq_2_8_1", True),
    )


def rows(fmt: str) -> list[str]:
    from mxconvert.target.revisions import REVISIONS

    return [r.name for r in REVISIONS.values() if fmt in r.formats]


@cache
def _mxfp4_inputs(E: int, H: int, I: int, Hp: int, Ip: int, seed: int):  # noqa: E741
    from canonical_inputs import make_canonical

    return make_canonical(E, H, I, Hp, Ip, seed)


@cache
def _mxfp4_ours(row: str, backend: str, target_json: str, E: int, H: int, I: int, Hp: int, Ip: int, seed: int):  # noqa: E741
    """mxconvert's tensors for one MXFP4 case under `row`: ("refused", why) or ("padding", (Hp, Ip))
    or ("tensors", {name: (dtype, sha256, view shape, view stride)})."""
    from mxconvert.core.errors import InputError, UnsupportedError
    from mxconvert.layouts import resolve_layout
    from mxconvert.target.backends import Mxfp4Backend
    from mxconvert.target.revisions import get_revision

    target = json.loads(target_json)
    revision = get_revision(row, "mxfp4")
    be = Mxfp4Backend.parse(backend)
    padded = revision.round_up(be, target["platform"], H, I)
    if padded != (Hp, Ip):
        return ("padding", padded)
    try:
        layout = resolve_layout(
            be, revision, _profile(target), tp=target.get("tp", 1), marlin_input_dtype=target.get("marlin_input_dtype")
        )
    except (UnsupportedError, InputError) as e:
        return ("refused", str(e))
    canonical = _mxfp4_inputs(E, H, I, Hp, Ip, seed)
    out = {}
    for name, tensor_layout in layout.tensors.items():
        buffer = tensor_layout.forward(canonical[name])
        dtype = tensor_layout.info.get("kernel_dtype", str(buffer.dtype).removeprefix("torch."))
        shape, stride = tensor_layout.view(tuple(buffer.shape))
        out[name] = (dtype, _digest(buffer), list(shape), list(stride))
    return ("tensors", out)


def input_digests(fmt: str, case: dict) -> dict[str, str]:
    """sha256 of the canonical inputs mxconvert builds for `case` (to hold against the record's)."""
    if fmt == "mxfp4":
        c = _mxfp4_inputs(case["E"], case["H"], case["I"], case["Hp"], case["Ip"], case["seed"])
    else:
        c = _nvfp4_inputs(
            case["E"], case["K"], case["N"], case["seed"], case.get("gated", True), case.get("w4a16", False)
        )
    return {k: _digest(v) for k, v in c.items()}


@cache
def _nvfp4_inputs(E: int, K: int, N: int, seed: int, gated: bool, w4a16: bool):
    from nvfp4_inputs import make_nvfp4_canonical

    return make_nvfp4_canonical(E, K, N, seed, gated=gated, w4a16=w4a16)


@cache
def _nvfp4_ours(row: str, backend: str, E: int, K: int, N: int, seed: int, gated: bool, w4a16: bool):
    """mxconvert's tensors for one NVFP4 case under `row` (see `_mxfp4_ours`)."""
    from mxconvert.core.errors import InputError, UnsupportedError
    from mxconvert.layouts import nvfp4_layout
    from mxconvert.target.backends import Nvfp4Backend
    from mxconvert.target.revisions import get_revision

    revision = get_revision(row, "nvfp4")
    canonical = _nvfp4_inputs(E, K, N, seed, gated, w4a16)
    try:
        layout = nvfp4_layout(Nvfp4Backend(backend), revision, K, N, E, gated=gated)
        out: dict[str, tuple] = {}
        for name, t in layout.tensors.items():
            buffer = t.forward(canonical[name])
            shape, stride = t.view(tuple(buffer.shape))
            out[name] = (str(buffer.dtype).removeprefix("torch."), _digest(buffer), list(shape), list(stride))
        for name, d in layout.derived.items():
            value = d.forward(canonical)
            out[name] = (str(value.dtype).removeprefix("torch."), _digest(value), None, None)
    except (UnsupportedError, InputError, ValueError) as e:
        return ("refused", str(e))
    return ("tensors", out)


def compare(fmt: str, case: dict, row: str) -> tuple[str, list[str]]:
    """("equal", []) | ("differs", [tensor names or "padding"]) | ("refused", [why]) for one case."""
    if fmt == "mxfp4":
        kind, ours = _mxfp4_ours(
            row,
            case["backend"],
            json.dumps(case["target"], sort_keys=True),
            case["E"],
            case["H"],
            case["I"],
            case["Hp"],
            case["Ip"],
            case["seed"],
        )
    else:
        kind, ours = _nvfp4_ours(
            row,
            case["backend"],
            case["E"],
            case["K"],
            case["N"],
            case["seed"],
            case.get("gated", True),
            case.get("w4a16", False),
        )
    if "raises" in case:  # the release refuses the case: mxconvert must refuse it too
        return ("equal", []) if kind == "refused" else ("differs", ["(accepts a shape the release refuses)"])
    if kind == "refused":
        return "refused", [ours]
    if kind == "padding":
        return "differs", ["padding"]
    differing = []
    recorded = case["tensors"]
    # every tensor mxconvert writes must be recorded; every recorded layer parameter must be written
    # (NVFP4 records also hold quant-config scales a row may not write: tests/test_golden_nvfp4.py)
    required = set(recorded) if fmt == "mxfp4" else {n for n in recorded if n.startswith(("w13_", "w2_"))}
    for name in sorted(required | set(ours)):
        mine, theirs = ours.get(name), recorded.get(name)
        if mine is None or theirs is None:
            differing.append(name)
            continue
        dtype, sha, shape, stride = mine
        same = dtype == theirs["dtype"] and sha == theirs["sha256"]
        if same and "view" in theirs and shape is not None:
            same = (shape, stride) == (theirs["view"]["shape"], theirs["view"]["stride"])
        if not same:
            differing.append(name)
    return ("equal", []) if not differing else ("differs", differing)


def case_status(case: dict) -> str | None:
    """Why a recorded case holds no tensors ("absent", "unrecorded", "error"), or None."""
    for k in ("absent", "unrecorded", "error"):
        if k in case:
            return k
    return None


def backend_summary(fmt: str, doc: dict) -> dict[str, dict]:
    """Per backend: {"equal_rows": [...], "cases": n, "unrecorded": n, "absent": bool, "diffs": {row: Counter}}."""
    out: dict[str, dict] = {}
    for case in doc["cases"]:
        b = out.setdefault(
            case["backend"], {"cases": 0, "unrecorded": 0, "absent": False, "errors": 0, "results": {}, "refused": {}}
        )
        status = case_status(case)
        if status == "absent":
            b["absent"] = True
            continue
        if status in ("unrecorded", "error"):
            b["unrecorded" if status == "unrecorded" else "errors"] += 1
            continue
        b["cases"] += 1
        for row in rows(fmt):
            kind, what = compare(fmt, case, row)
            res = b["results"].setdefault(row, Counter())
            if kind == "refused":
                b["refused"][row] = what[0]
                res["<refused>"] += 1
            else:
                res.update(what)
    for b in out.values():
        b["equal_rows"] = sorted(r for r, c in b["results"].items() if b["cases"] and sum(c.values()) == 0)
    return out


def expected_entry(fmt: str, doc: dict) -> dict:
    """expected_rows.json's entry for one record: per backend the rows whose bytes it equals
    (null: no case recorded), and `rows`: the rows equal for every backend with recorded cases."""
    summary = backend_summary(fmt, doc)
    per_backend = {b: (s["equal_rows"] if s["cases"] else None) for b, s in sorted(summary.items())}
    recorded = [set(v) for v in per_backend.values() if v is not None]
    common = sorted(set.intersection(*recorded)) if recorded else []
    return {"backends": per_backend, "rows": common}


def cell(summary: dict) -> str:
    if summary["absent"] and not summary["cases"]:
        return "-"
    if not summary["cases"]:
        return "unrecorded" if summary["unrecorded"] else "error"
    if summary["equal_rows"]:
        text = "= " + ", ".join(summary["equal_rows"])
    elif all(c.get("<refused>") for c in summary["results"].values()):
        text = "refused"
    else:
        scored = {
            r: c for r, c in summary["results"].items() if not c.get("<refused>") and "padding" not in c
        } or summary["results"]
        row = min(scored, key=lambda r: (sum(v for k, v in scored[r].items() if not k.startswith("<")), r))
        diffs = ", ".join(f"{k} x{v}" for k, v in sorted(scored[row].items()) if not k.startswith("<"))
        text = f"!= {row}: {diffs}"
    if summary["unrecorded"] or summary["errors"]:
        text += f" ({summary['unrecorded']} unrecorded, {summary['errors']} errors)"
    return text


def table(fmt: str) -> str:
    docs = [load(p) for p in records(fmt)]
    summaries = {d["release"]: backend_summary(fmt, d) for d in docs}
    backends = sorted({b for s in summaries.values() for b in s})
    lines = [f"| release ({fmt}) | " + " | ".join(backends) + " |", "|---" * (len(backends) + 1) + "|"]
    for release, s in summaries.items():
        lines.append(f"| {release} | " + " | ".join(cell(s[b]) if b in s else "-" for b in backends) + " |")
    return "\n".join(lines)


def expected_document() -> dict:
    doc: dict = {
        "about": (
            "Per vLLM release and format: the revision rows whose bytes mxconvert reproduces for every recorded "
            "case of each backend (tools/vllm_releases/tensor_table.py --write; docs/releases.md 'Tensor records')"
        )
    }
    for fmt in ("mxfp4", "nvfp4"):
        entries = {load(p)["release"]: expected_entry(fmt, load(p)) for p in records(fmt)}
        if entries:
            doc[fmt] = entries
    return doc


def as_if_proven(row: str) -> None:
    """Clear `row`'s unproven_layouts in this process only (mxconvert/target/revisions.py is untouched),
    so the table shows the bytes its layouts would write for the backends it refuses today."""
    from dataclasses import replace

    from mxconvert.target.revisions import REVISIONS

    REVISIONS[row] = replace(REVISIONS[row], unproven_layouts=())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write tests/golden/tensors/expected_rows.json")
    ap.add_argument("--check", action="store_true", help="exit 1 when expected_rows.json is stale")
    ap.add_argument("--format", choices=("mxfp4", "nvfp4"), action="append")
    ap.add_argument(
        "--as-if-proven",
        metavar="ROW",
        action="append",
        default=[],
        help="compare as if ROW's unproven_layouts were empty (what its layouts would write); never with --write",
    )
    args = ap.parse_args(argv)
    if args.as_if_proven and (args.write or args.check):
        ap.error("--as-if-proven changes the rows: it only prints the table")
    for name in args.as_if_proven:
        as_if_proven(name)
    for fmt in args.format or ("mxfp4", "nvfp4"):
        if records(fmt):
            print(table(fmt))
            print()
    if args.write or args.check:
        doc = expected_document()
        text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
        if args.check:
            current = EXPECTED.read_text() if EXPECTED.exists() else ""
            if current != text:
                print(f"{EXPECTED.relative_to(REPO)} is stale: run tensor_table.py --write", file=sys.stderr)
                return 1
        else:
            EXPECTED.write_text(text)
            print(f"wrote {EXPECTED.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
