"""NVFP4 layouts bit-exact against golden data made by running vLLM's own conversion code
(vLLM 0.33.0 for `vllm-0.33`, vLLM 0.15.0 for `vllm-0.15`; see tests/golden/nvfp4/README.md and
tools/golden/make_nvfp4_goldens.py): weights and block scales byte for byte (and inverted), the
global and activation scales the kernels read byte for byte, and the refusals where vLLM raises."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from golden.nvfp4_inputs import make_nvfp4_canonical
from safetensors import safe_open

from mxconvert.core.errors import UnsupportedError
from mxconvert.layouts import nvfp4_layout
from mxconvert.target.backends import Nvfp4Backend
from mxconvert.target.revisions import get_revision

GOLDEN = Path(__file__).resolve().parent / "golden" / "nvfp4"
STORED = sorted(GOLDEN.glob("*.safetensors"))
HASHED = json.loads((GOLDEN / "hashes.json").read_text())
HASHED = HASHED if isinstance(HASHED, list) else HASHED.get("cases", [])


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _parts(case: dict):
    revision = get_revision(case["revision"], "nvfp4")
    layout = nvfp4_layout(Nvfp4Backend(case["backend"]), revision, case["K"], case["N"], case["E"], gated=case["gated"])
    return layout.tensors, layout.derived, layout.params


def _kernel_outputs(case: dict, canonical: dict) -> dict[str, torch.Tensor]:
    tensors, derived, _ = _parts(case)
    out = {name: t.forward(canonical[name]) for name, t in tensors.items()}
    out.update({name: d.forward(canonical) for name, d in derived.items()})
    return out


def _golden_name(ours: str) -> str:
    return (
        ours
        if ours
        in (
            "w13_weight",
            "w13_weight_scale",
            "w13_weight_scale_2",
            "w13_input_scale",
            "w2_weight",
            "w2_weight_scale",
            "w2_weight_scale_2",
            "w2_input_scale",
        )
        else f"extra.{ours}"
    )


def _gated_case(case: dict) -> bool:
    if not case["gated"]:
        pytest.skip("non-gated NVFP4 MoE layers are not supported by mxconvert yet (readers assume gate/up)")
    return True


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_stored_nvfp4_golden_is_reproduced_bit_for_bit(path):
    with safe_open(path, "pt") as f:
        case = json.loads(f.metadata()["case"])
        canonical = {k.removeprefix("canonical."): f.get_tensor(k) for k in f.keys() if k.startswith("canonical.")}
        kernel = {k.removeprefix("kernel."): f.get_tensor(k) for k in f.keys() if k.startswith("kernel.")}
    _gated_case(case)
    if case["expected_error"]:
        with pytest.raises((UnsupportedError, ValueError)):
            tensors, derived, _ = _parts(case)
            for name, t in tensors.items():
                t.forward(canonical[name])
        return
    ours = _kernel_outputs(case, canonical)
    # every tensor the layer holds is produced (extras only where the runtime registers them on the layer)
    layer_params = {n for n in kernel if not n.startswith("extra.")}
    assert layer_params <= {_golden_name(n) for n in ours}, layer_params - {_golden_name(n) for n in ours}
    tensors, _, _ = _parts(case)
    for name, value in ours.items():
        golden = kernel.get(_golden_name(name))
        assert golden is not None, f"{case['case']}: no golden for {name}"
        assert value.dtype == golden.dtype, f"{case['case']} {name}: {value.dtype} vs {golden.dtype}"
        assert tuple(value.shape) == tuple(golden.shape), f"{case['case']} {name}"
        assert _raw(value) == _raw(golden), f"{case['case']} {name}: bytes differ from vLLM's"
        view = case["views"].get(_golden_name(name), {})
        if name in tensors:
            t = tensors[name]
            shape, stride = t.view(tuple(value.shape))
            mma = view.get("mma_view")
            if mma:
                assert (list(shape), list(stride)) == (mma["shape"], mma["stride"]), f"{case['case']} {name} view"
            dtype, cshape = canonical[name].dtype, tuple(canonical[name].shape)
            assert _raw(t.inverse(value, cshape, dtype)) == _raw(canonical[name]), f"{case['case']} {name} inverse"


@pytest.mark.parametrize("case", HASHED, ids=lambda c: c["case"])
def test_large_nvfp4_golden_hashes_are_reproduced(case):
    _gated_case(case)
    canonical = make_nvfp4_canonical(
        case["E"], case["K"], case["N"], case["seed"], gated=case["gated"], w4a16=case["w4a16"]
    )
    for name, digest in case["canonical_sha256"].items():
        assert hashlib.sha256(_raw(canonical[name])).hexdigest() == digest, f"input {name}"
    if case.get("expected_error"):
        with pytest.raises((UnsupportedError, ValueError)):
            _kernel_outputs(case, canonical)
        return
    ours = _kernel_outputs(case, canonical)
    for name, value in ours.items():
        out = case["outputs"]["kernel." + _golden_name(name)]
        assert hashlib.sha256(_raw(value)).hexdigest() == out["sha256"], f"{case['case']} {name}"
