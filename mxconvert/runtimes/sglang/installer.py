"""One artifact, one SGLang scheduler process: check it fits (fail closed), then stand in for
SGLang's MoE post-processing with the artifact's tensors.  No SGLang import (loader.py has those).

The loader (loader.py) and the tests call it in this order, as the vLLM plugin calls its
`ArtifactInstaller` (runtimes/vllm/installer.py; the generic pieces are the same functions):

0. the constructor        the manifest's structure and fingerprint (an edited manifest is refused),
                          and a `--dp` artifact of the old meaning is refused;
1. `check_runtime(live)`  before the model is built: the copied files SGLang reads (config,
                          tokenizer, chat template: size and sha256), then the artifact's runtime row
                          and the live SGLang release, platform, capability, FlashInfer release;
2. `prepare(layers)`      after SGLang built the MoE layers, before any weight is read: per layer the
                          backend SGLang's `Mxfp4MoEMethod` took, TP/EP size and rank, padded sizes,
                          fused shared experts, gate/up interleave, all2all backend; the MoE layer
                          set (the artifact's = the model's); each expert tensor's dtype and shape
                          (the artifact's = what SGLang's post-processing makes of the parameter it
                          allocated); the layout descriptors the sealed target gives; then, with
                          `verify_checksums` (the default), size and path of the rank's and
                          shared/'s files, and their digests: checked here and now, or with
                          `prepare(layers, overlapped=True)` (the loader) computed from here on in
                          the background while the tensors are read (ahead, `prefetch_bytes`) and
                          checked by `finish`. Only then are the checkpoint-shaped parameters released;
3. `shared_files()`       the non-expert tensors, for SGLang's own `model.load_weights`;
4. `postprocess(module, method)` in place of `method.process_weights_after_loading(module)`: the
                          artifact's tensors for its layers (install.py), SGLang's own
                          post-processing for every other module;
5. `finish()`             after the last `postprocess`, before the model goes back to SGLang: stop
                          reading ahead and wait for the digests (an overlapped `prepare`), raising
                          the first differing file's `MismatchError`; on any failure from `prepare`
                          on, `abort(error)` instead (runtimes/common/load_overlap.py, the vLLM
                          plugin's own code: docs/vllm-plugin.md, "Loader options").

Refusals are `ArtifactMismatch` (exit 1 under the CLI's codes): each names the field, both values
and the `mxconvert convert` command that fits (checks.py). There is no `on_mismatch=reconvert` here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mxconvert.artifact.checksums import FileChecks
from mxconvert.artifact.loader import check_copied_files, check_files, check_rank_layouts, rank_entry
from mxconvert.artifact.manifest import MANIFEST_NAME, check_fingerprint, read_manifest
from mxconvert.artifact.manifest_schema import refuse_ambiguous_parallel
from mxconvert.artifact.prefetch import Prefetcher
from mxconvert.core.errors import InputError
from mxconvert.core.parallel import default_jobs
from mxconvert.layouts.nvfp4_scales import CT_W4A4_CUTLASS_ACTIVATION_SCALE, CT_W4A4_TRTLLM_ACTIVATION_SCALE
from mxconvert.runtimes.common.layer_source import LayerSource
from mxconvert.runtimes.common.load_overlap import (
    CHECK_NICE,
    PREFETCH_BYTES,
    abort_load,
    check_threads,
    checked_prefetch_bytes,
    finish_load,
)
from mxconvert.runtimes.common.mismatch import ArtifactMismatch, Mismatch, artifact_format, check_layer_set
from mxconvert.runtimes.sglang.checks import (
    LiveSglang,
    SglangLayer,
    layer_mismatches,
    rank_mismatch,
    refusal,
    runtime_mismatches,
)
from mxconvert.runtimes.sglang.install import (
    AITER,
    AITER_DTYPES,
    CUTLASS_DTYPES,
    CUTLASS_SM90,
    CUTLASS_SM120,
    MARLIN_DTYPES,
    SGLANG_NAMES,
    TRTLLM_DTYPES,
    aiter_refusal,
    checkpoint_device,
    checkpoint_shapes,
    cutlass_shapes,
    install_aiter,
    install_cutlass,
    install_marlin,
    install_trtllm_sm100,
    marlin_shapes,
    release_checkpoint_params,
    sglang_gu_interleave_env,
)
from mxconvert.runtimes.sglang.install_nvfp4 import (
    NVFP4_CT_CUTLASS_NAMES,
    NVFP4_CUTEDSL_NAMES,
    NVFP4_CUTLASS_NAMES,
    NVFP4_MARLIN_NAMES,
    NVFP4_TRTLLM_NAMES,
    install_nvfp4_ct_cutlass,
    install_nvfp4_ct_marlin,
    install_nvfp4_cutedsl,
    install_nvfp4_cutlass,
    install_nvfp4_marlin,
    install_nvfp4_trtllm,
    nvfp4_ct_cutlass_specs,
    nvfp4_ct_device,
    nvfp4_ct_scheme,
    nvfp4_cutedsl_specs,
    nvfp4_cutlass_specs,
    nvfp4_marlin_specs,
    nvfp4_specs,
    release_nvfp4_params,
)
from mxconvert.runtimes.sglang.install_nvfp4_ct_trtllm import (
    NVFP4_CT_TRTLLM_NAMES,
    install_nvfp4_ct_trtllm,
    nvfp4_ct_trtllm_specs,
)

#: The NVFP4 backends the SGLang loader installs (install_nvfp4.py).
NVFP4_INSTALLED = ("FLASHINFER_TRTLLM", "MARLIN", "FLASHINFER_CUTLASS", "FLASHINFER_CUTEDSL")
#: The MXFP4 FlashInfer CUTLASS backends (SM90, SM120; install.py `install_cutlass`).
CUTLASS_INSTALLED = (CUTLASS_SM90, CUTLASS_SM120)

logger = logging.getLogger("mxconvert.runtimes.sglang")

#: `--model-loader-extra-config` keys the loader reads (SGLang's DefaultModelLoader gets the rest).
OWN_KEYS = ("verify_checksums", "prefetch_bytes")


class SglangArtifactInstaller:
    def __init__(
        self,
        root: str | Path,
        verify_checksums: bool = True,
        marlin_workspace: Callable[..., torch.Tensor] | None = None,
        nvfp4_dispatch: Callable[[], bool] | None = None,
        aiter_gu_interleave: Callable[[], bool] | None = None,
        *,
        prefetch_bytes: int = PREFETCH_BYTES,
    ):
        """`marlin_workspace`: SGLang's `marlin_make_workspace` (marlin_utils.py), which a MARLIN
        install calls as SGLang's post-processing does (loader.py passes it). `prefetch_bytes`: how far
        an overlapped `prepare` reads the expert tensors ahead of `postprocess` (0: each when asked)."""
        self.root = Path(root)
        self.verify_checksums = verify_checksums
        self.prefetch_bytes = checked_prefetch_bytes(prefetch_bytes)
        #: an overlapped `prepare`'s read-ahead and digests, until `finish` / `abort`
        self.reads: Prefetcher | None = None
        self.checks: FileChecks | None = None
        self.marlin_workspace = marlin_workspace
        self.manifest = read_manifest(self.root)
        check_fingerprint(self.manifest, self.root)  # a tampered manifest is refused before anything
        refuse_ambiguous_parallel(self.manifest, self.where)
        self.target = self.manifest["target"]
        self.live: LiveSglang | None = None
        self.sources: dict[int, LayerSource] = {}
        self.format = artifact_format(self.target)
        #: SGLang's `_use_nvfp4_dispatch` (modelopt_quant.py), for an NVFP4 install (loader.py passes it)
        self.nvfp4_dispatch: Callable[[], bool] = nvfp4_dispatch or (lambda: False)
        #: SGLang's `envs.SGLANG_USE_AITER_MOE_GU_ITLV.get()`, for an AITER install (install.py)
        self.aiter_gu_interleave: Callable[[], bool] = aiter_gu_interleave or sglang_gu_interleave_env

    @property
    def where(self) -> str:
        return str(self.root / MANIFEST_NAME)

    # ---- 1 ------------------------------------------------------------------------------------
    def check_runtime(self, live: LiveSglang) -> None:
        check_copied_files(self.root, self.manifest)
        fmt = artifact_format(self.target)
        if fmt not in ("mxfp4", "nvfp4") or (fmt == "nvfp4" and self.target.get("backend") not in NVFP4_INSTALLED):
            raise ArtifactMismatch(
                f"{self.where}: a {fmt} {self.target.get('backend')} artifact; the SGLang loader installs GPT-OSS "
                "MXFP4 and NVFP4 FLASHINFER_TRTLLM / MARLIN / FLASHINFER_CUTLASS / FLASHINFER_CUTEDSL artifacts only. "
                "Serve the checkpoint with SGLang's own loader.",
                [
                    Mismatch(
                        "format, backend",
                        f"{fmt}, {self.target.get('backend')}",
                        "mxfp4 / nvfp4 FLASHINFER_TRTLLM, MARLIN, FLASHINFER_CUTLASS, FLASHINFER_CUTEDSL",
                    )
                ],
            )
        self.format = fmt
        problems = runtime_mismatches(self.target, live)
        if problems:
            raise refusal(self.where, problems, self.manifest, live, None)
        self.live = live

    # ---- 2 ------------------------------------------------------------------------------------
    def prepare(self, layers: list[tuple[str, torch.nn.Module, SglangLayer]], overlapped: bool = False) -> None:
        """Every check before any weight is read, then the checkpoint-shaped parameters released.

        The digests (`verify_checksums`): with `overlapped` false, checked here before anything is
        released or read (`check_files`: a caller that never calls `finish` gets them checked all the
        same). With `overlapped` (the loader), every size and path is checked here, the digests are
        computed from here on beside the reads and the tensors are read ahead in install order, and
        the caller promises `finish()` before SGLang gets the model back, `abort(error)` on a failure.
        """
        if self.live is None:
            raise InputError("SglangArtifactInstaller.prepare before check_runtime (a bug in the caller)")
        if not layers:
            kind = "NVFP4" if self.format == "nvfp4" else "GPT-OSS MXFP4"
            raise ArtifactMismatch(f"{self.where}: the model SGLang built has no {kind} MoE layer", [])
        problems: list[Mismatch] = []
        for _prefix, _module, live_layer in layers:
            problems += layer_mismatches(self.target, live_layer)
            bad_rank = rank_mismatch(self.manifest, live_layer)
            if bad_rank is not None:
                problems.append(bad_rank)
        if problems:
            raise refusal(self.where, _unique(problems), self.manifest, self.live, layers[0][2])
        ranks = {live_layer.rank for _, _, live_layer in layers}
        if len(ranks) != 1:
            raise InputError(f"{self.where}: the MoE layers of one process report ranks {sorted(ranks)}")
        entry = rank_entry(self.manifest, ranks.pop(), self.root)
        check_rank_layouts(self.manifest, entry, self.root)  # descriptors the sealed target gives
        check_layer_set(self.where, entry, [prefix for prefix, _, _ in layers], "SGLang")
        for prefix, module, live_layer in layers:
            self._check_tensor_shapes(entry, prefix, module, live_layer)
        files = entry["files"] + self.manifest["shared"]["files"]
        if self.verify_checksums and not overlapped:
            check_files(self.root, files)
        elif self.verify_checksums:  # every size and path now; the digests while the tensors are read
            self.checks = FileChecks(self.root, files, check_threads(), nice=CHECK_NICE)
        try:
            self._release(layers, entry, overlapped)
        except BaseException as exc:
            self.abort(exc)
            raise

    def _release(self, layers: list[tuple[str, torch.nn.Module, SglangLayer]], entry: dict, overlapped: bool) -> None:
        """Release the checkpoint-shaped parameters and note each layer's source; overlapped, read the
        layers' tensors ahead in install order (`postprocess` is called in SGLang's module order,
        the order `layers` has: both `named_modules`)."""
        names = tuple(SGLANG_NAMES.values())
        if self.format == "nvfp4":
            names = {
                "MARLIN": NVFP4_MARLIN_NAMES,
                "FLASHINFER_CUTLASS": NVFP4_CUTLASS_NAMES,
                "FLASHINFER_CUTEDSL": NVFP4_CUTEDSL_NAMES,
            }.get(str(self.target.get("backend")), NVFP4_TRTLLM_NAMES)
            if self.target.get("layout", {}).get("activation_scale") == CT_W4A4_CUTLASS_ACTIVATION_SCALE:
                names = NVFP4_CT_CUTLASS_NAMES  # a compressed-tensors W4A4 CUTLASS artifact (its own scalars)
            if self.target.get("layout", {}).get("activation_scale") == CT_W4A4_TRTLLM_ACTIVATION_SCALE:
                names = NVFP4_CT_TRTLLM_NAMES  # a compressed-tensors W4A4 TRT-LLM artifact (its own scalars)
        for prefix, module, _live in layers:
            (release_nvfp4_params if self.format == "nvfp4" else release_checkpoint_params)(module)
            self.sources[id(module)] = LayerSource(self.root, entry, prefix, self.target, names)
        if not overlapped:
            return
        sources = [self.sources[id(module)] for _, module, _ in layers]
        order = [ref for source in sources for ref in source.refs()] if self.prefetch_bytes else []
        self.reads = Prefetcher(self.root, order, self.prefetch_bytes, default_jobs())
        for source in sources:
            source.prefetch = self.reads

    def finish(self) -> None:
        """After SGLang's post-processing loop, before the model goes back to SGLang: stop reading
        ahead and wait for the digests of an overlapped `prepare`, raising the `MismatchError` of the
        first file that differs (nothing read from the artifact may be used then); log what the reads
        and the checks took. Nothing to do after a synchronous `prepare`."""
        checks, self.checks = self.checks, None
        finish_load(self.reads, checks, self.prefetch_bytes, logger, "SGLang")

    def abort(self, error: BaseException) -> None:
        """After a failure while the artifact was read or installed (`error`): stop reading and
        hashing and, where a file's digest differs, raise that instead (`error` becomes its
        `__cause__`); else return, for the caller to re-raise `error`. Idempotent."""
        checks, self.checks = self.checks, None
        abort_load(self.reads, checks, error)

    def _check_tensor_shapes(self, entry: dict, prefix: str, module: torch.nn.Module, live_layer: SglangLayer) -> None:
        """Each tensor the artifact holds for the layer has the dtype and shape SGLang's post-processing
        for the layer's backend gives the parameter it allocated (install.py: TRT-LLM keeps the
        allocated shapes, `TRTLLM_DTYPES`; MARLIN repacks, `marlin_shapes`, `MARLIN_DTYPES`)."""
        if self.format == "nvfp4":
            specs = {
                "MARLIN": nvfp4_marlin_specs,
                "FLASHINFER_CUTLASS": nvfp4_cutlass_specs,
                "FLASHINFER_CUTEDSL": nvfp4_cutedsl_specs,
            }.get(live_layer.backend, nvfp4_specs)
            if nvfp4_ct_scheme(module) is not None and live_layer.backend == "FLASHINFER_CUTLASS":
                specs = nvfp4_ct_cutlass_specs  # CompressedTensorsW4A4Nvfp4MoE's CUTLASS branch
            if nvfp4_ct_scheme(module) is not None and live_layer.backend == "FLASHINFER_TRTLLM":
                specs = nvfp4_ct_trtllm_specs  # CompressedTensorsW4A4Nvfp4MoE's TRT-LLM branch
            wanted = dict(specs(module))
            by_name = {name: name for name in wanted}
        else:
            shapes = checkpoint_shapes(module)
            dtypes = TRTLLM_DTYPES
            if live_layer.backend == "MARLIN":
                shapes, dtypes = marlin_shapes(shapes), MARLIN_DTYPES
            elif live_layer.backend in CUTLASS_INSTALLED:
                shapes, dtypes = cutlass_shapes(shapes, live_layer.backend), CUTLASS_DTYPES
            elif live_layer.backend == AITER:  # create_weights allocated the padded sizes (install.py)
                dtypes = AITER_DTYPES
                why = aiter_refusal(module, self.aiter_gu_interleave())
                if why is not None:
                    assert self.live is not None
                    found_aiter = [Mismatch("AITER a16w4 shuffle (SGLang would make other bytes)", True, why)]
                    raise refusal(self.where, found_aiter, self.manifest, self.live, live_layer)
            wanted = {n: (dtypes[n], shapes[n]) for n in SGLANG_NAMES}
            by_name = SGLANG_NAMES
        found = []
        for sglang_name, name in by_name.items():
            info = entry["tensors"].get(f"{prefix}.{name}")
            held = (info["dtype"], list(info["shape"])) if info else None
            dtype, shape = wanted[sglang_name]
            want = (str(dtype).removeprefix("torch."), list(shape))
            if held != want:
                found.append(Mismatch(f"{sglang_name} dtype, shape", held, want, f"layer {prefix}"))
        if found:
            assert self.live is not None
            raise refusal(self.where, found, self.manifest, self.live, live_layer)

    # ---- 3, 4 ---------------------------------------------------------------------------------
    def shared_files(self) -> list[str]:
        return [str(self.root / f["file"]) for f in self.manifest["shared"]["files"]]

    def holds(self, module: torch.nn.Module) -> bool:
        return id(module) in self.sources

    def postprocess(self, module: torch.nn.Module, method: Any) -> None:
        """`method.process_weights_after_loading(module)`, or for a layer of the artifact the
        artifact's tensors with the state SGLang's post-processing for the artifact's backend sets
        (install.py; `prepare` checked the layer's backend is the artifact's)."""
        source = self.sources.get(id(module))
        if source is None:
            method.process_weights_after_loading(module)
            return
        if (
            self.format == "nvfp4"
            and nvfp4_ct_scheme(module) is not None
            and self.target.get("backend") == "FLASHINFER_CUTLASS"
        ):
            # compressed-tensors NVFP4 W4A4 (CompressedTensorsW4A4Nvfp4MoE's CUTLASS branch; `prepare` checked it)
            install_nvfp4_ct_cutlass(module, source.read(nvfp4_ct_device(module)))
            logger.debug("mxconvert: %s installed from %s", source.prefix, self.root)
            return
        if (
            self.format == "nvfp4"
            and nvfp4_ct_scheme(module) is not None
            and self.target.get("backend") == "FLASHINFER_TRTLLM"
        ):
            # compressed-tensors NVFP4 W4A4 (CompressedTensorsW4A4Nvfp4MoE's TRT-LLM branch; `prepare` checked it)
            install_nvfp4_ct_trtllm(module, source.read(nvfp4_ct_device(module)))
            logger.debug("mxconvert: %s installed from %s", source.prefix, self.root)
            return
        if self.format == "nvfp4" and nvfp4_ct_scheme(module) is not None:
            # compressed-tensors NVFP4 (CompressedTensorsW4A16Nvfp4MoE; `prepare` checked it is MARLIN)
            if self.marlin_workspace is None:
                raise InputError("a MARLIN install needs SGLang's marlin_make_workspace (a bug in the caller)")
            install_nvfp4_ct_marlin(module, source.read(nvfp4_ct_device(module)), self.marlin_workspace)
            logger.debug("mxconvert: %s installed from %s", source.prefix, self.root)
            return
        # CuTe DSL: the dense swizzled scales, of which the install makes FlashInfer's MMA views itself
        cutedsl = self.format == "nvfp4" and self.target.get("backend") == "FLASHINFER_CUTEDSL"
        tensors = source.read(checkpoint_device(module), as_buffer=cutedsl)
        if self.format == "nvfp4" and self.target.get("backend") == "FLASHINFER_CUTLASS":
            install_nvfp4_cutlass(module, tensors, self.nvfp4_dispatch)
        elif self.format == "nvfp4" and self.target.get("backend") == "FLASHINFER_CUTEDSL":
            install_nvfp4_cutedsl(module, tensors, self.nvfp4_dispatch)
        elif self.format == "nvfp4" and self.target.get("backend") != "MARLIN":
            install_nvfp4_trtllm(module, tensors, self.nvfp4_dispatch)
        elif self.target.get("backend") == "MARLIN":
            if self.marlin_workspace is None:
                raise InputError("a MARLIN install needs SGLang's marlin_make_workspace (a bug in the caller)")
            (install_nvfp4_marlin if self.format == "nvfp4" else install_marlin)(module, tensors, self.marlin_workspace)
        elif self.target.get("backend") in CUTLASS_INSTALLED:
            install_cutlass(module, tensors, self.target["backend"])
        elif self.target.get("backend") == AITER:
            install_aiter(module, tensors, self.aiter_gu_interleave())
        else:
            install_trtllm_sm100(module, tensors)
        logger.debug("mxconvert: %s installed from %s", source.prefix, self.root)


def _unique(mismatches: list[Mismatch]) -> list[Mismatch]:
    seen, out = set(), []
    for m in mismatches:
        key = (m.field, repr(m.artifact), repr(m.live))
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out
