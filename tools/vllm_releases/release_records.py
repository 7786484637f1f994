"""Records of what decides MoE selection and weight processing in one vLLM release (docs/releases.md).

A record is made from the release's wheel alone (the Python files are read straight out of the
zip): the wheel METADATA pins, the vendored triton_kernels (its API generation and a digest), and
per format (``mxfp4``, ``nvfp4``) the digest of every decision symbol that decision_symbols.py lists,
found by name in whichever file holds it in that release. Digests are over normalised source
(`normalise`), so comments, docstrings and formatting do not count but any code change does.

This module is the library; record.py, diff.py and table.py are its command lines.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from decision_symbols import GROUP_KEYS, RECORDED_PINS, TABLES

SCHEMA = 1
#: Bump when `normalise` or `symbols_of` change what they produce: digests made by different
#: normaliser versions (or Python minor versions, whose ast.unparse may differ) are not comparable.
NORMALISER_VERSION = 1
TRITON_KERNELS_DIR = "vllm/third_party/triton_kernels/"
FORMATS = tuple(TABLES)

Record = dict[str, Any]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _strip_docstrings(tree: ast.AST) -> None:
    """Drop the docstring of every module, class and function in `tree` (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0].value if body and isinstance(body[0], ast.Expr) else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                node.body = body[1:] or [ast.Pass()]


def normalise(source: str) -> str:
    """`source` with comments, docstrings and formatting removed: ast.unparse of the docstring-free tree."""
    tree = ast.parse(source)
    _strip_docstrings(tree)
    return ast.unparse(tree)


def _class_header(node: ast.ClassDef) -> ast.ClassDef:
    """`node` without its methods and nested classes (those are symbols of their own)."""
    rest = [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    header = copy.copy(node)
    header.body = rest or [ast.Pass()]
    return header


def _assigned_names(stmt: ast.Assign | ast.AnnAssign | ast.AugAssign) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return [ast.unparse(t) for t in targets]


def _collect(stmts: Iterable[ast.stmt], prefix: str, out: dict[str, list[str]]) -> None:
    for stmt in stmts:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(prefix + stmt.name, []).append(ast.unparse(stmt))
        elif isinstance(stmt, ast.ClassDef):
            qual = prefix + stmt.name
            out.setdefault(qual, []).append(ast.unparse(_class_header(stmt)))
            _collect(
                (s for s in stmt.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))),
                qual + ".",
                out,
            )
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and not prefix:
            text = ast.unparse(stmt)
            for name in _assigned_names(stmt):
                out.setdefault(name, []).append(text)
                # A module-level dict literal with string keys (envs.py's `environment_variables`):
                # each entry is a symbol of its own, `NAME[KEY]`.
                if isinstance(stmt.value, ast.Dict):
                    for key, value in zip(stmt.value.keys, stmt.value.values, strict=True):
                        if isinstance(key, ast.Constant) and isinstance(key.value, str):
                            out.setdefault(f"{name}[{key.value}]", []).append(ast.unparse(value))
        elif isinstance(stmt, (ast.If, ast.Try, ast.With)) and not prefix:
            # Conditional module-level definitions (`if triton_kernels_version is not None: ...`,
            # `try: import x except ImportError: def f(): ...`) count as module-level symbols.
            bodies: list[list[ast.stmt]] = [stmt.body]
            if isinstance(stmt, (ast.If, ast.Try)):
                bodies.append(stmt.orelse)
            if isinstance(stmt, ast.Try):
                bodies.append(stmt.finalbody)
                bodies.extend(h.body for h in stmt.handlers)
            for body in bodies:
                _collect(body, prefix, out)


def symbols_of(source: str) -> dict[str, str]:
    """Qualified name -> normalised source of every module-level function, class (header without
    methods), method, assignment and dict-literal entry in `source`. A name defined more than once
    (e.g. in both branches of an `if`) maps to its definitions joined in order."""
    tree = ast.parse(source)
    _strip_docstrings(tree)
    found: dict[str, list[str]] = {}
    _collect(tree.body, "", found)
    return {name: "\n".join(texts) for name, texts in found.items()}


# --------------------------------------------------------------------------------------------
# Wheel reading


def _read_text(wheel: zipfile.ZipFile, name: str) -> str:
    return wheel.read(name).decode("utf-8")


def parse_pins(metadata: str) -> dict[str, str | None]:
    """The RECORDED_PINS from a wheel METADATA: package -> requirement after the name (extras,
    specifier, marker), several lines joined with ' | '; None when the wheel does not name it."""
    found: dict[str, list[str]] = {}
    for line in metadata.splitlines():
        m = re.match(r"Requires-Dist:\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", line)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            found.setdefault(name, []).append(m.group(2).strip())
    return {p: (" | ".join(found[p]) if p in found else None) for p in RECORDED_PINS}


def triton_kernels_summary(files: Mapping[str, str]) -> dict[str, Any]:
    """Generation and digest of the vendored triton_kernels (`files`: path -> source, paths
    relative to the triton_kernels folder). The generation follows vLLM 0.31.0's
    `vllm.utils.import_utils.get_triton_kernels_version`: "3.8" without `matmul_ogs`, "3.5.1"
    without `tensor.SparseMatrix`, else "3.6"."""
    if not files:
        return {"generation": None, "files": 0, "sha256": None}
    if "matmul_ogs.py" not in files:
        generation = "3.8"
    elif "SparseMatrix" not in symbols_of(files.get("tensor.py", "")):
        generation = "3.5.1"
    else:
        generation = "3.6"
    lines = sorted(f"{path}\t{_sha256(normalise(src))}" for path, src in files.items())
    return {"generation": generation, "files": len(files), "sha256": _sha256("\n".join(lines))}


def _pattern(pattern: str) -> re.Pattern[str]:
    """`pattern` as a regex: `*` matches any run of characters (dots and slashes too); every other
    character, `[` and `?` included, stands for itself."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(_pattern(p).fullmatch(name) for p in patterns)


def format_symbols(sources: Mapping[str, str], fmt: str) -> dict[str, dict[str, str]]:
    """file -> qualified name -> sha256 of the normalised source, for every decision symbol of
    `fmt` found in `sources` (wheel path -> Python source)."""
    out: dict[str, dict[str, str]] = {}
    parsed: dict[str, dict[str, str]] = {}
    for decision in TABLES[fmt]:
        for path in sorted(sources):
            if not _matches(path, decision.files):
                continue
            if path not in parsed:
                parsed[path] = symbols_of(sources[path])
            for name, text in parsed[path].items():
                if _matches(name, decision.names):
                    out.setdefault(path, {})[name] = _sha256(text)
    return {path: dict(sorted(syms.items())) for path, syms in sorted(out.items())}


def format_digest(symbols: Mapping[str, Mapping[str, str]]) -> str:
    """One digest over a format's symbols: names and digests, NOT files, so a symbol that only
    moved to another file leaves it unchanged."""
    lines = sorted(f"{name}\t{sha}" for syms in symbols.values() for name, sha in syms.items())
    return _sha256("\n".join(lines))


def _decision_patterns() -> list[str]:
    return sorted({p for table in TABLES.values() for d in table for p in d.files})


def build_record(release: str, wheel_path: Path) -> Record:
    """The record of `release` from its wheel (read in memory; nothing is extracted)."""
    patterns = _decision_patterns()
    with zipfile.ZipFile(wheel_path) as wheel:
        names = wheel.namelist()
        metadata_names = [n for n in names if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", n)]
        if len(metadata_names) != 1:
            raise SystemExit(f"{wheel_path}: expected one vllm-*.dist-info/METADATA, found {metadata_names}")
        metadata = _read_text(wheel, metadata_names[0])
        version = re.search(r"^Version:\s*(\S+)", metadata, re.M)
        if version is None or version.group(1) != release:
            found = version.group(1) if version else "none"
            raise SystemExit(f"{wheel_path}: METADATA says version {found}, expected {release}")
        sources = {n: _read_text(wheel, n) for n in names if n.endswith(".py") and _matches(n, patterns)}
        triton = {
            n[len(TRITON_KERNELS_DIR) :]: _read_text(wheel, n)
            for n in names
            if n.startswith(TRITON_KERNELS_DIR) and n.endswith(".py")
        }
    formats = {}
    for fmt in FORMATS:
        symbols = format_symbols(sources, fmt)
        formats[fmt] = {"sha256": format_digest(symbols), "symbols": symbols}
    return {
        "schema": SCHEMA,
        "release": release,
        "wheel": wheel_path.name,
        "wheel_sha256": hashlib.sha256(wheel_path.read_bytes()).hexdigest(),
        "normaliser": {"version": NORMALISER_VERSION, "python": f"{sys.version_info[0]}.{sys.version_info[1]}"},
        "pins": parse_pins(metadata),
        "triton_kernels": triton_kernels_summary(triton),
        "formats": formats,
    }


def write_record(record: Record, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"vllm-{record['release']}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    return path


def load_record(path: Path) -> Record:
    record: Record = json.loads(path.read_text())
    return record


# --------------------------------------------------------------------------------------------
# Comparing and grouping


def version_key(release: str) -> tuple[int, ...]:
    """Sort key of a release number: `0.27.1` -> (0, 27, 1); `0.8.5.post1` -> (0, 8, 5, 1)."""
    return tuple(int(part.removeprefix("post")) for part in release.split("."))


def group_key(record: Record, fmt: str) -> tuple[str | None, ...]:
    """What must agree for two releases to share a row for `fmt`: the format digest and the
    GROUP_KEYS pins of decision_symbols.py."""
    values: list[str | None] = [record["formats"][fmt]["sha256"]]
    for key in GROUP_KEYS[fmt]:
        kind, _, name = key.partition(":")
        values.append(record["pins"][name] if kind == "pin" else record["triton_kernels"][name])
    return tuple(values)


def groups(records: Iterable[Record], fmt: str) -> list[list[str]]:
    """Releases with the same `group_key`, each group sorted, groups in order of their first release."""
    by_key: dict[tuple[str | None, ...], list[str]] = {}
    for record in sorted(records, key=lambda r: version_key(r["release"])):
        by_key.setdefault(group_key(record, fmt), []).append(record["release"])
    return sorted(by_key.values(), key=lambda g: version_key(g[0]))


def _flat(record: Record, fmt: str) -> dict[str, dict[str, str]]:
    """qualified name -> file -> digest."""
    out: dict[str, dict[str, str]] = {}
    for path, syms in record["formats"][fmt]["symbols"].items():
        for name, sha in syms.items():
            out.setdefault(name, {})[path] = sha
    return out


def diff_records(a: Record, b: Record) -> list[str]:
    """Human-readable lines: per format, the decision symbols that changed, were added, were
    removed or only moved file between `a` and `b`; then the pins and triton_kernels that differ."""
    lines = [f"vLLM {a['release']} -> {b['release']}"]
    if a["normaliser"] != b["normaliser"]:
        lines.append(
            f"  WARNING: records made with different normalisers ({a['normaliser']} vs {b['normaliser']}): "
            "digests may differ for that reason alone; remake the older record"
        )
    for fmt in FORMATS:
        fa, fb = _flat(a, fmt), _flat(b, fmt)
        same = a["formats"][fmt]["sha256"] == b["formats"][fmt]["sha256"]
        lines.append(f"  {fmt}: {'same decision symbols' if same else 'decision symbols differ'}")
        for name in sorted(set(fa) | set(fb)):
            where_a, where_b = fa.get(name), fb.get(name)
            if where_a is None and where_b is not None:
                lines.append(f"    + {name}  ({', '.join(sorted(where_b))})")
            elif where_b is None and where_a is not None:
                lines.append(f"    - {name}  ({', '.join(sorted(where_a))})")
            elif where_a is not None and where_b is not None:
                if sorted(where_a.values()) != sorted(where_b.values()):
                    lines.append(f"    ~ {name}  ({', '.join(sorted(where_b))})")
                elif sorted(where_a) != sorted(where_b):
                    lines.append(f"    moved {name}: {', '.join(sorted(where_a))} -> {', '.join(sorted(where_b))}")
    pin_lines = [
        f"    {pin}: {a['pins'].get(pin)} -> {b['pins'].get(pin)}"
        for pin in RECORDED_PINS
        if a["pins"].get(pin) != b["pins"].get(pin)
    ]
    lines.append("  pins: " + ("differ" if pin_lines else "same"))
    lines.extend(pin_lines)
    ta, tb = a["triton_kernels"], b["triton_kernels"]
    if ta != tb:
        lines.append(
            f"  triton_kernels: {ta['generation']} ({str(ta['sha256'])[:12]}) -> "
            f"{tb['generation']} ({str(tb['sha256'])[:12]})"
        )
    else:
        lines.append(f"  triton_kernels: same ({ta['generation']})")
    for fmt in FORMATS:
        verdict = "same row" if group_key(a, fmt) == group_key(b, fmt) else "different rows"
        lines.append(f"  {fmt}: {verdict} (format digest + {', '.join(GROUP_KEYS[fmt])})")
    return lines
