"""`--device`: the layouts' portable path (torch ops alone, what runs on CUDA) gives the host's bytes.

CI has no GPU, so the device path is run here on the host through the same code (a `Compute` on
the CPU device: torch codecs, arrange moves, `index_select` inverses); the GPU machine runs it on
CUDA (tools/gpu_check/device_convert_check.py). A `--device cuda` this machine lacks fails closed.
"""

from __future__ import annotations

import pytest
import torch
from helpers import EXAMPLE, flip_stored_bits, rank_tensor, run_cli, torch_specs, tree_digest
from test_layout_roundtrip import TARGETS, _bytes, _random

from mxconvert.core.bits import from_torch, to_torch
from mxconvert.core.dtypes import dtype_named
from mxconvert.core.errors import InputError
from mxconvert.formats.mxfp4.canonical import canonical_specs
from mxconvert.formats.registry import Geometry, format_of, open_model
from mxconvert.layouts import InverseError, nvfp4_layout, resolve_layout
from mxconvert.layouts.codecs import NIBBLES
from mxconvert.layouts.device import HOST, Compute, compute_for
from mxconvert.layouts.engine.plans import expert_index
from mxconvert.layouts.triton import HOPPER_PACK
from mxconvert.pipeline import convert as convert_mod
from mxconvert.pipeline import plan as plan_mod
from mxconvert.pipeline.verify import verify_artifact
from mxconvert.selection import Deployment
from mxconvert.target.backends import Nvfp4Backend as NB
from mxconvert.target.profiles import get_profile
from mxconvert.target.revisions import REVISIONS, get_revision

PORTABLE_CPU = Compute(torch.device("cpu"))
NVFP4_BACKENDS = [
    NB.FLASHINFER_TRTLLM,
    NB.FLASHINFER_CUTLASS,
    NB.VLLM_CUTLASS,
    NB.FLASHINFER_CUTEDSL,
    NB.FLASHINFER_CUTEDSL_BATCHED,
    NB.MARLIN,
]


def _mxfp4_cases():
    for backend, profile_name, revision_name in TARGETS:
        for marlin in [None, "fp8"] if backend.value.endswith("MARLIN") else [None]:
            profile, revision = get_profile(profile_name), REVISIONS[revision_name]
            layout = resolve_layout(backend, revision, profile, marlin_input_dtype=marlin)
            hp, ip = revision.round_up(backend, profile.platform, 160, 96)
            specs = torch_specs(canonical_specs(2, hp, ip))
            yield f"{backend.value}-{profile_name}-{revision_name}-{marlin}", layout, specs


def _nvfp4_cases():
    revision = get_revision("vllm-0.33", "nvfp4")
    for backend in NVFP4_BACKENDS:
        layout = nvfp4_layout(backend, revision, 256, 128, 2)
        yield f"nvfp4-{backend.value}", layout, torch_specs(Geometry("nvfp4", 256, 128).specs(2))


CASES = [*_mxfp4_cases(), *_nvfp4_cases()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_portable_path_gives_the_host_bytes_both_ways(case):
    """forward and inverse of every tensor of every layout: the torch-only path equals the host's
    numpy fast paths, and inverts exactly."""
    _, layout, specs = case
    for name, t in layout.tensors.items():
        dtype, shape = specs[name]
        x = _random(shape, dtype, 11)
        if name.endswith("scale") and dtype == torch.uint8:
            x = x.clamp(max=249)  # fp8-activation Marlin scales
        host = t.forward(x)
        portable = t.forward(x, "torch")
        assert torch.equal(_bytes(portable), _bytes(host)), name
        bits, bits_dtype = HOST.forward(t, from_torch(x), dtype_named(dtype))  # convert's host path
        assert bits_dtype == dtype_named(host.dtype) and torch.equal(_bytes(to_torch(bits, bits_dtype)), _bytes(host))
        back = t.inverse(host, shape, dtype, "torch")
        assert torch.equal(_bytes(back), _bytes(t.inverse(host, shape, dtype))), name
        assert torch.equal(_bytes(back), _bytes(x)), name
        restored = HOST.inverse(t, from_torch(host), shape, dtype_named(dtype))  # verify's host path
        assert torch.equal(_bytes(to_torch(restored, dtype)), _bytes(x)), name


@pytest.mark.parametrize("case", CASES[:3] + CASES[-6:], ids=lambda c: c[0])
def test_portable_inverse_refuses_wrong_padding(case):
    _, layout, specs = case
    for name, t in layout.tensors.items():
        dtype, shape = specs[name]
        x = _random(shape, dtype, 5)
        elements = t.split.split(x)
        index = expert_index(t, tuple(elements.shape[1:]))
        if not bool((index < 0).any()):
            continue
        pad_pos = int(torch.nonzero(index < 0)[0])
        arranged = t.arrange(elements, t.pad_value).contiguous()
        flat = arranged.reshape(shape[0], -1).clone()
        flat[-1, pad_pos] = (t.pad_value + 0x41) & 0xFF if flat.dtype == torch.uint8 else 1
        buffer = t.codec.encode(flat.reshape(arranged.shape))
        with pytest.raises(InverseError, match=f"padding is not .*expert {shape[0] - 1}"):
            t.inverse(buffer, shape, dtype, "torch")


def test_codecs_torch_forms_equal_their_numpy_forms():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (3, 4096), dtype=torch.uint8, generator=g)
    assert torch.equal(HOPPER_PACK.encode(x, portable=True), HOPPER_PACK.encode(x))
    assert torch.equal(HOPPER_PACK.decode(x, torch.uint8, portable=True), HOPPER_PACK.decode(x, torch.uint8))
    assert torch.equal(NIBBLES.split(x, portable=True), NIBBLES.split(x))


EXAMPLES = [
    ("tiny-gpt-oss", "h100", "vllm-0.33", 1),  # TRITON Hopper (fp4 pack)
    ("tiny-gpt-oss", "b200", "vllm-0.33", 2),  # TRTLLM, two TP ranks
    ("tiny-gpt-oss", "a100", "vllm-0.33", 1),  # MARLIN (nibble moves)
    ("tiny-nvfp4-modelopt-qwen3", "b200", None, 1),  # NVFP4 with derived tensors
    ("tiny-nvfp4-ct-qwen3", "a100", None, 1),  # NVFP4 MARLIN: rescaled scales
]


@pytest.mark.parametrize("example, profile, runtime, tp", EXAMPLES)
def test_convert_and_verify_on_the_portable_path_write_the_host_bytes(tmp_path, example, profile, runtime, tp):
    ckpt = open_model(str(EXAMPLE.parent / example))
    plan = plan_mod.make_plan(
        ckpt, get_profile(profile), get_revision(runtime, format_of(ckpt).name), Deployment(tp=tp), "auto"
    )
    convert_mod.execute(plan, tmp_path / "host", jobs=2, chunk_bytes=8 << 10)
    convert_mod.execute(plan, tmp_path / "portable", jobs=2, chunk_bytes=8 << 10, device=PORTABLE_CPU)
    host, portable = tree_digest(tmp_path / "host"), tree_digest(tmp_path / "portable")
    host.pop("mxconvert.json"), portable.pop("mxconvert.json")  # the output paths differ
    assert host == portable
    report = verify_artifact(
        tmp_path / "portable", str(EXAMPLE.parent / example), jobs=2, chunk_bytes=8 << 10, device=PORTABLE_CPU
    )
    assert report.ok, report.problems


def test_verify_on_the_portable_path_finds_a_changed_byte(tmp_path):
    ckpt = open_model(str(EXAMPLE))
    plan = plan_mod.make_plan(ckpt, get_profile("h100"), get_revision("vllm-0.33"), Deployment(), "auto")
    out = tmp_path / "a"
    convert_mod.execute(plan, out, jobs=1)
    key, file = rank_tensor(out, "w2_weight")
    flip_stored_bits(file, key, 7, 0x10)  # one bit of expert 0's stored weight
    report = verify_artifact(out, str(EXAMPLE), jobs=2, device=PORTABLE_CPU)
    kinds = {p.kind for p in report.problems}
    assert "file" in kinds  # the checksum
    assert any(p.kind in ("tensor", "padding") and p.tensor == key for p in report.problems), report.problems


def test_device_names():
    assert compute_for(None) is HOST and compute_for("cpu") is HOST and compute_for(" CPU ") is HOST
    assert compute_for(PORTABLE_CPU) is PORTABLE_CPU
    for bad in ("mps", "cuda:x", "gpu", "meta"):
        with pytest.raises(InputError, match="expected cpu"):
            compute_for(bad)


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@no_cuda
@pytest.mark.parametrize("command", ["convert", "verify"])
def test_device_cuda_without_cuda_fails_closed(tmp_path, command):
    out = tmp_path / "out"
    if command == "convert":
        result = run_cli("convert", EXAMPLE, "--profile", "h100", "-o", out, "--device", "cuda")
        assert not out.exists() and not list(tmp_path.iterdir())
    else:
        run_cli("convert", EXAMPLE, "--profile", "h100", "-o", out)
        before = tree_digest(out)
        result = run_cli("verify", out, "--device", "cuda:0")
        assert tree_digest(out) == before
    assert result.exit_code == 2, result.output
    assert "--device cuda" in result.stderr and "run without --device" in result.stderr
    assert "Traceback" not in result.output + result.stderr


@no_cuda
def test_execute_with_cuda_without_cuda_refuses_before_writing(tmp_path):
    ckpt = open_model(str(EXAMPLE))
    plan = plan_mod.make_plan(ckpt, get_profile("b200"), get_revision(None), Deployment(), "auto")
    with pytest.raises(InputError, match="--device cuda"):
        convert_mod.execute(plan, tmp_path / "out", device="cuda")
    assert not list(tmp_path.iterdir())
