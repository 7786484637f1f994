"""Does an artifact fit the live SGLang scheduler process?  Pure data comparisons, no SGLang import.

The loader (loader.py) gathers what the running process is (`LiveSglang`) and, per MoE layer, what
SGLang 0.5.23 decided for it (`SglangLayer`, read from the layer and its `Mxfp4MoEMethod` by
layer_state.py); this module compares those facts with the manifest's `target` and turns every
difference into a `Mismatch` (the vLLM plugin's: field, artifact's value, live value). A refusal
names each field with both values and the `mxconvert convert` command that makes a fitting artifact.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from mxconvert.runtimes.common.mismatch import ArtifactMismatch, Mismatch, artifact_format, expert_ids, public_release
from mxconvert.runtimes.sglang.dependency import INSTALLABLE_BACKENDS, LOADER_PROVEN
from mxconvert.selection.sglang.mxfp4_0_5_23 import RUNNER_BACKENDS
from mxconvert.selection.sglang.nvfp4_0_5_23 import RUNNER_BACKENDS as NVFP4_RUNNER_BACKENDS
from mxconvert.target.profiles import BUILTIN_PROFILES

#: The row a refusal's convert command names (the newest the loader is proven in).
LOADER_REVISION = next(iter(LOADER_PROVEN))

#: The `--moe-a2a-backend` the artifacts are made for (all2all / MegaMoE are not mirrored: docs/sglang.md).
NO_A2A = "none"


@dataclass(frozen=True)
class LiveSglang:
    """The scheduler process: what SGLang and the device say, before any layer is built."""

    sglang_version: str
    platform: str  # "cuda", "rocm", "xpu", "cpu", ...
    capability: list[int] | None
    #: the FlashInfer release whose permute indices SGLang's TRT-LLM post-processing would use
    #: (None: not installed)
    flashinfer: str | None


@dataclass(frozen=True)
class SglangLayer:
    """One GPT-OSS MXFP4 MoE layer as SGLang 0.5.23 built it (`FusedMoE` + `Mxfp4MoEMethod`)."""

    prefix: str
    #: the mxconvert backend of the `Mxfp4MoEMethod` path SGLang runs for the layer (`method_backend`)
    backend: str
    hidden_size_padded: int
    intermediate_size_padded: int
    tp_size: int
    ep_size: int
    rank: int
    num_experts: int
    #: the global id of the layer's local expert 0: SGLang 0.5.23 places experts contiguously by EP rank
    #: (models/gpt_oss.py:1009-1010 loads global experts `moe_ep_rank * E_local` onward, in order; the
    #: TRT-LLM runner's `local_expert_offset`, layers/quantization/mxfp4.py:1581, and the dispatcher's
    #: `local_expert_mapping`, token_dispatcher/standard.py:231-242, route by the same rule); 0 without EP
    first_expert: int = 0
    #: `FusedMoE.num_fused_shared_experts` (shared experts fused into the routed slots; none in GPT-OSS)
    fused_shared_experts: int = 0
    #: `moe_runner_config.gate_up_interleaved` (GPT-OSS checkpoints interleave gate/up rows)
    gate_up_interleaved: bool = True
    #: `--moe-a2a-backend` (`get_moe_a2a_backend()`), lower case; "none" without all2all
    a2a_backend: str = NO_A2A
    #: marlin only: SGLang's own `check_moe_marlin_supports_layer(layer, 32, allow_tile_padding=True)`
    #: (marlin_utils.py: hidden % 64, the rank's unpadded intermediate % 32, the activation), which
    #: its post-processing raises on; the loader skips that post-processing, so it checks it here
    marlin_supported: bool = True
    #: the artifact format the layer's quant method holds: "mxfp4" (`Mxfp4MoEMethod`) or "nvfp4"
    #: (`ModelOptNvFp4FusedMoEMethod`, install_nvfp4.py)
    format: str = "mxfp4"
    #: NVFP4: (field, what mxconvert's bytes assume, what SGLang set) of the layer's runner config and
    #: quant config (install_nvfp4.py `nvfp4_layer`)
    expected: tuple[tuple[str, object, object], ...] = ()


def method_backend(
    *,
    use_flashinfer: bool,
    fi_kernel: str | None,
    use_marlin: bool,
    use_deep_gemm: bool,
    use_mega_moe: bool,
    use_triton_kernels: bool,
    sm90_humming: bool = False,
    use_aiter: bool = False,
) -> str:
    """The mxconvert backend of the path `Mxfp4MoEMethod.process_weights_after_loading` (SGLang
    0.5.23, layers/quantization/mxfp4.py) takes for a layer, in its order: Marlin, DeepGEMM / MegaMoE,
    the FlashInfer kernels by `_fi_kernel`, AITER (`use_aiter`: the module-level `_use_aiter` of
    mxfp4.py, SGLANG_USE_AITER on ROCm), triton_kernels, and SGLang's own fallbacks. Paths with no
    mxconvert backend are named as SGLang names them, so a refusal says what SGLang is running."""
    if use_marlin and not use_mega_moe:
        return "MARLIN"
    if use_deep_gemm or use_mega_moe:
        return "DEEP_GEMM (SGLang's DeepGEMM fp8 x fp4; no mxconvert layout)"
    if fi_kernel == "cutlass_sm90":
        return "HUMMING (SGLang's SM90 W4A8; no mxconvert layout)" if sm90_humming else "FLASHINFER_CUTLASS_MXFP4_BF16"
    if fi_kernel == "cutlass_sm120":
        return "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    if use_flashinfer:  # fi_kernel == "trtllm_sm100"
        return "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    if use_aiter:
        return "AITER_MXFP4_BF16"
    if use_triton_kernels:
        return "TRITON"
    return "SGLang's own fallback (XPU / CPU / bf16 upcast)"


def loader_serves(target: dict, live: LiveSglang) -> bool:
    """The loader is proven in the live release for the artifact's format, under the artifact's row."""
    row = target.get("runtime_revision")
    proven = LOADER_PROVEN.get(row, {}) if isinstance(row, str) else {}
    return public_release(live.sglang_version) in proven.get(artifact_format(target), ())


def _releases(formats: dict[str, tuple[str, ...]]) -> list[str]:
    return sorted({release for releases in formats.values() for release in releases})


def runtime_mismatches(target: dict, live: LiveSglang) -> list[Mismatch]:
    """Differences that concern the whole process (checked before the model is built)."""
    out: list[Mismatch] = []
    if not loader_serves(target, live):
        proven = ", ".join(
            f"{row} (SGLang {', '.join(sorted(set().union(*fmts.values())))})" for row, fmts in LOADER_PROVEN.items()
        )
        out.append(
            Mismatch(
                "runtime_revision",
                f"{target.get('runtime_revision')} ({artifact_format(target)}; the loader serves {proven})",
                f"SGLang {live.sglang_version}",
            )
        )
    if target.get("platform") != live.platform:
        out.append(Mismatch("platform", target.get("platform"), live.platform))
    elif target.get("capability") != live.capability:
        out.append(Mismatch("capability", target.get("capability"), live.capability))
    made_with = (target.get("layout") or {}).get("flashinfer")
    if made_with is not None and (live.flashinfer is None or public_release(live.flashinfer) != made_with):
        out.append(Mismatch("flashinfer", made_with, live.flashinfer))
    return out


def layer_mismatches(target: dict, layer: SglangLayer) -> list[Mismatch]:
    """Differences of one MoE layer: backend, parallel setup, padded sizes, the layout's inputs."""
    where = f"layer {layer.prefix}"
    out: list[Mismatch] = []

    def check(field: str, artifact: object, now: object) -> None:
        if artifact != now:
            out.append(Mismatch(field, artifact, now, where))

    check("backend", target.get("backend"), layer.backend)
    if layer.backend == target.get("backend") and layer.backend not in INSTALLABLE_BACKENDS:
        check("backend (installable by the SGLang loader)", " / ".join(INSTALLABLE_BACKENDS), layer.backend)
    check("tp_size", target.get("tp_size"), layer.tp_size)
    check("ep_size", target.get("ep_size"), layer.ep_size)
    check("hidden_size_padded", target.get("hidden_size_padded"), layer.hidden_size_padded)
    check("intermediate_size_padded", target.get("intermediate_size_padded"), layer.intermediate_size_padded)
    check("fused shared experts", 0, layer.fused_shared_experts)
    check("moe_a2a_backend", NO_A2A, layer.a2a_backend)
    if layer.format == "nvfp4":
        for field, artifact, now in layer.expected:
            check(field, artifact, now)
        return out
    check("gate_up_interleaved", True, layer.gate_up_interleaved)
    if layer.backend == "MARLIN":
        check("check_moe_marlin_supports_layer (SGLang raises without the loader)", True, layer.marlin_supported)
    return out


def rank_mismatch(manifest: dict, layer: SglangLayer) -> Mismatch | None:
    """The process's MoE rank must be one the artifact holds, with the same experts in the same order
    (the artifact's plan: `expert_start` .. `expert_end - 1`; the layer's: `first_expert` onward,
    `num_experts` of them, SGLang's placement)."""
    have = sorted(entry["rank"] for entry in manifest["ranks"])
    if layer.rank not in have:
        return Mismatch("rank", have, layer.rank, f"layer {layer.prefix}")
    plan = next(entry["plan"] for entry in manifest["ranks"] if entry["rank"] == layer.rank)
    held = tuple(range(plan["expert_start"], plan["expert_end"]))
    if len(held) != layer.num_experts:
        return Mismatch("experts", expert_ids(held), f"{layer.num_experts} local experts", f"layer {layer.prefix}")
    live = tuple(range(layer.first_expert, layer.first_expert + layer.num_experts))
    if held != live:
        return Mismatch("experts", expert_ids(held), expert_ids(live), f"layer {layer.prefix}")
    return None


def runner_backend_name(backend: str, fmt: str = "mxfp4") -> str | None:
    """SGLang's `--moe-runner-backend` name that reaches `backend` of `fmt` (what `convert --backend` takes)."""
    runners = NVFP4_RUNNER_BACKENDS if fmt == "nvfp4" else RUNNER_BACKENDS
    return next((name for name, members in runners.items() if backend in {m.value for m in members}), None)


def profile_for(live: LiveSglang) -> str:
    """The built-in profile of the live device (a PROFILE.toml hint where none fits)."""
    for profile in BUILTIN_PROFILES:
        if profile.platform == live.platform == "cuda" and list(profile.capability or ()) == list(
            live.capability or ()
        ):
            return profile.name
    return f'PROFILE.toml (platform = "{live.platform}", capability = {live.capability})'


def convert_command(manifest: dict, live: LiveSglang, layer: SglangLayer | None) -> str:
    """The `mxconvert convert` command that makes an artifact for the live process."""
    identity = manifest.get("source", {}).get("identity", {})
    pinned: list[str] = []
    if identity.get("kind") == "hub" and identity.get("repo_id"):
        source = identity["repo_id"]
        if identity.get("revision"):
            pinned = ["--revision", identity["revision"]]
    else:
        source = manifest.get("provenance", {}).get("source_path") or "MODEL"
    release = public_release(live.sglang_version)
    proven = {r for fmts in LOADER_PROVEN.values() for rs in fmts.values() for r in rs}
    runtime = f"sglang=={release}" if release in proven else f"sglang=={LOADER_REVISION.removeprefix('sglang-')}"
    parts = ["mxconvert", "convert", source, *pinned, "--profile", profile_for(live), "--runtime", runtime]
    if layer is not None:
        name = runner_backend_name(layer.backend, layer.format)
        if name is not None:
            parts += ["--backend", name]
        parts += ["--ep", str(layer.ep_size)] if layer.ep_size > 1 else ["--tp", str(max(1, layer.tp_size))]
    parts += ["-o", "OUT"]
    return " ".join(shlex.quote(part) for part in parts)


def refusal(
    manifest_path: str, mismatches: list[Mismatch], manifest: dict, live: LiveSglang, layer: SglangLayer | None
) -> ArtifactMismatch:
    lines = [f"{manifest_path}: this artifact does not match the running SGLang process; nothing was loaded."]
    lines += [f"  {m.line()}" for m in mismatches]
    if layer is not None and layer.ep_size > 1 and layer.tp_size > 1:
        tp, ep = layer.tp_size, layer.ep_size
        lines.append(
            f"  this process runs MoE TP {tp} within EP {ep} (--tp-size {tp * ep} --ep-size {ep}), which mxconvert "
            'does not write: serve with --tp-size N --ep-size N (MoE TP 1) or --ep-size 1 (docs/sglang.md, "Expert '
            'parallelism")'
        )
    lines.append(f"  make a matching artifact: {convert_command(manifest, live, layer)}")
    lines.append("  or serve the original checkpoint with SGLang's own loader (sglang serve without --load-format)")
    return ArtifactMismatch("\n".join(lines), mismatches)
