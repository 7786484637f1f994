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
    from mxconvert.pipeline.inspect_describe import Description
    from mxconvert.pipeline.targets import Planned
    from mxconvert.pipeline.verify_report import VerifyReport
    from mxconvert.target.profiles import DeviceProfile


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
            shown = table(
                "backend",
                "--moe-backend",
                "selected by default on",
                title=f"{fmt.upper()}, {rev} (vLLM {part[0]['vllm']})",
                values=[(r["backend"],) for r in part],
            )
            for r in part:
                shown.add_row(r["backend"], r["moe_backend"] or "-", ", ".join(r["selected_on"]) or "-")
            out_console.print(shown)
    out_console.print("--backend takes either column; any other runtime version is refused (see README).")


def render_runtimes(document: dict) -> None:
    """`mxconvert runtimes`: the revision rows and the vLLM releases each covers per format, then
    the fields that differ between rows (read from the rows, one line each), each row's backends
    and the known releases that no row covers."""
    rows = document["rows"]
    fmts = ("mxfp4", "nvfp4")
    covered = table("row", *(f"{fmt.upper()} releases" for fmt in fmts), title="vLLM releases by revision row",
                    values=[(r["name"],) for r in rows])  # fmt: skip
    for r in rows:
        covered.add_row(
            r["name"], *((", ".join(r["release_ranges"][f]) or "none") if f in r["formats"] else "-" for f in fmts)
        )
    out_console.print(covered)
    names = document["differing_fields"]
    differs = table(
        "field", *(r["name"] for r in rows), title="what differs between rows", values=[(n,) for n in names]
    )
    for name in names:
        differs.add_row(name, *(_field_text(r["fields"][name]) for r in rows))
    out_console.print(differs)
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
    plan = planned.plan
    sel, prof, rev = plan.selection, plan.profile, plan.revision
    hp, ip = plan.geometry.hidden, plan.geometry.intermediate
    out_console.print(
        f"profile [bold]{escape(prof.label)}[/] ({prof.summary()}), runtime {rev.name}"
        + (f" (vLLM {plan.runtime_release})" if plan.runtime_release else "")
        + ", "
        f"requested backend {sel.requested}"
    )
    render_environment(planned.environment)
    shown = table("backend", "kernel class", "result", values=[(c.backend.value,) for c in sel.considered])
    for c in sel.considered:
        shown.add_row(c.backend.value, c.kernel_class or "-", "[green]chosen[/]" if c.chosen else escape(c.reason))
    out_console.print(shown)
    out_console.print(
        f"[bold green]{sel.backend.value}[/] ({sel.kernel_class}), activation {sel.activation}, "
        f"padded hidden {hp}, intermediate {ip}"
    )


def render_environment(report: dict) -> None:
    """The runtime environment a plan used: each value and where it came from; ignored ones as notes."""
    for key, entry in sorted(report.items()):
        if "ignored" in entry:
            err_console.print(
                f"[yellow]note:[/] {key}={entry['value']} (environment) is ignored: {entry['ignored']}", highlight=False
            )
        else:
            out_console.print(f"{key}={entry['value']} (from {entry['from']})", highlight=False, markup=False)


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


def render_plan(summary: dict, out: Path, dry_run: bool) -> None:
    """`mxconvert convert` with one target: the model, the target and the files of the artifact."""
    t = summary["target"]
    m = summary["model"]
    out_console.print(
        f"{'plan (dry run, nothing written)' if dry_run else 'converted'}: {m['num_layers']} layers x "
        f"{m['num_experts']} experts, H={m['hidden_size']} I={m['intermediate_size']}\n"
        f"target {t['profile']} ({t['platform']} {t['capability'] or t['gfx'] or ''}), "
        f"runtime {t['runtime_revision']}"
        + (f" (vLLM {t['runtime_release']})" if t.get("runtime_release") else "")
        + ", "
        f"backend [bold]{t['backend']}[/] ({t['kernel_class']}), activation {t['activation']}, "
        f"tp {t['tp_size']} ep {t['ep_size']}, padded H {t['hidden_size_padded']} I {t['intermediate_size_padded']}"
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


def render_description(d: Description) -> None:
    """`mxconvert inspect PATH`: a checkpoint's or an artifact's expert tensors (and an artifact's files)."""
    if d.kind == "artifact":
        t = d.target
        out_console.print(f"[bold]artifact[/] {d.path}  rank {d.summary['rank']} of ranks {d.summary['ranks']}")
        out_console.print(
            f"  target {t.get('profile')} ({t.get('platform')} {t.get('capability') or t.get('gfx') or ''}), "
            f"backend [bold]{t.get('backend')}[/] ({t.get('kernel_class')}), activation {t.get('activation')}, "
            f"runtime {t.get('runtime_revision')}, tp {t.get('tp_size')} ep {t.get('ep_size')}, "
            f"padded H {t.get('hidden_size_padded')} I {t.get('intermediate_size_padded')}"
        )
        out_console.print(f"  fingerprint {d.summary['fingerprint']}")
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
