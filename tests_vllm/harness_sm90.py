"""FlashInfer's SM90 fp4 weight interleave for path A of FLASHINFER_CUTLASS_MXFP4_BF16 (Hopper).

vLLM 0.33.0's conversion for that backend (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py,
`convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`) calls
`flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")` on w13 (after the
[w1; w3] -> [w3; w1] swap) and on w2. That function is a CUDA-only op of FlashInfer's JIT module
`fused_moe_90`; the CPU has no GPU to run it. (The scales go through FlashInfer's
`interleave_moe_scales_for_sm90_mixed_gemm`, plain torch, which runs on the CPU unchanged.)

Stand-in (path A only): `Sm90Interleave("replay")` returns the bytes FlashInfer 0.7.2.post1's own
kernel produced on a GPU for exactly that input, looked up by the input's shape and sha256 in
tests_vllm/data/sm90_interleave/ (see its README.md and provenance.json: which kernel source, which
GPU, which command). An input with no recorded output raises `MissingGpuResult` (no formula
fallback). `Sm90Interleave("record")` collects the inputs path A passes (tools/gpu_check/
sm90_interleave_record.py writes them for the GPU run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import harness as H
import torch

DATA = Path(__file__).resolve().parent / "data" / "sm90_interleave"
RESULTS_FILE = DATA / "fi_sm90_outputs.safetensors"
PROVENANCE_FILE = DATA / "provenance.json"
BACKEND = "FLASHINFER_CUTLASS_MXFP4_BF16"
HOPPER = (9, 0)
#: (TP size, rank) of every case whose path A the recorded outputs cover.
PARALLEL = {"tp1": (1, 0), "tp2-rank0": (2, 0), "tp2-rank1": (2, 1)}


class MissingGpuResult(KeyError):
    """Path A asked for the SM90 interleave of an input the GPU run never saw."""


def input_key(x: torch.Tensor) -> str:
    """`sm90w.<E>x<n>x<k/2>.<sha256 of the bytes>`: the name the GPU output is stored under."""
    data = x.contiguous().reshape(-1)
    digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()
    return f"sm90w.{'x'.join(map(str, x.shape))}.{digest}"


class Sm90Interleave:
    """`interleave_moe_weights_for_sm90_mixed_gemm` with FlashInfer's signature: 'record' keeps each
    input (and returns zeros of its shape), 'replay' returns the GPU's output for it."""

    def __init__(self, mode: str, results: dict[str, torch.Tensor] | None = None):
        assert mode in ("record", "replay"), mode
        self.mode = mode
        self.results = results if results is not None else {}
        self.inputs: dict[str, torch.Tensor] = {}
        self.used: list[str] = []

    def __call__(self, weight: torch.Tensor, quant_type: str = "fp4") -> torch.Tensor:
        # FlashInfer's binding accepts uint8 [E, n, k/2] with quant_type "fp4" (its checks, restated)
        if quant_type != "fp4" or weight.dtype != torch.uint8 or weight.dim() != 3:
            raise AssertionError(
                f"unexpected SM90 interleave call: {quant_type=}, {weight.dtype=}, shape {tuple(weight.shape)}"
            )
        key = input_key(weight)
        if self.mode == "record":
            self.inputs[key] = weight.contiguous().clone()
            return torch.zeros_like(weight)
        if key not in self.results:
            raise MissingGpuResult(
                f"no GPU output of FlashInfer's SM90 fp4 weight interleave for input {key} in {RESULTS_FILE}; "
                "the example checkpoint or vLLM's conversion changed: redo the GPU run "
                "(tools/gpu_check/sm90_interleave_record.py, then tools/gpu_check/sm90_interleave_gpu.sh)"
            )
        out = self.results[key]
        assert out.dtype == torch.uint8 and out.shape == weight.shape, (key, out.dtype, out.shape)
        self.used.append(key)
        return out.clone()


def recorded_results() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(RESULTS_FILE))


def provenance() -> dict:
    return json.loads(PROVENANCE_FILE.read_text())


@contextlib.contextmanager
def sm90_interleave(stand_in: Sm90Interleave):
    """vLLM's converter imports the function from `flashinfer.fused_moe` at call time."""
    import flashinfer.fused_moe as fi_moe

    with H.patched(fi_moe, interleave_moe_weights_for_sm90_mixed_gemm=stand_in):
        yield


def path_a(target: H.Target, stand_in: Sm90Interleave):
    """harness.path_a with FlashInfer's SM90 weight interleave stood in."""
    with sm90_interleave(stand_in):
        return H.path_a(target)
