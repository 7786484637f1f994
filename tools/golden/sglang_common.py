"""What the SGLang 0.5.23 golden tools (tools/golden/sglang_*.py) and tests_sglang/harness.py share:
reading SGLang's source from the wheel or the installed package and compiling chosen functions of it
(importing the modules needs SGLang's CUDA stack), the stand-ins several of them use, the random
GPT-OSS checkpoint of the MXFP4 goldens, and the tools' command-line front (docs/sglang.md, "Goldens").

Stand-ins here (each tool's docstring names where it uses them):
  * `fused_moe_fast_path`: the MXFP4 fast path of `FusedMoE.weight_loader` for a whole-layer tensor
    (`param.data[:, :dim1, :dim2].copy_(loaded_weight)`, layers/moe/fused_moe_triton/layer.py);
  * `cuda_is_identity`: `torch.Tensor.cuda` -> identity while SGLang's post-processing runs (the
    gemm1_* tensors stay on the CPU).
The `sys.modules` entries that answer SGLang's in-function `from sglang... import X` are put in place
by release_standins.py's `modules` (the vLLM release tools' same need).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import glob
import hashlib
import os
import types
import typing
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "sglang"
WHEELS = Path(os.path.expanduser("~/.cache/mxconvert-wheels"))
WHEEL_GLOB = str(WHEELS / "sglang-0.5.23-*.whl")
#: The FlashInfer release SGLang 0.5.23 pins (its TRT-LLM tools run FlashInfer's own code).
FLASHINFER_PIN = "0.7.2"
#: GPT-OSS's six MXFP4 expert parameters, as SGLang's `Mxfp4MoEMethod.create_weights` names them.
NAMES = ("w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight", "w2_weight_scale", "w2_weight_bias")


def round_up(x: int, y: int) -> int:
    """SGLang's `round_up` (x up to a multiple of y)."""
    return -(-x // y) * y


def mxfp4_namespace(platform: types.SimpleNamespace, has_triton_kernels: bool) -> dict:
    """The module-level names of SGLang's layers/quantization/mxfp4.py that `Mxfp4MoEMethod`'s
    create_weights and process_weights_after_loading look up, on a CUDA host (not HIP, XPU or CPU;
    no aiter) whose `get_platform()` is `platform`; `get_moe_a2a_backend()` not MORI;
    `set_weight_attrs` a no-op (the tools call the loader themselves)."""
    return {
        "torch": torch,
        "Parameter": torch.nn.Parameter,
        "Optional": typing.Optional,
        "round_up": round_up,
        "set_weight_attrs": lambda weight, attrs: None,
        "_UE8M0_ONE": 127,
        "_is_hip": False,
        "_is_xpu": False,
        "_is_cpu": False,
        "_use_aiter": False,
        "has_triton_kernels": has_triton_kernels,
        "get_platform": lambda: platform,
        "get_moe_a2a_backend": lambda: types.SimpleNamespace(is_mori=lambda: False),
    }


def wheel_reader(wheel: str) -> Callable[[str], str]:
    """A wheel's source files by path (`sglang/srt/...`)."""
    archive = zipfile.ZipFile(wheel)
    return lambda path: archive.read(path).decode()


def installed_reader(site_packages: Path) -> Callable[[str], str]:
    """An installed sglang's source files by path (tests_sglang reads the installed package)."""
    return lambda path: (site_packages / path).read_text()


def compile_functions(read: Callable[[str], str], path: str, wanted: dict[str | None, set[str]], namespace: dict):
    """Exec the functions of SGLang's `path` named in `wanted` (key None: module level; a class name:
    that class's methods, compiled as plain functions taking `self`) into `namespace`, as written."""
    tree = ast.parse(read(path))
    body: list[ast.stmt] = []
    for cls, names in wanted.items():
        nodes = tree.body
        if cls is not None:
            nodes = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), [])
        found = [n for n in nodes if isinstance(n, ast.FunctionDef) and n.name in names]
        missing = names - {n.name for n in found}
        if missing:
            raise SystemExit(f"{path} lacks {cls + '.' if cls else ''}{sorted(missing)}")
        body += found
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), path, "exec"), namespace)  # noqa: S102 - SGLang's own code
    return namespace


def fused_moe_fast_path(param, loaded_weight, weight_name=None, shard_id=None, expert_id=None) -> None:
    """FusedMoE.weight_loader's MXFP4 path for a whole-layer tensor (expert_id None)."""
    if loaded_weight.dim() == 2:
        param.data[:, : loaded_weight.shape[1]].copy_(loaded_weight)
    else:
        param.data[:, : loaded_weight.shape[1], : loaded_weight.shape[2]].copy_(loaded_weight)


def load_fast_path(layer: torch.nn.Module, ckpt: dict[str, torch.Tensor]) -> None:
    """Each checkpoint tensor into the layer parameter of its name, by `fused_moe_fast_path`."""
    for name, loaded in ckpt.items():
        fused_moe_fast_path(getattr(layer, name), loaded)


@contextlib.contextmanager
def cuda_is_identity() -> Iterator[None]:
    """Stand-in while SGLang's post-processing runs: `torch.Tensor.cuda` keeps the tensor on the CPU."""
    saved = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = saved  # type: ignore[method-assign]


def gpt_oss_checkpoint(experts: int, hidden: int, intermediate: int, seed: int) -> dict[str, torch.Tensor]:
    """One TP=1 rank of a GPT-OSS checkpoint's expert tensors (blocks flattened as the loader does)."""
    g = torch.Generator().manual_seed(seed)
    u8 = lambda *shape: torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)  # noqa: E731
    scale = lambda *shape: torch.randint(110, 140, shape, generator=g, dtype=torch.uint8)  # noqa: E731
    bf16 = lambda *shape: torch.randn(shape, generator=g).to(torch.bfloat16)  # noqa: E731
    return {
        "w13_weight": u8(experts, 2 * intermediate, hidden // 2),
        "w13_weight_scale": scale(experts, 2 * intermediate, hidden // 32),
        "w13_weight_bias": bf16(experts, 2 * intermediate),
        "w2_weight": u8(experts, hidden, intermediate // 2),
        "w2_weight_scale": scale(experts, hidden, intermediate // 32),
        "w2_weight_bias": bf16(experts, hidden),
    }


def digest(t: torch.Tensor) -> dict:
    """dtype, shape and sha256 of a tensor's bytes (the example digests' entries)."""
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def golden_arguments(description: str) -> argparse.Namespace:
    """The tools' `--wheel` / `--out` options (`wheel`: the cached sglang 0.5.23 wheel unless given)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--wheel", default=None, help="the sglang 0.5.23 wheel (default: the cached one)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.wheel = args.wheel or sglang_wheel()
    return args


def sglang_wheel() -> str:
    """The cached sglang 0.5.23 wheel; stops, saying how to fetch it, when there is none."""
    wheel = next(iter(sorted(glob.glob(WHEEL_GLOB))), None)
    if wheel is None:
        raise SystemExit(f"no wheel at {WHEEL_GLOB}: pip download --no-deps sglang==0.5.23 -d {WHEELS}")
    return wheel


def pinned_flashinfer() -> types.ModuleType:
    """FlashInfer, which must be SGLang 0.5.23's pin: the goldens run its permutes and swizzles."""
    import flashinfer

    if flashinfer.__version__ != FLASHINFER_PIN:
        raise SystemExit(f"FlashInfer {flashinfer.__version__} found; SGLang 0.5.23 pins {FLASHINFER_PIN}")
    return flashinfer
