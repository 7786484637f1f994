"""TRITON / TRITON_UNFUSED (and AITER_TRITON_MXFP4_BF16): the triton_kernels MXFP4 layouts,
v3.5.1 as vendored in vLLM 0.33.0 and v3.6.0 as vendored in vLLM 0.19/0.20. Formulas and
references: docs/layouts.md, "TRITON".

vLLM's `_swizzle_mxfp4` keeps the interleaved gate/up rows, casts biases to fp32, transposes
weights and scales to `[E, K, N]` views and converts them to a layout chosen by the device.
Every storage is held by the kernel as `.mT` of a dense buffer; we store the dense buffer and
record the view. Which layout a target gets is decided in `triton_layout_choice` from the revision
table and the profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, NotRequired, TypedDict

from mxconvert.core.dtypes import DType
from mxconvert.core.errors import UnsupportedError
from mxconvert.core.parallel import host_buffer
from mxconvert.layouts.base import (
    Arrange,
    TensorLayout,
    ViewFn,
    chain,
    pad_dims,
    reshaped_view,
    round_up,
    transposed_view,
)
from mxconvert.layouts.codecs import Codec, WideningCast, host_fast_path
from mxconvert.layouts.hopper_host import HopperValueHost
from mxconvert.layouts.primitives import identity, swizzle_128x4_blocks
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, register
from mxconvert.layouts.row_host import RowMove
from mxconvert.target.backends import TRITON_BACKENDS, Mxfp4Backend
from mxconvert.target.profiles import DeviceProfile
from mxconvert.target.revisions import RuntimeRevision

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import np, torch


# ---- Hopper fp4 bit packing (docs/layouts.md, "Hopper fp4 packing") --------------------------------------
def _pack_lane(n0, n1, n2, n3):
    return (
        ((n0 & 8) << 12)
        | ((n0 & 7) << 6)
        | ((n1 & 8) << 9)
        | ((n1 & 7) << 3)
        | ((n2 & 8) << 6)
        | (n2 & 7)
        | ((n3 & 8) << 11)
        | ((n3 & 6) << 9)
        | ((n3 & 1) << 13)
    )


def _unpack_lane(lane):
    n0 = ((lane >> 12) & 8) | ((lane >> 6) & 7)
    n1 = ((lane >> 9) & 8) | ((lane >> 3) & 7)
    n2 = ((lane >> 6) & 8) | (lane & 7)
    n3 = ((lane >> 11) & 8) | ((lane >> 9) & 6) | ((lane >> 13) & 1)
    return n0, n1, n2, n3


@dataclass(frozen=True)
class HopperPack(Codec):
    """PACK over each aligned 4-byte group `(b0, b1, b2, b3)`: a bijection on the 32 bits.

    Low 16-bit lane from the low (even-K) nibbles, high lane from the high nibbles; per lane
    bit 15 s0 | 14 s3 | 13 e3.m0 | 12 s1 | 11-10 e3.m2..m1 | 9 s2 | 8-6 e0 | 5-3 e1 | 2-0 e2.
    The word is stored little-endian in the same four bytes.
    """

    def encode(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        if host_fast_path(x, portable):
            return _pack_cpu(x)
        return self._encode_torch(x)

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype, portable: bool = False) -> torch.Tensor:
        if host_fast_path(y, portable):
            return _unpack_cpu(y)
        return self._decode_torch(y)

    def numpy_form(self, dtype: DType) -> bool:
        return True

    def encode_bits(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        t01, t23, _, _ = _pack_tables()
        return _lookup_words(x, t01, t23)

    def decode_bits(self, y: np.ndarray, arranged_dtype: DType) -> np.ndarray:
        _, _, u_lo, u_hi = _pack_tables()
        return _lookup_words(y, u_lo, u_hi)

    def _encode_torch(self, x: torch.Tensor) -> torch.Tensor:
        g = x.reshape(*x.shape[:-1], x.shape[-1] // 4, 4).to(torch.int32)
        lo = _pack_lane(*(g[..., i] & 0xF for i in range(4)))
        hi = _pack_lane(*(g[..., i] >> 4 for i in range(4)))
        out = torch.stack((lo & 0xFF, lo >> 8, hi & 0xFF, hi >> 8), dim=-1)
        return out.to(torch.uint8).reshape(x.shape)

    def _decode_torch(self, y: torch.Tensor) -> torch.Tensor:
        g = y.reshape(*y.shape[:-1], y.shape[-1] // 4, 4).to(torch.int32)
        lo = g[..., 0] | (g[..., 1] << 8)
        hi = g[..., 2] | (g[..., 3] << 8)
        nibbles = [a | (b << 4) for a, b in zip(_unpack_lane(lo), _unpack_lane(hi))]
        return torch.stack(nibbles, dim=-1).to(torch.uint8).reshape(y.shape)


HOPPER_PACK = HopperPack("hopper_fp4_pack")


@lru_cache(maxsize=1)
def _pack_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Lookup tables derived from the bitwise definition above: PACK ORs independent per-bit
    contributions, so a word is `T01[b0 | b1<<8] | T23[b2 | b3<<8]`; its inverse is
    `U_lo[low lane] | U_hi[high lane]`. Built with numpy (the same lane formulas as the torch
    codec, `_encode_numpy` / `_decode_numpy`), so the host path packs without importing torch;
    tests/test_positions.py checks them against `_encode_torch` / `_decode_torch`."""
    v = np.arange(65536, dtype=np.int32)
    lo, hi = (v & 0xFF).astype(np.uint8), (v >> 8).astype(np.uint8)
    zero = np.zeros_like(lo)
    first, second = np.stack((lo, hi, zero, zero), -1), np.stack((zero, zero, lo, hi), -1)
    tables = (_encode_numpy(first), _encode_numpy(second), _decode_numpy(first), _decode_numpy(second))
    return tuple(np.ascontiguousarray(t).view(np.uint32).reshape(-1) for t in tables)  # type: ignore[return-value]


def _encode_numpy(groups: np.ndarray) -> np.ndarray:
    """`HopperPack._encode_torch` of `[..., 4]` uint8 groups, with numpy."""
    g = groups.astype(np.int32)
    lo = _pack_lane(*(g[..., i] & 0xF for i in range(4)))
    hi = _pack_lane(*(g[..., i] >> 4 for i in range(4)))
    return np.stack((lo & 0xFF, lo >> 8, hi & 0xFF, hi >> 8), axis=-1).astype(np.uint8)


def _decode_numpy(groups: np.ndarray) -> np.ndarray:
    """`HopperPack._decode_torch` of `[..., 4]` uint8 groups, with numpy."""
    g = groups.astype(np.int32)
    lo = g[..., 0] | (g[..., 1] << 8)
    hi = g[..., 2] | (g[..., 3] << 8)
    return np.stack([a | (b << 4) for a, b in zip(_unpack_lane(lo), _unpack_lane(hi))], axis=-1).astype(np.uint8)


_LOOKUP_BLOCK = 1 << 16  # words per block: indices (8 bytes each) stay in cache, memory bounded


def _lookup_words(x: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """`first[low half] | second[high half]` of each 4-byte word. numpy converts uint16 indices
    to intp element by element inside fancy indexing; converting a block at a time into a reused
    intp buffer and using `np.take(..., out=)` is ~1.7x faster (bench/bench_layouts.py) and keeps
    the temporaries small whatever the chunk size. `mode="clip"`: a uint16 index is always inside
    the 65536-entry tables, and the default "raise" checks each index and buffers `out` (~10% of
    the packing, A/B in one process, bench/CHANGELOG.md "Session 5")."""
    halves = np.ascontiguousarray(x).reshape(-1).view(np.uint16).reshape(-1, 2)
    count = halves.shape[0]
    words = host_buffer(count * 4).view(np.uint32)  # a reused buffer (core/parallel.py): every word written
    block = max(1, min(_LOOKUP_BLOCK, count))
    index = np.empty(block, dtype=np.intp)
    high = np.empty(block, dtype=np.uint32)
    for start in range(0, count, block):
        stop = min(start + block, count)
        n = stop - start
        index[:n] = halves[start:stop, 0]
        np.take(first, index[:n], out=words[start:stop], mode="clip")  # uint16 indices: in range
        index[:n] = halves[start:stop, 1]
        np.take(second, index[:n], out=high[:n], mode="clip")
        words[start:stop] |= high[:n]
    return words.view(np.uint8).reshape(x.shape)


def _pack_cpu(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(HOPPER_PACK.encode_bits(x.contiguous().numpy(), DType("uint8")))


def _unpack_cpu(y: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(HOPPER_PACK.decode_bits(y.contiguous().numpy(), DType("uint8")))


# ---- arrange steps (each on [E, N, K] canonical tensors) ------------------------------------------
def pad_scale_groups_to_4(x: torch.Tensor, fill: int) -> torch.Tensor:
    """vLLM 0.33 SM90 patch: zero-pad the scale groups (last dim) to a multiple of 4."""
    return pad_dims(x, {2: round_up(x.shape[2], 4)}, fill)


def hopper_value(n_align: int, kb_align: int):
    """HopperMXValueLayout(mx_axis=1, mma_version=3) before PACK: `O [E, Np/4, 4*Kbp]` with
    `O[e, 4a+t0, 128b + 64s0 + 16t1 + 4k1 + 2w1 + w0] = D[e, 16a+8w0+2t0+s0, 32b+8k1+4w1+t1]`.
    v3.5.1 pads (N, Kb) to (16, 32); v3.6.0 first pads to (64, 64)."""

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        e, n, kb = x.shape
        np_, kbp = round_up(n, n_align), round_up(kb, kb_align)
        d = pad_dims(x, {1: np_, 2: kbp}, fill)
        d = d.reshape(e, np_ // 16, 2, 4, 2, kbp // 32, 4, 2, 4)  # (a, w0, t0, s0, b, k1, w1, t1)
        return d.permute(0, 1, 3, 5, 4, 8, 6, 7, 2).reshape(e, np_ // 4, 4 * kbp)

    arrange.__qualname__ = f"hopper_value_{n_align}_{kb_align}"
    return arrange


def hopper_scale(num_warps: int):
    """HopperMXScaleLayout(mx_axis=1, num_warps=w): N padded to 32w, Ks to 2;
    `O[e, w*n2 + wp, 64k2 + 32a + 4c + 2d + b] = S[e, 32w*n2 + 16w*a + 16wp + 8b + c, 2k2 + d]`."""

    def arrange(x: torch.Tensor, fill: int) -> torch.Tensor:
        e, n, ks = x.shape
        np_, ksp = round_up(n, 32 * num_warps), round_up(ks, 2)
        a = pad_dims(x, {1: np_, 2: ksp}, fill)
        a = a.reshape(e, np_ // (32 * num_warps), 2, num_warps, 2, 8, ksp // 2, 2)
        return a.permute(0, 1, 3, 6, 2, 5, 7, 4).reshape(e, np_ // 32, 32 * ksp)

    arrange.__qualname__ = f"hopper_scale_w{num_warps}"
    return arrange


def blackwell_value(x: torch.Tensor, fill: int) -> torch.Tensor:
    """BlackwellMXValueLayout: no reordering; Kb (bytes) zero-padded to a multiple of 128."""
    return pad_dims(x, {2: round_up(x.shape[2], 128)}, fill)


def blackwell_scale(x: torch.Tensor, fill: int) -> torch.Tensor:
    """BlackwellMXScaleLayout: N padded to 128, Ks to 8, then the 128x4 swizzle per expert."""
    return swizzle_128x4_blocks(x, fill, k_align=8)


def cdna4_scale(x: torch.Tensor, fill: int) -> torch.Tensor:
    """CDNA4MXScaleLayout (gfx950): no padding; needs N % 32 == 0 and Ks % 8 == 0;
    `O[e, n//32, 256(k//8) + 64(k%4) + 4(n%16) + 2((k%8)//4) + (n%32)//16] = S[e, n, k]`."""
    e, n, ks = x.shape
    if n % 32 or ks % 8:
        raise UnsupportedError(f"CDNA4 scale layout needs rows % 32 == 0 and scale groups % 8 == 0, got {n} x {ks}")
    s = x.reshape(e, n // 32, 2, 16, ks // 8, 2, 4)
    return s.permute(0, 1, 4, 6, 3, 5, 2).reshape(e, n // 32, 32 * ks)


def _blackwell_scale_view(shape: tuple[int, ...]) -> tuple[int, ...]:
    e, n128, kq, _, _, _ = shape
    return (1, e * n128, kq, 2, 256)


# ---- choice per target ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TritonChoice:
    value: str  # StridedLayout | HopperMXValueLayout | BlackwellMXValueLayout
    scale: str  # StridedLayout | HopperMXScaleLayout | BlackwellMXScaleLayout | CDNA4MXScaleLayout
    pad_scale_groups_to_4: bool
    num_warps: int
    generation: str  # triton_kernels version
    overread_bytes: int


def triton_layout_choice(
    revision: RuntimeRevision, profile: DeviceProfile, tp: int, num_warps: int = 8
) -> TritonChoice:
    """Which triton_kernels layouts vLLM's `_swizzle_mxfp4` picks for this target. `tp` is vLLM's
    tensor-parallel group size (`Deployment.attention_tp`): vLLM 0.33.0 picks the CDNA4 scales by
    `get_tensor_model_parallel_world_size()` (quantization/utils/mxfp4_utils.py
    `should_use_cdna4_mx_scale_swizzle`), whatever the MoE's TP/EP split."""
    gen = revision.triton_kernels
    if profile.platform == "rocm":
        if profile.gfx == "gfx1250":
            raise UnsupportedError(
                "TRITON on gfx1250 needs AITER's shuffle_scale_moe, which mxconvert does not reproduce"
            )
        cdna4 = profile.gfx == "gfx950" and (revision.cdna4_scale_max_tp is None or tp <= revision.cdna4_scale_max_tp)
        return TritonChoice(
            "StridedLayout", "CDNA4MXScaleLayout" if cdna4 else "StridedLayout", False, num_warps, gen, 0
        )
    if profile.platform != "cuda":
        raise UnsupportedError(f"TRITON runs on CUDA and ROCm only, not on {profile.platform}")
    sm90 = profile.cap == (9, 0)
    pad4 = sm90 and revision.sm90_triton_scale_pad4
    if profile.cap >= (10, 0):
        return TritonChoice("BlackwellMXValueLayout", "BlackwellMXScaleLayout", False, num_warps, gen, 0)
    if profile.cap >= (9, 0) and not (sm90 and not profile.torch_geq_2_8_1):
        return TritonChoice(
            "HopperMXValueLayout", "HopperMXScaleLayout", pad4, num_warps, gen, revision.hopper_scale_overread
        )
    return TritonChoice("StridedLayout", "StridedLayout", pad4, num_warps, gen, 0)


class _Parts(TypedDict):
    """The parts of a value or scale `TensorLayout` that the triton_kernels layout class decides."""

    arrange: Arrange
    view: ViewFn
    steps: tuple[str, ...]
    codec: NotRequired[Codec]
    host: NotRequired[HopperValueHost | RowMove]


def triton_tensors(choice: TritonChoice) -> tuple[TensorLayout, ...]:
    """The six tensor layouts of the TRITON backend for one target."""
    kwargs_v = {"mx_axis": 1} if choice.value == "HopperMXValueLayout" else {}
    if choice.value == "HopperMXValueLayout":
        align = (64, 64) if choice.generation == "3.6.0" else (16, 32)
        value = _Parts(
            arrange=hopper_value(*align),
            view=transposed_view,
            codec=HOPPER_PACK,
            host=HopperValueHost(*align, _pack_tables),
            steps=(f"pad N,Kb to {align}", "hopper_value_permute", "hopper_fp4_pack", "view .mT"),
        )
    elif choice.value == "BlackwellMXValueLayout":
        value = _Parts(arrange=blackwell_value, view=transposed_view, steps=("pad Kb to 128", "view .mT"))
    else:
        value = _Parts(arrange=identity, view=transposed_view, steps=("view .mT",), host=RowMove(identity))

    pre = pad_scale_groups_to_4 if choice.pad_scale_groups_to_4 else identity
    pre_steps = ("pad scale groups to 4 (vLLM 0.33 SM90)",) if choice.pad_scale_groups_to_4 else ()
    kwargs_s: dict = {}
    if choice.scale == "HopperMXScaleLayout":
        kwargs_s = {"mx_axis": 1, "num_warps": choice.num_warps}
        scale = _Parts(
            arrange=chain(pre, hopper_scale(choice.num_warps)),
            view=transposed_view,
            steps=(*pre_steps, f"hopper_scale(num_warps={choice.num_warps})", "view .mT"),
        )
    elif choice.scale == "BlackwellMXScaleLayout":
        scale = _Parts(
            arrange=chain(pre, blackwell_scale),
            view=reshaped_view(_blackwell_scale_view),
            steps=(*pre_steps, "pad N to 128, Ks to 8", "swizzle_128x4", "view [1, E*Np/128, Kp/4, 2, 256]"),
        )
    elif choice.scale == "CDNA4MXScaleLayout":
        scale = _Parts(
            arrange=chain(pre, cdna4_scale), view=transposed_view, steps=(*pre_steps, "cdna4_scale_permute", "view .mT")
        )
    else:
        scale = _Parts(arrange=pre, view=transposed_view, steps=(*pre_steps, "view .mT"))

    def value_logical(shape):  # [E, N, Kb] -> [E, K, N]
        return (shape[0], shape[2] * 2, shape[1])

    def scale_logical(shape):  # [E, N, Ks] -> [E, Ks (after the vLLM pad), N]
        ks = round_up(shape[2], 4) if choice.pad_scale_groups_to_4 else shape[2]
        return (shape[0], ks, shape[1])

    common = {"row_order": "gate/up interleaved (g0,u0,g1,u1,...)", "triton_kernels": choice.generation}
    v_info = {**common, "layout_class": choice.value, "layout_kwargs": kwargs_v, "dtype_label": "FP4"}
    s_info: dict[str, object] = {**common, "layout_class": choice.scale, "layout_kwargs": kwargs_s}
    if choice.overread_bytes:
        s_info["overread_bytes"] = choice.overread_bytes
    natural = {"row_order": "natural"}
    f32 = WideningCast("bf16 -> fp32", "float32")
    return (
        TensorLayout("w13_weight", info=v_info, logical=value_logical, **value),
        TensorLayout("w13_weight_scale", info=s_info, logical=scale_logical, **scale),
        TensorLayout("w13_bias", identity, f32, steps=("to float32",), info={"row_order": common["row_order"]}),
        TensorLayout("w2_weight", info=v_info | natural, logical=value_logical, **value),
        TensorLayout("w2_weight_scale", info=s_info | natural, logical=scale_logical, **scale),
        TensorLayout("w2_bias", identity, f32, steps=("to float32",), info=natural),
    )


@register("mxfp4", *TRITON_BACKENDS, Mxfp4Backend.AITER_TRITON_MXFP4_BF16)
def mxfp4_triton(target: LayoutTarget) -> ExpertLayout:
    if target.profile is None:
        raise AssertionError("a Triton layout depends on the device: the target needs a profile")
    choice = triton_layout_choice(target.revision, target.profile, target.tp)
    return ExpertLayout(
        target.backend,
        target.revision.name,
        "triton",
        {t.name: t for t in triton_tensors(choice)},
        {
            "triton_kernels": choice.generation,
            "value_layout": choice.value,
            "scale_layout": choice.scale,
            "num_warps": choice.num_warps,
            "scale_groups_padded_to_4": choice.pad_scale_groups_to_4,
            "opt_flags": triton_opt_flags(target.profile, target.revision),
        },
    )


def triton_opt_flags(profile: DeviceProfile, revision: RuntimeRevision) -> dict:
    """Process-wide opt-flag constraints vLLM sets for this target (no data change; a loader must set them)."""
    if profile.platform != "cuda":
        return {}
    if profile.cap == (9, 0):
        return {"split_k": 1}
    if profile.cap[0] == 10 or (profile.cap[0] == 12 and revision.triton_sm12x_opt_flags):
        return {"is_persistent": True, "epilogue_subtile": 1}
    return {}
