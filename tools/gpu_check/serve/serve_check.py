#!/usr/bin/env python3
"""Serve from an mxconvert artifact with a real vLLM on a real GPU, and compare with vLLM's own path.

    python tools/gpu_check/serve/serve_check.py --work /tmp/serve --out $OUT [--cases triton,marlin,nvfp4]
    python tools/gpu_check/serve/serve_check.py --work /tmp/serve --out $OUT --timing-layers 8

Needs vLLM (0.26.0 on the GPU machine; setup_remote.sh installs it) and mxconvert (with its vLLM
plugin entry point) importable by `python3`. Every engine runs in its own process (llm_run.py).

Correctness mode (default), per MoE backend:
  A  = the checkpoint through vLLM's default loader and vLLM's own weight processing;
  A' = A again (shows whether the kernels are deterministic run to run);
  B  = `mxconvert convert --runtime vllm-0.26 --profile h100 --backend X` of the same checkpoint,
       loaded with `load_format="mxconvert"`.
  Greedy tokens and every returned logprob (prompt and generated, top-8 per position) of B must be
  bit-equal to A's. Then the fail-closed cases: an artifact for another backend, and one for another
  TP size, must be refused with the plugin's message; with `on_mismatch: reconvert` the other-backend
  artifact loads and its tokens must equal A's of the live backend.
Timing mode (--timing-layers N): a gpt-oss-120b-shaped stack (128 experts, H = I = 2880) of N layers,
  load only, A vs B per backend, each run 2 times (page cache warm after the first).
Writes OUT/serve-check.json (every figure and verdict) and OUT/serve-check.txt (a table).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
import models  # noqa: E402

PY = sys.executable


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_llm(
    work: Path, tag: str, model: Path, *, load_format="auto", backend="auto", extra=None, gen=True, parallel=()
) -> dict:
    out = work / f"run-{tag}.json"
    cmd = [PY, str(HERE / "llm_run.py"), "--model", str(model), "--out", str(out), "--load-format", load_format]
    cmd += ["--moe-backend", backend, *parallel]
    if extra is not None:
        cmd += ["--extra", json.dumps(extra)]
    if not gen:
        cmd += ["--no-generate"]
    log(f"run {tag}: {' '.join(cmd[2:])}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (work / f"run-{tag}.log").write_text(proc.stdout + "\n----- stderr -----\n" + proc.stderr)
    result = json.loads(out.read_text()) if out.exists() else {"ok": False, "error": proc.stderr[-3000:]}
    result["process_seconds"] = time.perf_counter() - t0
    result["stderr_tail"] = proc.stderr[-2500:]
    # vLLM's workers (TP > 1) log to the process's output, not to llm_run's handlers
    result["output_took_lines"] = [
        line[-300:] for line in (proc.stdout + proc.stderr).splitlines() if " took " in line and "ms" not in line
    ][:40]
    log(f"  -> ok={result.get('ok')} {result.get('error_type', '')} {str(result.get('error', ''))[:300]}")
    return result


def convert(work: Path, ckpt: Path, out: Path, *args: str) -> dict:
    cmd = [PY, "-m", "mxconvert", "convert", str(ckpt), "-o", str(out), "--runtime", "vllm-0.26", "--profile", "h100"]
    cmd += [*args, "--force", "--json"]
    log(f"convert: {' '.join(cmd[3:])}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"convert failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"seconds": seconds, "args": list(args)}


def compare(a: dict, b: dict) -> dict:
    """Tokens equal? Logprobs bit-equal? Max |difference| over logprobs present in both."""
    if not (a.get("ok") and b.get("ok")):
        return {"comparable": False}
    tokens_equal = [x["tokens"] for x in a["outputs"]] == [x["tokens"] for x in b["outputs"]]
    max_diff, unequal, total, key_mismatch = 0.0, 0, 0, 0
    for xa, xb in zip(a["outputs"], b["outputs"], strict=True):
        for field in ("prompt_logprobs", "logprobs"):
            for pa, pb in zip(xa[field], xb[field]):
                da = {t: float.fromhex(v) for t, v, _ in pa}
                db = {t: float.fromhex(v) for t, v, _ in pb}
                if set(da) != set(db):
                    key_mismatch += 1
                for t in set(da) & set(db):
                    total += 1
                    if da[t] != db[t]:
                        unequal += 1
                        max_diff = max(max_diff, abs(da[t] - db[t]))
    return {
        "comparable": True,
        "tokens_equal": tokens_equal,
        "logprobs_compared": total,
        "logprobs_unequal": unequal,
        "logprob_max_abs_diff": max_diff,
        "top8_sets_differ": key_mismatch,
        "bitwise_equal": tokens_equal and unequal == 0 and key_mismatch == 0,
    }


def load_figures(r: dict) -> dict:
    load = (r.get("load") or [{}])[0]
    return {
        "ok": r.get("ok"),
        "load_model_seconds": load.get("seconds"),
        "load_peak_gib": (load.get("peak_bytes_above_start") or 0) / 2**30,
        "load_resident_gib": (load.get("resident_bytes") or 0) / 2**30,
        "engine_ready_seconds": r.get("engine_ready_seconds"),
        "vllm_log": [x for x in r.get("log_lines", []) if "took" in x] or r.get("output_took_lines", []),
    }


def correctness(
    work: Path, cases: list[str], results: dict, tp: int = 1, ep: bool = False, repeat: bool = True
) -> None:
    ckpt = work / "gpt-oss-small"
    if not (ckpt / "config.json").exists():
        t0 = time.perf_counter()
        models.write_gpt_oss(ckpt, layers=2, experts=8)
        log(f"checkpoint {ckpt} in {time.perf_counter() - t0:.1f} s")
    results["checkpoint"] = {
        "path": str(ckpt),
        "layers": 2,
        "experts": 8,
        "hidden": 2880,
        "intermediate": 2880,
        "heads": 64,
        "kv_heads": 8,
        "vocab": 2048,
        "experts_per_token": 4,
    }
    runs: dict[str, dict] = {}
    par = f"tp{tp}" + ("-ep" if ep else "")
    llm_par = ("--tp", str(tp), *(("--ep",) if ep else ()))
    conv_par = ("--tp", str(tp), *(("--enable-expert-parallel",) if ep else ()))
    for backend in cases:
        a = run_llm(work, f"A-{backend}-{par}", ckpt, backend=backend, parallel=llm_par)
        if not a.get("ok"):
            results["cases"][f"mxfp4-{backend}-{par}"] = {"A_error": a.get("error"), "A_traceback": a.get("traceback")}
            raise SystemExit(f"vLLM's own path failed for {backend}: {a.get('error')}")
        a2 = run_llm(work, f"A2-{backend}-{par}", ckpt, backend=backend, parallel=llm_par) if repeat else {}
        art = work / f"art-{backend}-{par}"
        conv = convert(work, ckpt, art, "--backend", backend, *conv_par)
        b = run_llm(work, f"B-{backend}-{par}", art, load_format="mxconvert", backend=backend, parallel=llm_par)
        runs[backend] = a
        results["cases"][f"mxfp4-{backend}-{par}"] = {
            "A_vs_A2": compare(a, a2),
            "A_vs_B": compare(a, b),
            "A": load_figures(a),
            "B": load_figures(b),
            "convert": conv,
            "B_error": b.get("error"),
            "A_error": a.get("error"),
        }
        (work / "partial.json").write_text(json.dumps(results, indent=1))
    if "triton" in cases and "marlin" in cases and tp == 1 and not ep:
        # An artifact for MARLIN where vLLM picks TRITON (its choice on an H100): refused, then reconverted.
        fc = results["fail_closed"]
        r = run_llm(work, "F-wrong-backend", work / "art-marlin-tp1", load_format="mxconvert", backend="triton")
        fc["other_backend"] = {"refused": not r.get("ok"), "error_type": r.get("error_type"), "message": r.get("error")}
        r = run_llm(
            work,
            "F-reconvert",
            work / "art-marlin-tp1",
            load_format="mxconvert",
            backend="triton",
            extra={"on_mismatch": "reconvert"},
        )
        fc["other_backend_reconvert"] = {
            "loaded": r.get("ok"),
            "vs_A_triton": compare(runs["triton"], r),
            "error": r.get("error"),
        }
        tp2 = work / "art-triton-tp2"
        convert(work, ckpt, tp2, "--backend", "triton", "--tp", "2")
        r = run_llm(work, "F-tp2-at-tp1", tp2, load_format="mxconvert", backend="triton")
        fc["other_tp"] = {"refused": not r.get("ok"), "error_type": r.get("error_type"), "message": r.get("error")}


#: The plugin's settings the timing mode loads with: the defaults; without the checksum pass;
#: without reading ahead (each tensor read on vLLM's thread when asked, as before the read-ahead).
B_VARIANTS: dict[str, dict | None] = {
    "B": None,
    "Bnoverify": {"verify_checksums": False},
    "Bnoprefetch": {"prefetch_bytes": 0},
}


def timing(
    work: Path, layers: int, cases: list[str], results: dict, variants: tuple[str, ...] = tuple(B_VARIANTS)
) -> None:
    ckpt = work / f"gpt-oss-120b-shape-{layers}L"
    if not (ckpt / "config.json").exists():
        t0 = time.perf_counter()
        models.write_gpt_oss(ckpt, layers=layers, experts=128)
        log(f"checkpoint {ckpt} in {time.perf_counter() - t0:.1f} s")
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    results["timing_checkpoint"] = {"layers": layers, "experts": 128, "bytes": size}
    for backend in cases:
        art = work / f"art-120b-{backend}"
        conv = convert(work, ckpt, art, "--backend", backend)
        row: dict = {"convert": conv}
        for rep in range(2):
            row[f"A{rep}"] = load_figures(run_llm(work, f"T-A{rep}-{backend}", ckpt, backend=backend, gen=False))
            for variant in variants:
                extra = B_VARIANTS[variant]
                row[f"{variant}{rep}"] = load_figures(
                    run_llm(
                        work,
                        f"T-{variant}{rep}-{backend}",
                        art,
                        load_format="mxconvert",
                        backend=backend,
                        extra=extra,
                        gen=False,
                    )
                )
        results["timing"][backend] = row
        shutil.rmtree(art, ignore_errors=True)
        (work / "partial.json").write_text(json.dumps(results, indent=1))


def _num(value: float | None, digits: int = 2) -> str:
    """A figure, or "-" where the run has none (TP > 1: vLLM loads in worker processes the probe
    does not see; their own "Model loading took" lines are in the case's `vllm_log`)."""
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: dict) -> str:
    lines = [
        "case | tokens equal | logprobs bit-equal (unequal/compared, max |diff|) | A vs A' | "
        "load_model s A/B | peak GiB A/B | engine ready s A/B"
    ]
    for name, c in results["cases"].items():
        if "A_vs_B" not in c:  # vLLM's own path failed: nothing to compare
            lines.append(f"{name} | vLLM's own path failed: {str(c.get('A_error'))[:300]}")
            continue
        ab, aa = c["A_vs_B"], c["A_vs_A2"]
        if not ab.get("comparable"):
            lines.append(
                f"{name} | not comparable: A ok={c['A']['ok']} B ok={c['B']['ok']} "
                f"A err={str(c['A_error'])[:200]} B err={str(c['B_error'])[:300]}"
            )
            continue
        lines.append(
            f"{name} | {ab['tokens_equal']} | {ab['bitwise_equal']} "
            f"({ab['logprobs_unequal']}/{ab['logprobs_compared']},"
            f" {ab['logprob_max_abs_diff']:.3g}) | {aa.get('bitwise_equal')} | "
            f"{_num(c['A']['load_model_seconds'])}/{_num(c['B']['load_model_seconds'])} | "
            f"{_num(c['A']['load_peak_gib'])}/{_num(c['B']['load_peak_gib'])} | "
            f"{_num(c['A']['engine_ready_seconds'], 1)}/{_num(c['B']['engine_ready_seconds'], 1)}"
        )
    for k, v in results["fail_closed"].items():
        lines.append(f"fail-closed {k}: {json.dumps(v)[:600]}")
    for backend, row in results["timing"].items():
        for rep in ("0", "1"):
            for side in ("A", *B_VARIANTS):
                if side + rep not in row:
                    continue
                r = row.get(side + rep, {})
                took = "; ".join(x.split(": ", 1)[-1][:120] for x in r.get("vllm_log", []))
                lines.append(
                    f"timing {backend} run {rep} {side}: load_model {r.get('load_model_seconds')} s, "
                    f"peak {r.get('load_peak_gib')} GiB, ready {r.get('engine_ready_seconds')} s | {took}"
                )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", default="triton,marlin")
    ap.add_argument("--timing-layers", type=int, default=0)
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--variants", default=",".join(B_VARIANTS), help="the plugin settings timed (B_VARIANTS)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the correctness cases")
    ap.add_argument("--ep", action="store_true", help="expert parallelism (EP size = TP) in the correctness cases")
    ap.add_argument("--no-repeat", action="store_true", help="no A' run (A vs A' shown elsewhere)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in a.cases.split(",") if c]
    results: dict = {"cases": {}, "fail_closed": {}, "timing": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        import torch

        results["device"] = torch.cuda.get_device_name(0)
        results["torch"] = torch.__version__
        results["host_cores"] = os.cpu_count()
        if not a.skip_correctness:
            mxfp4 = [c for c in cases if c != "nvfp4"]
            if mxfp4:
                correctness(a.work, mxfp4, results, a.tp, a.ep, not a.no_repeat)
            if "nvfp4" in cases:  # Qwen3-MoE ModelOpt and compressed-tensors, every backend sm90 runs
                import nvfp4_cases

                nvfp4_cases.nvfp4_correctness(
                    a.work, results, run_llm, convert, compare, load_figures, a.tp, a.ep, not a.no_repeat
                )
        if a.timing_layers:
            timing(a.work, a.timing_layers, cases, results, tuple(v for v in a.variants.split(",") if v))
    finally:
        (a.out / "serve-check.json").write_text(json.dumps(results, indent=1))
        text = table(results)
        (a.out / "serve-check.txt").write_text(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
