"""What SGLang's mirrors (mxfp4_0_5_23, nvfp4_0_5_23) share: the bookkeeping of one walk down SGLang's
chain of tests, and the `mxconvert backends` rows of an SGLang row.

SGLang has no priority list to run through the selection engine (selection/engine.py): each mirror
walks SGLang's own branches in order, noting every one it passes over with SGLang's reason, so the
report reads like vLLM's (docs/sglang.md, "Selection").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mxconvert.core.errors import InputError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.report import Considered, Selection, SelectionRefused
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision


class Walk:
    """The bookkeeping of one selection: every branch passed over, then the chosen one."""

    def __init__(self, profile: DeviceProfile, revision: RuntimeRevision, requested: str) -> None:
        self.profile, self.revision, self.requested = profile, revision, requested
        self.considered: list[Considered] = []

    def note(self, backend: Mxfp4Backend | Nvfp4Backend, kernel: str, reason: str) -> None:
        """A branch SGLang passes over here, with its reason."""
        self.considered.append(Considered(backend, kernel, False, reason))

    def selection(
        self, backend: Mxfp4Backend | Nvfp4Backend, kernel: str, reason: str, activation: str, **fields: Any
    ) -> Selection:
        """The chosen branch, last in the report; `fields` are the format's own `Selection` fields."""
        self.considered.append(Considered(backend, kernel, True, reason))
        return Selection(
            backend=backend,
            kernel_class=kernel,
            requested=self.requested,
            revision=self.revision.name,
            profile=self.profile.name,
            activation=activation,
            considered=tuple(self.considered),
            **fields,
        )

    def refuse(self, head: str) -> SelectionRefused:
        """No branch applies (or not the requested one): every branch passed over, with its reason."""
        lines = [f"  - {c.backend.value} [{c.kernel_class}]: {c.reason}" for c in self.considered]
        where_ = f"profile {self.profile.name} ({self.profile.summary()}) under {self.revision.name}"
        return SelectionRefused(
            f"{head} on {where_}" + (":\n" + "\n".join(lines) if lines else ""), tuple(self.considered)
        )


def parallel_refusal(deployment: Deployment, runtime: str) -> InputError | None:
    """Why mxconvert's parallel options (vLLM's vocabulary: `--tp`, `--ep` / `--enable-expert-parallel`,
    `--dp`; selection/deployment.py) have no SGLang deployment here, or None.

    SGLang 0.5.23's sizes (server_args `--tp-size`, `--ep-size`; runtime_context.py
    `derive_parallel_widths`: moe_tp_size = tp_size // ep_size // moe_dp_size) map from them as
    `--tp T` -> `--tp-size T` and `--ep T` (or `--tp T --enable-expert-parallel`) -> `--tp-size T
    --ep-size T` (MoE TP 1), what `mxconvert convert` writes. vLLM's `--dp D` widens the MoE's TP group
    to T x D ranks; SGLang's `--dp-size` runs replicas (or attention DP) and never does, and its
    `--moe-dp-size` is not mirrored, so `--dp` is refused rather than given a meaning SGLang lacks
    (docs/sglang.md, "Expert parallelism")."""
    if deployment.dp > 1:
        return InputError(
            f"--dp {deployment.dp} has no {runtime} meaning: vLLM's --data-parallel-size widens the MoE's TP group, "
            "SGLang's --dp-size runs replicas (or attention DP) and does not, and its --moe-dp-size is not mirrored; "
            "give SGLang's sizes instead: --tp T for its --tp-size T, and --ep T (or --tp T --enable-expert-parallel) "
            'for --tp-size T --ep-size T (docs/sglang.md, "Expert parallelism")'
        )
    return None


def ep_refusal(
    walk: Walk,
    chosen: Selection,
    ep: int,
    ep_backends: frozenset,
    refused: Mapping[Mxfp4Backend | Nvfp4Backend, str],
    runtime: str,
    kind: str = "",
) -> Selection:
    """`chosen` where SGLang's path for it runs with `ep` and mxconvert writes its EP artifact
    (`ep_backends`), else the walk refused with the reason (`refused`, or a default): the chosen branch
    turns into a passed-over one. `kind` names the format in the refusal ("NVFP4 ", or "" for MXFP4)."""
    if ep == 1 or chosen.backend in ep_backends:
        return chosen
    last = walk.considered.pop()
    default = f"expert parallelism (ep {ep}) is not mirrored for {chosen.backend.value} under {runtime}"
    why = refused.get(chosen.backend, default)
    walk.note(chosen.backend, last.kernel_class or "", f"{last.reason}; but {why}")
    mirrored = ", ".join(sorted(b.value for b in ep_backends))
    raise walk.refuse(f"expert parallelism is mirrored for {kind}{mirrored} only, not {chosen.backend.value},")


def backend_rows(
    fmt: str,
    revision: RuntimeRevision,
    profiles: tuple[DeviceProfile, ...],
    runner_backends: Mapping[str, tuple[Mxfp4Backend | Nvfp4Backend, ...]],
    pick_auto: Callable[[DeviceProfile], Selection],
) -> list[dict]:
    """`mxconvert backends` rows of an SGLang row for `fmt`: each backend, the `--moe-runner-backend`
    name that reaches it (`runner_backends`) and the profiles on which "auto" picks it (`pick_auto`,
    the format's usual model on one GPU). The release is under "sglang" (vLLM rows carry theirs under
    "vllm")."""
    chosen: dict[str, list[str]] = {}
    for profile in profiles:
        try:
            picked = pick_auto(profile)
        except (InputError, SelectionRefused):
            continue
        chosen.setdefault(picked.backend.value, []).append(profile.name)
    return [
        {
            "format": fmt,
            "revision": revision.name,
            "sglang": revision.versions,
            "backend": backend.value,
            "moe_backend": name,
            "selected_on": chosen.get(backend.value, []),
        }
        for name, backends in runner_backends.items()
        for backend in backends
    ]
