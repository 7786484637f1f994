"""Marlin: MXFP4 MARLIN and BATCHED_MARLIN (the same bytes for both) and NVFP4 MARLIN.
Formulas and references: docs/layouts.md, "MARLIN".

MXFP4 (vLLM `prepare_moe_mxfp4_layer_for_marlin`). M1 weights: `gptq_marlin_repack` of each
expert's `[K/8, N]` int32 view, written here as a move of 4-bit codes (`V[k, n]`, the code of
row n, column k) into tiles, packed eight to an int32: 16-bit activations tile 16(k) x 64(n);
FP8 activations (`is_a_8bit`) tile 32(k) x 32(n).
M2 scales: transposed to `[K/32, N]`, Marlin's scale permutation (`marlin_permute_scales`), then
`mxfp4_marlin_process_scales` (16-bit: swap the middle pair of every 4; fp8: byte + 6), e8m0 dtype.
M3 bias: `marlin_permute_bias` (the single-scale permutation), bf16. Rows stay g/u interleaved for
vLLM; a row with `mxfp4_marlin_w13_rows == "halves"` (SGLang 0.5.23, whose
`deinterleave_moe_mxfp4_w13_for_marlin` runs before the same preparation) de-interleaves w13's
weights, scales and bias into [gate; up] first (docs/sglang.md, "MARLIN").

NVFP4 (`prepare_nvfp4_moe_layer_for_marlin`): the same 16-bit-activation repack of the 4-bit codes
(w13 halves and w2's columns padded as the revision row says); block and global scales are
rescaled arithmetic (`nvfp4_scales`), not moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mxconvert.core.dtypes import INT32, DType
from mxconvert.core.errors import UnsupportedError
from mxconvert.layouts.base import Arrange, TensorLayout, chain, pad_dims, round_up
from mxconvert.layouts.codecs import NIBBLES, Codec, Relabel
from mxconvert.layouts.derived import DerivedTensor
from mxconvert.layouts.errors import InverseError
from mxconvert.layouts.nvfp4_scales import (
    E4M3_BLOCK_SCALES,
    marlin_global_scales,
    marlin_scales,
    pad_scale_columns,
    pad_scale_halves,
    plain_marlin_global_scales,
    plain_marlin_scales,
)
from mxconvert.layouts.primitives import deinterleave, pad_halves
from mxconvert.layouts.registry import ExpertLayout, LayoutTarget, nvfp4_layout, register
from mxconvert.target.backends import MARLIN_BACKENDS, Nvfp4Backend

if TYPE_CHECKING:
    import torch
else:  # imported when a layout first runs on data (mxconvert/lazy_import.py)
    from mxconvert.core.lazy_import import torch


@dataclass(frozen=True)
class PackInt32(Codec):
    """Eight 4-bit codes `[..., 8]` -> one int32 `[...]`, code j in bits 4j..4j+3."""

    def encode(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        # codes (2m, 2m+1) form byte m (low nibble first); four bytes are the little-endian word
        packed = (x[..., 0::2] | (x[..., 1::2] << 4)).contiguous()
        return packed.view(torch.int32).reshape(x.shape[:-1])

    def encoded_spec(self, dtype: DType | torch.dtype, shape: tuple[int, ...]) -> tuple[DType, tuple[int, ...]]:
        return INT32, tuple(shape[:-1])

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype, portable: bool = False) -> torch.Tensor:
        return NIBBLES.split(y.contiguous().view(torch.uint8), portable).reshape(*y.shape, 8)


@dataclass(frozen=True)
class E8m0Offset(Codec):
    """FP8-activation Marlin scales: raw e8m0 byte + 6 (vLLM asserts the byte is <= 249)."""

    offset: int = 6

    def encode(self, x: torch.Tensor, portable: bool = False) -> torch.Tensor:
        if x.device.type != "meta" and bool((x > 255 - self.offset).any()):
            raise ValueError(f"Marlin fp8 scales need e8m0 bytes <= {255 - self.offset}")
        return (x + self.offset).view(torch.float8_e8m0fnu)

    def decode(self, y: torch.Tensor, arranged_dtype: torch.dtype, portable: bool = False) -> torch.Tensor:
        raw = y.view(torch.uint8)
        if bool((raw < self.offset).any()):
            raise InverseError(f"Marlin fp8 scale byte below the +{self.offset} offset")
        return raw - self.offset


def repack_16bit(v: torch.Tensor, fill: int) -> torch.Tensor:
    """Codes `[E, N, K]` -> `[E, K/16, 2N, 8]`: word `[KT, 128NT + 16c + 4r + w]` holds code
    `j = 4kk + 2nb + kb` = `V[16KT + 8kb + 2r + kk, 64NT + 16w + 8nb + c]`."""
    e, n, k = v.shape
    if k % 16 or n % 64:
        raise ValueError(f"Marlin repack needs K % 16 == 0 and N % 64 == 0, got K={k} N={n}")
    t = v.transpose(1, 2).reshape(e, k // 16, 2, 4, 2, n // 64, 4, 2, 8)  # (KT, kb, r, kk, NT, w, nb, c)
    return t.permute(0, 1, 5, 8, 3, 6, 4, 7, 2).reshape(e, k // 16, 2 * n, 8)  # (KT, NT, c, r, w, kk, nb, kb)


def repack_8bit(v: torch.Tensor, fill: int) -> torch.Tensor:
    """FP8 activations: tiles 32(k) x 32(n), `k = 32KT + 16jb + 4r + jh`, `n = 32NT + 8w + c`,
    code `j = 2jh + jb` of word `(KT, NT, c, r, w)`."""
    e, n, k = v.shape
    if k % 32 or n % 32:
        raise ValueError(f"Marlin fp8 repack needs K % 32 == 0 and N % 32 == 0, got K={k} N={n}")
    t = v.transpose(1, 2).reshape(e, k // 32, 2, 4, 4, n // 32, 4, 8)  # (KT, jb, r, jh, NT, w, c)
    return t.permute(0, 1, 5, 7, 3, 6, 4, 2).reshape(e, k // 16, 2 * n, 8)  # (KT, NT, c, r, w, jh, jb)


def scales_16bit(s: torch.Tensor, fill: int) -> torch.Tensor:
    """`[E, N, Ks]` -> `[E, Ks, N]`: 8x8 transpose in each 64-block (`scale_perm`), then swap the
    middle pair of every 4 (`[0, 2, 1, 3]`)."""
    e, n, ks = s.shape
    if n % 64:
        raise ValueError(f"Marlin scale permutation needs N % 64 == 0, got {n}")
    t = s.transpose(1, 2).reshape(e, ks, n // 64, 8, 8).transpose(-1, -2)
    return t.reshape(e, ks, n // 4, 2, 2).transpose(-1, -2).reshape(e, ks, n)


def _single_perm(x: torch.Tensor) -> torch.Tensor:
    """`scale_perm_single` along the last dim in blocks of 32: out[8a + 2c + d] = in[8c + 2a + d]."""
    *lead, n = x.shape
    if n % 32:
        raise ValueError(f"Marlin single-scale permutation needs a multiple of 32, got {n}")
    return x.reshape(*lead, n // 32, 4, 4, 2).transpose(-3, -2).reshape(*lead, n)


def scales_8bit(s: torch.Tensor, fill: int) -> torch.Tensor:
    return _single_perm(s.transpose(1, 2))


def bias_perm(b: torch.Tensor, fill: int) -> torch.Tensor:
    return _single_perm(b)


_E8M0 = Relabel("label float8_e8m0fnu", "float8_e8m0fnu")
_INT32 = PackInt32("pack 8 codes per int32")


def marlin_tensors(fp8_activations: bool, w13_halves: bool = False) -> tuple[TensorLayout, ...]:
    """The six MXFP4 Marlin tensors; `w13_halves` de-interleaves w13's rows first (SGLang)."""
    repack = repack_8bit if fp8_activations else repack_16bit
    scales = scales_8bit if fp8_activations else scales_16bit
    scale_codec = E8m0Offset("e8m0 byte + 6", "float8_e8m0fnu") if fp8_activations else _E8M0
    tile = "32x32 (fp8 activations)" if fp8_activations else "16x64 (16-bit activations)"
    s_steps = (
        "transpose",
        "marlin_permute_scales" + (" (single)" if fp8_activations else ""),
        "mxfp4_marlin_process_scales" + (" (+6)" if fp8_activations else " ([0,2,1,3])"),
    )
    s_info = {"scale_encoding": "e8m0" + (" + 6" if fp8_activations else ""), "swizzle": "marlin scale permutation"}
    natural = {"row_order": "natural"}
    w_steps = ("4-bit codes", f"gptq_marlin_repack tile {tile}", "pack int32")
    w13_steps: tuple[str, ...]
    s13_steps: tuple[str, ...]
    b13_steps: tuple[str, ...]
    if w13_halves:
        rows13 = {"row_order": "[gate; up] halves (deinterleave_moe_mxfp4_w13_for_marlin)"}

        def rows(move: Arrange) -> Arrange:
            return chain(deinterleave, move)

        w13_steps, s13_steps, b13_steps = (
            ("deinterleave", *w_steps),
            ("deinterleave", *s_steps),
            ("deinterleave", "marlin_permute_bias"),
        )
    else:
        rows13 = {"row_order": "gate/up interleaved (g0,u0,g1,u1,...)"}

        def rows(move: Arrange) -> Arrange:
            return move  # vLLM's layout, unchanged

        w13_steps, s13_steps, b13_steps = w_steps, s_steps, ("marlin_permute_bias",)
    return (
        TensorLayout("w13_weight", rows(repack), _INT32, split=NIBBLES, steps=w13_steps, info=rows13),
        TensorLayout("w13_weight_scale", rows(scales), scale_codec, steps=s13_steps, info=rows13 | s_info),
        TensorLayout("w13_bias", rows(bias_perm), steps=b13_steps, info=rows13),
        TensorLayout("w2_weight", repack, _INT32, split=NIBBLES, steps=w_steps, info=natural),
        TensorLayout("w2_weight_scale", scales, scale_codec, steps=s_steps, info=natural | s_info),
        TensorLayout("w2_bias", bias_perm, steps=("marlin_permute_bias",), info=natural),
    )


@register("mxfp4", *MARLIN_BACKENDS)
def mxfp4_marlin(target: LayoutTarget) -> ExpertLayout:
    fp8 = target.marlin_input_dtype == "fp8"
    return ExpertLayout(
        target.backend,
        target.revision.name,
        "marlin",
        {t.name: t for t in marlin_tensors(fp8, target.revision.mxfp4_marlin_w13_rows == "halves")},
        {"marlin_input_dtype": "fp8" if fp8 else None, "group_size": 32},
    )


# ---- NVFP4 ----------------------------------------------------------------------------------------
@register("nvfp4", Nvfp4Backend.MARLIN)
def nvfp4_marlin(target: LayoutTarget) -> ExpertLayout:
    if target.revision.nvfp4_marlin_scales == "plain":
        return _nvfp4_marlin_plain(target)
    K, N = target.hidden, target.intermediate
    if K % 64:
        raise UnsupportedError(f"MARLIN needs the hidden size to be a multiple of 64, got {K}")
    np_ = round_up(N, 64) if K % 128 == 0 else round_up(N, 128)

    def repack_w2(codes, fill):  # [E, K, N'] codes: size_k = N', size_n = K
        return repack_16bit(pad_dims(codes, {2: np_}, fill), fill)

    tensors = {
        "w13_weight": TensorLayout(
            "w13_weight",
            chain(pad_halves(np_), repack_16bit),
            _INT32,
            split=NIBBLES,
            steps=("pad halves", "gptq_marlin_repack 16x64", "pack int32"),
            info={"row_order": "[w1 (gate); w3 (up)]"},
        ),
        "w2_weight": TensorLayout(
            "w2_weight",
            repack_w2,
            _INT32,
            split=NIBBLES,
            steps=("pad", "gptq_marlin_repack 16x64", "pack int32"),
            info={"row_order": "natural"},
        ),
    }
    pad13, pad2 = pad_scale_halves(np_), pad_scale_columns(np_ // 16)
    derived = {
        "w13_weight_scale": DerivedTensor(
            "w13_weight_scale", ("w13_weight_scale",), marlin_scales(pad13), ("marlin scales",), E4M3_BLOCK_SCALES
        ),
        "w13_weight_scale_2": DerivedTensor(
            "w13_weight_scale_2",
            ("w13_weight_scale_2", "w13_weight_scale"),
            marlin_global_scales(pad13),
            ("w * 2^119 / sf",),
            {},
        ),
        "w2_weight_scale": DerivedTensor(
            "w2_weight_scale", ("w2_weight_scale",), marlin_scales(pad2), ("marlin scales",), E4M3_BLOCK_SCALES
        ),
        "w2_weight_scale_2": DerivedTensor(
            "w2_weight_scale_2",
            ("w2_weight_scale_2", "w2_weight_scale"),
            marlin_global_scales(pad2),
            ("w * 2^119 / sf",),
            {},
        ),
    }
    return nvfp4_layout(target, tensors, derived, {"intermediate_padded": np_, "marlin_input_dtype": None})


def _nvfp4_marlin_plain(target: LayoutTarget) -> ExpertLayout:
    """No N padding, no rescale factor, subnormal block scales kept, global scales
    `bf16(w) * 2^119` held in bfloat16."""
    tensors = {
        "w13_weight": TensorLayout(
            "w13_weight",
            repack_16bit,
            _INT32,
            split=NIBBLES,
            steps=("gptq_marlin_repack 16x64", "pack int32"),
            info={"row_order": "[w1 (gate); w3 (up)]"},
        ),
        "w2_weight": TensorLayout(
            "w2_weight",
            repack_16bit,
            _INT32,
            split=NIBBLES,
            steps=("gptq_marlin_repack 16x64", "pack int32"),
            info={"row_order": "natural"},
        ),
    }
    derived = {
        name: DerivedTensor(name, (name,), plain_marlin_scales, ("marlin scales (subnormals kept)",), E4M3_BLOCK_SCALES)
        for name in ("w13_weight_scale", "w2_weight_scale")
    } | {
        name: DerivedTensor(name, (name,), plain_marlin_global_scales, ("bf16(w) * 2^119",), {})
        for name in ("w13_weight_scale_2", "w2_weight_scale_2")
    }
    return nvfp4_layout(
        target, tensors, derived, {"intermediate_padded": target.intermediate, "marlin_input_dtype": None}
    )
