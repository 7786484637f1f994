"""Where one `mxconvert verify` spends its CPU seconds and wall time, by phase: the same exact
per-thread accounting as bench/convert_cpu_phases.py (read its docstring), with verify's phases.

    python bench/verify_cpu_phases.py ARTIFACT [--json-out F] [--package /tmp/before] [-- verify options]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convert_cpu_phases as phases  # noqa: E402 - after its folder is on the path

phases.PHASES = {
    "planning (manifest, source headers, layout)": [("mxconvert.pipeline.verify", "_verify")],
    "tree digests (artifact + source leaves)": [
        ("mxconvert.core.digest", "piece_digest"),
        ("mxconvert.core.digest", "pieces_digest"),
    ],
    "whole-file sha256 (source)": [("mxconvert.core.digest", "sha256_stream")],
    "layout plans (gather indices)": [("mxconvert.layouts.engine.plans", "prepare")],
    "chunk check (reads, the rest)": [("mxconvert.pipeline.verify_tensors", "_check_chunk")],
    "source chunk (canonical bits)": [("mxconvert.formats.mxfp4.format", "Mxfp4Format.load_bits")],
    "inverse layout": [("mxconvert.layouts.device", "HostCompute.inverse")],
    "byte comparison": [("mxconvert.pipeline.verify_tensors", "same_bytes")],
    "dequantized samples": [("mxconvert.pipeline.verify_tensors", "dequant_check")],
    "pass-through tensors": [("mxconvert.pipeline.verify_tensors", "check_passthrough")],
}
phases.REBIND = {"sha256_stream": ["mxconvert.storage.files"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--package", type=Path, default=phases.ROOT, help="folder holding the mxconvert package")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("verify_args", nargs="*", help="more verify options (after --)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.package.resolve()))
    phases._install()
    phases._gc_timer()
    from mxconvert._entry import main as cli

    sys.argv = ["mxconvert", "verify", args.artifact, *args.verify_args]
    code: object = 0
    try:
        cli()
    except SystemExit as exc:
        code = exc.code or 0
    wall, total = time.perf_counter() - phases.T0, phases._process_cpu()
    if code:
        raise SystemExit(f"verify failed with exit {code}")
    cpu = phases.CPU
    rest = total - sum(cpu.values())
    print(f"verify: wall {wall:.2f} s, CPU {total:.2f} s (user + system, all threads)")
    print("| phase | CPU s | share | wall span s | calls |\n|---|---|---|---|---|")
    for phase, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
        first, last = phases.SPAN.get(phase, (0.0, 0.0))
        span = f"{last - first:.2f} ({first:.2f}-{last:.2f})" if phase in phases.SPAN else "-"
        print(f"| {phase} | {seconds:.2f} | {seconds / total:.0%} | {span} | {phases.CALLS[phase]} |")
    print(f"| start-up, imports, CLI, the rest | {rest:.2f} | {rest / total:.0%} | - | - |")
    print(f"| all | {total:.2f} | 100% | {wall:.2f} | - |")
    if args.json_out:
        result = {
            "wall_s": wall,
            "cpu_s": total,
            "phases": {p: {"cpu_s": cpu[p], "span_s": phases.SPAN.get(p), "calls": phases.CALLS[p]} for p in cpu},
            "rest_cpu_s": rest,
        }
        args.json_out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
