"""mxconvert's layouts against vLLM 0.33.0's own conversion code, run on the same CPU, in the same
process, on the same canonical tensors of one gpt-oss-size MoE layer (issue 11, target 5).

    PYTHONPATH=. python bench/bench_vs_vllm.py [--experts 4] [--repeat 3] [--jobs N] \
        [--formats mxfp4,nvfp4] [--only TRITON,MARLIN] [--aiter-shuffle .../aiter/ops/shuffle.py]

`python` is one with vLLM 0.33.0 installed for CPU (flashinfer-python 0.7.2.post1, triton 3.9.0,
torch 2.13.0), e.g. `.venv-vllm/bin/python` after `tools/vllm_env/setup.sh`; mxconvert is imported
from the checkout beside this file (first on sys.path), in the same process. The AITER row needs
`aiter/ops/shuffle.py` out of the amd-aiter 0.1.7.post2.dev18 wheel
(`pip download --no-deps --pre amd-aiter==0.1.7.post2.dev18`, then unzip that one file);
without `--aiter-shuffle` the row is skipped.

What is timed, per backend, per layer (H = I = 2880, padded as each backend pads):

  * vLLM, MXFP4: `vllm.model_executor.layers.fused_moe.oracle.mxfp4.
    convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(backend, layer, w13, w2, s13, s2, b13, b2)`
    on clones of the canonical tensors (cloning is outside the timing). Its permute-index cache
    (`_cache_permute_indices`, TRTLLM) is kept across calls as vLLM keeps it across layers, and
    the best of `--repeat` calls after a warm-up is reported (both sides), so both are steady state.
  * vLLM, NVFP4: `...oracle.nvfp4.convert_to_nvfp4_moe_kernel_format(backend, layer, ...)` (gated,
    W4A4, as ModelOptNvFp4FusedMoE calls it) on the canonical tensors of
    tests/golden/nvfp4_inputs.py (K = --hidden, N = --intermediate), with tools/golden's stand-in
    layer (`make_nvfp4_goldens.StandInRoutedExperts`, built outside the timing). The later steps
    of vLLM's weight processing (quant config, the experts' global-scale fold) are not timed; on
    mxconvert's side the folded scales (derived tensors) are, so that side does a little more.
  * mxconvert: every kernel tensor's `TensorLayout.forward`, cut into chunks of experts and run on
    `--jobs` threads with `parallel.ordered_map` under `parallel.torch_threads`, exactly as
    `convert.execute` drives it (same chunk size rule, `chunk_bytes_for(jobs)`); the gather plans
    are built once beforehand (`prepare_all`, as convert does once per conversion; its time is
    printed separately). Reading the source and writing / hashing the artifact are not included
    on either side.

Calls inside vLLM's converters that need a GPU or ROCm are replaced; the table marks with `*`
the rows where vLLM actually called one and names it (a stand-in's speed is not the speed of
vLLM's kernel for that step; on a GPU those steps run as CUDA kernels):

  * FlashInfer `nvfp4_block_scale_interleave` / `block_scale_interleave` (CUDA JIT) -> the
    pure-torch 128x4 swizzle FlashInfer 0.7.2.post1 ships
    (`flashinfer.diffusion_ops.minimax_h3_fc1_swiglu._swizzle_sf_128x4`), per 2-D matrix
    (NVFP4: vLLM's own pure-torch `swizzle_blockscale`, as tools/golden/make_nvfp4_goldens.py);
  * FlashInfer `interleave_moe_weights_for_sm90_mixed_gemm` (CUDA op) -> the closed form of
    tools/golden (`mxfp4_vllm_backends.cf_sm90_weights` with `make_mxfp4_goldens.cf_pack`), which
    the golden self-checks hold equal to the GPU's output;
  * `vllm._custom_ops.gptq_marlin_repack` (CUDA op) -> vLLM's own test reference
    `marlin_utils_test.marlin_weights` (as tools/golden does);
  * `aiter.ops.shuffle` (ROCm package) -> the module file `aiter/ops/shuffle.py` of the
    amd-aiter 0.1.7.post2.dev18 wheel (pure torch: this is AITER's real code, not a stand-in);
  * `current_platform` answers as a CUDA device of the target's capability (TRITON: which
    triton_kernels layouts `_swizzle_mxfp4` picks), triton_kernels' `cuda_capability_geq` too.

"one copy": one plain copy (numpy's) of every canonical tensor whose bytes the layout
changes (tensors it keeps as they are come back as views of the input on mxconvert's side and
are left out; inputs of derived tensors are in), on the same clock and threads: a single pass
over the bytes that must be rewritten, into new buffers. vLLM / one copy is about the most any
converter that writes new buffers could reach against vLLM on this row ("MB in / out": those
bytes, read and written).

Output bytes of the two sides are compared where vLLM returns a plain tensor buffer (a cheap
sanity check; the golden tests are the real proof).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import sys
import time
import types
from functools import partial
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mxconvert.core.dtypes import torch_dtype  # noqa: E402
from mxconvert.core.parallel import chunk_bytes_for, default_jobs, ordered_map, torch_threads  # noqa: E402
from mxconvert.formats.mxfp4.canonical import CANONICAL_NAMES, canonical_specs  # noqa: E402
from mxconvert.layouts import resolve_layout  # noqa: E402
from mxconvert.layouts.engine.plans import prepare_all  # noqa: E402
from mxconvert.target.backends import Mxfp4Backend as B  # noqa: E402
from mxconvert.target.profiles import get_profile  # noqa: E402
from mxconvert.target.revisions import get_revision  # noqa: E402

U8 = torch.uint8

#: The clock both sides are timed with (`--clock`): wall time, or the CPU seconds of the whole
#: process (all its threads: the work done, which other processes on a loaded machine move far
#: less than the wall time; with `--jobs 1` and one torch thread it is one core's time).
CLOCK = time.perf_counter

#: (label, backend, mxconvert profile, Marlin activation dtype)
TARGETS = [
    ("TRTLLM_MXFP4_BF16 (b200)", B.FLASHINFER_TRTLLM_MXFP4_BF16, "b200", None),
    ("TRTLLM_MXFP4_MXFP8 (b200)", B.FLASHINFER_TRTLLM_MXFP4_MXFP8, "b200", None),
    ("TRITON Hopper (h100)", B.TRITON, "h100", None),
    ("TRITON Blackwell (b200)", B.TRITON, "b200", None),
    ("CUTLASS_MXFP4_BF16 SM90 (h100)", B.FLASHINFER_CUTLASS_MXFP4_BF16, "h100", None),
    ("CUTLASS_MXFP4_MXFP8 (b200)", B.FLASHINFER_CUTLASS_MXFP4_MXFP8, "b200", None),
    ("MARLIN (a100)", B.MARLIN, "a100", None),
    ("MARLIN fp8 act. (l40s)", B.MARLIN, "l40s", "fp8"),
    ("AITER_MXFP4_BF16 CK (mi355x)", B.AITER_MXFP4_BF16, "mi355x-aiter", None),
]


# ---- canonical tensors ----------------------------------------------------------------------------
def make_canonical(experts: int, hp: int, ip: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random fp4 bytes, valid E8M0 scales near 1.0 (118..129), bf16 biases."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (dtype_name, shape) in canonical_specs(experts, hp, ip).items():
        dtype = torch_dtype(dtype_name)
        if name.endswith("_scale"):
            out[name] = torch.randint(118, 130, shape, dtype=U8, generator=g)
        elif dtype == U8:
            out[name] = torch.randint(0, 256, shape, dtype=U8, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g).to(dtype)
    return out


# ---- stand-ins for GPU / ROCm-only calls ----------------------------------------------------------
#: Names of the stand-ins vLLM's converter actually called during the current backend's run.
USED: set[str] = set()


def counted(name: str, fn):
    """`fn`, noting in USED that vLLM called it (the table names only stand-ins really used)."""

    def wrapper(*args, **kwargs):
        USED.add(name)
        return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def patched(obj, **attrs):
    missing = object()
    saved = {k: getattr(obj, k, missing) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                delattr(obj, k)
            else:
                setattr(obj, k, v)


def swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """Stand-in for FlashInfer's CUDA-only (nvfp4_)block_scale_interleave: FlashInfer's own
    pure-torch 128x4 swizzle of each [M, K] matrix, flattened."""
    from flashinfer.diffusion_ops.minimax_h3_fc1_swiglu import _swizzle_sf_128x4

    assert sf.dtype == U8 and sf.dim() in (2, 3)
    if sf.dim() == 3:
        return torch.cat([_swizzle_sf_128x4(m) for m in sf])
    return _swizzle_sf_128x4(sf)


def _golden_module(name: str):
    path = REPO / "tools" / "golden" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def sm90_weights_closed_form(weight: torch.Tensor, quant_type: str = "fp4") -> torch.Tensor:
    """Stand-in for FlashInfer's CUDA op interleave_moe_weights_for_sm90_mixed_gemm(x, "fp4"):
    the closed form tools/golden checks against the GPU's output."""
    assert quant_type == "fp4" and weight.dtype == U8 and weight.dim() == 3
    mb = _golden_module("mxfp4_vllm_backends")
    pack = _pack_fn()
    return mb.cf_sm90_weights(weight.contiguous(), pack)


_PACK = None


def _pack_fn():
    """tools/golden's `cf_pack` (the Hopper fp4 packing of docs/layouts.md), compiled from its source
    without importing the golden script (which needs the reference environment's folders at import time)."""
    global _PACK
    if _PACK is None:
        import ast

        src = (REPO / "tools" / "golden" / "make_mxfp4_goldens.py").read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef) and node.name == "cf_pack":
                ns: dict = {"torch": torch}
                exec(compile(ast.Module(body=[node], type_ignores=[]), "make_mxfp4_goldens.py", "exec"), ns)
                _PACK = ns["cf_pack"]
                break
    return _PACK


def marlin_repack_reference(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False, perm=None):
    """Stand-in for the CUDA op gptq_marlin_repack: vLLM's test reference on the unpacked nibbles."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_test import get_weight_perm, marlin_weights

    assert num_bits == 4 and b_q_weight.dtype == torch.int32
    assert perm is None or perm.numel() == 0
    shifts = (4 * torch.arange(8, dtype=torch.int32)).view(1, 8, 1)
    q_w = ((b_q_weight.unsqueeze(1) >> shifts) & 0xF).reshape(size_k, size_n)
    return marlin_weights(q_w, size_k, size_n, num_bits, get_weight_perm(num_bits, is_a_8bit), is_a_8bit=is_a_8bit)


@contextlib.contextmanager
def aiter_shuffle_module(path: Path | None):
    """`aiter.ops.shuffle` = the wheel's module file (pure torch), as tests_vllm/harness_rocm.py
    stands it in (checked to be amd-aiter 0.1.7.post2.dev18's)."""
    if path is None:
        yield False
        return
    sys.path.insert(0, str(REPO / "tests_vllm"))
    from harness_rocm import aiter_modules

    with aiter_modules(path):
        yield True


@contextlib.contextmanager
def device_as(profile):
    """vLLM's `current_platform` (and triton_kernels' capability query) answer as the profile's
    device; the GPU/ROCm-only calls are swapped for the stand-ins above."""
    import flashinfer
    import flashinfer.fp4_quantization as fp4q
    import flashinfer.fused_moe as fi_moe
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as mfp4
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    tk_layout = importlib.import_module("triton_kernels.tensor_details.layout")
    cap = tuple(profile.capability)
    dc = DeviceCapability(*cap)
    rocm = profile.platform == "rocm"

    def as_int(c):
        return c[0] * 10 + c[1] if isinstance(c, tuple) else int(c)

    with (
        patched(
            current_platform,
            is_cuda=lambda: not rocm,
            is_cuda_alike=lambda: True,
            is_rocm=lambda: rocm,
            get_device_capability=lambda device_id=0: dc,
            is_device_capability=lambda c, device_id=0: as_int(c) == dc.to_int(),
            is_device_capability_family=lambda c, device_id=0: as_int(c) // 10 == dc.to_int() // 10,
            has_device_capability=lambda c, device_id=0: dc.to_int() >= as_int(c),
        ),
        patched(
            tk_layout, cuda_capability_geq=lambda major, minor=0: cap >= (major, minor), is_hip_cdna4=lambda: False
        ),
        patched(fp4q, nvfp4_block_scale_interleave=counted("128x4 scale interleave", swizzle_128x4)),
        patched(flashinfer, block_scale_interleave=counted("128x4 scale interleave", swizzle_128x4)),
        patched(
            fi_moe,
            interleave_moe_weights_for_sm90_mixed_gemm=counted("sm90 weight interleave", sm90_weights_closed_form),
        ),
        patched(ops, gptq_marlin_repack=counted("gptq_marlin_repack", marlin_repack_reference)),
    ):
        yield mfp4


# ---- the two sides --------------------------------------------------------------------------------
def vllm_convert(oracle, backend: B, canon: dict, cache: dict, marlin_dtype, profile):
    """One call of vLLM's converter on clones of the canonical tensors; returns (seconds,
    {name: output tensor or None where it is not a plain tensor})."""
    args = [
        canon[k].clone()
        for k in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias")
    ]
    layer = types.SimpleNamespace(
        params_dtype=torch.bfloat16, w13_weight=None, w2_weight=None, w13_weight_scale=None, w2_weight_scale=None
    )
    be = oracle.Mxfp4MoeBackend[backend.value]
    dtype = torch.float8_e4m3fn if marlin_dtype == "fp8" else None
    with device_as(profile) as mfp4, patched(mfp4, get_marlin_input_dtype=lambda *a, **k: dtype), torch.no_grad():
        start = CLOCK()
        res = oracle.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(be, layer, *args, _cache_permute_indices=cache)
        took = CLOCK() - start
    names = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias")
    return took, {n: _plain(v) for n, v in zip(names, res, strict=True)}


def _plain(v):
    """The buffer of an output: a tensor, a triton_kernels Tensor's storage, a PrecisionConfig's
    weight scale storage; None where none is found."""
    if isinstance(v, torch.nn.Parameter):
        return v.data
    if isinstance(v, torch.Tensor):
        return v
    if hasattr(v, "storage") and hasattr(v.storage, "data"):
        return v.storage.data
    for attr in ("b_mx_scale", "weight_scale"):
        inner = getattr(v, attr, None)
        if inner is not None:
            return _plain(inner)
    return None


def mxconvert_layer(layout, canon: dict, jobs: int) -> tuple[float, dict[str, list[torch.Tensor]]]:
    """Every kernel tensor of the layer through the layout, chunk by chunk on `jobs` threads,
    as convert.execute does (results in order; nothing written). Derived tensors (NVFP4 scale
    folds) are one step each, from the whole tensors, as convert computes them."""
    chunk_bytes = chunk_bytes_for(jobs)
    experts = canon["w13_weight"].shape[0]
    steps = []
    for name in layout.tensors:
        x = canon[name]
        per_expert = max(1, x.numel() * x.element_size() // experts)
        step = max(1, chunk_bytes // per_expert)
        steps += [(name, e0, min(e0 + step, experts)) for e0 in range(0, experts, step)]
    steps += [(name, None, None) for name in layout.derived]

    def run(s):
        name, e0, e1 = s
        if e0 is None:
            return name, layout.derived[name].forward(canon)
        return name, layout.tensors[name].forward(canon[name][e0:e1])

    out: dict[str, list[torch.Tensor]] = {n: [] for n in layout.kernel_names}
    with torch_threads(jobs):
        start = CLOCK()
        for name, piece in ordered_map(run, steps, jobs):
            out[name].append(piece)
        took = CLOCK() - start
    return took, out


def memory_bytes(t: torch.Tensor) -> bytes:
    """A dense tensor's bytes in memory order (vLLM returns some outputs as strided views)."""
    perm = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    t = t.permute(perm).contiguous().reshape(-1)
    return (t if t.dtype == U8 else t.view(U8)).numpy().tobytes()


def compare(ours: dict[str, list[torch.Tensor]], theirs: dict, names=CANONICAL_NAMES) -> str:
    """Bytes of the tensors both sides hold under the same name (NVFP4: the weights and block
    scales; the global / activation scales are folded later, outside the timed function)."""
    equal, differ, skipped = [], [], []
    for name in names:
        ref = theirs.get(name)
        if ref is None:
            skipped.append(name)
            continue
        mine = b"".join(memory_bytes(p) for p in ours[name])
        (equal if mine == memory_bytes(ref) else differ).append(name)
    if differ:
        return f"DIFFER: {','.join(differ)}"
    return f"{len(equal)}/{len(names)} equal" + (f" ({','.join(skipped)} not compared)" if skipped else "")


def best(call, repeat: int) -> tuple[float, dict]:
    """`repeat` timed calls of `call() -> (seconds, outputs)`: the least seconds, the last outputs."""
    runs = [call() for _ in range(repeat)]
    return min(took for took, _ in runs), runs[-1][1]


NVFP4_TARGETS = [  # (label, vLLM NvFp4MoeBackend member; mxconvert uses the same names)
    ("NVFP4 FLASHINFER_TRTLLM", "FLASHINFER_TRTLLM"),
    ("NVFP4 FLASHINFER_CUTLASS", "FLASHINFER_CUTLASS"),
    ("NVFP4 VLLM_CUTLASS", "VLLM_CUTLASS"),
    ("NVFP4 FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL"),
    ("NVFP4 FLASHINFER_CUTEDSL_BATCHED", "FLASHINFER_CUTEDSL_BATCHED"),
    ("NVFP4 MARLIN", "MARLIN"),
]


def _nvfp4_golden_tools():
    """tools/golden/make_nvfp4_goldens.py: its stand-in layer (`StandInRoutedExperts`) and its
    run-time stand-ins (`reference_patches`: CUDA-only 128x4 interleave -> vLLM's pure-torch
    `swizzle_blockscale`, gptq_marlin_repack -> `marlin_weights`, Tensor.cuda -> identity)."""
    return _golden_module("make_nvfp4_goldens")


def vllm_convert_nvfp4(ng, oracle, backend_name: str, canon: dict, E: int, K: int, N: int):
    """One call of vLLM 0.33.0's `convert_to_nvfp4_moe_kernel_format` (gated, W4A4), as
    ModelOptNvFp4FusedMoE.process_weights_after_loading calls it; the layer is built outside the
    timing."""
    from vllm.model_executor.layers.quantization.utils.flashinfer_utils import trtllm_nvfp4_hidden_alignment

    layer = ng.StandInRoutedExperts(canon, E, K, N, True, ng._activation("vllm-0.33", True))
    be = oracle.NvFp4MoeBackend[backend_name]
    import flashinfer
    import vllm._custom_ops as ops

    with (
        ng.reference_patches("vllm-0.33"),
        patched(
            flashinfer,
            nvfp4_block_scale_interleave=counted("128x4 scale interleave", flashinfer.nvfp4_block_scale_interleave),
        ),
        patched(ops, gptq_marlin_repack=counted("gptq_marlin_repack", ops.gptq_marlin_repack)),
        torch.no_grad(),
    ):
        start = CLOCK()
        outs = oracle.convert_to_nvfp4_moe_kernel_format(
            nvfp4_backend=be,
            layer=layer,
            w13=layer.w13_weight,
            w13_scale=layer.w13_weight_scale,
            w13_scale_2=layer.w13_weight_scale_2,
            a13_scale=layer.w13_input_scale,
            w2=layer.w2_weight,
            w2_scale=layer.w2_weight_scale,
            w2_scale_2=layer.w2_weight_scale_2,
            a2_scale=layer.w2_input_scale,
            is_act_and_mul=True,
            use_a16=False,
            trtllm_hidden_alignment=trtllm_nvfp4_hidden_alignment(per_token_activation=False, is_act_and_mul=True),
        )
        took = CLOCK() - start
    return took, {n: _plain(v) for n, v in zip(ng.NAMES, outs, strict=True)}


def run_mxfp4(args, jobs: int, rows: list) -> None:
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    revision = get_revision("vllm-0.33")
    for label, backend, profile_name, marlin in TARGETS:
        if not _selected(args, label):
            continue
        USED.clear()
        profile = get_profile(profile_name)
        hp, ip = revision.round_up(backend, profile.platform, args.hidden, args.intermediate)
        canon = make_canonical(args.experts, hp, ip)
        layout = resolve_layout(backend, revision, profile, marlin_input_dtype=marlin)
        with aiter_shuffle_module(args.aiter_shuffle) as have_aiter:
            if backend == B.AITER_MXFP4_BF16 and not have_aiter:
                print(f"{label}: skipped (no --aiter-shuffle)", flush=True)
                continue
            cache: dict = {}
            vllm_convert(oracle, backend, canon, cache, marlin, profile)  # warm-up (fills vLLM's caches)
            t_vllm, theirs = best(partial(vllm_convert, oracle, backend, canon, cache, marlin, profile), args.repeat)
        specs = canonical_specs(args.experts, hp, ip)
        _finish_row(rows, label, layout, specs, canon, jobs, args.repeat, t_vllm, theirs, CANONICAL_NAMES)


def run_nvfp4(args, jobs: int, rows: list) -> None:
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    from mxconvert.layouts import nvfp4_layout
    from mxconvert.target.backends import Nvfp4Backend

    ng = _nvfp4_golden_tools()
    revision = get_revision("vllm-0.33", "nvfp4")
    E, K, N = args.experts, args.hidden, args.intermediate
    canon = ng.make_nvfp4_canonical(E, K, N, 0, gated=True, w4a16=False)
    for label, backend_name in NVFP4_TARGETS:
        if not _selected(args, label):
            continue
        USED.clear()
        try:
            layout = nvfp4_layout(Nvfp4Backend(backend_name), revision, K, N, E, gated=True)
            vllm_convert_nvfp4(ng, oracle, backend_name, canon, E, K, N)  # warm-up
        except Exception as exc:  # a backend that refuses this shape: say so, go on
            print(f"{label}: not run ({type(exc).__name__}: {exc})", flush=True)
            continue
        t_vllm, theirs = best(partial(vllm_convert_nvfp4, ng, oracle, backend_name, canon, E, K, N), args.repeat)
        specs = {n: (t.dtype, tuple(t.shape)) for n, t in canon.items()}
        _finish_row(rows, label, layout, specs, canon, jobs, args.repeat, t_vllm, theirs, tuple(layout.tensors))


def _selected(args, label: str) -> bool:
    return not args.only or any(s.strip() and s.strip() in label for s in args.only.split(","))


def one_pass(canon: dict, names, jobs: int) -> tuple[float, dict]:
    """The floor of any converter that must rewrite these tensors: one plain copy of each named
    canonical tensor into a new buffer, on the same clock. numpy's copy, not torch's `clone`:
    numpy asks for transparent huge pages for arrays of 4 MB and more (as mxconvert's outputs,
    numpy arrays, get them), and first-touch page faults of a new buffer are a large part of a
    copy's time here (a torch `clone` of 33 MB took ~17 ms, numpy's copy ~9 ms)."""
    with torch_threads(jobs):
        start = CLOCK()
        copies = {name: canon[name].contiguous().reshape(-1).view(U8).numpy().copy() for name in names}
        took = CLOCK() - start
    return took, copies


def _shares(piece: torch.Tensor, whole: torch.Tensor) -> bool:
    """Whether `piece` lies in `whole`'s memory (a chunk of a kept tensor is a view of it)."""
    start = whole.data_ptr()
    return start <= piece.data_ptr() < start + whole.numel() * whole.element_size()


def _finish_row(rows, label, layout, specs, canon, jobs, repeat, t_vllm, theirs, names) -> None:
    """Time mxconvert's side (plan once, then steady state), compare bytes, print the row.
    Also times one plain copy of the canonical tensors it reads (`one_pass`): where vLLM's own
    conversion is itself about one pass over the bytes, t_vllm / t_copy bounds the ratio any
    converter that writes new buffers can reach."""
    standin = ", ".join(sorted(USED))
    t0 = CLOCK()
    with torch_threads(jobs):
        prepare_all(layout.tensors, specs, jobs)
    prep = CLOCK() - t0
    mxconvert_layer(layout, canon, jobs)  # warm-up
    t_ours, ours = best(partial(mxconvert_layer, layout, canon, jobs), repeat)
    # the tensors whose bytes change (a layout that keeps a tensor returns views of it: no pass)
    moved = [n for n in layout.tensors if not all(_shares(p, canon[n]) for p in ours[n])]
    moved += [n for d in layout.derived.values() for n in d.inputs if n not in moved]
    t_copy, _ = best(partial(one_pass, canon, moved, jobs), repeat)
    mb_in = sum(canon[n].numel() * canon[n].element_size() for n in moved) / 1e6
    mb_out = sum(p.numel() * p.element_size() for n, pieces in ours.items() if n in moved for p in pieces) / 1e6
    check = compare(ours, theirs, names)
    rows.append((label + (" *" if standin else ""), t_vllm, t_ours, prep, check, standin, t_copy, mb_in, mb_out))
    print(
        f"{label:34} vLLM {t_vllm:8.3f} s  mxconvert {t_ours:7.3f} s  ratio {t_vllm / t_ours:6.1f}x  "
        f"(plan {prep:.2f} s once)  {check}  stand-ins: {standin or '-'}  one copy {t_copy:.4f} s "
        f"({mb_in:.1f} MB in, {mb_out:.1f} MB out; vLLM / copy {t_vllm / t_copy:.1f}x)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    parser.add_argument("--repeat", type=int, default=2, help="timed calls per side after one warm-up; best reported")
    parser.add_argument("--jobs", type=int, default=None, help="mxconvert threads (default: as convert)")
    parser.add_argument("--formats", default="mxfp4,nvfp4")
    parser.add_argument("--only", default="", help="comma-separated substrings of the labels to run")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU seconds on both sides (use with --jobs 1 on a shared machine; "
        "torch then runs one thread too)",
    )
    parser.add_argument(
        "--aiter-shuffle",
        type=Path,
        default=None,
        help="aiter/ops/shuffle.py from the amd-aiter 0.1.7.post2.dev18 wheel (AITER row)",
    )
    args = parser.parse_args()
    jobs = args.jobs or default_jobs()
    if args.clock == "cpu":
        global CLOCK
        CLOCK = time.process_time
        if jobs == 1:
            torch.set_num_threads(1)  # vLLM's side on one thread too: both sides one core's work

    import vllm
    from vllm.utils.import_utils import import_triton_kernels

    import_triton_kernels()  # vLLM's vendored triton_kernels as the top-level package, as vLLM does
    import mxconvert

    print(f"mxconvert from {Path(mxconvert.__file__).parent}")
    print(
        f"vLLM {vllm.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (affinity {default_jobs()}), load {os.getloadavg()[0]:.1f}, "
        f"mxconvert jobs {jobs}, {args.experts} experts, H={args.hidden} I={args.intermediate}, "
        f"clock {args.clock}",
        flush=True,
    )
    rows: list = []
    formats = {f.strip() for f in args.formats.split(",")}
    if "mxfp4" in formats:
        run_mxfp4(args, jobs, rows)
    if "nvfp4" in formats:
        run_nvfp4(args, jobs, rows)
    print(
        f"\nPer layer of {args.experts} experts (H = I = {args.hidden}, NVFP4: K = {args.hidden}, "
        f"N = {args.intermediate}); ratio = vLLM / mxconvert; load average at the end "
        f"{os.getloadavg()[0]:.1f}; * = vLLM's converter runs with a CPU stand-in for a GPU-only step\n"
    )
    print(
        "| backend | vLLM 0.33.0 s/layer | mxconvert s/layer | ratio | mxconvert plan (once) | bytes | "
        "stand-in in vLLM's run | one copy s | MB in / out | vLLM / one copy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, t_vllm, t_ours, prep, check, standin, t_copy, mb_in, mb_out in rows:
        print(
            f"| {label} | {t_vllm:.3f} | {t_ours:.3f} | {t_vllm / t_ours:.1f}x | {prep:.2f} s | "
            f"{check} | {standin or '-'} | {t_copy:.4f} | {mb_in:.0f} / {mb_out:.0f} | {t_vllm / t_copy:.1f}x |"
        )


if __name__ == "__main__":
    main()
