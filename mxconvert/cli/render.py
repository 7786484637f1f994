"""How each command's result looks on a terminal: rich tables and lines built from the library's
results (or their JSON documents). Nothing here decides anything; `--json` prints the same results
with `console.print_json` instead.

rich is imported on first use (mxconvert/cli/startup.py): `--version` and `--json` never need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxconvert.cli.console import err_console, out_console
from mxconvert.cli.startup import escape

if TYPE_CHECKING:
    from mxconvert.formats.base import Geometry
    from mxconvert.pipeline.inspect_describe import Description
    from mxconvert.pipeline.plan import LayoutRefused
    from mxconvert.pipeline.results import Planned
    from mxconvert.pipeline.verify_report import VerifyReport
    from mxconvert.selection.report import Selection
    from mxconvert.target.profiles import DeviceProfile
    from mxconvert.target.revisions import RuntimeRevision

#: How a revision row's `runtime` is written next to a release number ("runtime vllm-0.33 (vLLM 0.33.0)").
_ENGINES = {"vllm": "vLLM", "sglang": "SGLang"}


#: The `"schema"` name and version of each `--json` document a command builds here
#: (docs/exit-codes-and-json.md; docs/schemas/ holds each as a JSON Schema). `convert`, `convert-multi`,
#: `runtimes` and `error` documents carry theirs from where they are built.
JSON_SCHEMAS = {
    "profiles": "mxconvert.profiles/1",
    "backends": "mxconvert.backends/1",
    "select": "mxconvert.select/1",
    "verify": "mxconvert.verify/1",
    "inspect": "mxconvert.inspect/1",
    "inspect-diff": "mxconvert.inspect-diff/1",
}


def json_document(name: str, body: dict) -> dict:
    """`body` as the `--json` document of `name`: its `"schema"` first, then its fields."""
    return {"schema": JSON_SCHEMAS[name], **body}


def table(*columns: str, title: str | None = None, key: int = 0, values: Sequence[Sequence[Any]] = ()):
    """A table that wraps and never cuts: every column folds, the key column is as wide as its
    longest value, so two backends or tensors that share a prefix stay distinguishable at 80 columns."""
    from rich.table import Table

    table = Table(title=title)
    longest = max((len(str(row[key])) for row in values), default=0)
    for i, col in enumerate(columns):
        if i == key:
            table.add_column(col, overflow="fold", no_wrap=True, min_width=max(len(col), longest))
        else:
            table.add_column(col, overflow="fold")
    return table


def render_profiles(profiles: Sequence[DeviceProfile]) -> None:
    """`mxconvert profiles`: one row per device profile."""
    rows = []
    for p in profiles:
        libs = [
            n
            for n, on in (
                ("flashinfer", p.has_flashinfer),
                ("triton_kernels", p.has_triton_kernels),
                ("aiter", p.rocm_use_aiter),
            )
            if on
        ]
        rows.append((p.name, p.description, p.summary(), ", ".join(p.aliases), ", ".join(libs)))
    shown = table("name", "device", "platform", "aliases", "libraries", title="device profiles", values=rows)
    for row in rows:
        shown.add_row(*row)
    out_console.print(shown)


def render_backends(rows: list[dict]) -> None:
    """`mxconvert backends`: one table per model format and runtime revision, in the rows' order."""
    for fmt in dict.fromkeys(r["format"] for r in rows):
        for rev in dict.fromkeys(r["revision"] for r in rows if r["format"] == fmt):
            part = [r for r in rows if r["format"] == fmt and r["revision"] == rev]
            sglang = "sglang" in part[0]  # SGLang rows carry their release under "sglang"
            shown = table(
                "backend",
                "--moe-runner-backend (SGLang)" if sglang else "--moe-backend",
                "convert writes",
                "selected by default on",
                title=f"{fmt.upper()}, {rev} ("
                + (f"SGLang {part[0]['sglang']})" if sglang else f"vLLM {part[0]['vllm']})"),
                values=[(r["backend"],) for r in part],
            )
            for r in part:
                writes = "yes" if r["writable"] else "no (select only)"
                shown.add_row(r["backend"], r["moe_backend"] or "-", writes, ", ".join(r["selected_on"]) or "-")
            out_console.print(shown)
            for r in part:
                if not r["writable"]:
                    out_console.print(f"  {r['backend']}: {escape(r['not_writable'])}", highlight=False)
    out_console.print(
        "--backend takes either of the first two columns; select reports every backend, convert writes those "
        "marked yes; any other runtime version is refused (see README)."
    )


def render_runtimes(document: dict) -> None:
    """`mxconvert runtimes`: the revision rows and the vLLM releases each covers per format, then
    the fields that differ between rows (read from the rows, one line each), each row's backends
    and the known releases that no row covers."""
    rows = document["rows"]
    fmts = ("mxfp4", "nvfp4")
    vllm_rows = [r for r in rows if r["runtime"] == "vllm"]
    covered = table("row", *(f"{fmt.upper()} releases" for fmt in fmts), title="vLLM releases by revision row",
                    values=[(r["name"],) for r in vllm_rows])  # fmt: skip
    for r in vllm_rows:
        covered.add_row(
            r["name"], *((", ".join(r["release_ranges"][f]) or "none") if f in r["formats"] else "-" for f in fmts)
        )
    out_console.print(covered)
    for r in rows:  # other engines' rows (SGLang): their releases on one line each
        if r["runtime"] != "vllm":
            releases = "; ".join(f"{f.upper()} {', '.join(r['release_ranges'][f]) or 'none'}" for f in r["formats"])
            engine = _ENGINES.get(r["runtime"], r["runtime"])
            out_console.print(f"{r['name']}: {engine} releases {releases}", highlight=False)
    # one line per row (a table with a column per row is unreadable once there are a score of rows)
    names = document["differing_fields"]
    out_console.print("what differs between rows:", highlight=False)
    for r in rows:
        fields = "; ".join(f"{name} {_field_text(r['fields'][name])}" for name in names)
        out_console.print(f"  {r['name']}: {fields}", highlight=False, soft_wrap=True)
    for r in rows:
        for fmt in r["formats"]:
            out_console.print(
                f"{r['name']} {fmt.upper()} backends: {', '.join(r['backends'][fmt]) or '-'}", highlight=False
            )
        if r["unproven_layouts"]:
            out_console.print(
                f"{r['name']} selects but does not write (bytes not proven yet): {', '.join(r['unproven_layouts'])}",
                highlight=False,
            )
    for fmt, releases in document["uncovered"].items():
        out_console.print(f"not covered for {fmt.upper()}: {', '.join(releases) or 'none'}", highlight=False)
    installed = document["installed_vllm"]
    auto = f"the installed vLLM {installed}" if installed else f"{document['default']} (no vLLM installed)"
    out_console.print(
        f"--runtime auto: {auto}; --runtime vllm==X.Y.Z takes a covered release, --runtime ROW a row by name.",
        highlight=False,
    )


def _field_text(value: Any) -> str:
    if isinstance(value, dict):  # a round-up rule: intermediate / hidden alignment
        return "I " + " H ".join(str(v) for v in value.values())
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return "-" if value is None else str(value)


def render_selection(planned: Planned) -> None:
    """`mxconvert select`: the backend chosen for one planned target, and why the others were not."""
    from mxconvert.pipeline.plan import serve_command

    plan = planned.plan
    _render_choice(
        plan.selection, plan.profile, plan.revision, plan.runtime_release, plan.geometry, planned.environment
    )
    target = plan.target()
    render_serve_command(serve_command(target, "ART"), target)


def render_refused_selection(refused: LayoutRefused, revision: RuntimeRevision, release: str | None) -> None:
    """`mxconvert select` of a target whose layout convert refuses: the same report; the refusal
    follows as the error (exit 2)."""
    _render_choice(refused.selection, refused.profile, revision, release, refused.geometry, refused.environment)


def _render_choice(
    sel: Selection,
    prof: DeviceProfile,
    rev: RuntimeRevision,
    release: str | None,
    geometry: Geometry,
    environment: dict,
) -> None:
    hp, ip = geometry.hidden, geometry.intermediate
    out_console.print(
        f"profile [bold]{escape(prof.label)}[/] ({prof.summary()}), runtime {rev.name}"
        + (f" ({_ENGINES.get(rev.runtime, rev.runtime)} {release})" if release else "")
        + ", "
        f"requested backend {sel.requested}"
    )
    render_environment(environment)
    shown = table("backend", "kernel class", "result", values=[(c.backend.value,) for c in sel.considered])
    for c in sel.considered:
        shown.add_row(c.backend.value, c.kernel_class or "-", "[green]chosen[/]" if c.chosen else escape(c.reason))
    out_console.print(shown)
    out_console.print(
        f"[bold green]{sel.backend.value}[/] ({sel.kernel_class}), activation {sel.activation}, "
        f"padded hidden {hp}, intermediate {ip}"
    )


def render_serve_command(command: str | None, target: dict) -> None:
    """The `vllm serve` line an artifact of `target` is for (pipeline/plan.py `serve_command`), or
    why there is none (`no_serve_command`)."""
    if command is None:
        from mxconvert.pipeline.plan import no_serve_command

        command = no_serve_command(target)
    out_console.print(f"serve with: {escape(command)}", highlight=False, soft_wrap=True)


def render_environment(report: dict) -> None:
    """The runtime environment a plan used: each value and where it came from; ignored ones as notes."""
    for key, entry in sorted(report.items()):
        if "ignored" in entry:
            err_console.print(
                f"[yellow]note:[/] {key}={entry['value']} (environment) is ignored: {entry['ignored']}", highlight=False
            )
        else:
            out_console.print(f"{key}={entry['value']} (from {entry['from']})", highlight=False, markup=False)


def _engine(target: dict) -> str:
    """The engine of a plan's target (its `runtime.runtime`), as it is written: vLLM, SGLang."""
    runtime = (target.get("runtime") or {}).get("runtime", "vllm")
    return _ENGINES.get(runtime, runtime)


def render_targets(results: list[dict]) -> None:
    """`mxconvert convert` with several targets: one row per target folder."""
    rows = [
        (
            Path(r["artifact"]).name,
            r["target"]["backend"],
            r["status"].replace("_", " "),
            f"{r['bytes'] / 1e6:.1f}",
            (r["fingerprint"] or "-")[:19],
        )
        for r in results
    ]
    shown = table("target", "backend", "status", "MB", "fingerprint", title="targets", values=rows)
    for row in rows:
        shown.add_row(*row)
    out_console.print(shown)
    for r in results:
        render_serve_command(r["serve_command"], r["target"])


def render_plan(summary: dict, out: Path, dry_run: bool) -> None:
    """`mxconvert convert` with one target: the model, the target and the files of the artifact."""
    t = summary["target"]
    m = summary["model"]
    out_console.print(
        f"{'plan (dry run, nothing written)' if dry_run else 'converted'}: {m['num_layers']} layers x "
        f"{m['num_experts']} experts, H={m['hidden_size']} I={m['intermediate_size']}\n"
        f"target {t['profile']} ({t['platform']} {t['capability'] or t['gfx'] or ''}), "
        f"runtime {t['runtime_revision']}"
        + (f" ({_engine(t)} {t['runtime_release']})" if t.get("runtime_release") else "")
        + ", "
        f"backend [bold]{t['backend']}[/] ({t['kernel_class']}), activation {t['activation']}, "
        f"MoE tp {t['tp_size']} ep {t['ep_size']}, padded H {t['hidden_size_padded']} I {t['intermediate_size_padded']}"
    )
    names = [(f["file"],) for r in summary["ranks"] for f in r["files"]] + [
        (f["file"],) for f in summary["shared_files"]
    ]
    shown = table("file", "tensors", "MB", title=str(out), values=names)
    for r in summary["ranks"]:
        for f in r["files"]:
            shown.add_row(f["file"], str(f["tensors"]), f"{f['bytes'] / 1e6:.2f}")
    for f in summary["shared_files"]:
        shown.add_row(f["file"], str(f["tensors"]), f"{f['bytes'] / 1e6:.2f}")
    out_console.print(shown)


def render_written(doc: dict, out: Path) -> None:
    """The last line of a one-target `convert`: what it wrote, or why it wrote nothing."""
    if doc["status"] == "up_to_date":
        out_console.print(
            f"up to date: {out} already holds this conversion (fingerprint {doc['fingerprint']}); "
            "nothing written (--force rewrites it)"
        )
    elif doc["status"] == "written":
        out_console.print(
            f"wrote {out} ({doc['bytes'] / 1e6:.1f} MB in {doc['files']} files), fingerprint {doc['fingerprint']}"
        )
    render_serve_command(doc["serve_command"], doc["target"])


def render_description(d: Description) -> None:
    """`mxconvert inspect PATH`: a checkpoint's or an artifact's expert tensors (and an artifact's files)."""
    if d.kind == "artifact":
        t = d.target
        out_console.print(f"[bold]artifact[/] {d.path}  rank {d.summary['rank']} of ranks {d.summary['ranks']}")
        out_console.print(
            f"  target {t.get('profile')} ({t.get('platform')} {t.get('capability') or t.get('gfx') or ''}), "
            f"backend [bold]{t.get('backend')}[/] ({t.get('kernel_class')}), activation {t.get('activation')}, "
            f"runtime {t.get('runtime_revision')}, MoE tp {t.get('tp_size')} ep {t.get('ep_size')}, "
            f"padded H {t.get('hidden_size_padded')} I {t.get('intermediate_size_padded')}"
        )
        out_console.print(f"  fingerprint {d.summary['fingerprint']}")
        render_serve_command(d.summary.get("serve_command"), t)
    else:
        m = d.summary["model"]
        out_console.print(
            f"[bold]checkpoint[/] {d.path}  ({d.summary['format']['quant_method']}, "
            f"{d.summary['format']['layout']} layout)"
        )
        top = f" (top-{m['experts_per_token']})" if "experts_per_token" in m else ""
        out_console.print(
            f"  {m['num_layers']} layers x {m['num_experts']} experts{top}, "
            f"hidden {m['hidden_size']}, intermediate {m['intermediate_size']}"
        )
    tensors = table(
        "tensor",
        "dtype",
        "shape",
        "view (shape / strides)",
        "row order",
        "layout",
        title="expert tensors",
        values=[(f"L{v['layer']} {v['name']}",) for v in d.tensors.values()],
    )
    for v in d.tensors.values():
        layout = v.get("layout_class") or (", ".join(v["steps"]) if v["steps"] else "as stored")
        if v.get("swizzle") and v.get("swizzle") not in ("none", v.get("layout_class")):
            layout += f"; swizzle {v['swizzle']}"
        tensors.add_row(
            *(
                escape(str(c))
                for c in (
                    f"L{v['layer']} {v['name']}",
                    v["dtype"],
                    v["shape"],
                    f"{v['view_shape']} / {v['view_stride']}",
                    v["row_order"],
                    layout,
                )
            )
        )
    out_console.print(tensors)
    if d.kind == "artifact":
        files = table("file", "bytes", "sha256", title="files", values=[(f["file"],) for f in d.files])
        for f in d.files:
            digest = f.get("sha256") or f["sha256_chunked"]["digest"]  # a /2 file: its tree digest
            files.add_row(f["file"], str(f["size"]), digest[:16] + "...")
        out_console.print(files)


def render_diff(result: dict) -> None:
    """`mxconvert inspect A B`: same, or each difference on its own line."""
    if result["same"]:
        out_console.print(f"[green]same[/]: {result['a']} and {result['b']}")
        return
    out_console.print(f"[bold red]different[/]: A = {result['a']}, B = {result['b']}")
    for t in result["target"]:
        out_console.print(f"  target {t['field']}: {t['a']} vs {t['b']}", highlight=False, markup=False)
    for key in result["only_in_a"]:
        out_console.print(f"  only in A: {key}", markup=False)
    for key in result["only_in_b"]:
        out_console.print(f"  only in B: {key}", markup=False)
    for d in result["descriptors"]:
        for c in d["changes"]:
            out_console.print(f"  {c['text']}", highlight=False, markup=False)
    for b in result["bytes"]:
        out_console.print(f"  {b['text']}", highlight=False, markup=False)
    for section, label in (("other_tensors", "other tensor"), ("copied_files", "copied"), ("source", "")):
        for item in result.get(section, []):
            out_console.print(f"  {label + ' ' if label else ''}{item['text']}", highlight=False, markup=False)


def render_verify(report: VerifyReport) -> None:
    """`mxconvert verify`: verified or the problems found, with what was checked."""
    status = "[bold green]verified[/]" if report.ok else f"[bold red]{len(report.problems)} problem(s)[/]"
    out_console.print(f"{status}: {report.artifact} against {report.source}")
    out_console.print(
        f"  {report.files_checked} files, {report.tensors_checked} expert tensors, "
        f"{report.passthrough_checked} other tensors checked; fingerprint {report.fingerprint}"
    )
    if report.max_dequant_diff:
        worst = max(report.max_dequant_diff.values())
        out_console.print(
            f"  largest dequantized difference over {len(report.max_dequant_diff)} sampled tensors: {worst}"
        )
    for problem in report.problems:
        out_console.print(f"  [red]{problem.kind}[/]: {escape(problem.message)}", highlight=False)
