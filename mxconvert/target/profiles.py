"""Device profiles: the facts about a target machine that decide backend and layout.

A profile is data: platform, compute capability (or AMD gfx arch), which kernel libraries the
deployment has, and the runtime switches that change selection (e.g. `VLLM_ROCM_USE_AITER`).
Users name built-in profiles as they say them (`h100`, `b200`, `mi355x`) or pass a JSON/TOML file
with the same fields.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from mxconvert.core import jsonio
from mxconvert.core.errors import InputError
from mxconvert.core.jsonio import first_non_finite

PLATFORMS = ("cuda", "rocm", "xpu", "cpu")

#: vLLM reports these pseudo-capabilities for AMD archs (`on_gfx9` family).
ROCM_CAPABILITY = {"gfx90a": (9, 0), "gfx942": (9, 4), "gfx950": (9, 5), "gfx1250": (12, 5)}


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    platform: str
    #: CUDA compute capability, or vLLM's pseudo-capability for ROCm; None on XPU/CPU.
    capability: tuple[int, int] | None = None
    #: AMD arch (gfx942, gfx950) on ROCm, else None.
    gfx: str | None = None
    aliases: tuple[str, ...] = ()
    has_flashinfer: bool = True
    has_flashinfer_cutlass: bool = True
    has_triton_kernels: bool = True
    has_humming: bool = False
    #: `VLLM_ROCM_USE_AITER=1` (default off in vLLM) and `VLLM_ROCM_USE_AITER_MOE` (default on).
    rocm_use_aiter: bool = False
    rocm_use_aiter_moe: bool = True
    #: torch >= 2.8.1 enables the Hopper triton_kernels layouts (older torch: Strided).
    torch_geq_2_8_1: bool = True
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    #: The built-in profile a user profile file started from (`base = "h100"`), else None.
    base: str | None = None

    @property
    def cap(self) -> tuple[int, int]:
        """Capability for comparisons; (0, 0) where the platform has none."""
        return self.capability or (0, 0)

    @property
    def cap_int(self) -> int:
        major, minor = self.cap
        return major * 10 + minor

    def is_cuda_family(self, major: int) -> bool:
        """vLLM's `is_device_capability_family(major*10)`: the same major capability on CUDA."""
        return self.platform == "cuda" and self.cap[0] == major

    def summary(self) -> str:
        if self.platform == "cuda":
            return f"CUDA sm{self.cap[0]}{self.cap[1]} ({self.cap[0]}.{self.cap[1]})"
        if self.platform == "rocm":
            return f"ROCm {self.gfx}"
        return self.platform.upper()

    def to_json(self) -> dict:
        data = asdict(self)
        data["capability"] = list(self.capability) if self.capability else None
        data["aliases"] = list(self.aliases)
        if self.base is None:  # built-in profiles: the record of earlier artifacts, unchanged
            del data["base"]
        return data

    @property
    def label(self) -> str:
        """The name to show: a derived profile under its own name and its base."""
        return f"{self.name} (from {self.base})" if self.base else self.name

    @classmethod
    def from_json(cls, data: dict) -> DeviceProfile:
        """The profile recorded in a manifest (so a user profile file is not needed later)."""
        data = dict(data)
        data["capability"] = tuple(data["capability"]) if data.get("capability") else None
        data["aliases"] = tuple(data.get("aliases", ()))
        return cls(**data)


def _cuda(name: str, cap: tuple[int, int], description: str, *aliases: str, **kw) -> DeviceProfile:
    return DeviceProfile(name, description, "cuda", cap, None, tuple(aliases), **kw)


def _rocm(name: str, gfx: str, description: str, *aliases: str, **kw) -> DeviceProfile:
    return DeviceProfile(
        name,
        description,
        "rocm",
        ROCM_CAPABILITY[gfx],
        gfx,
        tuple(aliases),
        has_flashinfer=False,
        has_flashinfer_cutlass=False,
        **kw,
    )


BUILTIN_PROFILES: tuple[DeviceProfile, ...] = (
    _cuda("a100", (8, 0), "NVIDIA A100 (Ampere)", "a100-80gb", "a100-40gb", "sm80"),
    _cuda("a10g", (8, 6), "NVIDIA A10G (Ampere)", "a10", "sm86"),
    _cuda("l40s", (8, 9), "NVIDIA L40S (Ada)", "l4", "rtx-4090", "sm89"),
    _cuda("h100", (9, 0), "NVIDIA H100 (Hopper)", "h100-80gb", "h800", "sm90"),
    _cuda("h200", (9, 0), "NVIDIA H200 (Hopper)", "gh200"),
    _cuda("b200", (10, 0), "NVIDIA B200 (Blackwell)", "sm100"),
    _cuda("gb200", (10, 0), "NVIDIA GB200 (Grace Blackwell)"),
    _cuda("b300", (10, 3), "NVIDIA B300 (Blackwell Ultra)", "gb300", "sm103"),
    _cuda("thor", (11, 0), "NVIDIA Jetson Thor", "sm110"),
    _cuda("rtx-pro-6000", (12, 0), "NVIDIA RTX PRO 6000 Blackwell", "rtx-pro-6000-blackwell", "sm120"),
    _cuda("rtx-5090", (12, 0), "NVIDIA GeForce RTX 5090", "rtx5090"),
    _cuda("gb10", (12, 1), "NVIDIA GB10 (DGX Spark)", "dgx-spark", "sm121"),
    _rocm("mi300x", "gfx942", "AMD Instinct MI300X (CDNA3)", "mi300", "mi325x", "gfx942"),
    _rocm("mi355x", "gfx950", "AMD Instinct MI355X (CDNA4)", "mi350x", "mi350", "mi355", "gfx950"),
    _rocm(
        "mi300x-aiter",
        "gfx942",
        "AMD MI300X, AITER on (VLLM_ROCM_USE_AITER=1, SGLANG_USE_AITER=1)",
        rocm_use_aiter=True,
    ),
    _rocm(
        "mi355x-aiter",
        "gfx950",
        "AMD MI355X, AITER on (VLLM_ROCM_USE_AITER=1, SGLANG_USE_AITER=1)",
        rocm_use_aiter=True,
    ),
    DeviceProfile(
        "intel-xpu",
        "Intel Data Center GPU (XPU)",
        "xpu",
        None,
        None,
        ("xpu", "pvc", "arc-b580"),
        has_flashinfer=False,
        has_flashinfer_cutlass=False,
        has_triton_kernels=False,
    ),
    DeviceProfile(
        "cpu",
        "CPU (x86-64 / Arm)",
        "cpu",
        None,
        None,
        (),
        has_flashinfer=False,
        has_flashinfer_cutlass=False,
        has_triton_kernels=False,
    ),
)


def _index() -> dict[str, DeviceProfile]:
    table: dict[str, DeviceProfile] = {}
    for profile in BUILTIN_PROFILES:
        for key in (profile.name, *profile.aliases):
            table[key] = profile
    return table


_BY_NAME = _index()


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def builtin_name(name: str) -> str | None:
    """The name of the built-in profile `name` names (its name or an alias, in any case), or None
    when it names none (`load_artifact`'s `expect={"profile": "sm90"}` matches an h100 artifact)."""
    found = _BY_NAME.get(_normalise(name))
    return found.name if found is not None else None


def close_matches(word: str, names, key=str.lower) -> list[str]:
    """The names closest to an unknown `word`, best first (difflib's `get_close_matches`, compared
    through `key`: lower case by default, so `H10` finds `h100`), each once, as given."""
    import difflib

    by_key: dict[str, str] = {}
    for name in names:
        by_key.setdefault(key(name), name)
    return list(dict.fromkeys(by_key[k] for k in difflib.get_close_matches(key(word), list(by_key), n=3)))


def did_you_mean(suggestions: list[str]) -> str:
    """ " (did you mean X, Y?)" for an unknown name's `close_matches`; "" when there are none."""
    return f" (did you mean {', '.join(suggestions)}?)" if suggestions else ""


def load_profile_file(path: Path) -> DeviceProfile:
    """Read a user profile (JSON or TOML) with the fields of `DeviceProfile`.

    A file may set `base = "h100"` to start from a built-in profile and override some fields.
    """
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else jsonio.loads(text)
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"profile file {path}: cannot read it: {exc}") from None
    non_finite = first_non_finite(data)
    if non_finite:  # TOML's nan / inf: no JSON document (a manifest, --json output) can hold them
        raise InputError(f"profile file {path}: {non_finite} is not a finite number")
    if not isinstance(data, dict):
        raise InputError(f"profile file {path}: expected a table of fields, got {type(data).__name__}")
    known = {f.name for f in fields(DeviceProfile)} - {"base"}
    base_name = data.pop("base", None)
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(
            f"profile file {path}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known | {'base'}))}"
        )
    if base_name is not None and not isinstance(base_name, str):
        raise InputError(f"profile file {path}: base must be a profile name (a string), got {base_name!r}")
    _check_types(path, data)
    if "capability" in data and data["capability"] is not None:
        cap = data["capability"]
        if isinstance(cap, str):
            cap = cap.split(".")
        try:
            if len(cap) != 2:
                raise ValueError
            data["capability"] = (int(cap[0]), int(cap[1]))
        except (TypeError, ValueError, IndexError):
            raise InputError(f'profile file {path}: capability must look like "9.0" or [9, 0]') from None
    if "aliases" in data:
        data["aliases"] = tuple(data["aliases"])
    if base_name is not None:
        base = get_profile(str(base_name))
        data.setdefault("name", path.stem)  # a derived profile is never reported as its base
        data.setdefault("description", f"user profile from {path.name}, based on {base.name}")
        profile = replace(base, aliases=(), base=base.name, **data)
    else:
        for required in ("name", "platform"):
            if required not in data:
                raise InputError(f"profile file {path}: missing field {required!r}")
        data.setdefault("description", f"user profile from {path.name}")
        if data.get("platform") == "rocm" and data.get("gfx") and "capability" not in data:
            data["capability"] = ROCM_CAPABILITY.get(data["gfx"])
        profile = DeviceProfile(**data)
    if profile.platform not in PLATFORMS:
        raise InputError(f"profile file {path}: platform {profile.platform!r} is not one of {', '.join(PLATFORMS)}")
    if profile.platform == "cuda" and profile.capability is None:
        raise InputError(f'profile file {path}: a CUDA profile needs a capability such as "9.0"')
    return profile


#: Type of each field a profile file may set (booleans must be true/false, never "false").
_FIELD_TYPES: dict[str, Any] = {
    "name": str,
    "description": str,
    "platform": str,
    "gfx": (str, type(None)),
    "has_flashinfer": bool,
    "has_flashinfer_cutlass": bool,
    "has_triton_kernels": bool,
    "has_humming": bool,
    "rocm_use_aiter": bool,
    "rocm_use_aiter_moe": bool,
    "torch_geq_2_8_1": bool,
    "extra": dict,
}
_TYPE_WORDS = {str: "a string", bool: "true or false", dict: "a table"}


def _check_types(path: Path, data: dict) -> None:
    """Refuse a field of the wrong type, naming the field, the value and the type expected."""
    for key, value in data.items():
        want = _FIELD_TYPES.get(key)
        if want is not None and not isinstance(value, want):
            words = _TYPE_WORDS.get(want, "a string or null")
            raise InputError(f"profile file {path}: {key} must be {words}, got {value!r}")
        if key == "aliases" and not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
            raise InputError(f"profile file {path}: aliases must be a list of strings, got {value!r}")
        if (
            key == "capability"
            and value is not None
            and not (isinstance(value, str) or (isinstance(value, list) and all(type(v) is int for v in value)))
        ):
            raise InputError(f'profile file {path}: capability must look like "9.0" or [9, 0], got {value!r}')


def get_profile(name_or_path: str) -> DeviceProfile:
    """A built-in profile by name or alias, or a user profile from a .json/.toml file.

    Args:
        name_or_path (`str`):
            A built-in profile's name or alias, in any case (`"h100"`, `"B200"`, `"mi355x-aiter"`;
            `mxconvert profiles` lists them), or the path of a `.json` / `.toml` file with the fields
            of `DeviceProfile` (`base = "h100"` starts from a built-in profile).

    Returns:
        `DeviceProfile`: the device's platform, capability (or gfx), installed kernel libraries and
        runtime switches, as `select` and `convert` read them.

    Raises:
        `InputError`: an unknown name (the message lists the built-in profiles), a file that does
            not exist or cannot be read, or a field of the wrong type or unknown to `DeviceProfile`.

    Example:

    ```python
    import mxconvert

    profile = mxconvert.get_profile("h100")
    print(profile.name, profile.platform, profile.capability)
    ```
    """
    candidate = Path(name_or_path)
    if candidate.suffix in (".json", ".toml"):
        if not candidate.is_file():
            raise InputError(f"profile file {candidate} does not exist")
        return load_profile_file(candidate)
    key = _normalise(name_or_path)
    if key in _BY_NAME:
        return _BY_NAME[key]
    # names and aliases are compared; an alias found is named by its profile (`sm_90` suggests h100)
    close = list(dict.fromkeys(_BY_NAME[m].name for m in close_matches(key, _BY_NAME, key=_normalise)))
    raise InputError(
        f"unknown profile {name_or_path!r}{did_you_mean(close)}; built-in profiles: "
        + ", ".join(p.name for p in BUILTIN_PROFILES)
        + " (or pass a .json/.toml profile file)"
    )
