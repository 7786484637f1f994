"""SGLang 0.5.23's GPT-OSS MXFP4 AITER bytes (ROCm gfx95x, SGLANG_USE_AITER=1: AITER_MXFP4_BF16)
against mxconvert's layout (docs/sglang.md, "AITER").

The goldens are SGLang's own `create_weights` + loading + `process_weights_after_loading` (its
`_use_aiter` branch) run on CPU with AITER's own pure-torch `aiter/ops/shuffle.py` standing in for the
ROCm-only import (tools/golden/sglang_mxfp4_aiter.py). They show:

* SGLang's bytes are vLLM's AITER moves (layouts/aiter.py: de-interleave, `shuffle_weight_a16w4`,
  `shuffle_scale_a16w4`, fp32 biases) of the canonical tensors at the row's AITER sizes (I -> 256,
  H -> 256) with the row's 0x7F scale fill, bit for bit; zero scale padding differs exactly in the scales;
* so `convert --runtime sglang==0.5.23 --profile mi355x --env SGLANG_USE_AITER=1` of the example
  checkpoint writes SGLang's bytes, TP 1 and 2, and verify accepts them;
* the environment that changes SGLang's AITER bytes (SGLANG_AITER_K3_OPT on,
  SGLANG_USE_AITER_MOE_GU_ITLV off) is refused, exit 2, nothing written.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import EXAMPLE, run_cli
from sglang_golden_helpers import (
    GOLDEN,
    artifact_tensors,
    convert_example_for_sglang,
    digest,
    padded_gpt_oss,
    read_golden,
    tensor_bytes,
    verify_accepts,
)
from test_sglang_golden import NAMES, SCALES

from mxconvert.layouts.registry import LayoutTarget, build_layout
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.report import SelectionRefused
from mxconvert.selection.sglang.mxfp4_0_5_23 import aiter_env_refusal, select
from mxconvert.target.backends import Mxfp4Backend
from mxconvert.target.profiles import get_profile
from mxconvert.target.sglang_revisions import get_sglang_revision, unproven_layout_reason

ROW = get_sglang_revision("sglang-0.5.23")
B = Mxfp4Backend.AITER_MXFP4_BF16
PROFILE = get_profile("mi355x")
TAG = "aiter-gfx950"
CASES = sorted(GOLDEN.glob(f"{TAG}_sglang-0.5.23_e*.safetensors"))
PADDED = GOLDEN / f"{TAG}_sglang-0.5.23_e2_h160_i160.safetensors"  # H and I 160 -> 256
DIGESTS = GOLDEN / f"{TAG}_sglang-0.5.23_example_digests.json"
USE_AITER = ("--env", "SGLANG_USE_AITER=1")


def _sizes(golden: dict[str, torch.Tensor]) -> tuple[int, int]:
    _, rows, half_h = golden["in.w13_weight"].shape
    return ROW.round_up(B, "rocm", 2 * half_h, rows // 2)


def _canonical(golden: dict[str, torch.Tensor], scale_fill: int = 0x7F) -> dict[str, torch.Tensor]:
    return {NAMES[n]: t for n, t in padded_gpt_oss(golden, *_sizes(golden), scale_fill).items()}


def _layout():
    return build_layout("mxfp4", LayoutTarget(B, ROW, PROFILE))


def _kernel(canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The row's layout of the canonical tensors, as the kernel views them (`kernel_view`: the scales'
    [E * N, groups], SGLang's own parameter shape)."""
    layout = _layout()
    return {name: layout.tensors[name].kernel_view(layout.tensors[name].forward(t)) for name, t in canonical.items()}


def _artifact_kernel_digests(out) -> dict:
    """`_artifact_digests` of the artifact's tensors as the kernel views them (the layout's `kernel_view`,
    which the loader applies), in the digests' form."""
    layout = _layout()
    sglang_names = {v: k for k, v in NAMES.items()}
    digests: dict = {}
    for rank, layer, name, tensor in artifact_tensors(out):
        viewed = layout.tensors[name].kernel_view(tensor)
        digests.setdefault(rank, {}).setdefault(layer, {})[sglang_names[name]] = digest(viewed)
    return digests


def test_goldens_cover_padded_and_unpadded_sizes():
    assert PADDED in CASES and len(CASES) == 2, CASES
    golden = read_golden(PADDED)
    assert golden["out.w13_weight"].shape == (2, 512, 128)  # 2 x I 256, H 256 / 2
    assert golden["out.w2_weight_scale"].shape == (2 * 256, 8)  # [E * H, I / 32], SGLang's view


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_row_pads_as_sglangs_aiter_create_weights(path):
    """I -> 256, H -> 256 (mxfp4.py `create_weights`, `_use_aiter` branch, SGLANG_AITER_K3_OPT off)."""
    golden = read_golden(path)
    e, rows, half_h = golden["in.w13_weight"].shape
    hp, ip = _sizes(golden)
    assert (hp % 256, ip % 256) == (0, 0)
    assert golden["out.w13_weight"].shape == (e, 2 * ip, hp // 2)
    assert golden["out.w2_weight"].shape == (e, hp, ip // 2)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_sglang_bytes_are_the_rows_aiter_layout(path):
    golden = read_golden(path)
    kernel = _kernel(_canonical(golden))
    for sglang_name, name in NAMES.items():
        want = golden[f"out.{sglang_name}"]
        got = kernel[name]
        assert tuple(got.shape) == tuple(want.shape), name
        assert got.dtype == want.dtype, name
        assert tensor_bytes(got) == tensor_bytes(want), name


def test_zero_scale_padding_differs_only_in_the_scales():
    """vLLM's zero scale fill, on SGLang's sizes: every tensor but the two scales equals SGLang's."""
    golden = read_golden(PADDED)
    kernel = _kernel(_canonical(golden, scale_fill=0))
    for sglang_name, name in NAMES.items():
        same = tensor_bytes(kernel[name]) == tensor_bytes(golden[f"out.{sglang_name}"])
        assert same == (sglang_name not in SCALES), name


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_the_inverse_gives_the_canonical_tensors_back(path):
    golden = read_golden(path)
    canonical = _canonical(golden)
    layout = _layout()
    by_name = {v: k for k, v in NAMES.items()}
    for name, tensor in canonical.items():
        stored = golden[f"out.{by_name[name]}"].reshape(layout.tensors[name].forward(tensor).shape)
        back = layout.tensors[name].inverse(stored, tuple(tensor.shape), tensor.dtype)
        assert tensor_bytes(back) == tensor_bytes(tensor), name


def test_row_writes_aiter():
    assert unproven_layout_reason(ROW, "mxfp4", B.value) is None
    assert ROW.round_up(B, "rocm", 2880, 2880) == (3072, 3072)


@pytest.mark.parametrize("tp", [1, 2])
def test_converted_example_is_sglangs_own_bytes(tmp_path, tp):
    """`convert --runtime sglang==0.5.23 --profile mi355x --env SGLANG_USE_AITER=1` of
    examples/tiny-gpt-oss: every expert tensor of every rank equals what SGLang's own loading and AITER
    post-processing hold (tools/golden/sglang_mxfp4_aiter.py); verify accepts it."""
    out = tmp_path / "out"
    target = convert_example_for_sglang(out, tp, "--profile", "mi355x", *USE_AITER)
    assert target["backend"] == B.value
    golden = json.loads(DIGESTS.read_text())
    assert golden["env"]["SGLANG_USE_AITER"] == "1"
    assert _artifact_kernel_digests(out) == golden["digests"][f"tp{tp}"]
    verify_accepts(out)


def test_use_aiter_is_read_as_sglangs_get_bool_env_var():
    """`_use_aiter = get_bool_env_var("SGLANG_USE_AITER") and _is_hip`: only "true" / "1" (any case)."""
    for value, aiter in (("1", True), ("TRUE", True), ("yes", False), ("on", False), ("0", False)):
        try:
            picked = select(PROFILE, ROW, Deployment(env={"SGLANG_USE_AITER": value})).backend
        except SelectionRefused:
            picked = None
        assert (picked == B) == aiter, value


def test_selection_names_the_env_defaults_it_assumes():
    s = select(PROFILE, ROW, Deployment(env={"SGLANG_USE_AITER": "1"}))
    assert s.backend == B
    chosen = s.considered[-1].reason
    assert "SGLANG_AITER_K3_OPT=0" in chosen and "SGLANG_USE_AITER_MOE_GU_ITLV=1" in chosen


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({}, False),
        ({"SGLANG_AITER_K3_OPT": "0"}, False),
        ({"SGLANG_USE_AITER_MOE_GU_ITLV": "true"}, False),
        ({"SGLANG_AITER_K3_OPT": "1"}, True),
        ({"SGLANG_AITER_K3_OPT": "True"}, True),
        ({"SGLANG_USE_AITER_MOE_GU_ITLV": "0"}, True),
        ({"SGLANG_USE_AITER_MOE_GU_ITLV": "false"}, True),
        ({"SGLANG_USE_AITER_MOE_GU_ITLV": "N"}, True),
        ({"SGLANG_USE_AITER_MOE_GU_ITLV": "on"}, True),  # EnvBool raises on it
        ({"SGLANG_USE_AITER_MOE_GU_ITLV": "yes"}, False),
        ({"SGLANG_AITER_K3_OPT": "yes"}, False),  # get_bool_env_var: only "true" / "1" are on
    ],
)
def test_aiter_env_refusal_follows_sglangs_bool_parsing(env, refused):
    reason = aiter_env_refusal(env)
    assert (reason is not None) == refused, reason
    if refused:
        assert next(iter(env)) in reason


@pytest.mark.parametrize("variable", ["SGLANG_AITER_K3_OPT=1", "SGLANG_USE_AITER_MOE_GU_ITLV=0"])
def test_convert_with_an_env_that_changes_the_bytes_exits_2_and_writes_nothing(tmp_path, variable):
    out = tmp_path / "out"
    result = run_cli(
        "convert",
        EXAMPLE,
        "--runtime",
        "sglang==0.5.23",
        "--profile",
        "mi355x",
        *USE_AITER,
        "--env",
        variable,
        "--out",
        out,
    )
    assert result.exit_code == 2, result.output
    assert variable.split("=")[0] in result.output
    assert not out.exists()
    with pytest.raises(SelectionRefused, match=variable.split("=")[0]):
        select(PROFILE, ROW, Deployment(env=dict([("SGLANG_USE_AITER", "1"), tuple(variable.split("="))])))
