"""NVFP4 cases of the serving check (serve_check.py calls `nvfp4_correctness`): Qwen3-MoE NVFP4
checkpoints (ModelOpt and compressed-tensors, models.write_qwen3_nvfp4) served by vLLM 0.26.0 on an H100.

Per checkpoint kind and backend, as serve_check.correctness does for MXFP4:
  A  = the checkpoint through vLLM's default loader and vLLM's own NVFP4 MoE weight processing;
  A' = A again (are the kernels deterministic run to run?);
  B  = `mxconvert convert --runtime vllm==0.26.0 --profile h100 --backend X` of the same checkpoint,
       loaded with `load_format="mxconvert"`.
`--runtime vllm==0.26.0`, not serve_check.convert's `--runtime vllm-0.26`: the vllm-0.26 row has no
NVFP4 layouts (convert refuses it for an NVFP4 checkpoint); the release resolves to the row that covers
vLLM 0.26.0 for NVFP4, vllm-0.25-nvfp4 (mxconvert/target/revisions.py), which the plugin serves vLLM
0.26.0 as for NVFP4 artifacts (mxconvert/runtimes/vllm/dependency.py PLUGIN_PROVEN). The option is passed
after serve_check.convert's own `--runtime vllm-0.26`; the last `--runtime` given is the one used.

Backends (`SM90_BACKENDS`): MARLIN only. vLLM 0.26.0's NVFP4 oracle (fused_moe/oracle/nvfp4.py
`select_nvfp4_moe_backend`) tries FLASHINFER_TRTLLM, FLASHINFER_CUTEDSL, FLASHINFER_CUTEDSL_BATCHED,
FLASHINFER_CUTLASS, VLLM_CUTLASS, MARLIN, HUMMING, EMULATION and picks MARLIN on sm90: TRTLLM and the
CuteDSL experts need the sm100 family, FlashInfer CUTLASS takes the NVFP4 W4A4 scheme from capability
10.0 on (experts/flashinfer_cutlass_moe.py `_supports_quant_scheme`; on sm90 only bf16, FP8 and MXFP4
W4A16), vLLM's CUTLASS FP4 experts run on the sm100/110/120 families (experts/cutlass_moe.py
`CutlassExpertsFp4._supports_current_device`). HUMMING (needs the `humming` package) and EMULATION
would run on sm90 only when asked for by `moe_backend`, and mxconvert writes neither (no layout). The
name passed, "marlin", is a `moe_backend` value vLLM 0.26.0 maps to NVFP4 MARLIN (`map_nvfp4_backend`);
llm_run.py passes it as `LLM(moe_backend=...)` as for MXFP4.

Fail closed (`results["fail_closed"]["nvfp4_other_row"]`): the ModelOpt checkpoint's artifact for row
vllm-0.33 (vLLM 0.33.0's bytes) must be refused by vLLM 0.26.0's plugin, naming `runtime_revision`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import models  # noqa: E402

#: `mxconvert convert` arguments that pick the NVFP4 row of vLLM 0.26.0 (see the module docstring).
RUNTIME = ("--runtime", "vllm==0.26.0")
#: The row those artifacts must record.
ROW = "vllm-0.25-nvfp4"
#: Checkpoint kinds (models.NVFP4_KINDS).
KINDS = ("modelopt", "ct")
#: The NVFP4 backends vLLM 0.26.0 runs on sm90 that mxconvert writes (see the module docstring), as
#: `--moe-backend` / `mxconvert convert --backend` names.
SM90_BACKENDS = ("marlin",)


def checkpoint(work: Path, kind: str) -> Path:
    """The Qwen3-MoE NVFP4 checkpoint of `kind` under `work` (written once)."""
    ckpt = work / f"qwen3-nvfp4-{kind}"
    if not (ckpt / "config.json").exists():
        t0 = time.perf_counter()
        models.write_qwen3_nvfp4(ckpt, kind, **models.NVFP4_SIZES)
        print(f"checkpoint {ckpt} in {time.perf_counter() - t0:.1f} s", flush=True)
    return ckpt


def artifact_row(art: Path) -> str | None:
    """The runtime row the artifact's manifest records."""
    manifest = art / "mxconvert.json"
    return json.loads(manifest.read_text())["target"].get("runtime_revision") if manifest.exists() else None


def nvfp4_correctness(
    work: Path,
    results: dict,
    run_llm: Callable[..., dict],
    convert: Callable[..., dict],
    compare: Callable[[dict, dict], dict],
    load_figures: Callable[[dict], dict],
    tp: int = 1,
    ep: bool = False,
    repeat: bool = True,
) -> None:
    """A, A', B per checkpoint kind and sm90 backend into `results["cases"]["nvfp4-{kind}-{backend}-tp{tp}"]`
    (serve_check.correctness's shape, plus the artifact's `runtime_row`); a case whose A fails records
    `A_error` and the next case runs. At TP 1 without EP, then the other-row refusal into
    `results["fail_closed"]` (it is a check of the artifact's row, the same at every TP size)."""
    results["nvfp4_checkpoint"] = {"architecture": "Qwen3MoeForCausalLM", "kinds": list(KINDS), **models.NVFP4_SIZES}
    llm_par = ("--tp", str(tp), *(("--ep",) if ep else ()))
    conv_par = ("--tp", str(tp), *(("--enable-expert-parallel",) if ep else ()))
    for kind in KINDS:
        ckpt = checkpoint(work, kind)
        for backend in SM90_BACKENDS:
            name = f"nvfp4-{kind}-{backend}-tp{tp}" + ("-ep" if ep else "")
            a = run_llm(work, f"A-{name}", ckpt, backend=backend, parallel=llm_par)
            if not a.get("ok"):
                results["cases"][name] = {"A_error": a.get("error"), "A_traceback": a.get("traceback")}
                (work / "partial.json").write_text(json.dumps(results, indent=1))
                continue
            a2 = run_llm(work, f"A2-{name}", ckpt, backend=backend, parallel=llm_par) if repeat else {}
            art = work / f"art-{name}"
            conv = convert(work, ckpt, art, "--backend", backend, *conv_par, *RUNTIME)
            b = run_llm(work, f"B-{name}", art, load_format="mxconvert", backend=backend, parallel=llm_par)
            results["cases"][name] = {
                "A_vs_A2": compare(a, a2),
                "A_vs_B": compare(a, b),
                "A": load_figures(a),
                "B": load_figures(b),
                "convert": conv,
                "runtime_row": artifact_row(art),
                "B_error": b.get("error"),
                "A_error": a.get("error"),
            }
            (work / "partial.json").write_text(json.dumps(results, indent=1))
    if tp != 1 or ep:
        return
    # An artifact of row vllm-0.33 (vLLM 0.33.0's bytes) in vLLM 0.26.0: refused before any weight is read.
    ckpt = checkpoint(work, "modelopt")
    other = work / "art-nvfp4-modelopt-marlin-vllm-0.33"
    convert(work, ckpt, other, "--backend", "marlin", "--runtime", "vllm-0.33")
    r = run_llm(work, "F-nvfp4-other-row", other, load_format="mxconvert", backend="marlin")
    results["fail_closed"]["nvfp4_other_row"] = {
        "refused": not r.get("ok"),
        "names_runtime_revision": "runtime_revision" in str(r.get("error")),
        "error_type": r.get("error_type"),
        "message": r.get("error"),
    }
