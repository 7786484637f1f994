"""Stand-ins for what a vLLM release's weight processing asks of a GPU, for running it on CPU.

Used by tools/golden/release_mxfp4_tensors.py and release_nvfp4_tensors.py, which run INSIDE one
release's environment (tools/vllm_releases/record_tensors.py builds it). Only device queries and
CUDA-only ops are replaced; the release's own Python (its converters, round-up rules, triton_kernels
copy, FlashInfer's Python) runs unchanged. Each stand-in is named in the record it helps make:

* `FakePlatform`: vLLM's `current_platform` answering for one target device (CUDA capability, or a
  ROCm gfx name), patched into every loaded `vllm.*` module that holds it; `vllm.platforms.rocm`'s
  gfx queries; triton_kernels' `target_info` capability queries; the TP world size.
* `block_scale_interleave_128x4`: FlashInfer's CUDA `block_scale_interleave` (`nvfp4_` variant
  too), transcribed from its kernel `block_scale_interleave_kernel` + `get_sf_out_offset_128x4`
  (csrc/nv_internal/cpp/kernels/quantization.cu, tensorrt_llm/kernels/quantization_utils.cuh; the
  same code in every FlashInfer pin of vLLM 0.19.0-0.33.0, see docs/releases.md "Tensor records").
  Its outputs are checked against the GPU results recorded in tools/golden/device_results.json
  wherever an input matches one by sha256.
* `sm90_fp4_weights_0_6`: FlashInfer <= 0.6.16.post3's CUDA kernel
  `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` (moe_gemm_mixed_utils.cu), transcribed
  thread by thread. FlashInfer >= 0.6.18 changed that kernel; its outputs come only from the GPU
  run (`DeviceDigests`): an output whose input has no GPU result is "unrecorded", never guessed.
* `marlin_repack_reference`: the CUDA op `gptq_marlin_repack` -> the release's own test reference
  `marlin_utils_test.marlin_weights` (held equal to the op by vLLM's tests).
* AITER's `aiter.ops.shuffle` -> the module file of the amd-aiter wheel (pure torch).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
DEVICE_RESULTS = HERE / "device_results.json"


def sha256_bytes(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes in its logical (row-major) order."""
    t = t.contiguous().reshape(-1)
    if t.dtype != torch.uint8:
        t = t.view(torch.uint8)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


class Unrecorded(Exception):
    """An output needs a CUDA op whose result for this input was never recorded on a GPU."""


# ------------------------------------------------------------------------------------------------
# device queries
# ------------------------------------------------------------------------------------------------
class _Capability(tuple):
    """vLLM's `DeviceCapability` (major, minor) with `to_int()`."""

    @property
    def major(self) -> int:
        return self[0]

    @property
    def minor(self) -> int:
        return self[1]

    def to_int(self) -> int:
        return self[0] * 10 + self[1]

    def as_version_str(self) -> str:
        return f"{self[0]}.{self[1]}"


class FakePlatform:
    """`current_platform` for one target: {"platform": "cuda", "capability": [9, 0]} or
    {"platform": "rocm", "gfx": "gfx950"}. Any query it does not know raises, so a release
    that asks something new is noticed instead of answered wrongly."""

    ROCM_CAPABILITY = {"gfx950": (9, 5), "gfx942": (9, 4), "gfx90a": (9, 0)}

    def __init__(self, target: dict):
        self.target = target
        self.platform = target["platform"]
        cap = target.get("capability") or self.ROCM_CAPABILITY[target["gfx"]]
        self.capability = _Capability(tuple(cap))
        self.device_type = "cuda"  # ROCm builds of torch also say "cuda"
        self.device_name = self.platform

    def is_cuda(self) -> bool:
        return self.platform == "cuda"

    def is_rocm(self) -> bool:
        return self.platform == "rocm"

    def is_cuda_alike(self) -> bool:
        return True

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def is_out_of_tree(self) -> bool:
        return False

    def get_device_capability(self, device_id: int = 0) -> _Capability:
        return self.capability

    def has_device_capability(self, capability, device_id: int = 0) -> bool:
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return self.capability.to_int() >= want

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return self.capability.to_int() == want

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return self.capability.to_int() // 10 == capability // 10

    def __getattr__(self, name: str):
        raise AttributeError(f"FakePlatform: the release asked current_platform.{name}, which this stand-in lacks")


def _rocm_module(target: dict) -> types.ModuleType:
    gfx = target.get("gfx", "")
    mod = types.ModuleType("vllm.platforms.rocm")
    mod.on_gfx950 = lambda: gfx == "gfx950"  # type: ignore[attr-defined]
    mod.on_gfx1250 = lambda: gfx == "gfx1250"  # type: ignore[attr-defined]
    mod.on_gfx942 = lambda: gfx == "gfx942"  # type: ignore[attr-defined]
    mod.on_mi3xx = lambda: gfx in ("gfx942", "gfx950")  # type: ignore[attr-defined]
    mod.on_gfx9 = lambda: gfx.startswith("gfx9")  # type: ignore[attr-defined]
    mod.get_cdna_version = lambda: {"gfx950": 4, "gfx942": 3, "gfx90a": 2}.get(gfx, 0)  # type: ignore[attr-defined]
    return mod


@contextlib.contextmanager
def patched_attrs(pairs):
    """Set (module, name, value) triples, restore them afterwards (absent names are removed)."""
    saved = [(m, n, getattr(m, n, _MISSING)) for m, n, _ in pairs]
    try:
        for m, n, v in pairs:
            setattr(m, n, v)
        yield
    finally:
        for m, n, v in reversed(saved):
            if v is _MISSING:
                delattr(m, n)
            else:
                setattr(m, n, v)


_MISSING = object()


@contextlib.contextmanager
def device(target: dict, torch_geq_2_8_1: bool = True):
    """Answer every device query of the release (and of its triton_kernels copy) for `target`."""
    plat = FakePlatform(target)
    tp = int(target.get("tp", 1))
    pairs: list[tuple[Any, str, Any]] = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "vllm" or name.startswith("vllm.")):
            continue
        if "current_platform" in vars(mod):
            pairs.append((mod, "current_platform", plat))
        if "get_tensor_model_parallel_world_size" in vars(mod):
            pairs.append((mod, "get_tensor_model_parallel_world_size", lambda: tp))
        if "is_torch_equal_or_newer" in vars(mod) and name.endswith("mxfp4_utils"):
            real = vars(mod)["is_torch_equal_or_newer"]
            pairs.append(
                (mod, "is_torch_equal_or_newer", lambda v, _r=real: torch_geq_2_8_1 if v == "2.8.1" else _r(v))
            )
    cuda_cap = plat.capability if plat.is_cuda() else None
    tk_answers = {
        "cuda_capability_geq": lambda major, minor=0: cuda_cap is not None and tuple(cuda_cap) >= (major, minor),
        "is_hip_cdna4": lambda: target.get("gfx") == "gfx950",
        "is_hip_cdna3": lambda: target.get("gfx") == "gfx942",
        "is_cuda": lambda: plat.is_cuda(),
        "is_hip": lambda: plat.is_rocm(),
    }
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "triton_kernels" or name.startswith("triton_kernels.")):
            continue
        for fn, answer in tk_answers.items():
            if fn in vars(mod):
                pairs.append((mod, fn, answer))
    saved_rocm: Any = sys.modules.get("vllm.platforms.rocm", _MISSING)
    sys.modules["vllm.platforms.rocm"] = _rocm_module(target)
    try:
        with patched_attrs(pairs):
            yield plat
    finally:
        if saved_rocm is _MISSING:
            sys.modules.pop("vllm.platforms.rocm", None)
        else:
            sys.modules["vllm.platforms.rocm"] = saved_rocm


@contextlib.contextmanager
def cuda_properties_at_import():
    """Some FlashInfer releases (0.6.8.post1's gdn kernels) read
    `torch.cuda.get_device_properties(0).multi_processor_count` at import time when the CUTLASS DSL
    is importable; answer with an SM100-sized device while FlashInfer is imported (no weight depends
    on it)."""
    props = types.SimpleNamespace(multi_processor_count=148, major=10, minor=0, name="release_standins")
    with patched_attrs([(torch.cuda, "get_device_properties", lambda *a, **k: props)]):
        yield


# ------------------------------------------------------------------------------------------------
# FlashInfer's CUDA-only layout functions
# ------------------------------------------------------------------------------------------------
def c_function_digest(text: str, name: str) -> str:
    """sha256 over every definition of the C/C++/CUDA function `name` in `text` (a definition is
    `name(...) {...}`; calls are skipped), whitespace collapsed, in file order."""
    import re

    bodies = []
    for match in re.finditer(r"\b" + re.escape(name) + r"\s*\(", text):
        i, depth = match.end(), 1
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        head = re.match(r"[^;{]*\{", text[i : i + 400])
        if not head:
            continue
        k, depth = i + head.end(), 1
        while depth:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
        start = text.rfind("\n", 0, match.start()) + 1
        bodies.append(re.sub(r"\s+", " ", text[start:k]))
    return hashlib.sha256("\n".join(bodies).encode()).hexdigest()


#: FlashInfer source (under data/csrc/nv_internal/) whose code the stand-ins stand for: per function,
#: the files that may define it (the first that does counts; FlashInfer moves them), and its name
BSI_SOURCE = (
    (("cpp/kernels/quantization.cu",), "block_scale_interleave_kernel"),
    (
        ("tensorrt_llm/kernels/quantization_utils.cuh", "tensorrt_llm/kernels/quantization.cuh"),
        "get_sf_out_offset_128x4",
    ),
)
SM90_SOURCE = (
    (
        ("tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu",),
        "interleave_fp4_weights_for_sm90_mixed_gemm_kernel",
    ),
)
_EMPTY = hashlib.sha256(b"").hexdigest()


def source_digest(csrc: Path, functions) -> str:
    """One digest over `functions` of a FlashInfer wheel's csrc/nv_internal (file names excluded)."""
    parts = []
    for files, name in functions:
        digest = "missing"
        for rel in files:
            path = csrc / rel
            if path.exists() and (d := c_function_digest(path.read_text(), name)) != _EMPTY:
                digest = d
                break
        parts.append(f"{name}:{digest}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


#: block_scale_interleave sources (digest -> why the transcription stands for them)
BSI_KNOWN = {
    "9872edf86c58b10b0b9057b13b4e19924732e7d8828a4633cb9eab40124747ee": (
        "FlashInfer 0.6.12-0.7.2.post1: the code behind the GPU results of tools/golden/device_results.json"
    ),
    "26bfbc2e59cde3e08676242d4f876266a8174a0a3158cb0013dd284e7c5002c8": (
        "FlashInfer 0.6.1-0.6.11.post2: get_sf_out_offset_128x4 takes std::optional batch and row count and "
        "uses value_or(0); the kernel passes both, so the offsets are those of 0.6.12+ (docs/releases.md)"
    ),
}
#: SM90 fp4 weight interleave kernel sources
SM90_GPU_DIGESTS = "e5e650f6316d7e2d28e1f8266d3958bdb01f303db3f57cf5fa1657a7137e16f4"  # 0.6.18-0.7.2.post1
SM90_TRANSCRIBED = "eea31c62b29f9c0ae4360f4df86b0dad1c04d23aa945372e0caf0b79aa1ea331"  # 0.6.11.post2-0.6.16.post3


def _device_results() -> dict:
    """{"<function>": {input sha256: output sha256}} from the GPU run (tools/golden/device_results.json)."""
    data = json.loads(DEVICE_RESULTS.read_text())
    out: dict[str, dict[str, str]] = {}
    for r in data["results"]:
        out.setdefault(r["function"], {})[r["input_sha256"]] = r["output_sha256"]
    return out


def _block_scale_interleave_128x4(sf: torch.Tensor) -> torch.Tensor:
    """FlashInfer `block_scale_interleave_kernel` (128x4, uint8) transcribed: input [B, M, K] or
    [M, K]; output 1-D of B * ru(M, 128) * ru(K, 4) bytes, zero where padded.
    dst = b * bTile + (m // 128) * mTile + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4."""
    x = sf.reshape(-1, *sf.shape[-2:]) if sf.dim() >= 2 else sf.reshape(1, 1, -1)
    B, M, K = x.shape
    Mp, Kp = -(-M // 128) * 128, -(-K // 4) * 4
    padded = torch.zeros(B, Mp, Kp, dtype=x.dtype)
    padded[:, :M, :K] = x
    m = torch.arange(Mp).view(Mp, 1)
    k = torch.arange(Kp).view(1, Kp)
    k_tiles = Kp // 4
    offset = (m // 128) * (k_tiles * 512) + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
    out = torch.zeros(B, Mp * Kp, dtype=x.dtype)
    out[:, offset.reshape(-1)] = padded.reshape(B, -1)
    return out.reshape(-1)


class FlashInferCuda:
    """The CUDA-only FlashInfer functions vLLM's converters call, for one run.

    `block_scale_interleave` returns the transcribed kernel's bytes, and checks them against the
    GPU result wherever one was recorded for the same input. `sm90_weights` (SM90 mixed-GEMM fp4
    weight interleave): the transcription of the pinned FlashInfer's kernel (0.6.x or 0.6.18+), each
    checked against the GPU (device_sm90_fp4_0_6.json; device_results.json per matching input).
    FlashInfer source neither transcription was checked against -> `Unrecorded`."""

    def __init__(self, flashinfer_version: str, csrc: Path):
        self.version = flashinfer_version
        self.sources = {
            "block_scale_interleave": source_digest(csrc, BSI_SOURCE),
            "sm90_weights": source_digest(csrc, SM90_SOURCE),
        }
        self.device = _device_results()
        self.checked: list[str] = []

    def block_scale_interleave(self, sf: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs.get("out") is not None:
            raise NotImplementedError("block_scale_interleave stand-in: only the single-argument call")
        if self.sources["block_scale_interleave"] not in BSI_KNOWN:
            raise Unrecorded(f"needs block_scale_interleave on a GPU (FlashInfer {self.version}'s kernel is new)")
        x = sf.contiguous()
        assert x.dtype == torch.uint8, x.dtype
        y = _block_scale_interleave_128x4(x)
        want = self.device.get("block_scale_interleave", {}).get(sha256_bytes(x))
        if want is not None:
            got = sha256_bytes(y)
            if got != want:
                raise AssertionError(f"block_scale_interleave transcription differs from the GPU for input {x.shape}")
            self.checked.append("block_scale_interleave")
        return y

    def sm90_weights(self, weight: torch.Tensor, quant_type: str = "fp4") -> torch.Tensor:
        assert quant_type == "fp4" and weight.dtype == torch.uint8 and weight.dim() == 3
        x = weight.contiguous()
        if self.sources["sm90_weights"] == SM90_TRANSCRIBED:  # checked on a GPU: device_sm90_fp4_0_6.json
            return torch.stack([sm90_fp4_weights_0_6(x[e]) for e in range(x.shape[0])])
        if self.sources["sm90_weights"] != SM90_GPU_DIGESTS:
            raise Unrecorded(f"needs interleave_moe_weights_for_sm90_mixed_gemm on a GPU (FlashInfer {self.version})")
        y = torch.stack([sm90_fp4_weights_0_7(x[e]) for e in range(x.shape[0])])
        want = self.device.get("sm90 fp4 weight interleave", {}).get(sha256_bytes(x))
        if want is not None:
            if sha256_bytes(y) != want:
                raise AssertionError(f"SM90 fp4 weight interleave transcription differs from the GPU for {x.shape}")
            self.checked.append("interleave_moe_weights_for_sm90_mixed_gemm")
        return y


def sm90_fp4_weights_0_6(w: torch.Tensor) -> torch.Tensor:
    """FlashInfer 0.6.x `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` (rows = n, cols = k
    elements, w = [n, k/2] bytes), every (block_id, partition_id, lane_id) thread of the kernel:

        row = block_id / 8 * 16 + block_id % 8;  mma = lane / 8;  dst_row = row + (mma % 2) * 8
        ilane = lane / 16 * 16 + (lane % 4) * 4 + (lane % 8) / 4 * 2
        col = part * 32 + lane;  dst_col = part * 32 + ilane
        a = w[row][col], b = w[row + 8][col]
        a' = (a & 0x0F) | ((b & 0x0F) << 4);  b' = (b & 0xF0) | ((a & 0xF0) >> 4)
        out[dst_row][dst_col] = a';  out[dst_row][dst_col + 1] = b'

    Bytes no thread writes stay as `torch.empty` left them in the CUDA op; here they are zero and
    the caller must not rely on them (none exist when n % 16 == 0 and k % 64 == 0)."""
    n, kb = w.shape
    cols = 2 * kb
    assert n % 16 == 0 and cols % 64 == 0, (n, cols)
    out = torch.zeros_like(w)
    written = torch.zeros_like(w, dtype=torch.bool)
    block = torch.arange(n // 2).view(-1, 1, 1)
    part = torch.arange(cols // 64).view(1, -1, 1)
    lane = torch.arange(32).view(1, 1, -1)
    row = block // 8 * 16 + block % 8
    dst_row = row + ((lane // 8) % 2) * 8
    ilane = lane // 16 * 16 + (lane % 4) * 4 + (lane % 8) // 4 * 2
    col = part * 32 + lane
    dst_col = part * 32 + ilane
    shape = (n // 2, cols // 64, 32)
    row, dst_row, col, dst_col = (t.expand(shape).reshape(-1) for t in (row, dst_row, col, dst_col))
    a = w[row, col]
    b = w[row + 8, col]
    a2 = (a & 0x0F) | ((b & 0x0F) << 4)
    b2 = (b & 0xF0) | ((a & 0xF0) >> 4)
    out[dst_row, dst_col] = a2
    out[dst_row, dst_col + 1] = b2
    written[dst_row, dst_col] = True
    written[dst_row, dst_col + 1] = True
    assert bool(written.all()), "the transcribed kernel left bytes unwritten"
    return out


#: FlashInfer >= 0.6.18 `interleave_fp4_weights_for_sm90_mixed_gemm_kernel`: (mask, left shift) of its
#: bit moves on the 4 gathered bytes (a negative shift is a right shift), in the kernel's order
_SM90_0_7_MOVES = (
    (0x00000080, 24), (0x00000070, 18), (0x00000008, 12), (0x00000007, 6),
    (0x00008000, 13), (0x00007000, 7), (0x00000800, 1), (0x00000700, -5),
    (0x00800000, 2), (0x00700000, -4), (0x00080000, -10), (0x00070000, -16),
    (0x80000000, -1), (0x10000000, 1), (0x60000000, -3), (0x08000000, -13),
    (0x01000000, -11), (0x06000000, -15),
)  # fmt: skip


def sm90_fp4_weights_0_7(w: torch.Tensor) -> torch.Tensor:
    """FlashInfer 0.6.18-0.7.2.post1 `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` (launched
    with block (16, 32)), every (block_id, partition_id, lane_id < 16) thread:

        row = block_id / 8 * 16 + block_id % 8;  mma = lane / 4;  dst_row = row + (mma % 2) * 8
        ilane = lane / 8 * 16 + (lane % 4) * 4
        col = part * 32 + mma * 8 + lane % 4;  dst_col = part * 32 + ilane
        raw = w[row][col] | w[row + 8][col] << 8 | w[row][col + 4] << 16 | w[row + 8][col + 4] << 24
        out = OR of ((raw & mask) << shift) over _SM90_0_7_MOVES
        out bytes 0..3 -> dst[dst_row][dst_col .. dst_col + 3]

    Checked against the GPU results of tools/golden/device_results.json wherever an input has one
    (`FlashInferCuda.sm90_weights`)."""
    n, kb = w.shape
    cols = 2 * kb
    assert n % 16 == 0 and cols % 64 == 0, (n, cols)
    out = torch.zeros_like(w)
    written = torch.zeros_like(w, dtype=torch.bool)
    block = torch.arange(n // 2).view(-1, 1, 1)
    part = torch.arange(cols // 64).view(1, -1, 1)
    lane = torch.arange(16).view(1, 1, -1)
    row = block // 8 * 16 + block % 8
    mma = lane // 4
    dst_row = row + (mma % 2) * 8
    col = part * 32 + mma * 8 + lane % 4
    dst_col = part * 32 + lane // 8 * 16 + (lane % 4) * 4
    shape = (n // 2, cols // 64, 16)
    row, dst_row, col, dst_col = (t.expand(shape).reshape(-1) for t in (row, dst_row, col, dst_col))
    x = w.to(torch.int64)
    raw = x[row, col] | (x[row + 8, col] << 8) | (x[row, col + 4] << 16) | (x[row + 8, col + 4] << 24)
    moved = torch.zeros_like(raw)
    for mask, shift in _SM90_0_7_MOVES:
        bits = raw & mask
        moved |= (bits << shift) if shift >= 0 else (bits >> -shift)
    moved &= 0xFFFFFFFF
    for b in range(4):
        out[dst_row, dst_col + b] = ((moved >> (8 * b)) & 0xFF).to(torch.uint8)
        written[dst_row, dst_col + b] = True
    assert bool(written.all()), "the transcribed kernel left bytes unwritten"
    return out


# ------------------------------------------------------------------------------------------------
# Marlin, AITER
# ------------------------------------------------------------------------------------------------
def marlin_repack_reference(
    b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int, is_a_8bit: bool = False, perm=None, **_
) -> torch.Tensor:
    """Stand-in for the CUDA op `gptq_marlin_repack`: the release's own test reference
    `marlin_utils_test.marlin_weights` on the unpacked GPTQ nibbles."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_test import get_weight_perm, marlin_weights

    assert num_bits == 4 and b_q_weight.dtype == torch.int32
    assert list(b_q_weight.shape) == [size_k // 8, size_n]
    assert perm is None or perm.numel() == 0  # no act-order for MXFP4
    shifts = (4 * torch.arange(8, dtype=torch.int32)).view(1, 8, 1)
    q_w = ((b_q_weight.unsqueeze(1) >> shifts) & 0xF).reshape(size_k, size_n)
    try:
        return marlin_weights(q_w, size_k, size_n, num_bits, get_weight_perm(num_bits, is_a_8bit), is_a_8bit=is_a_8bit)
    except TypeError:  # releases whose reference has no is_a_8bit (16-bit activations only)
        assert not is_a_8bit
        return marlin_weights(q_w, size_k, size_n, num_bits, get_weight_perm(num_bits))


def aiter_modules(shuffle_file: Path) -> dict[str, types.ModuleType]:
    """`aiter`, `aiter.ops`, `aiter.ops.shuffle` with the wheel's shuffle.py (pure torch)."""
    spec = importlib.util.spec_from_file_location("aiter.ops.shuffle", shuffle_file)
    assert spec is not None and spec.loader is not None
    shuffle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shuffle)
    aiter = types.ModuleType("aiter")
    ops = types.ModuleType("aiter.ops")
    aiter.ops = ops  # type: ignore[attr-defined]
    ops.shuffle = shuffle  # type: ignore[attr-defined]
    return {"aiter": aiter, "aiter.ops": ops, "aiter.ops.shuffle": shuffle}


@contextlib.contextmanager
def modules(mods: dict[str, types.ModuleType]):
    saved = {k: sys.modules.get(k, _MISSING) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is _MISSING:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v  # type: ignore[assignment]
