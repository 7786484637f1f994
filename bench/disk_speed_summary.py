"""The tables of bench/README.md "Convert at disk speed" from what tools/gpu_check/disk_speed_run.sh
(or bench_engine.py --json-out) wrote: `python bench/disk_speed_summary.py OUTDIR` reads
OUTDIR/targets.json and OUTDIR/fullsize-*.json (those present) and prints markdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

CONVERT_TARGET, VERIFY_TARGET = 1.3, 1.0  # issue 24 item 3: convert <= 1.3x cp; verify <= 1.0x its convert


def _load(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.is_file() else []


def _baseline(rows: list[dict]) -> dict:
    return next((r for r in rows if r.get("baseline")), {})


def _by(rows: list[dict], profile: str, variant: str) -> dict | None:
    return next((r for r in rows if r.get("profile") == profile and r.get("variant", "default") == variant), None)


def targets_table(rows: list[dict]) -> str:
    base = _baseline(rows)
    if not base:
        return ""
    lines = [
        f"{base['layers']} layers x {base['experts']} experts, {base['bytes'] / 1e9:.2f} GB; "
        f"`cp -r` + `sync` {base['cp_s']:.2f} s ({base['bytes'] / base['cp_s'] / 1e9:.2f} GB/s); "
        "best of the run's repeats",
        "",
        "| profile | convert | x cp | GB/s | peak RSS | verify | x convert | verify RSS | no fsync | fsync cost "
        "| fsync at the end only | --file-sha256 | targets (<= 1.3x cp, <= 1.0x) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for profile in dict.fromkeys(r["profile"] for r in rows if r.get("profile")):
        d = _by(rows, profile, "default")
        if d is None:
            continue
        nf, fs = _by(rows, profile, "no-fsync"), _by(rows, profile, "file-sha256")
        nw = _by(rows, profile, "no-writeback")
        end_only = f"{nw['convert_s']:.2f} s ({nw['convert_s'] - d['convert_s']:+.2f} s)" if nw else "-"
        v = d.get("verify_s")
        verify = (
            "- | - | -" if v is None else f"{v:.2f} s | {d['verify_x_convert']:.2f}x | {d['verify_rss_gib']:.2f} GiB"
        )
        no_fsync, cost = "-", "-"
        if nf:
            no_fsync = f"{nf['convert_s']:.2f} s"
            cost = f"{d['convert_s'] - nf['convert_s']:+.2f} s ({(d['convert_s'] / nf['convert_s'] - 1) * 100:+.0f}%)"
        sha = f"{fs['convert_s']:.2f} s ({fs['convert_s'] / d['convert_s']:.2f}x)" if fs else "-"
        ok_c = "met" if d["convert_x_cp"] <= CONVERT_TARGET else "NOT met"
        ok_v = "met" if v is not None and d["verify_x_convert"] <= VERIFY_TARGET else "NOT met"
        lines.append(
            f"| {profile} | {d['convert_s']:.2f} s | {d['convert_x_cp']:.2f}x | {d['convert_gb_s']:.2f} | "
            f"{d['convert_rss_gib']:.2f} GiB | {verify} | {no_fsync} | {cost} | {end_only} | {sha} | "
            f"convert {ok_c}, verify {ok_v} |"
        )
    return "\n".join(lines)


def fullsize_table(rows: list[dict], label: str) -> str:
    base = _baseline(rows)
    if not base:
        return ""
    lines = [
        f"{label}: {base['layers']} layers x {base['experts']} experts, {base['bytes'] / 1e9:.2f} GB; "
        f"`cp -r` + `sync` {base['cp_s']:.2f} s ({base['bytes'] / base['cp_s'] / 1e9:.2f} GB/s); one run each",
        "",
        "| profile | convert | x cp | GB/s written | peak RSS | verify | x convert | verify RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("profile") is None or r.get("variant", "default") != "default":
            continue
        v = r.get("verify_s")
        verify = f"{v:.2f} s | {r['verify_x_convert']:.2f}x | {r['verify_rss_gib']:.2f} GiB" if v else "- | - | -"
        lines.append(
            f"| {r['profile']} | {r['convert_s']:.2f} s | {r['convert_x_cp']:.2f}x | {r['convert_gb_s']:.2f} | "
            f"{r['convert_rss_gib']:.2f} GiB | {verify} |"
        )
    return "\n".join(lines)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    parts = [targets_table(_load(out / "targets.json"))]
    parts.append(fullsize_table(_load(out / "fullsize-20b.json"), "gpt-oss-20b sizes"))
    parts.append(fullsize_table(_load(out / "fullsize-120b.json"), "gpt-oss-120b shape"))
    print("\n\n".join(p for p in parts if p) or f"no results in {out}")


if __name__ == "__main__":
    main()
