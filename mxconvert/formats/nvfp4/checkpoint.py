"""Reading NVFP4 MoE checkpoints: ModelOpt and compressed-tensors, as vLLM 0.33.0 reads them
(vllm/model_executor/layers/quantization/modelopt.py and compressed_tensors/compressed_tensors_moe.py).

Routed experts are found by their names (`...layers.L.mlp.experts.E.{gate,up,down}_proj.*`, the
naming of Qwen3-MoE, DeepSeek-V3/R1, Mixtral-style HF exports), so dense layers and shared experts
pass through untouched. For one rank, the per-expert tensors are assembled into the canonical
tensors vLLM's converter receives (docs/architecture.md, Formats): `w13 = [w1 (gate); w3 (up)]`,
block scales alike, per-expert weight global scales (gate's, with a warning when up's differs, as
vLLM does) and input scales, all in ModelOpt's decode convention (compressed-tensors global scales
are stored as encode scales: vLLM takes their float32 reciprocals, and so do we).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mxconvert.core.dtypes import FLOAT8_E4M3FN, FLOAT32, UINT8, DType
from mxconvert.core.errors import InputError
from mxconvert.formats.base import FORMATS_READ, RankPlan, expert_parallel_plans
from mxconvert.storage.files import read_folder_json
from mxconvert.storage.source import SafetensorsSource, SourceIdentity

if TYPE_CHECKING:
    import torch

#: Canonical NVFP4 tensor names (vLLM's fused-MoE layer params, ModelOpt naming).
NVFP4_NAMES = (
    "w13_weight",
    "w13_weight_scale",
    "w13_weight_scale_2",
    "w13_input_scale",
    "w2_weight",
    "w2_weight_scale",
    "w2_weight_scale_2",
    "w2_input_scale",
)

_EXPERT = re.compile(
    r"^(?P<prefix>.*\.layers\.(?P<layer>\d+)\.mlp\.experts)\.(?P<expert>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj)\.(?P<tensor>\w+)$"
)


@dataclass(frozen=True)
class Producer:
    """What differs between the tools that write NVFP4 checkpoints (the `quant_format` of the facts)."""

    #: On-disk tensor names: (packed weight, block scale, weight global scale, input scale).
    names: tuple[str, str, str, str]
    #: The global and input scales are stored as encode scales, and vLLM takes their float32
    #: reciprocals (compressed-tensors); False: stored in the decode convention vLLM uses (ModelOpt).
    encoded_scales: bool
    #: vLLM holds the input scales of every global expert (not only the rank's) for the backends
    #: that quantize activations with one global scale (ModelOpt); False: the rank's experts only.
    input_scales_of_every_expert: bool


#: The NVFP4 producers mxconvert reads, by `quant_format` (what `detect_nvfp4` finds).
PRODUCERS = {
    "modelopt": Producer(
        names=("weight", "weight_scale", "weight_scale_2", "input_scale"),
        encoded_scales=False,
        input_scales_of_every_expert=True,
    ),
    "compressed-tensors": Producer(
        names=("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"),
        encoded_scales=True,
        input_scales_of_every_expert=False,
    ),
}


@dataclass(frozen=True)
class Nvfp4Facts:
    model_type: str
    quant_format: str  # "modelopt" | "compressed-tensors"
    w4a16: bool
    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int
    hidden_size: int
    intermediate_size: int
    swiglu_limit: float | None
    layout: str = "hf"
    quant_method: str = "nvfp4"

    def to_json(self) -> dict:
        data = asdict(self)
        data["moe_layers"] = list(self.moe_layers)
        return data


def nvfp4_canonical_specs(
    num_experts: int, hidden: int, inter: int, input_rows: int | None = None
) -> dict[str, tuple[DType, tuple[int, ...]]]:
    """dtype and shape of each canonical NVFP4 tensor of a rank (docs/architecture.md, Formats).
    `input_rows`: rows of the input scales (all global experts where the runtime holds them)."""
    e, k, n = num_experts, hidden, inter
    rows = input_rows or e
    return _Nvfp4Specs(
        {
            "w13_weight": (UINT8, (e, 2 * n, k // 2)),
            "w13_weight_scale": (FLOAT8_E4M3FN, (e, 2 * n, k // 16)),
            "w13_weight_scale_2": (FLOAT32, (e,)),
            "w13_input_scale": (FLOAT32, (rows, 2)),
            "w2_weight": (UINT8, (e, k, n // 2)),
            "w2_weight_scale": (FLOAT8_E4M3FN, (e, k, n // 16)),
            "w2_weight_scale_2": (FLOAT32, (e,)),
            "w2_input_scale": (FLOAT32, (rows,)),
        },
        num_experts=e,
    )


#: The stored (encode) input scales of a compressed-tensors W4A4 checkpoint, as SGLang's
#: `CompressedTensorsW4A4Nvfp4MoE` reads them ([gate, up] per expert, and down's): the canonical
#: `w13/w2_input_scale` hold their float32 reciprocals, from which the stored values cannot be rebuilt
#: bit for bit (`1 / (1 / x)` differs from x for about one float32 in eight). Read only by the layouts
#: that need them (layouts/nvfp4_scales.py `ct_w4a4_cutlass_scales`), so not listed among the specs.
STORED_INPUT_SCALES = ("w13_input_global_scale", "w2_input_global_scale")


class _Nvfp4Specs(dict):
    """The canonical NVFP4 specs: the eight tensors every NVFP4 checkpoint has (what iterating lists,
    e.g. `inspect` of a checkpoint), and, looked up by name, the stored input scales
    (`STORED_INPUT_SCALES`, one row per local expert)."""

    def __init__(self, listed: dict[str, tuple[DType, tuple[int, ...]]], num_experts: int) -> None:
        super().__init__(listed)
        self.num_experts = num_experts

    def __missing__(self, name: str) -> tuple[DType, tuple[int, ...]]:
        if name == "w13_input_global_scale":
            return FLOAT32, (self.num_experts, 2)
        if name == "w2_input_global_scale":
            return FLOAT32, (self.num_experts,)
        raise KeyError(name)


def _obj(value: object) -> dict:
    """A config block as a dict (a malformed block reads as empty and is refused later)."""
    return value if isinstance(value, dict) else {}


def detect_nvfp4(root: Path) -> tuple[str, bool] | None:
    """(format, w4a16) if the folder holds an NVFP4 checkpoint, else None."""
    config = read_folder_json(root / "config.json") if (root / "config.json").exists() else {}
    quant = _obj(config.get("quantization_config"))
    legacy = root / "hf_quant_config.json"
    if quant.get("quant_method") == "compressed-tensors":
        if quant.get("format") != "nvfp4-pack-quantized":
            return None
        groups = {k: _obj(g) for k, g in _obj(quant.get("config_groups")).items()}
        for name, group in groups.items():
            w = _obj(group.get("weights"))
            if (w.get("num_bits"), w.get("type"), w.get("strategy"), w.get("group_size")) != (
                4,
                "float",
                "tensor_group",
                16,
            ):
                raise InputError(f"{root / 'config.json'}: compressed-tensors group {name} is not NVFP4 (weights {w})")
        a16 = all(g.get("input_activations") is None for g in groups.values())
        return "compressed-tensors", a16
    algo = None
    if quant.get("quant_method") == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        groups = {k: _obj(g) for k, g in _obj(quant.get("config_groups")).items()}
        if algo == "NVFP4" and groups and all(g.get("input_activations") is None for g in groups.values()):
            algo = "W4A16_NVFP4"
    elif legacy.exists():
        data = read_folder_json(legacy)
        if _obj(data.get("producer")).get("name") == "modelopt":
            algo = str(_obj(data.get("quantization")).get("quant_algo", "")).upper()
    if algo is None:
        return None
    if algo not in ("NVFP4", "W4A16_NVFP4"):
        raise InputError(
            f"{root}: a ModelOpt checkpoint whose quant_algo {algo!r} is not NVFP4 (nor W4A16_NVFP4); {FORMATS_READ}"
        )
    return "modelopt", algo == "W4A16_NVFP4"


class Nvfp4Checkpoint(SafetensorsSource):
    """A validated NVFP4 MoE checkpoint on local disk."""

    format_name = "nvfp4"
    #: Any per-expert tensor (`....experts.E.<anything>`): converted, or refused by name.
    EXPERT_LIKE = re.compile(r"\.experts\.\d+\.")
    EXTRA_SOURCE_FILES = ("hf_quant_config.json",)

    def __init__(self, root: Path, identity: SourceIdentity, quant_format: str, w4a16: bool) -> None:
        super().__init__(root, identity)
        self.layout = "hf"
        self.config = self._read_config()
        self.warnings: list[str] = []
        self._open_weights()
        self.producer = PRODUCERS[quant_format]
        self._names = self.producer.names
        self.experts: dict[int, dict[tuple[int, str], str]] = {}  # layer -> (expert, proj) -> prefix
        for name in self.weight_map:
            m = _EXPERT.match(name)
            if m:
                key = (int(m["expert"]), m["proj"])
                self.experts.setdefault(int(m["layer"]), {})[key] = f"{m['prefix']}.{m['expert']}.{m['proj']}"
        self.facts = self._facts(quant_format, w4a16)
        self._check()
        self.account()
        self._check_scalars()

    def _facts(self, quant_format: str, w4a16: bool) -> Nvfp4Facts:
        c, path = self.config, self.config_path
        experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts")
        inter = c.get("moe_intermediate_size") or c.get("intermediate_size")
        if not experts or not inter or "hidden_size" not in c:
            raise InputError(f"{path}: needs hidden_size, moe_intermediate_size and num_experts / n_routed_experts")
        if not self.experts:
            raise InputError(f"{self.root}: no routed expert tensors (…layers.L.mlp.experts.E.gate_proj…) found")
        facts = Nvfp4Facts(
            model_type=str(c.get("model_type")),
            quant_format=quant_format,
            w4a16=w4a16,
            num_layers=_positive(c.get("num_hidden_layers", max(self.experts) + 1), "num_hidden_layers", path),
            moe_layers=tuple(sorted(self.experts)),
            num_experts=_positive(experts, "the expert count", path),
            hidden_size=_positive(c["hidden_size"], "hidden_size", path),
            intermediate_size=_positive(inter, "moe_intermediate_size", path),
            swiglu_limit=c.get("swiglu_limit"),
        )
        for key in ("hidden_size", "intermediate_size"):
            if getattr(facts, key) % 32:
                raise InputError(f"{path}: {key} = {getattr(facts, key)} is not a multiple of 32")
        return facts

    def _expected(self, proj: str, tensor: str) -> tuple[DType, tuple[tuple[int, ...], ...]]:
        k, i = self.facts.hidden_size, self.facts.intermediate_size
        rows, cols = (k, i) if proj == "down_proj" else (i, k)
        packed, block, global_, inp = self._names
        scalar = ((), (1,))
        return {
            packed: (UINT8, ((rows, cols // 2),)),
            block: (FLOAT8_E4M3FN, ((rows, cols // 16),)),
            global_: (FLOAT32, scalar),
            inp: (FLOAT32, scalar),
        }[tensor]

    def _check(self) -> None:
        f = self.facts
        wanted = self._wanted()
        for layer in f.moe_layers:
            for e in range(f.num_experts):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    prefix = self.experts[layer].get((e, proj))
                    if prefix is None:
                        raise InputError(
                            f"{self.root}: layer {layer} has no tensors for expert {e} {proj} "
                            f"(expected {f.num_experts} experts from {self.config_path.name})"
                        )
                    for tensor in wanted:
                        info = self.info(f"{prefix}.{tensor}")
                        dtype, shapes = self._expected(proj, tensor)
                        where = self.root / self.weight_map[info.name]
                        if info.dtype != dtype:
                            raise InputError(f"{where}: tensor {info.name} has dtype {info.dtype}, expected {dtype}")
                        if info.shape not in shapes:
                            raise InputError(
                                f"{where}: tensor {info.name} has shape {list(info.shape)}, expected "
                                f"{list(shapes[0])} (hidden {f.hidden_size}, intermediate "
                                f"{f.intermediate_size})"
                            )

    def _check_scalars(self) -> None:
        """Global and input scales must be numbers the kernels can use (finite, positive, also
        after compressed-tensors' reciprocal). vLLM keeps gate's weight global scale for w13 and
        only warns when up's differs (vLLM 0.33.0 ModelOptNvFp4FusedMoE.process_weights_after_loading).
        The float32 values are read and compared without torch (`select` opens the checkpoint too),
        in float32 arithmetic as torch would do it (`_float32`, `_allclose_float32`)."""
        f = self.facts
        _, _, global_name, input_name = self._names
        checked = (global_name,) if f.w4a16 else (global_name, input_name)
        encoded = self.producer.encoded_scales
        for layer in f.moe_layers:
            for e in range(f.num_experts):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    for tensor in checked:
                        value = self.scalar_value(layer, e, proj, tensor)
                        decoded = _reciprocal_float32(value) if encoded else value
                        if not (math.isfinite(value) and math.isfinite(decoded) and value > 0):
                            name = f"{self.experts[layer][(e, proj)]}.{tensor}"
                            raise InputError(
                                f"{self.file_of(name)}: tensor {name} is {value!r}; a "
                                f"{'global' if tensor == global_name else 'input'} scale must be a positive finite "
                                "number the kernel can use (the checkpoint is damaged or was not calibrated)"
                            )
                gate = self.scalar_value(layer, e, "gate_proj", global_name)
                up = self.scalar_value(layer, e, "up_proj", global_name)
                if not _allclose_float32(gate, up):
                    self.warnings.append(
                        f"layer {layer} expert {e}: gate and up weight global scales differ "
                        f"({gate:.6g} vs {up:.6g}); the runtime uses gate's for both, as vLLM does"
                    )

    def _scalar(self, layer: int, expert: int, proj: str, tensor: str) -> torch.Tensor:
        return self.tensor(f"{self.experts[layer][(expert, proj)]}.{tensor}").reshape(())

    def scalar_value(self, layer: int, expert: int, proj: str, tensor: str) -> float:
        """The value of a float32 scalar tensor (dtype and shape checked by `_check`), read
        without torch."""
        name = f"{self.experts[layer][(expert, proj)]}.{tensor}"
        self.info(name)
        (value,) = struct.unpack("<f", self.shards[self.weight_map[name]].get_bytes(name))
        return value

    @property
    def moe_layers(self) -> list[int]:
        return list(self.facts.moe_layers)

    def _wanted(self) -> tuple[str, ...]:
        """Per-expert tensors of one projection: W4A16 checkpoints carry no input scale."""
        return self._names[:3] if self.facts.w4a16 else self._names

    def expert_names(self) -> set[str]:
        """Exactly the per-expert tensors this checkpoint's config accounts for."""
        f = self.facts
        return {
            f"{self.experts[layer][(e, proj)]}.{tensor}"
            for layer in f.moe_layers
            for e in range(f.num_experts)
            for proj in ("gate_proj", "up_proj", "down_proj")
            if (e, proj) in self.experts[layer]
            for tensor in self._wanted()
        }

    def _accounting_hint(self) -> str:
        return (
            f"{self.config_path.name}: {self.facts.num_experts} experts per layer, each with "
            f"{', '.join(self._wanted())} of gate_proj, up_proj and down_proj"
        )

    # ---- canonical tensors ------------------------------------------------------------------------
    def load_canonical(
        self, layer: int, plan: RankPlan, experts: range | None, names: tuple[str, ...], input_rows: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Canonical tensors `names` of `layer` for the rank's experts (global ids)."""
        import torch

        experts = experts or range(plan.expert_start, plan.expert_end)
        packed, block, global_, inp = self._names
        s, t = plan.i_start, plan.i_end
        encoded = self.producer.encoded_scales

        def proj_tensor(e: int, proj: str, tensor: str):
            """A lazy slice: a TP rank reads only its rows / columns of each expert."""
            name = f"{self.experts[layer][(e, proj)]}.{tensor}"
            self.info(name)
            return self.shards[self.weight_map[name]].get_slice(name)

        def decode_scale(x: torch.Tensor) -> torch.Tensor:
            x = x.reshape(()).to(torch.float32)
            return 1.0 / x if encoded else x  # vLLM: `1.0 / global_scale` (float32) for compressed-tensors

        out: dict[str, torch.Tensor] = {}
        for name in names:
            if name == "w13_weight":
                out[name] = torch.stack(
                    [
                        torch.cat([proj_tensor(e, "gate_proj", packed)[s:t], proj_tensor(e, "up_proj", packed)[s:t]])
                        for e in experts
                    ]
                )
            elif name == "w13_weight_scale":
                out[name] = torch.stack(
                    [
                        torch.cat([proj_tensor(e, "gate_proj", block)[s:t], proj_tensor(e, "up_proj", block)[s:t]])
                        for e in experts
                    ]
                )
            elif name == "w2_weight":
                out[name] = torch.stack([proj_tensor(e, "down_proj", packed)[:, s // 2 : t // 2] for e in experts])
            elif name == "w2_weight_scale":
                out[name] = torch.stack([proj_tensor(e, "down_proj", block)[:, s // 16 : t // 16] for e in experts])
            elif name == "w13_weight_scale_2":
                out[name] = torch.stack([decode_scale(self._scalar(layer, e, "gate_proj", global_)) for e in experts])
            elif name == "w2_weight_scale_2":
                out[name] = torch.stack([decode_scale(self._scalar(layer, e, "down_proj", global_)) for e in experts])
            elif name in ("w13_input_scale", "w2_input_scale"):
                rows = range(self.facts.num_experts) if input_rows else experts
                if self.facts.w4a16:
                    shape = (len(rows), 2) if name == "w13_input_scale" else (len(rows),)
                    out[name] = torch.ones(shape, dtype=torch.float32)  # vLLM's A16 params stay at one
                elif name == "w13_input_scale":
                    out[name] = torch.stack(
                        [
                            torch.stack(
                                [
                                    decode_scale(self._scalar(layer, e, "gate_proj", inp)),
                                    decode_scale(self._scalar(layer, e, "up_proj", inp)),
                                ]
                            )
                            for e in rows
                        ]
                    )
                else:
                    out[name] = torch.stack([decode_scale(self._scalar(layer, e, "down_proj", inp)) for e in rows])
            elif name in STORED_INPUT_SCALES:
                out[name] = self._stored_input_scales(layer, experts, name)
            else:
                raise KeyError(name)
        return out

    def _stored_input_scales(self, layer: int, experts: range, name: str) -> torch.Tensor:
        """`STORED_INPUT_SCALES`: the stored float32 values, undecoded, of the rank's experts."""
        import torch

        _, _, _, inp = self._names
        if not self.producer.encoded_scales or self.facts.w4a16:
            raise AssertionError(f"{name}: only a compressed-tensors W4A4 checkpoint stores encode input scales")
        if name == "w13_input_global_scale":
            return torch.stack(
                [
                    torch.stack([self._scalar(layer, e, "gate_proj", inp), self._scalar(layer, e, "up_proj", inp)])
                    for e in experts
                ]
            ).to(torch.float32)
        return torch.stack([self._scalar(layer, e, "down_proj", inp) for e in experts]).to(torch.float32)


def _float32(x: float) -> float:
    """`x` rounded to float32 (to nearest; past the largest float32: inf). One float32 operation
    on float32 operands is the double result rounded this way (53 >= 2 x 24 + 2 bits)."""
    try:
        (rounded,) = struct.unpack("<f", struct.pack("<f", x))
    except OverflowError:
        return math.copysign(math.inf, x)
    return rounded


def _reciprocal_float32(x: float) -> float:
    """torch's `1.0 / x` of a float32 scalar: `x.reciprocal() * 1.0` in float32."""
    if x == 0:
        return math.copysign(math.inf, x)
    if math.isnan(x):
        return x
    return _float32(1.0 / x)


def _allclose_float32(a: float, b: float, rtol: float = 1e-05, atol: float = 1e-08) -> bool:
    """`torch.allclose(a, b)` of two float32 scalars: equal, or a finite `|a - b|` within
    `atol + |rtol * b|`, every step in float32 (torch casts rtol and atol to the tensors' dtype)."""
    if a == b:
        return True
    allowed = _float32(_float32(atol) + abs(_float32(_float32(rtol) * b)))
    actual = abs(_float32(a - b))
    return math.isfinite(actual) and actual <= allowed


def _positive(value: object, key: str, path: Path) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value != value
        or value in (float("inf"), float("-inf"))
        or int(value) != value
        or value <= 0
    ):
        raise InputError(f"{path}: {key} must be a positive whole number, got {value!r}")
    return int(value)


def plan_nvfp4_ranks(facts: Nvfp4Facts, tp: int, ep: int) -> list[RankPlan]:
    """vLLM narrows NVFP4 experts evenly (no padded TP): rank r holds rows [r*I/tp, (r+1)*I/tp)."""
    if tp < 1 or ep < 1:
        raise InputError("--tp and --ep must be at least 1")
    if tp > 1 and ep > 1:
        raise InputError("with expert parallelism the experts are not TP-sliced: give the EP size alone (--ep N)")
    E, I = facts.num_experts, facts.intermediate_size
    if ep > 1:
        return expert_parallel_plans(E, I, ep)
    if I % tp or (I // tp) % 16:
        raise InputError(
            f"--tp {tp}: the per-rank intermediate size {I}/{tp} must be a whole multiple of 16 "
            "(NVFP4 block scales cover 16 values)"
        )
    n = I // tp
    return [RankPlan(r, tp, r, 1, 0, 0, E, r * n, (r + 1) * n) for r in range(tp)]


def open_nvfp4(root: Path, identity: SourceIdentity) -> Nvfp4Checkpoint | None:
    found = detect_nvfp4(root)
    if found is None:
        return None
    return Nvfp4Checkpoint(root, identity, *found)
