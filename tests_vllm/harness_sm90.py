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

FlashInfer 0.6.11.post2-0.6.16.post3 (vLLM 0.22.0-0.28.0, rows whose `cutlass_sm90_layout` is
"sm90-interleave-0.6") ship another kernel. For those, `Sm90Interleave("transcribe")` computes the
kernel's thread-by-thread transcription (tools/golden/release_standins.py `sm90_fp4_weights_0_6`)
and hands path A its bytes only if their sha256 is the one FlashInfer 0.6.14's kernel produced on a
GPU for exactly that input (tests_vllm/data/sm90_interleave_0_6/provenance.json, which records the
digests, not the bytes); any other input or output raises `MissingGpuResult`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from pathlib import Path

import harness as H
import torch

DATA = Path(__file__).resolve().parent / "data" / "sm90_interleave"
RESULTS_FILE = DATA / "fi_sm90_outputs.safetensors"
PROVENANCE_FILE = DATA / "provenance.json"
#: FlashInfer 0.6.14's kernel: the sha256 of its GPU output for each input (key), not the bytes
PROVENANCE_0_6_FILE = DATA.parent / "sm90_interleave_0_6" / "provenance.json"
GOLDEN_TOOLS = Path(__file__).resolve().parents[1] / "tools" / "golden"
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


def _digest(x: torch.Tensor) -> str:
    return hashlib.sha256(x.contiguous().reshape(-1).numpy().tobytes()).hexdigest()


class Sm90Interleave:
    """`interleave_moe_weights_for_sm90_mixed_gemm` with FlashInfer's signature: 'record' keeps each
    input (and returns zeros of its shape), 'replay' returns the GPU's output for it, 'transcribe'
    returns the kernel transcription's output when its sha256 is the GPU's (`digests`: key -> sha256)."""

    def __init__(
        self,
        mode: str,
        results: dict[str, torch.Tensor] | None = None,
        digests: dict[str, str] | None = None,
    ):
        assert mode in ("record", "replay", "transcribe"), mode
        self.mode = mode
        self.results = results if results is not None else {}
        self.digests = digests if digests is not None else {}
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
        if self.mode == "transcribe":
            return self._transcribed(key, weight)
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

    def _transcribed(self, key: str, weight: torch.Tensor) -> torch.Tensor:
        if key not in self.digests:
            raise MissingGpuResult(
                f"no GPU output digest of FlashInfer 0.6's SM90 fp4 weight interleave for input {key} in "
                f"{PROVENANCE_0_6_FILE}; the example checkpoint or vLLM's conversion changed: redo the GPU run "
                "(tools/gpu_check/sm90_interleave_record.py in a 0.22.0-0.28.0 venv, then sm90_interleave_gpu.sh "
                "with FlashInfer 0.6.14)"
            )
        if str(GOLDEN_TOOLS) not in sys.path:
            sys.path.insert(0, str(GOLDEN_TOOLS))
        from release_standins import sm90_fp4_weights_0_6

        out = torch.stack([sm90_fp4_weights_0_6(expert) for expert in weight.contiguous()])
        if _digest(out) != self.digests[key]:
            raise MissingGpuResult(
                f"the transcription of FlashInfer 0.6's SM90 interleave gives {_digest(out)} for input {key}, "
                f"the GPU gave {self.digests[key]} ({PROVENANCE_0_6_FILE})"
            )
        self.used.append(key)
        return out


def recorded_digests_0_6() -> dict[str, str]:
    """input key -> sha256 of FlashInfer 0.6.14's GPU output (tests_vllm/data/sm90_interleave_0_6/)."""
    results = json.loads(PROVENANCE_0_6_FILE.read_text())["results"]
    return {r["key"]: r["output_sha256"] for r in results}


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
