"""The plan of a conversion: which backend, which layout, the padded sizes, every output tensor's
dtype and shape, and which file holds it.

Planning is pure (no bytes read beyond headers): `convert --dry-run`, `select` and the first step
of `convert` run it; `verify` reads the same plan back to know what an artifact must hold.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mxconvert.artifact.manifest_schema import serve_mismatch
from mxconvert.artifact.parts import part_key
from mxconvert.core.dtypes import DType, dtype_named
from mxconvert.core.errors import (
    InputError,
    UnsupportedError,
)
from mxconvert.formats.base import RankPlan
from mxconvert.formats.registry import Ckpt, Geometry, format_of
from mxconvert.layouts import ExpertLayout
from mxconvert.selection import Deployment, Selection
from mxconvert.selection.environment import MARLIN_INPUT_DTYPE
from mxconvert.selection.sglang.mxfp4_0_5_23 import layer_refusal
from mxconvert.target.backends import CUTLASS_BACKENDS, MARLIN_BACKENDS
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision
from mxconvert.target.sglang_revisions import RUNTIME as SGLANG_RUNTIME
from mxconvert.target.sglang_revisions import SGLANG_REVISIONS

GiB = 1 << 30
DEFAULT_SHARD_BYTES = 4 * GiB


@dataclass(frozen=True)
class TargetRequest:
    """What one `plan` or `convert` call asks for besides the model (and, for `convert`, how to
    write): the targets (profiles x TP sizes, the parallel layout), the runtime and its switches, how
    the model is read and how large a file may be. Built once, from the command line's options or
    the public functions' keywords (`from_keywords`), and passed on as one value. Nothing is checked
    here: `plan_targets` (pipeline/targets.py) checks each option where it always did, so a bad one
    is refused with the same message, in the same order."""

    profile: tuple[str | DeviceProfile, ...]
    tp: tuple[int, ...] = (1,)
    runtime: str | None = None
    backend: str = "auto"
    ep: int = 1
    dp: int = 1
    enable_expert_parallel: bool = False
    rank: int | None = None
    activation: str = "bf16"
    lora: bool = False
    batched: bool = False
    all2all: str | None = None
    eplb: bool = False
    env: Mapping[str, str] | tuple[str, ...] = ()  # unparsed: `env_overrides` refuses a bad one
    marlin_input_dtype: str | None = None
    revision: str | None = None
    cache_dir: str | None = None
    layout: str | None = None
    max_shard_size: int | str = "4GB"

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> TargetRequest:
        """The request from a caller's options named as the fields: the `locals()` of the public
        `plan` and `convert` (whose signatures list every field: tests/test_target_request.py holds
        them equal) or of a CLI command (whose options it lacks keep their defaults). `profile` and
        `tp` may be one or several, `env` a mapping, `KEY=VALUE` strings or None."""
        options = {f.name: keywords[f.name] for f in fields(cls) if f.name in keywords}
        profile, tp, env = options["profile"], options.get("tp", 1), options.get("env")
        options["profile"] = (profile,) if isinstance(profile, (str, DeviceProfile)) else tuple(profile)
        options["tp"] = (tp,) if isinstance(tp, int) else tuple(tp)
        options["env"] = dict(env) if isinstance(env, Mapping) else tuple(env or ())
        return cls(**options)

    def env_overrides(self) -> dict[str, str]:
        """`--env KEY=VALUE` options (or a mapping) as a dict."""
        if isinstance(self.env, Mapping):
            return {str(k).strip(): str(v).strip() for k, v in self.env.items()}
        overrides: dict[str, str] = {}
        for item in self.env:
            if "=" not in item:
                raise InputError(f"--env {item!r}: expected KEY=VALUE")
            key, value = item.split("=", 1)
            overrides[key.strip()] = value.strip()
        return overrides


class LayoutRefused(UnsupportedError):
    """The selected backend's layout is refused (layouts/registry.py `build_layout`: bytes not proven
    under the row, or not laid out). Carries the selection, so `select` still prints its report
    (every passed-over backend with the runtime's reason) before the refusal; `targets.plan` adds
    the target's environment report. Its `--json` error kind stays "UnsupportedError"."""

    json_kind = "UnsupportedError"

    def __init__(self, message: str, selection: Selection, geometry: Geometry, profile: DeviceProfile):
        super().__init__(message)
        self.selection, self.geometry, self.profile = selection, geometry, profile
        self.environment: dict[str, dict] = {}


def expert_key(layer: int, name: str) -> str:
    """The runtime parameter name under which a converted expert tensor is stored."""
    return f"model.layers.{layer}.mlp.experts.{name}"


@dataclass(frozen=True)
class TensorPlan:
    key: str
    layer: int | None  # None for pass-through tensors
    name: str  # canonical name, or the source name for pass-through tensors
    dtype: DType
    shape: tuple[int, ...]
    #: For a part of a tensor split across files (--max-shard-size): the whole tensor, and the
    #: experts (rows of dim 0 of its buffer, local to the rank) this part holds.
    whole: TensorPlan | None = None
    rows: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        n = dtype_named(self.dtype).itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class FilePlan:
    path: str  # relative to the artifact root
    tensors: tuple[TensorPlan, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass
class Plan:
    ckpt: Ckpt  # a Checkpoint of any format (formats/registry.py)
    profile: DeviceProfile
    revision: RuntimeRevision
    deployment: Deployment
    selection: Selection
    layout: ExpertLayout
    geometry: Geometry
    ranks: list[RankPlan]
    rank_files: dict[int, list[FilePlan]] = field(default_factory=dict)
    shared_files: list[FilePlan] = field(default_factory=list)
    #: The vLLM release `--runtime` asked for (`vllm==X.Y.Z`, or `auto` with vLLM installed), which
    #: `revision` covers; None when a row was named or nothing was installed (no manifest field then).
    runtime_release: str | None = None

    def target(self) -> dict:
        p = self.profile
        return {
            "profile": p.name,
            "platform": p.platform,
            "capability": list(p.capability) if p.capability else None,
            "gfx": p.gfx,
            "backend": self.selection.backend.value,
            "kernel_class": self.selection.kernel_class,
            "requested_backend": self.selection.requested,
            "activation": self.selection.activation,
            "runtime_revision": self.revision.name,
            **({"runtime_release": self.runtime_release} if self.runtime_release is not None else {}),
            "runtime": self.revision.describe(),
            "format": self.geometry.fmt,
            # the MoE layers' sizes (what every rank's plan slices by), and vLLM's own options
            "tp_size": self.deployment.moe_tp,
            "ep_size": self.deployment.moe_ep,
            "dp_size": self.deployment.dp,
            "serve": self.serve(),
            **self.geometry.to_target(),
            "layout": self.layout.describe(),
            "device": p.to_json(),
        }

    def serve(self) -> dict:
        """What `vllm serve` runs this artifact with (the manifest's `target.serve`): vLLM's
        parallel options, from which the MoE sizes above follow (selection/deployment.py), the
        switches of the deployment that change vLLM's backend choice, and the VLLM_* variables the
        selection read (`--env`, the environment, `--marlin-input-dtype`, the profile's AITER
        switches)."""
        dep, profile = self.deployment, self.profile
        env = dict(dep.env)
        if self.selection.marlin_input_dtype is not None:
            env[MARLIN_INPUT_DTYPE] = self.selection.marlin_input_dtype
        sglang = self.revision.runtime == SGLANG_RUNTIME  # its AITER switch is in dep.env already
        if profile.platform == "rocm" and profile.rocm_use_aiter and not sglang:  # only the -aiter profiles set it
            env["VLLM_ROCM_USE_AITER"] = "1"
            if not profile.rocm_use_aiter_moe:
                env["VLLM_ROCM_USE_AITER_MOE"] = "0"
        return {
            **dep.serve_parallel(),
            "all2all_backend": dep.all2all,
            "enable_lora": dep.lora,
            "env": dict(sorted(env.items())),
        }

    def summary(self) -> dict:
        """The plan as JSON (what --dry-run prints)."""
        return {
            "source": self.ckpt.identity.to_json() | {"layout": self.ckpt.layout},
            "model": self.ckpt.facts.to_json(),
            "target": self.target(),
            "selection": self.selection.to_json(),
            "ranks": [
                {
                    "rank": rp.rank,
                    "plan": rp.to_json(),
                    "files": [
                        {"file": f.path, "bytes": f.nbytes, "tensors": len(f.tensors)} for f in self.rank_files[rp.rank]
                    ],
                }
                for rp in self.ranks
            ],
            "shared_files": [{"file": f.path, "bytes": f.nbytes, "tensors": len(f.tensors)} for f in self.shared_files],
            "total_bytes": sum(f.nbytes for fs in self.rank_files.values() for f in fs)
            + sum(f.nbytes for f in self.shared_files),
        }


def serve_command(target: dict, artifact: str) -> str | None:
    """The `vllm serve` command line an artifact of `target` (a plan's or a manifest's) is for:
    `[VLLM_*=... ]vllm serve ARTIFACT --load-format mxconvert -tp T [-dp D] [--enable-expert-parallel]
    [--moe-backend NAME] [--all2all-backend NAME] [--enable-lora]`. `select`, `convert` and `inspect`
    show it (text and JSON, "serve_command").

    Read from the target's `serve` (vLLM's own options). A manifest without it was made before
    `--tp`/`--dp` took vLLM's meaning: without DP its sizes are vLLM's (`--ep N`: TP N with expert
    parallelism) and the command is rebuilt from them, with no VLLM_* variables (not recorded then);
    with DP its meaning is ambiguous (artifact/manifest_schema.py `refuse_ambiguous_parallel`), so
    there is no command (None); nor is there for a `serve` that contradicts the MoE sizes
    (`serve_mismatch`, which `verify` reports)."""
    serve = target.get("serve")
    if str(target.get("runtime_revision", "")).strip().lower() in SGLANG_REVISIONS:
        return _sglang_serve_command(target, artifact)
    if serve_mismatch(target) is not None:  # an edited manifest: no line `verify` would not stand by
        return None
    if not isinstance(serve, dict):
        if target.get("dp_size", 1) != 1:
            return None
        serve = Deployment.from_target(target).serve_parallel()
    words = [f"{key}={value}" for key, value in sorted((serve.get("env") or {}).items())]
    words += ["vllm", "serve", artifact, "--load-format", "mxconvert", "-tp", str(serve["tensor_parallel_size"])]
    if serve["data_parallel_size"] > 1:
        words += ["-dp", str(serve["data_parallel_size"])]
    if serve["enable_expert_parallel"]:
        words.append("--enable-expert-parallel")
    requested = target.get("requested_backend")
    if isinstance(requested, str) and requested != "auto":  # a forced backend: vLLM's own name for it
        words += ["--moe-backend", requested]
    if serve.get("all2all_backend"):
        words += ["--all2all-backend", serve["all2all_backend"]]
    if serve.get("enable_lora"):
        words.append("--enable-lora")
    return shlex.join(words)


def _sglang_serve_command(target: dict, artifact: str) -> str:
    """`[SGLANG_*=... ]sglang serve --model-path ARTIFACT --load-format mxconvert --tp-size T
    [--ep-size E] [--moe-runner-backend NAME]`: SGLang 0.5.23's own CLI with the load format
    mxconvert's SGLang plugin adds (runtimes/sglang, docs/sglang.md "Loader"). SGLang's sizes follow
    from the artifact's MoE sizes by its own rule (runtime_context.py `derive_parallel_widths`:
    moe_tp_size = tp_size // ep_size // moe_dp_size; mxconvert mirrors moe_dp_size 1): `--tp-size` is
    the MoE's TP x EP size, and `--ep-size` the MoE's EP size where it is over 1 (docs/sglang.md,
    "Expert parallelism"). The variables are the `SGLANG_*` ones the selection read
    (`target.serve.env`), e.g. `SGLANG_USE_AITER=1` for an AITER artifact: served without them,
    SGLang prepares other bytes."""
    serve = target.get("serve")
    env = serve.get("env") if isinstance(serve, dict) else None
    words = [f"{k}={v}" for k, v in sorted((env or {}).items()) if str(k).startswith("SGLANG_")]
    words += ["sglang", "serve", "--model-path", artifact, "--load-format", "mxconvert"]
    moe_tp, moe_ep = int(target.get("tp_size", 1)), int(target.get("ep_size", 1))
    words += ["--tp-size", str(moe_tp * moe_ep)]
    if moe_ep > 1:
        words += ["--ep-size", str(moe_ep)]
    requested = target.get("requested_backend")
    if isinstance(requested, str) and requested != "auto":  # a forced runner: SGLang's own name for it
        words += ["--moe-runner-backend", requested]
    return shlex.join(words)


def no_serve_command(target: dict) -> str:
    """What the text output says after "serve with:" where `serve_command(target, ...)` is None,
    for each reason it is: a `serve` that contradicts the MoE sizes, or a manifest an older
    mxconvert wrote with DP (its --tp meant the MoE group)."""
    mismatch = serve_mismatch(target)
    if mismatch is not None:
        return f"unknown: {mismatch} (an edited manifest; mxconvert verify reports it)"
    return "unknown: made by an older mxconvert whose --tp with --dp meant the MoE group; reconvert it"


def make_plan(
    ckpt,
    profile: DeviceProfile,
    revision: RuntimeRevision,
    deployment: Deployment,
    backend: str = "auto",
    rank: int | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Plan:
    fmt = format_of(ckpt)
    selection = fmt.select(ckpt, profile, revision, deployment, backend)
    # the geometry first: it refuses a MoE TP size that does not divide the model in terms of the
    # options given (--tp x --dp), before the rank plan would in terms of the MoE's own sizes
    geometry = fmt.geometry(ckpt, selection, revision, profile, deployment)
    ranks = fmt.plan_ranks(ckpt, deployment.moe_tp, deployment.moe_ep)
    if rank is not None:
        if not 0 <= rank < len(ranks):
            raise InputError(f"--rank {rank} is out of range: this setup has ranks 0..{len(ranks) - 1}")
        ranks = [ranks[rank]]
    refusal = _sglang_marlin_refusal(ckpt, selection, revision, geometry, deployment)
    if refusal is not None:
        raise LayoutRefused(refusal, selection, geometry, profile)
    try:
        layout = fmt.layout_for(ckpt, selection, revision, geometry, deployment, profile)
    except UnsupportedError as exc:
        raise LayoutRefused(str(exc), selection, geometry, profile) from None
    plan = Plan(ckpt, profile, revision, deployment, selection, layout, geometry, ranks)
    for rp in ranks:
        specs = geometry.specs(rp.num_experts)
        tensors = []
        for layer in ckpt.moe_layers:
            for name in layout.kernel_names:
                try:
                    out_dtype, out_shape = layout.buffer_spec(name, specs)
                except (ValueError, RuntimeError) as exc:
                    shape = list(specs[name][1]) if name in specs else "?"
                    raise UnsupportedError(
                        f"{selection.backend.value} cannot lay out {name} of shape {shape}: {exc}"
                    ) from None
                tensors.append(TensorPlan(expert_key(layer, name), layer, name, out_dtype, out_shape))
        plan.rank_files[rp.rank] = _pack_files(f"rank-{rp.rank:05d}", tensors, max_shard_bytes, _expert_rows(rp))
    passthrough = [
        TensorPlan(name, None, name, ckpt.info(name).dtype, ckpt.info(name).shape) for name in ckpt.other_tensor_names()
    ]
    plan.shared_files = _pack_files("shared", passthrough, max_shard_bytes) if passthrough else []
    return plan


def sglang_marlin_input(
    revision: RuntimeRevision,
    requested: str | None,
    explicit: Mapping[str, str],
    resolved: str | None,
    env_report: dict[str, dict],
) -> str | None:
    """The Marlin input dtype a target of `revision` is planned with: `resolved` (what
    `resolve_environment` read) for a vLLM row. SGLang 0.5.23 has no fp8-activation MXFP4 Marlin (its
    Marlin MoE takes 16-bit activations: layers/quantization/marlin_utils_fp4.py
    `prepare_moe_mxfp4_layer_for_marlin`, docs/sglang.md "MARLIN") and reads no
    VLLM_MARLIN_INPUT_DTYPE, so under an SGLang row `--marlin-input-dtype` or `--env
    VLLM_MARLIN_INPUT_DTYPE=...` is refused rather than ignored, and the variable set in the
    environment (perhaps for a vLLM server) is reported as ignored and not used (None)."""
    if revision.runtime != SGLANG_RUNTIME:
        return resolved
    asked = f"--marlin-input-dtype {requested}" if requested is not None else None
    if asked is None and MARLIN_INPUT_DTYPE in explicit:
        asked = f"--env {MARLIN_INPUT_DTYPE}={explicit[MARLIN_INPUT_DTYPE]}"
    if asked is not None:
        raise UnsupportedError(
            f"{asked}: SGLang has no fp8-activation MXFP4 Marlin ({revision.name}: its Marlin MoE runs 16-bit "
            f"activations, layers/quantization/marlin_utils_fp4.py prepare_moe_mxfp4_layer_for_marlin, and it reads "
            f"no {MARLIN_INPUT_DTYPE}); drop the option, or convert for a vLLM --runtime, whose "
            f"{MARLIN_INPUT_DTYPE}=fp8 Marlin takes fp8 activations"
        )
    if MARLIN_INPUT_DTYPE in env_report:
        env_report[MARLIN_INPUT_DTYPE]["ignored"] = f"SGLang does not read it ({revision.name} has 16-bit Marlin only)"
    return None


def _sglang_marlin_refusal(
    ckpt, selection: Selection, revision: RuntimeRevision, geometry: Geometry, deployment: Deployment
) -> str | None:
    """Why SGLang would raise at load for this MARLIN target (its `check_moe_marlin_supports_layer`
    on the unpadded sizes, selection/sglang/mxfp4_0_5_23.py `marlin_layer_refusal`) or FLASHINFER_CUTLASS
    target (its unpadded parameters too small for the loader's slice, `cutlass_layer_refusal`), or None. Made
    here, where the checkpoint's sizes and the MoE TP size meet; the loader keeps its own check
    (runtimes/sglang/checks.py)."""
    if revision.runtime != SGLANG_RUNTIME or geometry.fmt != "mxfp4":
        return None
    if selection.backend not in MARLIN_BACKENDS | CUTLASS_BACKENDS:
        return None
    facts = ckpt.facts
    return layer_refusal(selection.backend, facts.hidden_size, facts.intermediate_size, deployment.moe_tp)


#: Upper bounds of a safetensors file's header (8-byte length, metadata, alignment) and of one
#: tensor's header entry beyond its name, so --max-shard-size bounds the whole file.
_FILE_HEADER_BOUND = 8 + 512 + 8


def _entry_bound(t: TensorPlan) -> int:
    return len(t.key.encode()) + 64 + 24 * (len(t.shape) + 2)


def _expert_rows(rp: RankPlan) -> Callable[[TensorPlan], str | None]:
    """Why a tensor of rank `rp` cannot be split into parts of whole experts (None: it can).

    Every layout stores each expert's bytes as one contiguous block, experts in order, along dim 0
    of the buffer (mxconvert/layouts/base.py; the writer relies on it too, laying a tensor out a
    chunk of experts at a time), so a buffer whose dim 0 is the rank's experts splits exactly. The
    kernel's view may span experts (TRITON's Blackwell scale view `[1, ...]`, AITER's `[E*rows,
    16]` scales): it is applied to the reassembled buffer, so it does not matter here. A buffer
    that does not start with the experts is refused rather than split along something else."""

    def reason(t: TensorPlan) -> str | None:
        if not t.shape or t.shape[0] != rp.num_experts:
            return f"its buffer {list(t.shape)} does not hold the rank's {rp.num_experts} experts along dim 0"
        return None

    return reason


def _pack_files(
    folder: str,
    tensors: list[TensorPlan],
    max_bytes: int,
    unsplittable: Callable[[TensorPlan], str | None] | None = None,
) -> list[FilePlan]:
    """Group tensors, in order, into files of at most `max_bytes` each (--max-shard-size is a hard
    limit). A tensor that fits in a file of its own is never split (it goes whole into the current
    file or the next). A larger expert tensor is split into parts of whole experts, each filling
    what is left of the current file and then whole new files (see mxconvert/parts.py); a tensor
    that cannot be split (`unsplittable` gives why; pass-through tensors are never split), or one of
    whose experts alone exceeds the limit, is refused with the smallest limit that works."""
    groups: list[list[TensorPlan]] = [[]]
    size = _FILE_HEADER_BOUND

    def add(t: TensorPlan, need: int) -> None:
        nonlocal size
        groups[-1].append(t)
        size += need

    def new_file() -> None:
        nonlocal size
        groups.append([])
        size = _FILE_HEADER_BOUND

    for t in tensors:
        need = t.nbytes + _entry_bound(t)
        if _FILE_HEADER_BOUND + need <= max_bytes:
            if groups[-1] and size + need > max_bytes:
                new_file()
            add(t, need)
            continue
        why = unsplittable(t) if unsplittable is not None else "pass-through tensors are not split"
        if why is not None:
            raise InputError(
                f"--max-shard-size {max_bytes} bytes: tensor {t.key} alone is {t.nbytes} bytes and "
                f"cannot be split into parts of whole experts ({why}); use --max-shard-size "
                f"{_FILE_HEADER_BOUND + need} or more"
            )
        rows = t.shape[0]
        row_bytes = t.nbytes // rows
        bound = _entry_bound(replace(t, key=part_key(t.key, rows - 1, rows)))  # the longest part key
        start = 0
        while start < rows:
            count = min(rows - start, max(0, (max_bytes - size - bound) // row_bytes))
            if count == 0 and groups[-1]:
                new_file()
                continue
            if count == 0:
                raise InputError(
                    f"--max-shard-size {max_bytes} bytes: one expert of tensor {t.key} is {row_bytes} "
                    f"bytes (the tensor is {t.nbytes} bytes) and an expert is not split; use "
                    f"--max-shard-size {_FILE_HEADER_BOUND + row_bytes + bound} or more"
                )
            part = TensorPlan(
                part_key(t.key, start, start + count),
                t.layer,
                t.name,
                t.dtype,
                (count, *t.shape[1:]),
                whole=t,
                rows=(start, start + count),
            )
            add(part, part.nbytes + _entry_bound(part))
            start += count
    n = len(groups)
    return [FilePlan(f"{folder}/model-{i + 1:05d}-of-{n:05d}.safetensors", tuple(g)) for i, g in enumerate(groups)]
