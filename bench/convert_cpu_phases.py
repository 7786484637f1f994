"""Where one `mxconvert convert` spends its CPU seconds and wall time, by phase, exactly: the
command runs in this process (the CLI entry, start-up included) with the functions of each phase
wrapped; a wrapper adds the CPU time of its own thread (`time.thread_time`: user + system, this
thread only) spent inside it, less that of wrapped calls inside it (each second counted once), and
the phase's wall span runs from its first start to its last end (phases overlap: the source is
hashed while the chunks are laid out). What no wrapper covers (interpreter start, imports, the
CLI's own work) is the process's CPU (`getrusage`) less the phases'. Garbage collection is timed
by `gc.callbacks`. No sampling, so no idle thread is ever counted, and it runs where py-spy and
perf are missing.

    python bench/convert_cpu_phases.py CKPT OUT --profile h100 [--json-out F] [-- convert options]
    python bench/convert_cpu_phases.py CKPT OUT --profile b200 --package /tmp/before   # older code

The wrappers cost a few microseconds a call (~200 calls a GB): the total CPU is within noise of
an unwrapped run (`bench_engine.py` gives that one).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]

#: phase -> [(module, attribute path)]: every one adds its CPU to the phase; the first one alone
#: gives its wall span (the source's sha256 streams also hash the small aux files at the end).
PHASES: dict[str, list[tuple[str, str]]] = {
    "planning (headers, selection, plan)": [("mxconvert.pipeline.targets", "plan_targets")],
    "source fingerprint (sha256 of the source files)": [
        ("mxconvert.storage.source", "SafetensorsSource.describe_files"),
        ("mxconvert.core.digest", "sha256_stream"),
    ],
    "layout plans (gather indices)": [("mxconvert.layouts.engine.plans", "prepare")],
    "chunk read (source bytes into canonical)": [("mxconvert.pipeline.convert", "_run_step")],
    "chunk layout (move + codec)": [("mxconvert.layouts.device", "HostCompute.forward")],
    "safetensors writing (write(), digest hand-off)": [
        ("mxconvert.storage.safetensors_io", "StreamingWriter._emit"),
        ("mxconvert.storage.safetensors_io", "StreamingWriter.close"),
    ],
    "output tree digest (leaves)": [
        ("mxconvert.core.digest", "piece_digest"),
        ("mxconvert.core.digest", "pieces_digest"),
    ],
    "fsync + rename": [("mxconvert.pipeline.durable", "sync_tree"), ("mxconvert.pipeline.output", "replace")],
    "manifest (seal, write)": [
        ("mxconvert.pipeline.convert", "seal"),
        ("mxconvert.pipeline.convert", "write_manifest"),
    ],
}
#: Modules that bound a wrapped function by name at import (`from ... import name`): rebound too.
REBIND = {"sha256_stream": ["mxconvert.storage.files"]}

CPU: dict[str, float] = defaultdict(float)
SPAN: dict[str, list[float]] = {}
CALLS: dict[str, int] = defaultdict(int)
_local = threading.local()
_lock = threading.Lock()


def _wrap(phase: str, real, spans: bool = True):
    def timed(*args, **kwargs):
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        start, wall = time.thread_time(), time.perf_counter() - T0
        stack.append(0.0)  # CPU of wrapped calls inside this one
        try:
            return real(*args, **kwargs)
        finally:
            inner = stack.pop()
            spent = time.thread_time() - start
            if stack:
                stack[-1] += spent
            end = time.perf_counter() - T0
            with _lock:
                CPU[phase] += spent - inner
                CALLS[phase] += spans
                if spans:
                    first, last = SPAN.get(phase, (wall, end))
                    SPAN[phase] = [min(first, wall), max(last, end)]

    return timed


def _install() -> None:
    for phase, targets in PHASES.items():
        for i, (module_name, path) in enumerate(targets):
            owner = importlib.import_module(module_name)
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            if not hasattr(owner, name):  # an older package (--package) without this function
                continue
            wrapped = _wrap(phase, getattr(owner, name), spans=i == 0 or "writing" in phase)
            setattr(owner, name, wrapped)
            for other in REBIND.get(name, []):
                setattr(importlib.import_module(other), name, wrapped)


def _gc_timer():
    started: dict[int, float] = {}

    def callback(stage: str, info: dict) -> None:
        key = threading.get_ident()
        if stage == "start":
            started[key] = time.thread_time()
        elif key in started:
            spent = time.thread_time() - started.pop(key)
            with _lock:
                CPU["garbage collection"] += spent
                CALLS["garbage collection"] += 1
            stack = getattr(_local, "stack", None)
            if stack:  # inside a wrapped call: counted here, not there
                stack[-1] += spent

    gc.callbacks.append(callback)


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--package", type=Path, default=ROOT, help="folder holding the mxconvert package to run")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("convert_args", nargs="*", help="more convert options (after --)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.package.resolve()))
    cpu_before_imports = _process_cpu()
    _install()  # imports the package's modules: the start-up the command would pay anyway
    _gc_timer()
    from mxconvert._entry import main as cli

    sys.argv = ["mxconvert", "convert", args.checkpoint, "-o", args.out, "-p", args.profile, "--force"]
    sys.argv += args.convert_args
    code: object = 0
    try:
        cli()
    except SystemExit as exc:
        code = exc.code or 0
    wall, total = time.perf_counter() - T0, _process_cpu()
    if code:
        raise SystemExit(f"convert failed with exit {code}")
    phases = sorted(CPU.items(), key=lambda kv: -kv[1])
    rest = total - sum(CPU.values())
    print(
        f"convert -p {args.profile}: wall {wall:.2f} s, CPU {total:.2f} s (user + system, all threads; "
        f"{cpu_before_imports:.2f} s before the first import of the package)"
    )
    print(f"| phase ({args.profile}) | CPU s | share | wall span s | calls |\n|---|---|---|---|---|")
    for phase, seconds in phases:
        first, last = SPAN.get(phase, (0.0, 0.0))
        span = f"{last - first:.2f} ({first:.2f}-{last:.2f})" if phase in SPAN else "-"
        print(f"| {phase} | {seconds:.2f} | {seconds / total:.0%} | {span} | {CALLS[phase]} |")
    print(f"| start-up, imports, CLI, the rest | {rest:.2f} | {rest / total:.0%} | - | - |")
    print(f"| all | {total:.2f} | 100% | {wall:.2f} | - |")
    if args.json_out:
        result = {
            "profile": args.profile,
            "wall_s": wall,
            "cpu_s": total,
            "phases": {p: {"cpu_s": CPU[p], "span_s": SPAN.get(p), "calls": CALLS[p]} for p in CPU},
            "rest_cpu_s": rest,
        }
        args.json_out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
