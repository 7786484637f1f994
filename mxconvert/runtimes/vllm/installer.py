"""One artifact, one vLLM worker: check it fits (fail closed), then hand vLLM the artifact's tensors.

`ArtifactInstaller` holds no vLLM state of its own; the model loader (loader.py) and the tests call
it in the same order:

0. the constructor        the manifest's structure and fingerprint (an edited manifest is refused);
1. `check_runtime(live)`  before the model is built: the copied files vLLM reads (config, tokenizer,
                          chat template: size and sha256, always), then vLLM version, revision,
                          platform, capability;
2. `prepare(layers)`      after vLLM built the MoE layers, before any weight is read: per layer the
                          format, the backend vLLM's oracle picked, TP/EP size and rank, padded
                          sizes, the triton_kernels generation, Marlin's activation dtype (NVFP4:
                          activation, EPLB, the checkpoint shapes vLLM allocated, the sizes vLLM
                          pads the layer to); the MoE layer set (the artifact's = the model's); then,
                          with `verify_checksums` (the default), the size of the rank's and shared/'s
                          files, and their digests start being computed in the background
                          (`FileChecks`; `false` skips this hashing, nothing else); then, per layer,
                          either "install from the artifact" (its checkpoint-shaped parameters are
                          released, never filled) or, with `on_mismatch="reconvert"` (formats with
                          exact inverses: MXFP4), once every digest matched, the canonical tensors
                          restored into them;
3. `shared_weights()`     the non-expert tensors, for vLLM's normal `model.load_weights`;
4. `conversion_bypass()`  the context in which vLLM's `process_weights_after_loading` runs
                          (install.py for MXFP4, install_nvfp4.py for NVFP4, which also checks the
                          `g1_scale_c` vLLM computes against the artifact's). The layers' kernel
                          tensors are read ahead of it on all cores (artifact/prefetch.py), at most
                          `prefetch_bytes` of host memory ahead (4 GiB; 0: each read when asked),
                          starting once every check of 2 but the digests passed, while the digests
                          are computed. Leaving the context stops the reads and waits for the
                          digests: a file that differs raises its `MismatchError` there, before
                          vLLM gets the model back (`finish`); on a failure inside it, the digests'
                          verdict is raised in its place where a file differs (a corrupted header
                          or tensor is best explained by the file's digest).

What differs per checkpoint format is a row of a table keyed by `target.format`: `INSTALLS` here (the
tensors read, how the checkpoint-shaped parameters are released, the conversion bypass) and
`FORMAT_CHECKS` in checks.py (the format's own checks, whether `on_mismatch=reconvert` applies).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from mxconvert.artifact import loader
from mxconvert.artifact.checksums import FileChecks
from mxconvert.artifact.loader import check_rank_layouts, rank_entry
from mxconvert.artifact.manifest import MANIFEST_NAME, check_fingerprint, read_manifest
from mxconvert.artifact.manifest_schema import refuse_ambiguous_parallel
from mxconvert.artifact.prefetch import Prefetcher
from mxconvert.core.errors import InputError, MismatchError
from mxconvert.core.parallel import default_jobs
from mxconvert.runtimes.common.layer_source import LayerSource
from mxconvert.runtimes.common.load_overlap import (
    CHECK_NICE,
    PREFETCH_BYTES,
    abort_load,
    check_threads,
    checked_prefetch_bytes,
    finish_load,
)
from mxconvert.runtimes.common.mismatch import check_layer_set
from mxconvert.runtimes.vllm.checks import (
    FORMAT_CHECKS,
    NOT_RECONVERTIBLE,
    ArtifactMismatch,
    LiveLayer,
    LiveRuntime,
    Mismatch,
    artifact_format,
    layer_mismatches,
    rank_mismatch,
    refusal,
    runtime_mismatches,
)
from mxconvert.runtimes.vllm.install import EXPERT_NAMES, bypass_conversion, release_checkpoint_params
from mxconvert.runtimes.vllm.install_nvfp4 import NVFP4_NAMES, bypass_nvfp4_conversion, release_nvfp4_params
from mxconvert.runtimes.vllm.reconvert import canonical_tensors, fill_parameter

logger = logging.getLogger("mxconvert.runtimes.vllm")

ON_MISMATCH = ("fail", "reconvert")
#: Which layer the artifact has tensors for (`None`: vLLM's own conversion runs for it).
Sources = Callable[[torch.nn.Module], LayerSource | None]


@dataclass(frozen=True)
class FormatInstall:
    """How one checkpoint format's expert tensors get from the artifact into vLLM's layers."""

    #: the kernel tensors of a layer the plugin reads from the artifact
    names: tuple[str, ...]
    #: drops the memory of the checkpoint-shaped parameters vLLM allocated for a layer (never filled)
    release: Callable[[torch.nn.Module], None]
    #: the context in which vLLM's `process_weights_after_loading` takes the artifact's tensors
    bypass: Callable[[Sources], AbstractContextManager]


#: The checkpoint formats the plugin installs, by `target.format` of the manifest.
INSTALLS: dict[str, FormatInstall] = {
    "mxfp4": FormatInstall(EXPERT_NAMES, release_checkpoint_params, bypass_conversion),
    "nvfp4": FormatInstall(NVFP4_NAMES, release_nvfp4_params, bypass_nvfp4_conversion),
}
FORMATS = tuple(INSTALLS)


def check_copied_files(root: Path, manifest: dict) -> None:
    """The files copied from the source that vLLM reads as the model's configuration (config,
    generation config, tokenizer, chat template: the manifest's `aux_files`): size and sha256, as
    `load_artifact` and `mxconvert verify` check them. Small, so checked whatever
    `verify_checksums` says."""
    loader.check_copied_files(root, manifest)


class ArtifactInstaller:
    def __init__(
        self,
        root: str | Path,
        on_mismatch: str = "fail",
        verify_checksums: bool = True,
        prefetch_bytes: int = PREFETCH_BYTES,
    ):
        if on_mismatch not in ON_MISMATCH:
            raise InputError(f"model_loader_extra_config on_mismatch={on_mismatch!r}: expected one of {ON_MISMATCH}")
        checked_prefetch_bytes(prefetch_bytes)
        self.root = Path(root)
        self.on_mismatch = on_mismatch
        self.verify_checksums = verify_checksums
        self.prefetch_bytes = prefetch_bytes
        self.reads: Prefetcher | None = None
        #: the digests of the rank's and shared/'s files, computed from `prepare` to `finish`
        self.checks: FileChecks | None = None
        #: inside `conversion_bypass`, whose end waits for the digests (`finish`)
        self.bypassing = False
        self.manifest = read_manifest(self.root)
        check_fingerprint(self.manifest, self.root)  # a tampered manifest is refused before anything
        refuse_ambiguous_parallel(self.manifest, str(self.root / MANIFEST_NAME))  # --dp's old meaning
        self.target = self.manifest["target"]
        self.live: LiveRuntime | None = None
        self.runtime_problems: list[Mismatch] = []
        self.sources: dict[int, LayerSource] = {}
        self.reconverted: dict[str, list[Mismatch]] = {}

    @property
    def where(self) -> str:
        return str(self.root / MANIFEST_NAME)

    # ---- 1 ------------------------------------------------------------------------------------
    def check_runtime(self, live: LiveRuntime) -> None:
        check_copied_files(self.root, self.manifest)
        self.live = live
        problems = runtime_mismatches(self.target, live)
        hard = [m for m in problems if m.field in NOT_RECONVERTIBLE]
        if self.fmt not in FORMATS:
            raise ArtifactMismatch(
                f"{self.where}: a {self.fmt} artifact; this vLLM plugin installs {' and '.join(FORMATS)} artifacts. "
                "Load the checkpoint with vLLM's own loader, or use mxconvert.load_artifact in your own integration.",
                [Mismatch("format", self.fmt, " / ".join(FORMATS))],
            )
        if hard or (problems and not self.reconverts):
            raise refusal(self.where, problems, self.manifest, live, None)
        self.runtime_problems = problems

    @property
    def fmt(self) -> str:
        return artifact_format(self.target)

    @property
    def reconverts(self) -> bool:
        """on_mismatch=reconvert, for a format whose every kernel tensor has an exact inverse (MXFP4)."""
        return self.on_mismatch == "reconvert" and FORMAT_CHECKS[self.fmt].no_reconvert is None

    # ---- 2 ------------------------------------------------------------------------------------
    def prepare(self, layers: list[tuple[str, torch.nn.Module, LiveLayer]]) -> None:
        assert self.live is not None, "check_runtime first"
        if not layers:
            raise ArtifactMismatch(
                f"{self.where}: the model vLLM built has no MXFP4 or NVFP4 MoE layer to install the artifact into", []
            )
        problems: dict[str, list[Mismatch]] = {}
        for prefix, _module, live_layer in layers:
            found = layer_mismatches(self.target, live_layer, self.live)
            bad_rank = rank_mismatch(self.manifest, live_layer)  # or its experts
            if bad_rank is not None:
                found.append(bad_rank)
            elif live_layer.fmt == self.fmt:  # the format's own checks against the rank's entry
                found += FORMAT_CHECKS[self.fmt].rank(rank_entry(self.manifest, live_layer.rank, self.root), live_layer)
            if found or self.runtime_problems:
                problems[prefix] = self.runtime_problems + found
        rank = layers[0][2].rank
        if problems:
            every = [m for found in problems.values() for m in found]
            hard = [m for m in every if m.field in NOT_RECONVERTIBLE]
            if hard or not self.reconverts:
                raise refusal(self.where, _unique(every), self.manifest, self.live, layers[0][2])
        entry = rank_entry(self.manifest, rank, self.root)
        check_rank_layouts(
            self.manifest, entry, self.root
        )  # descriptors the sealed target gives, not the manifest's word
        check_layer_set(self.where, entry, [prefix for prefix, _, _ in layers], "vLLM")
        if self.verify_checksums:  # every size and path now; the digests while the tensors are read
            self.checks = FileChecks(
                self.root, entry["files"] + self.manifest["shared"]["files"], check_threads(), nice=CHECK_NICE
            )
        try:
            self._install(layers, entry, problems)
        except BaseException as exc:
            self.abort(exc)
            raise

    def _install(self, layers: list[tuple[str, torch.nn.Module, LiveLayer]], entry: dict, problems: dict) -> None:
        if problems and self.checks is not None:  # the inverses read the artifact: its digests first
            self.checks.check()
        install = INSTALLS[self.fmt]
        sources = []
        for prefix, module, _live in layers:
            if prefix in problems:
                self._reconvert(prefix, module, entry, problems[prefix])
            else:
                install.release(module)
                sources.append((module, LayerSource(self.root, entry, prefix, self.target, install.names)))
        order = [ref for _, source in sources for ref in source.refs()] if self.prefetch_bytes else []
        self.reads = Prefetcher(self.root, order, self.prefetch_bytes, default_jobs())
        for module, source in sources:
            source.prefetch = self.reads
            self.sources[id(module)] = source

    def finish(self) -> None:
        """After vLLM processed every layer: stop reading ahead and wait for the digests, raising the
        `MismatchError` of the first file that differs (nothing read from the artifact may be used
        then); log what the reads and the checks took (runtimes/common/load_overlap.py)."""
        checks, self.checks = self.checks, None
        finish_load(self.reads, checks, self.prefetch_bytes, logger, "vLLM")

    def abort(self, error: BaseException) -> None:
        """After a failure while the artifact was read or installed (`error`): stop reading and
        hashing and, where a file's digest differs, raise that instead (the cause a corrupted header
        or tensor has; `error` becomes its `__cause__`); else return, for the caller to re-raise
        `error`. An interrupt does not wait for the digests. Idempotent."""
        checks, self.checks = self.checks, None
        abort_load(self.reads, checks, error)

    def _reconvert(self, prefix: str, module: torch.nn.Module, entry: dict, found: list[Mismatch]) -> None:
        logger.warning(
            "mxconvert: %s: the artifact does not match this worker (%s); restoring the checkpoint "
            "tensors through mxconvert's exact inverses and running vLLM's own conversion",
            prefix,
            "; ".join(m.line() for m in found),
        )
        for name, tensor in canonical_tensors(self.root, self.target, entry, prefix).items():
            param = getattr(module, name, None)
            if param is None:
                raise MismatchError(f"{prefix}: the live layer has no parameter {name}")
            fill_parameter(param, tensor, f"{prefix}.{name}")
        self.reconverted[prefix] = found

    # ---- 3, 4 ---------------------------------------------------------------------------------
    def shared_files(self) -> list[str]:
        return [str(self.root / f["file"]) for f in self.manifest["shared"]["files"]]

    def source_for(self, layer: torch.nn.Module) -> LayerSource | None:
        return self.sources.get(id(layer))

    @contextmanager
    def conversion_bypass(self) -> Iterator[None]:
        self.bypassing = True
        try:
            with INSTALLS[self.fmt].bypass(self.source_for):
                yield
        except BaseException as exc:
            self.abort(exc)
            raise
        finally:
            self.bypassing = False
        self.finish()


def _unique(mismatches: list[Mismatch]) -> list[Mismatch]:
    seen, out = set(), []
    for m in mismatches:
        key = (m.field, repr(m.artifact), repr(m.live))
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def iter_shared(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Fallback reader of the shared tensors (vLLM's own iterator is used by the loader)."""
    from safetensors import safe_open

    for path in files:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)
