"""Does an artifact fit the live vLLM worker?  Pure data comparisons, no vLLM import.

The loader gathers what the running worker is (`LiveRuntime`, and per MoE layer `LiveLayer`) from
vLLM itself; this module compares those facts with the manifest's `target` and turns every
difference into a `Mismatch` naming the field, the artifact's value and the live value. A refusal
message also gives the `mxconvert convert` command that would make a matching artifact.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from mxconvert.runtimes.common.mismatch import (
    LEGACY_FORMAT,
    ArtifactMismatch,
    Mismatch,
    artifact_format,
    expert_ids,
    public_release,
)
from mxconvert.runtimes.vllm.adapters import ADAPTERS, served_releases, serving_row
from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN
from mxconvert.target.profiles import BUILTIN_PROFILES
from mxconvert.target.revisions import REVISIONS

#: The newest runtime revision the plugin installs into (the one a refusal's convert command names
#: when the live vLLM is none the plugin serves). The plugin serves the reference release of every
#: row in adapters.py's `ADAPTERS` (vLLM 0.33.0: vllm-0.33, vLLM 0.26.0: vllm-0.26) and loads an
#: artifact of the live vLLM's row only. Artifacts of other revisions (vllm-0.20, vllm-0.15) stay valid
#: for users with their own loaders; the plugin refuses them (or, with on_mismatch=reconvert, restores
#: their canonical tensors).
PLUGIN_REVISION = next(iter(ADAPTERS))


#: triton_kernels' names of the CDNA4 (gfx950) MX scale swizzle (`GFX950MXScaleLayout` before 3.6).
CDNA4_SCALE_LAYOUTS = frozenset({"CDNA4MXScaleLayout", "GFX950MXScaleLayout"})

#: The params dtype mxconvert's Marlin layout casts scales and biases to (GPT-OSS: bfloat16).
MARLIN_PARAMS_DTYPE = "bfloat16"


#: Differences `on_mismatch=reconvert` cannot bridge: the artifact holds another slice of the model
#: (TP/EP size, rank, the global experts of the rank's slots), was made for another vLLM, or the
#: worker runs EPLB (EPLB_UNSUPPORTED).
NOT_RECONVERTIBLE = frozenset({"tp_size", "ep_size", "rank", "experts", "vllm_version", "eplb"})


@dataclass(frozen=True)
class LiveRuntime:
    """The worker process: what vLLM and the device say, before any layer is built."""

    vllm_version: str
    platform: str  # "cuda", "rocm", "xpu", "cpu"
    capability: list[int] | None
    gfx: str | None
    triton_kernels: str | None  # None when vLLM finds no triton_kernels
    #: ROCm: vLLM 0.33.0's `should_use_cdna4_mx_scale_swizzle()` (quantization/utils/mxfp4_utils.py),
    #: which decides the scale layout of the triton_kernels backends (`_swizzle_mxfp4`) and the scale
    #: argument AITER's Triton kernels get (`get_aiter_mx_scale_swizzle`): gfx950 at an attention TP
    #: size <= 2. None elsewhere.
    cdna4_scale_swizzle: bool | None = None


@dataclass(frozen=True)
class LiveLayer:
    """One MoE layer as vLLM built it: the backend its oracle picked and the sizes it allocated."""

    prefix: str
    backend: str
    hidden_size_padded: int
    intermediate_size_padded: int
    tp_size: int
    ep_size: int
    rank: int
    num_experts: int
    marlin_input_dtype: str | None = None
    params_dtype: str = "bfloat16"
    fmt: str = LEGACY_FORMAT
    #: NVFP4: the checkpoint-shaped expert parameters vLLM allocated, as (name, shape) pairs
    checkpoint_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: NVFP4: the sizes vLLM 0.33.0's conversion pads this layer to, as (layout field, size) pairs
    #: (`hidden_padded`, `intermediate_padded`; none for a backend that pads no MoE size), computed
    #: by vLLM's own round-up helpers on the live layer (nvfp4_padding.py); None: not known for the
    #: live backend
    padded: tuple[tuple[str, int], ...] | None = None
    #: NVFP4: "nvfp4", "nvfp4_per_token" or "bf16" (the activation the method quantizes to)
    activation: str | None = None
    #: `--enable-eplb` (the layer's `moe_parallel_config.enable_eplb`); artifacts are made without it
    eplb: bool = False
    #: the global id of each local expert slot, in slot order, from vLLM's expert map (None: unknown)
    global_experts: tuple[int, ...] | None = None
    #: vLLM's data-parallel size (the MoE sizes above flatten it: EP size TP x DP with expert
    #: parallelism, else the TP size above is TP x DP; `serve_parallel_options`)
    dp_size: int = 1


def version_in_range(version: str, versions: str) -> bool:
    """`versions` as a revision row writes it: "0.33.0", "0.19.0-0.20.0" or "~0.15.0"."""
    live = _vtuple(version)
    if "-" in versions:
        low, high = versions.split("-", 1)
        return _vtuple(low) <= live <= _vtuple(high)
    if versions.startswith("~"):
        return live[:2] == _vtuple(versions[1:])[:2]
    return live == _vtuple(versions)


def _vtuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def runtime_mismatches(target: dict, live: LiveRuntime) -> list[Mismatch]:
    """Differences that concern the whole worker (checked before the model is built)."""
    out: list[Mismatch] = []
    # the row of the live release for the artifact's format (vLLM 0.26.0: vllm-0.26 for MXFP4,
    # vllm-0.25-nvfp4 for NVFP4)
    fmt = artifact_format(target)
    serving = serving_row(live.vllm_version, fmt)
    if serving is None and serving_row(live.vllm_version) is not None:  # served, for other formats only
        releases = f"{served_releases(fmt)} (the vLLM this plugin installs {fmt.upper()} artifacts into)"
        out.append(Mismatch("vllm_version", releases, live.vllm_version))
    elif serving is None:
        out.append(
            Mismatch("vllm_version", f"{served_releases()} (the vLLM this plugin installs into)", live.vllm_version)
        )
    elif not artifact_fits_release(target, serving.name, live.vllm_version):
        made_by = target.get("runtime_revision")
        revision = REVISIONS.get(made_by) if isinstance(made_by, str) else None
        made_for = f"{made_by} (vLLM {revision.versions if revision else '?'})"
        out.append(Mismatch("runtime_revision", made_for, f"{serving.name} (vLLM {live.vllm_version})"))
    if target.get("platform") != live.platform:
        out.append(Mismatch("platform", target.get("platform"), live.platform))
    elif live.platform == "rocm":
        if target.get("gfx") != live.gfx:
            out.append(Mismatch("gfx", target.get("gfx"), live.gfx))
    elif target.get("capability") != live.capability:
        out.append(Mismatch("capability", target.get("capability"), live.capability))
    return out


def artifact_fits_release(target: dict, serving: str, vllm_version: str) -> bool:
    """The plugin is proven in the live release for the artifact's format (dependency.PLUGIN_PROVEN),
    and the artifact's runtime row is `serving` (the row the live vLLM is, adapters.py) or claims the
    live release for the artifact's format (its `releases`)."""
    if public_release(vllm_version) not in PLUGIN_PROVEN.get(serving, {}).get(artifact_format(target), ()):
        return False
    made_by = target.get("runtime_revision")
    if made_by == serving:
        return True
    revision = REVISIONS.get(made_by) if isinstance(made_by, str) else None
    return revision is not None and public_release(vllm_version) in revision.releases.get(artifact_format(target), ())


def live_revision(live: LiveRuntime, fmt: str | None = None) -> str:
    """The runtime row of the live vLLM for format `fmt` (for any format when the release serves none of
    `fmt`, or `fmt` is None; the newest the plugin serves when it serves none)."""
    serving = (serving_row(live.vllm_version, fmt) if fmt is not None else None) or serving_row(live.vllm_version)
    return serving.name if serving is not None else PLUGIN_REVISION


#: `check(field, artifact's value, live value)` records a mismatch where the two differ.
Check = Callable[[str, object, object], None]


def layer_mismatches(target: dict, layer: LiveLayer, live: LiveRuntime) -> list[Mismatch]:
    """Differences of one MoE layer: backend, parallel setup, rank, padded sizes, layout inputs."""
    where = f"layer {layer.prefix}"
    out: list[Mismatch] = []

    def check(field: str, artifact, now) -> None:
        if artifact != now:
            out.append(Mismatch(field, artifact, now, where))

    check("format", artifact_format(target), layer.fmt)
    check("backend", target.get("backend"), layer.backend)
    check("tp_size", target.get("tp_size"), layer.tp_size)
    check("ep_size", target.get("ep_size"), layer.ep_size)
    check("eplb", False, layer.eplb)  # no artifact is made for EPLB (EPLB_UNSUPPORTED says why)
    FORMAT_CHECKS[layer.fmt].layer(target, layer, live, check)  # the live layer's format decides
    return out


def _mxfp4_layer_checks(target: dict, layer: LiveLayer, live: LiveRuntime, check: Check) -> None:
    """GPT-OSS MXFP4: vLLM's `create_weights` pads the sizes itself; the layout's own inputs."""
    check("hidden_size_padded", target.get("hidden_size_padded"), layer.hidden_size_padded)
    check("intermediate_size_padded", target.get("intermediate_size_padded"), layer.intermediate_size_padded)
    layout = target.get("layout") or {}
    if layout.get("kind") == "triton":
        check("triton_kernels", layout.get("triton_kernels"), live.triton_kernels)
        if live.cdna4_scale_swizzle is not None:
            # vLLM decides by its TP group size (mxconvert by `Deployment.attention_tp`, the same
            # size); artifacts made before mxconvert read that size decided by --tp alone. The
            # kernels read the scales as vLLM decided, whatever layout the installed tensors carry
            check("CDNA4 scale swizzle", layout.get("scale_layout") in CDNA4_SCALE_LAYOUTS, live.cdna4_scale_swizzle)
    if layout.get("kind") == "marlin":
        check("activation (marlin_input_dtype)", layout.get("marlin_input_dtype"), layer.marlin_input_dtype)
        # Marlin casts scales and biases to the layer's params dtype; mxconvert lays GPT-OSS out in bf16
        check("params_dtype (--dtype)", MARLIN_PARAMS_DTYPE, layer.params_dtype)


def _nvfp4_layer_checks(target: dict, layer: LiveLayer, live: LiveRuntime, check: Check) -> None:
    """NVFP4: the layout pads itself, so the checkpoint shapes (`nvfp4_shape_mismatches`) and the
    padded sizes vLLM pads the live layer to are compared; the activation; Marlin's params dtype."""
    check("activation", target.get("activation"), layer.activation)
    if target.get("backend") == "MARLIN":  # Marlin's scales are computed in the params dtype
        check("params_dtype (--dtype)", MARLIN_PARAMS_DTYPE, layer.params_dtype)
    if target.get("backend") == layer.backend:
        for m in nvfp4_padding_mismatches(target, layer):
            check(m.field, m.artifact, m.live)


def nvfp4_shape_mismatches(rank_entry: dict, layer: LiveLayer) -> list[Mismatch]:
    """NVFP4: each expert tensor's checkpoint shape (the artifact's `canonical_shape`) must be the shape
    of the parameter vLLM allocated for this rank (model geometry and TP slice)."""
    out = []
    for name, live_shape in layer.checkpoint_shapes:
        info = rank_entry["tensors"].get(f"{layer.prefix}.{name}")
        if info is not None and "canonical_shape" not in info["layout"]:
            continue  # a derived tensor (Marlin's rescaled block scales): its shape is the kernel's
        held = tuple(info["layout"]["canonical_shape"]) if info else None
        if held != tuple(live_shape):
            out.append(
                Mismatch(
                    f"checkpoint shape of {name}",
                    list(held) if held else None,
                    list(live_shape),
                    f"layer {layer.prefix}",
                )
            )
    return out


#: The padded sizes an NVFP4 layout records (`target.layout`); vLLM pads inside its conversion.
NVFP4_PADDED_FIELDS = ("hidden_padded", "intermediate_padded")


def nvfp4_padding_mismatches(target: dict, layer: LiveLayer) -> list[Mismatch]:
    """NVFP4: vLLM 0.33.0 pads inside the conversion the plugin bypasses (and its pre-processed path
    takes the padded sizes from the installed weights), so nothing in vLLM checks them. The live padded
    sizes are those vLLM itself pads this layer to (`LiveLayer.padded`: vLLM's own round-up helpers run
    on the layer it built, nvfp4_padding.py), never mxconvert's rule for them. The artifact's recorded
    sizes (its tensors' shapes, checked by `verify`) must be these."""
    recorded = target.get("layout") or {}
    if layer.padded is None:
        return [
            Mismatch(
                "padded sizes",
                {f: recorded.get(f) for f in NVFP4_PADDED_FIELDS},
                f"unknown (this plugin does not know how vLLM 0.33.0 pads backend {layer.backend})",
            )
        ]
    live = dict(layer.padded)
    return [Mismatch(f, recorded.get(f), live.get(f)) for f in NVFP4_PADDED_FIELDS if recorded.get(f) != live.get(f)]


def rank_mismatch(manifest: dict, layer: LiveLayer) -> Mismatch | None:
    """The worker's rank must be one the artifact holds (a `--rank R` artifact holds one), and under
    expert parallelism vLLM must place the same global experts in the same local slots as that
    rank's plan (`expert_start` .. `expert_end - 1`, linear)."""
    have = sorted(entry["rank"] for entry in manifest["ranks"])
    if layer.rank not in have:
        return Mismatch("rank", have, layer.rank, f"layer {layer.prefix}")
    if layer.global_experts is None:
        return None
    plan = next(entry["plan"] for entry in manifest["ranks"] if entry["rank"] == layer.rank)
    held = tuple(range(plan["expert_start"], plan["expert_end"]))
    if tuple(layer.global_experts) != held:
        return Mismatch("experts", expert_ids(held), expert_ids(layer.global_experts), f"layer {layer.prefix}")
    return None


def convert_command(manifest: dict, live: LiveRuntime, layer: LiveLayer | None) -> str:
    """The `mxconvert convert` command that makes an artifact for the live worker."""
    identity = manifest.get("source", {}).get("identity", {})
    pinned: list[str] = []
    if identity.get("kind") == "hub" and identity.get("repo_id"):
        source = identity["repo_id"]
        if identity.get("revision"):  # the commit the artifact was made from, not the repo's head today
            pinned = ["--revision", identity["revision"]]
    else:
        source = manifest.get("provenance", {}).get("source_path") or "MODEL"
    parts = ["mxconvert", "convert", source, *pinned, "--profile", _profile_for(live, layer)]
    fmt = layer.fmt if layer is not None else artifact_format(manifest.get("target", {}))
    parts += ["--runtime", live_revision(live, fmt)]
    if layer is not None:
        name = moe_backend_name(layer.backend, layer.fmt)
        if name is None and layer.backend == "FLASHINFER_CUTEDSL_BATCHED":  # the batched variant of CuteDSL
            parts += ["--backend", "flashinfer_cutedsl", "--batched"]
        elif name is not None:
            parts += ["--backend", name]
        parts += serve_parallel_options(layer)
    parts += ["-o", "OUT"]
    return " ".join(shlex.quote(part) for part in parts)  # a path from the manifest is pasted quoted


def serve_parallel_options(layer: LiveLayer) -> list[str]:
    """The `mxconvert convert` parallel options of the live layer's worker, in vLLM's terms.

    The layer's sizes are the MoE's: vLLM 0.33.0 (and 0.26.0) flatten DP (x PCP) x TP into its EP size
    under expert parallelism and into its TP size without (fused_moe/config.py
    `FusedMoEParallelConfig.make`; docs/artifact.md, "Parallel sizes"), so vLLM's own
    `--tensor-parallel-size` is that size over DP, which is what mxconvert's `--tp` takes. `--ep N`
    is the EP group's size (TP = N / DP); `--dp` is given whenever DP > 1, with or without EP
    (vLLM's kernel choice depends on it: no monolithic kernel)."""
    dp = max(1, layer.dp_size)
    group = ["--ep", str(layer.ep_size)] if layer.ep_size > 1 else ["--tp", str(max(1, layer.tp_size // dp))]
    return group + (["--dp", str(dp)] if dp > 1 else [])


def moe_backend_name(backend: str, fmt: str = LEGACY_FORMAT) -> str | None:
    """The vLLM 0.33 `--moe-backend` name that selects exactly `backend` (what `--backend` takes)."""
    names = FORMAT_CHECKS[fmt].backend_names()
    single = [n for n, members in names.items() if [m.value for m in members] == [backend]]
    first = [n for n, members in names.items() if members and members[0].value == backend]
    found = single or first
    return found[0] if found else None


def _mxfp4_backend_names() -> dict:
    from mxconvert.selection import MOE_BACKEND_NAMES

    return MOE_BACKEND_NAMES


def _nvfp4_backend_names() -> dict:
    from mxconvert.selection import NVFP4_MOE_BACKEND_NAMES

    return NVFP4_MOE_BACKEND_NAMES


def _profile_for(live: LiveRuntime, layer: LiveLayer | None = None) -> str:
    # On ROCm an AITER backend runs only with VLLM_ROCM_USE_AITER=1, which only the `-aiter` profiles
    # set: mxconvert refuses `--backend aiter...` on the plain profile of the same gfx.
    aiter = layer is not None and layer.backend.startswith("AITER")
    for profile in BUILTIN_PROFILES:
        if profile.platform != live.platform:
            continue
        if live.platform == "rocm" and profile.gfx == live.gfx and profile.rocm_use_aiter == aiter:
            return profile.name
        if live.platform == "cuda" and list(profile.capability or ()) == list(live.capability or ()):
            return profile.name
        if live.platform in ("xpu", "cpu"):
            return profile.name
    return f'PROFILE.toml (platform = "{live.platform}", capability = {live.capability})'


def refusal(
    manifest_path: str, mismatches: list[Mismatch], manifest: dict, live: LiveRuntime, layer: LiveLayer | None
) -> ArtifactMismatch:
    lines = [f"{manifest_path}: this artifact does not match the running vLLM worker; nothing was loaded."]
    lines += [f"  {m.line()}" for m in mismatches]
    if any(m.field == "eplb" for m in mismatches):
        lines.append(f"  {EPLB_UNSUPPORTED}")
        return ArtifactMismatch("\n".join(lines), mismatches)
    lines.append(f"  make a matching artifact: {convert_command(manifest, live, layer)}")
    if any(m.field in NOT_RECONVERTIBLE for m in mismatches):
        hard = ", ".join(sorted({m.field for m in mismatches if m.field in NOT_RECONVERTIBLE}))
        lines.append(
            f"  (on_mismatch=reconvert cannot bridge {hard}: it re-lays out the same slice of the model "
            "for another backend of the same vLLM)"
        )
    else:
        row = FORMAT_CHECKS.get(artifact_format(manifest.get("target", {})))
        if row is not None and row.no_reconvert is None:
            lines.append(
                "  or load it anyway through vLLM's own conversion: "
                '--model-loader-extra-config \'{"on_mismatch": "reconvert"}\''
            )
        elif row is not None:
            lines.append(f"  ({row.no_reconvert})")
    return ArtifactMismatch("\n".join(lines), mismatches)


#: Why on_mismatch=reconvert does not apply to NVFP4 artifacts.
NVFP4_NO_RECONVERT = (
    "on_mismatch=reconvert does not apply to NVFP4 artifacts: their activation and global "
    "scales are reductions (a maximum over experts, a product with the activation scale) "
    "that have no exact inverse, so the checkpoint tensors cannot be restored bit for bit; "
    "load the checkpoint itself with vLLM's own loader instead"
)

#: Why a worker with EPLB on is refused (vLLM 0.33.0; docs/artifact.md, "Expert parallelism").
EPLB_UNSUPPORTED = (
    "EPLB (--enable-eplb) is not supported by the mxconvert plugin: an artifact records no EPLB and holds "
    "each rank's experts in the fixed linear placement with no redundant expert slots, while under EPLB "
    "vLLM 0.33.0 takes the NVFP4 activation scales of the global-scale backends as a maximum all-reduced "
    "over the whole EP group instead of over this rank's experts (quant_utils.amax_for_moe_activation_quant), "
    "may add redundant expert slots (--eplb-config num_redundant_experts) and moves experts between ranks "
    "while serving. Serve without --enable-eplb, or load the checkpoint with vLLM's own loader "
    "(`mxconvert convert --eplb` only makes the backend choice vLLM makes under EPLB)"
)


@dataclass(frozen=True)
class FormatChecks:
    """What the checks of one checkpoint format add to the common ones (a row of `FORMAT_CHECKS`)."""

    #: the format's own per-layer comparisons (`layer_mismatches` runs them for the live layer's format)
    layer: Callable[[dict, LiveLayer, LiveRuntime, Check], None]
    #: comparisons against the rank's manifest entry
    rank: Callable[[dict, LiveLayer], list[Mismatch]]
    #: vLLM 0.33's `--moe-backend` names of the format (backend -> the name `convert --backend` takes)
    backend_names: Callable[[], dict]
    #: None where `on_mismatch=reconvert` restores the format's checkpoint tensors exactly; else why not
    no_reconvert: str | None


def _no_rank_checks(rank_entry: dict, layer: LiveLayer) -> list[Mismatch]:
    """GPT-OSS MXFP4: vLLM's checkpoint shapes follow from the sizes `layer_mismatches` compares."""
    return []


#: The checkpoint formats the plugin installs, by `target.format` (and `LiveLayer.fmt`).
FORMAT_CHECKS: dict[str, FormatChecks] = {
    "mxfp4": FormatChecks(_mxfp4_layer_checks, _no_rank_checks, _mxfp4_backend_names, None),
    "nvfp4": FormatChecks(_nvfp4_layer_checks, nvfp4_shape_mismatches, _nvfp4_backend_names, NVFP4_NO_RECONVERT),
}
