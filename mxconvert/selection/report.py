"""The selection report: the chosen backend and kernel class, and every backend tried before it
with the reason it was passed over (`Considered`). It is recorded in every manifest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mxconvert.core.errors import InputError, UnsupportedError
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend

#: Backend enum per weight format (recorded as "format" in NVFP4 selection JSON; MXFP4 JSON has no
#: "format" key, for compatibility with manifests written before NVFP4 existed).
FORMAT_ENUMS: dict[str, type[Mxfp4Backend] | type[Nvfp4Backend]] = {"mxfp4": Mxfp4Backend, "nvfp4": Nvfp4Backend}
#: The format of selection JSON without a "format" key (written before NVFP4 existed).
UNTAGGED_FORMAT = "mxfp4"
#: The fields a format's selection JSON records past the common ones, in order: MXFP4's none (its
#: JSON stays as it was before NVFP4 existed); NVFP4's its format and its own fields.
_FORMAT_FIELDS: dict[str, tuple[str, ...]] = {
    "mxfp4": (),
    "nvfp4": ("format", "use_global_sf", "use_a16", "activation_fn"),
}


@dataclass(frozen=True)
class Considered:
    """One line of the "why not" report."""

    backend: Mxfp4Backend | Nvfp4Backend
    kernel_class: str | None
    chosen: bool
    reason: str

    def to_json(self) -> dict:
        return {
            "backend": self.backend.value,
            "kernel_class": self.kernel_class,
            "chosen": self.chosen,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping, fmt: str = UNTAGGED_FORMAT) -> Considered:
        enum = _format_enum(fmt)
        return cls(enum(data["backend"]), data["kernel_class"], bool(data["chosen"]), data["reason"])


def _format_enum(fmt: str) -> type[Mxfp4Backend] | type[Nvfp4Backend]:
    try:
        return FORMAT_ENUMS[fmt]
    except (KeyError, TypeError):
        raise InputError(f"unknown selection format {fmt!r}; known: {', '.join(FORMAT_ENUMS)}") from None


@dataclass(frozen=True)
class Selection:
    backend: Mxfp4Backend | Nvfp4Backend
    kernel_class: str
    #: "auto" or the --moe-backend name.
    requested: str
    revision: str
    profile: str
    #: Activations the chosen kernel computes with: "bf16" or "mxfp8" (MXFP4); "nvfp4" or "bf16"
    #: (NVFP4: "bf16" for W4A16 / forced-A16 runs and for the weight-only MARLIN).
    activation: str
    #: Every backend tried, in order, with the reason it was passed over; the chosen one last.
    considered: tuple[Considered, ...]
    #: VLLM_MARLIN_INPUT_DTYPE in effect ("fp8" or None) when a Marlin backend is chosen, else None.
    #: (An addition to the brief's API: the Marlin layout depends on it, `is_a_8bit`.)
    marlin_input_dtype: str | None = None
    #: "mxfp4" (``backend`` is an Mxfp4Backend) or "nvfp4" (an Nvfp4Backend).
    format: str = UNTAGGED_FORMAT
    #: NVFP4 only (None for MXFP4): ``is_global_sf_supported_for_nvfp4_backend(backend)``, i.e. the
    #: activation input scales are reduced to one scalar over all experts (global ones under EP).
    use_global_sf: bool | None = None
    #: NVFP4 only: the kernel runs with 16-bit activations (W4A16 checkpoint, or B12X with
    #: VLLM_B12X_MOE_FP4_FORCE_A16=1): vLLM's ``_use_a16``.
    use_a16: bool | None = None
    #: NVFP4 only: the MoE activation function the selection was made for (MoEActivation value).
    activation_fn: str | None = None

    def to_json(self) -> dict:
        data = {
            "backend": self.backend.value,
            "kernel_class": self.kernel_class,
            "requested": self.requested,
            "revision": self.revision,
            "profile": self.profile,
            "activation": self.activation,
            "marlin_input_dtype": self.marlin_input_dtype,
            "considered": [c.to_json() for c in self.considered],
        }
        data.update((name, getattr(self, name)) for name in _FORMAT_FIELDS[self.format])
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> Selection:
        fmt = data.get("format", UNTAGGED_FORMAT)
        enum = _format_enum(fmt)
        return cls(
            backend=enum(data["backend"]),
            kernel_class=data["kernel_class"],
            requested=data["requested"],
            revision=data["revision"],
            profile=data["profile"],
            activation=data["activation"],
            considered=tuple(Considered.from_json(c, fmt) for c in data["considered"]),
            marlin_input_dtype=data.get("marlin_input_dtype"),
            format=fmt,
            use_global_sf=data.get("use_global_sf"),
            use_a16=data.get("use_a16"),
            activation_fn=data.get("activation_fn"),
        )


class SelectionRefused(UnsupportedError):
    """No backend (or not the requested one) can run; `considered` holds the per-backend reasons."""

    def __init__(self, message: str, considered: tuple[Considered, ...]) -> None:
        super().__init__(message)
        self.considered = considered
