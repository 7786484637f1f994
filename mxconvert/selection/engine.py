"""The shared selection engine: kernel classes and their predicates, priority lists with their
modifiers, env overrides, and the bookkeeping of one run (`Run`) that records why every backend
was passed over.

A vLLM oracle is data for this engine (a `SelectionStyle`: priority list, modifiers, kernel-class
table, names, env variables) plus its control flow (one `select(run)` function per oracle module).
`is_supported` walks a class's predicates in the order of vLLM 0.33.0's
``FusedMoEExperts.is_supported_config`` (vllm/model_executor/layers/fused_moe/modular_kernel.py).
See docs/architecture.md, "Selection".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.report import Considered, Selection, SelectionRefused
from mxconvert.target.backends import Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision


@dataclass(frozen=True)
class Context:
    """What a predicate may look at: the device, the deployment, the candidate's activation."""

    profile: DeviceProfile
    deployment: Deployment
    #: Activation quant key of the candidate being checked: "bf16" (vLLM's None), "mxfp8", "fp8",
    #: "mxfp4" for MXFP4 weights; "nvfp4" (kNvfp4Dynamic) or "bf16" for NVFP4 weights.
    activation: str
    hidden_size: int | None
    #: Weight format as reasons name it.
    weight: str = "MXFP4"
    #: The model's routing method (a RoutingMethodType name); None: not known, assumed supported.
    routing: str | None = "RenormalizeNaive"
    #: MoE activation function (MoEActivation value); None: not modelled (the GPT-OSS MXFP4 path).
    activation_fn: str | None = None
    #: VLLM_BATCH_INVARIANT=1 (NVFP4 0.33 only).
    batch_invariant: bool = False

    @property
    def is_act_and_mul(self) -> bool:
        # MoEActivation.is_gated: every activation but the *_no_mul ones.
        return self.activation_fn is None or not self.activation_fn.endswith("_no_mul")


Reason = str | None
Check = Callable[[Context], Reason]


def where(p: DeviceProfile) -> str:
    """How a reason names the device: "profile h100 is 9.0", "... is ROCm gfx942", "... is XPU"."""
    if p.platform == "cuda":
        return f"profile {p.name} is {p.cap[0]}.{p.cap[1]}"
    if p.platform == "rocm":
        return f"profile {p.name} is ROCm {p.gfx}"
    return f"profile {p.name} is {p.platform.upper()}"


def any_parallel(ctx: Context) -> Reason:
    return None


# Routing. GPT-OSS routes with softmax + renormalize, i.e. RoutingMethodType.RenormalizeNaive.
GPT_OSS_ROUTING = "RenormalizeNaive"


@dataclass(frozen=True)
class KernelClass:
    """One vLLM expert class and the predicates of its ``is_supported_config``."""

    name: str
    monolithic: bool
    #: ``_supports_current_device`` as a list of checks; the first failing one is the reason.
    device: tuple[Check, ...]
    #: ``_supports_quant_scheme`` for MXFP4 weights and the candidate's activation.
    quant: Check
    parallel: Check = any_parallel
    #: Routing methods a monolithic class accepts (None: any).
    routing: frozenset[str] | None = None
    #: ``_supports_shape(hidden_dim)``; vLLM's default accepts every shape and no class on the
    #: GPT-OSS MXFP4 path overrides it, so this stays None everywhere.
    shape: Check | None = None
    formats: frozenset[str] = frozenset({"standard"})
    lora: bool = False
    #: Only tried when the backend is requested explicitly (TrtLlmMxfp4LoRAExperts).
    explicit_only: bool = False
    #: ``_supports_no_act_and_mul`` (non-gated MoE, activations ending in "_no_mul").
    no_act_and_mul: bool = True
    #: ``_supports_activation``; None: not modelled (every class on the GPT-OSS MXFP4 path takes it).
    activation: Check | None = None
    #: ``_supports_batch_invariance`` (checked only with VLLM_BATCH_INVARIANT=1).
    batch_invariant: bool = False


def is_supported(cls: KernelClass, ctx: Context) -> Reason:
    """``is_supported_config`` in vLLM 0.33.0's order ;
    None when it passes.

    Order: device, act_and_mul, activation, quant scheme, parallel config, routing method, shape,
    activation format, batch invariance, LoRA. Hash routing, the decomposed-backend requirement and
    the router-logits dtype are accepted by every class mxconvert lays out, so they are not modelled.
    On the GPT-OSS MXFP4 path act_and_mul (gated), the activation (SWIGLUOAI) and batch invariance
    never refuse either: its contexts carry activation_fn=None and batch_invariant=False.
    """
    for check in cls.device:
        reason = check(ctx)
        if reason:
            return reason
    if not (ctx.is_act_and_mul or cls.no_act_and_mul):
        return "kernel does not support no act_and_mul MLP layer"
    if cls.activation is not None:
        reason = cls.activation(ctx)
        if reason:
            return reason
    reason = cls.quant(ctx)
    if reason:
        return reason
    reason = cls.parallel(ctx)
    if reason:
        return reason
    if cls.routing is not None and ctx.routing is not None and ctx.routing not in cls.routing:
        return f"kernel does not support {ctx.routing} routing"
    if cls.shape is not None:
        reason = cls.shape(ctx)
        if reason:
            return reason
    fmt = ctx.deployment.activation_format
    if fmt not in cls.formats:
        (only,) = tuple(cls.formats)
        return f"kernel supports only the {only} activation format, deployment uses the {fmt} format"
    if ctx.batch_invariant and not cls.batch_invariant:
        return "kernel does not support batch invariance (VLLM_BATCH_INVARIANT=1)"
    if ctx.deployment.lora and not cls.lora:
        return "kernel class does not support LoRA"
    return None


@dataclass(frozen=True)
class PriorityMove:
    """A priority-list modifier: move `backend` right after `after` (or right before `before`)."""

    backend: Backend
    applies: Callable[[DeviceProfile], bool]
    why: str
    after: Backend | None = None
    before: Backend | None = None

    def apply(self, order: list[Backend]) -> list[Backend]:
        if self.backend not in order:
            return order
        out = [b for b in order if b != self.backend]
        anchor = self.after if self.after is not None else self.before
        if anchor not in out:
            return order
        idx = out.index(anchor) + (1 if self.after is not None else 0)
        out.insert(idx, self.backend)
        return out


@dataclass(frozen=True)
class EnvOverride:
    """One env-style override of an older oracle, in the order the oracle reads them.

    When set to a true value the first matching (condition, backend) of `force` is returned
    through `_return_or_raise` (no match: the override is refused with `no_match`); when set to
    false the `remove_when_false` backends leave the priority list. `when_true`, if given, replaces
    `force` with a function of the run (an override whose true branch reads other variables, like
    the NVFP4 ``VLLM_USE_FLASHINFER_MOE_FP4`` + ``VLLM_FLASHINFER_MOE_BACKEND`` pair).
    """

    var: str
    force: tuple[tuple[Callable[[DeviceProfile], bool], Backend], ...] = ()
    remove_when_false: tuple[Backend, ...] = ()
    no_match: str = ""
    when_true: Callable[[Run], Selection] | None = None


def always(p: DeviceProfile) -> bool:
    return True


@dataclass(frozen=True)
class SelectionStyle:
    name: str
    runtime: str
    priority: tuple[Backend, ...]
    moves: tuple[PriorityMove, ...]
    names: Mapping[str, tuple[Backend, ...]]
    #: Names vLLM of this revision accepts but mxconvert cannot lay out.
    unsupported_names: Mapping[str, str]
    classes: Mapping[Backend, tuple[KernelClass, ...]]
    env_overrides: tuple[EnvOverride, ...]
    #: Whether `Deployment.activation` (quantization_config.moe.activation) exists here.
    activation_override: bool
    #: The activation key a backend runs with (vLLM's ``_backend_activation_key``).
    activation_of: Callable[[Run, Backend], str]
    #: Records the chosen backend and builds the format's `Selection` report.
    choose: Callable[[Run, Backend, str, str, str], Selection]
    #: Weight format of the oracle ("mxfp4" or "nvfp4"); names the enum of every backend above.
    fmt: str = "mxfp4"
    #: Backends that apply the SwiGLU clamp (NVFP4 ``NVFP4_BACKENDS_WITH_CLAMP``); None: no filter.
    clamp: frozenset | None = None
    #: Explicit-name backend -> its variant for the batched activation format.
    batched_variants: Mapping[Backend, Backend] = field(default_factory=dict)
    #: String-valued env variables and their allowed values (``env_with_choices``).
    env_choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Boolean env variables that predicates read (not overrides), e.g. VLLM_BATCH_INVARIANT.
    env_flags: tuple[str, ...] = ()
    #: Env variables of older trees that this one no longer reads -> what replaces them.
    env_removed: Mapping[str, str] = field(default_factory=dict)
    #: MXFP4 ``_filter_by_activation`` (vLLM 0.32.0 on): with a requested activation, the BF16
    #: backends follow the matching ones as a higher-precision fallback (before 0.32.0 they drop out).
    activation_bf16_fallback: bool = False
    #: MXFP4: the platforms whose backend vLLM forces after the priority list found none (0.29.0:
    #: XPU and CPU; later: XPU only), each forced with activation key None.
    forced_after_list: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    """Model-side inputs of a selection. The GPT-OSS MXFP4 path fixes them (the defaults)."""

    routing: str | None = GPT_OSS_ROUTING
    activation_fn: str | None = None
    #: W4A16 checkpoint (NVFP4 without input scales: vLLM passes activation_key=None).
    w4a16: bool = False
    swiglu_limit: float | None = None
    #: The checkpoint's (unsharded) MoE intermediate size, for the shape refusals.
    intermediate_size: int | None = None


class Run:
    """Bookkeeping shared by all algorithms: the context, the considered lines, the errors."""

    def __init__(
        self,
        style: SelectionStyle,
        profile: DeviceProfile,
        revision: RuntimeRevision,
        deployment: Deployment,
        requested: str,
        hidden_size: int | None,
        model: Model = Model(),
    ):
        self.style = style
        self.profile = profile
        self.revision = revision
        self.deployment = deployment
        self.requested = requested
        self.hidden_size = hidden_size
        self.model = model
        self.considered: list[Considered] = []
        #: Parsed env overrides (bools, or strings for `style.env_choices`); set by `parse_env`.
        self.env: dict[str, bool | str] = {}

    def ctx(self, activation: str) -> Context:
        return Context(
            self.profile,
            self.deployment,
            activation,
            self.hidden_size,
            weight=self.style.fmt.upper(),
            routing=self.model.routing,
            activation_fn=self.model.activation_fn,
            batch_invariant=bool(self.env.get("VLLM_BATCH_INVARIANT", False)),
        )

    def activation_for(self, backend: Backend) -> str:
        return self.style.activation_of(self, backend)

    def note(self, backend: Backend, kernel_class: str | None, reason: str) -> None:
        self.considered.append(Considered(backend, kernel_class, False, reason))

    def try_backend(self, backend: Backend, activation: str, explicit: bool) -> tuple[KernelClass, str] | None:
        """Try the kernel classes of `backend` in order; record each failure; return the winner."""
        classes = [c for c in self.style.classes.get(backend, ()) if explicit or not c.explicit_only]
        if not classes:
            self.note(backend, None, "mxconvert knows no kernel class for this backend")
            return None
        ctx = self.ctx(activation)
        for cls in classes:
            reason = is_supported(cls, ctx)
            if reason is None:
                return cls, activation
            self.note(backend, cls.name, reason)
        return None

    def choose(self, backend: Backend, cls: KernelClass | str, activation: str, reason: str) -> Selection:
        """Record `backend` as chosen and build the format's `Selection` (the style's `choose`)."""
        name = cls if isinstance(cls, str) else cls.name
        return self.style.choose(self, backend, name, activation, reason)

    def selection(self, backend: Backend, kernel_class: str, activation: str, **fields: Any) -> Selection:
        """The report of a chosen backend (after `choose` recorded it), with format-specific fields."""
        return Selection(
            backend=backend,
            kernel_class=kernel_class,
            requested=self.requested,
            revision=self.revision.name,
            profile=self.profile.name,
            activation=activation,
            considered=tuple(self.considered),
            **fields,
        )

    def where(self) -> str:
        return f"profile {self.profile.name} ({self.profile.summary()}) under {self.revision.name}"

    def refuse(self, head: str, since: int = 0) -> UnsupportedError:
        lines = [
            f"  - {c.backend.value}" + (f" [{c.kernel_class}]" if c.kernel_class else "") + f": {c.reason}"
            for c in self.considered[since:]
        ]
        return SelectionRefused(head + (":\n" + "\n".join(lines) if lines else ""), tuple(self.considered))


def normalise_name(name: str) -> str:
    if not isinstance(name, str):
        raise InputError(f"--moe-backend must be a string, got {name!r}")
    return name.strip().lower().replace("-", "_")


def resolve_name(run: Run, name: str) -> tuple[Backend, ...]:
    style = run.style
    if name in style.names:
        return style.names[name]
    if name in style.unsupported_names:
        raise UnsupportedError(
            f"--moe-backend {name!r} is a {style.runtime} name, but mxconvert cannot produce its "
            f"layout: {style.unsupported_names[name]}"
        )
    raise InputError(
        f"unknown --moe-backend {name!r} for {run.revision.name} ({style.runtime}); valid names: "
        + ", ".join(("auto", *style.names))
    )


def parse_env_bool(var: str, value: str) -> bool:
    # vLLM envs: bool(int(value)) (maybe_convert_bool for VLLM_MXFP4_USE_MARLIN; bool(int(...)) for
    # the VLLM_USE_FLASHINFER_MOE_MXFP4_* switches), so only integers are accepted.
    try:
        return bool(int(value))
    except ValueError:
        raise InputError(f"{var}={value!r}: vLLM parses it with int(); use 0 or 1") from None


def parse_env(run: Run) -> dict[str, bool | str]:
    """Check `deployment.env` against the style's variables and parse it into `run.env`."""
    style = run.style
    known = [o.var for o in style.env_overrides] + list(style.env_choices) + list(style.env_flags)
    unknown = sorted(set(run.deployment.env) - set(known))
    gone = [k for k in unknown if k in style.env_removed]
    if gone:
        raise InputError(
            f"env override(s) {', '.join(gone)} do not exist in {style.runtime}: "
            + "; ".join(f"{k}: {style.env_removed[k]}" for k in gone)
        )
    if unknown:
        raise InputError(
            f"unknown env override(s) {', '.join(unknown)} for {run.revision.name}; known: " + ", ".join(known)
        )
    env: dict[str, bool | str] = {}
    for key, value in run.deployment.env.items():
        if key in style.env_choices:
            choices = style.env_choices[key]
            if value.lower() not in choices:
                raise InputError(f"{key}={value!r}: vLLM accepts only {', '.join(choices)}")
            env[key] = value.lower()
        else:
            env[key] = parse_env_bool(key, value)
    run.env = env
    return env


def moved_priority(run: Run) -> list:
    """The style's priority list after its modifiers (`PriorityMove`s) for this profile."""
    order = list(run.style.priority)
    for move in run.style.moves:
        if move.applies(run.profile):
            order = move.apply(order)
    return order


def first_passing(run: Run, order, skipped: Mapping) -> Selection | None:
    """Walk `order`; note the `skipped` backends with their reason; choose the first that passes."""
    for backend in order:
        if backend in skipped:
            run.note(backend, None, skipped[backend])
            continue
        act = run.activation_for(backend)
        hit = run.try_backend(backend, act, explicit=False)
        if hit:
            return run.choose(backend, hit[0], act, "first backend in priority order whose predicates all pass")
    return None


def force(run: Run, backend: Backend, why: str, refusal: str) -> Selection:
    """vLLM's ``_return_or_raise``: the backend's first passing class, or a refusal."""
    act = run.activation_for(backend)
    hit = run.try_backend(backend, act, explicit=True)
    if hit:
        return run.choose(backend, hit[0], act, why)
    raise run.refuse(refusal)


def apply_env_overrides(run: Run) -> tuple[Selection | None, dict]:
    """Run the style's `EnvOverride`s in order over `run.env`.

    Returns (a forced selection or None, {backend removed from the priority list: why}).
    """
    removed: dict = {}
    p = run.profile
    for override in run.style.env_overrides:
        if override.var not in run.env:
            continue
        if not run.env[override.var]:
            for b in override.remove_when_false:
                removed.setdefault(b, f"removed by {override.var}=0")
            continue
        if override.when_true is not None:
            return override.when_true(run), removed
        for applies, backend in override.force:
            if applies(p):
                return force(
                    run,
                    backend,
                    f"forced by {override.var}=1",
                    f"{override.var}=1 forces {backend.value}, which cannot run on {run.where()}",
                ), removed
        raise UnsupportedError(f"{override.no_match}; {where(p)}")
    return None, removed
