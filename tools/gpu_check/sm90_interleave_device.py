#!/usr/bin/env python3
"""On the GPU machine: FlashInfer 0.7.2.post1's SM90 fp4 weight interleave of path A's inputs.

Builds, with FlashInfer's own JIT and sm90a flags, the wheel's UNMODIFIED
`moe_gemm_mixed_utils.cu` (kernel `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` and its
launcher) with the entry point tools/golden/fi_sm90_interleave_binding.cu (the per-expert loop of
FlashInfer's `interleave_moe_weights_for_sm90_mixed_gemm` binding, quant_type fp4) -- the same
build spec as tools/golden/device_flashinfer.py, imported from there -- and runs it on every tensor
of --inputs (written by tools/gpu_check/sm90_interleave_record.py).

Writes under --out: `fi_sm90_outputs.safetensors` (same names as the inputs, the kernel's outputs)
and `fi_sm90_report.json` (versions, GPU, build/run times, input/output sha256, and a re-run of the
weight probes of tools/golden/device_results.json, whose output hashes must come out the same).
Run by tools/gpu_check/sm90_interleave_gpu.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def sha256(t) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).numpy().tobytes()).hexdigest()


def golden_probes(torch):
    """The weight probes of tools/golden/make_mxfp4_goldens.py `prepare_device` (same generator
    sequence: three scale probes drawn first, then the three weight probes)."""
    g = torch.Generator().manual_seed(4242)
    for shp in ((2, 200, 7), (1, 5888, 96), (3, 128, 4)):
        torch.randint(0, 256, shp, dtype=torch.uint8, generator=g)
    return [
        torch.randint(0, 256, shp, dtype=torch.uint8, generator=g)
        for shp in ((3, 48, 96), (1, 2944, 1472), (2, 16, 32))
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--golden-root",
        type=Path,
        default=REPO / "tools" / "golden",
        help="folder holding device_flashinfer.py, fi_sm90_interleave_binding.cu, device_results.json",
    )
    ap.add_argument("--build-only", action="store_true", help="compile only (a CPU machine with nvcc)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(args.golden_root))
    import flashinfer
    import torch
    from device_flashinfer import _sm90_interleave_spec
    from safetensors.torch import load_file, save_file

    report: dict = {
        "argv": sys.argv,
        "python": sys.version,
        "host": platform.node(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "flashinfer": flashinfer.__version__,
        "flashinfer_file": flashinfer.__file__,
    }
    try:
        from flashinfer import _build_meta  # type: ignore[attr-defined]

        report["flashinfer_git_commit"] = getattr(_build_meta, "__git_commit__", None)
    except ImportError:
        pass
    report["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip()
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
        report["capability"] = list(torch.cuda.get_device_capability(0))
        report["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()

    def save_report() -> None:
        (args.out / "fi_sm90_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")

    t0 = time.time()
    spec = _sm90_interleave_spec()
    module = spec.build(verbose=False) if args.build_only else spec.build_and_load()
    report["build_seconds"] = round(time.time() - t0, 1)
    print(f"built in {report['build_seconds']} s", flush=True)
    save_report()
    if args.build_only:
        return

    def interleave(x):
        xc = x.cuda().contiguous()
        y = torch.empty_like(xc)
        module.interleave_fp4_moe_weights(xc, y)
        torch.cuda.synchronize()
        return y.cpu()

    t0 = time.time()
    inputs = load_file(str(args.inputs))
    outputs = {k: interleave(x) for k, x in sorted(inputs.items())}
    report["run_seconds"] = round(time.time() - t0, 2)
    save_file(outputs, str(args.out / "fi_sm90_outputs.safetensors"))
    report["results"] = [
        {
            "key": k,
            "shape": list(x.shape),
            "input_sha256": sha256(x),
            "output_sha256": sha256(outputs[k]),
            "changed": not torch.equal(x, outputs[k]),
        }
        for k, x in sorted(inputs.items())
    ]

    golden = json.loads((args.golden_root / "device_results.json").read_text())
    if golden["device"]["flashinfer"] != flashinfer.__version__:
        # device_results.json holds another FlashInfer's kernel outputs (e.g. 0.7.2.post1's, while
        # FlashInfer 0.6.x's kernel differs): its probes do not apply; the outputs are checked on
        # the CPU afterwards (tests/test_cutlass_sm90_0_6.py against the kernel's transcription)
        report["golden_probes_note"] = (
            f"not run: tools/golden/device_results.json holds FlashInfer {golden['device']['flashinfer']}'s "
            f"outputs, this is FlashInfer {flashinfer.__version__}"
        )
        save_report()
        print(json.dumps({"outputs": len(outputs), "gpu": report.get("gpu")}), flush=True)
        return
    expected = {
        r["input_sha256"]: r["output_sha256"]
        for r in golden["results"]
        if r.get("function") == "sm90 fp4 weight interleave"
    }
    probes = []
    for x in golden_probes(torch):
        probes.append(
            {
                "shape": list(x.shape),
                "input_sha256": sha256(x),
                "output_sha256": sha256(interleave(x)),
                "golden_output_sha256": expected.get(sha256(x)),
            }
        )
    report["golden_probes"] = probes
    report["golden_probes_equal"] = all(p["output_sha256"] == p["golden_output_sha256"] for p in probes)
    save_report()
    print(
        json.dumps(
            {"outputs": len(outputs), "golden_probes_equal": report["golden_probes_equal"], "gpu": report.get("gpu")}
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
