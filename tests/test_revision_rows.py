"""Every difference between runtime revisions is a field of the revision row.

The proof: a copy of a row under a new name (the "next version" a maintainer adds by copying the
newest row) must lay out and select exactly like the row it copies. A layout or selection that
branched on a version string would treat the copy like some other revision and fail here.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from mxconvert.core.dtypes import torch_dtype
from mxconvert.core.errors import MxconvertError
from mxconvert.formats.mxfp4.canonical import canonical_specs
from mxconvert.formats.registry import Geometry
from mxconvert.layouts import nvfp4_layout, resolve_layout
from mxconvert.selection import Deployment, select_backend, select_nvfp4_backend
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import BUILTIN_PROFILES, get_profile
from mxconvert.target.revisions import REVISIONS, RuntimeRevision

PROFILES = ("a100", "l40s", "h100", "b200", "rtx-5090", "mi355x", "mi355x-aiter", "intel-xpu")


def _copy(row: RuntimeRevision) -> RuntimeRevision:
    return replace(row, name=row.name + "-next", versions="next")


def _same_text(text: str, copy: RuntimeRevision, row: RuntimeRevision) -> str:
    return text.replace(copy.name, row.name)


def _random_canonical(specs: dict, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (dtype_name, shape) in specs.items():
        dtype = torch_dtype(dtype_name)
        if dtype.itemsize == 1:  # codes: any byte; block scales: finite, in the kernels' range
            low, high = (0x30, 0x50) if "scale" in name else (0, 256)
            out[name] = torch.randint(low, high, shape, dtype=torch.uint8, generator=g).view(dtype)
        else:
            out[name] = (torch.rand(shape, generator=g) + 0.5).to(dtype)
    return out


def _outcome(build, specs: dict, row: RuntimeRevision, original: RuntimeRevision):
    """(description, tensor descriptions, kernel bytes) of a layout, or its refusal."""
    try:
        layout = build(row)
    except MxconvertError as err:
        return ("refused", _same_text(str(err), row, original))
    described = {**layout.describe(), "revision": None}
    tensors = {n: layout.describe_tensor(n, specs) for n in layout.kernel_names}
    canonical = _random_canonical(specs, seed=7)
    data = {n: t.forward(canonical[n]).contiguous().view(torch.uint8) for n, t in layout.tensors.items()}
    data |= {n: d.forward(canonical).contiguous().view(torch.uint8) for n, d in layout.derived.items()}
    return described, tensors, data


def _assert_same(a, b) -> None:
    assert a[0] == b[0] and a[1] == b[1] if a[0] == "refused" else a[:2] == b[:2]
    if a[0] != "refused":
        assert a[2].keys() == b[2].keys()
        for name in a[2]:
            assert torch.equal(a[2][name], b[2][name]), name


@pytest.mark.parametrize("name", sorted(r for r in REVISIONS if "mxfp4" in REVISIONS[r].formats))
def test_a_copied_row_lays_out_mxfp4_like_the_row_it_copies(name):
    row = REVISIONS[name]
    copy = _copy(row)
    for backend in Mxfp4Backend:
        # The device matters to the Triton layouts and Marlin's fp8 variant only.
        profiles = PROFILES if backend in (Mxfp4Backend.TRITON, Mxfp4Backend.MARLIN) else ("h100",)
        for profile in map(get_profile, profiles):
            for marlin in (None, "fp8") if backend == Mxfp4Backend.MARLIN else (None,):
                hp, ip = row.round_up(backend, profile.platform, 128, 128)
                specs = canonical_specs(1, hp, ip)

                def build(r, backend=backend, profile=profile, marlin=marlin):
                    return resolve_layout(backend, r, profile, tp=1, marlin_input_dtype=marlin)

                _assert_same(_outcome(build, specs, row, row), _outcome(build, specs, copy, row))


@pytest.mark.parametrize("name", sorted(r for r in REVISIONS if "nvfp4" in REVISIONS[r].formats))
@pytest.mark.parametrize("K, N", [(256, 128), (128, 96)])
def test_a_copied_row_lays_out_nvfp4_like_the_row_it_copies(name, K, N):
    row = REVISIONS[name]
    copy = _copy(row)
    specs = Geometry("nvfp4", K, N).specs(2)
    for backend in Nvfp4Backend:

        def build(r, backend=backend):
            return nvfp4_layout(backend, r, K, N, 2)

        _assert_same(_outcome(build, specs, row, row), _outcome(build, specs, copy, row))


def _selection_text(select, row: RuntimeRevision) -> str:
    try:
        return json.dumps(select(row).to_json(), sort_keys=True)
    except MxconvertError as err:
        return "refused: " + str(err)


DEPLOYMENTS = (
    Deployment(),
    Deployment(tp=2),
    Deployment(ep=2, dp=2, all2all="deepep_low_latency"),
    Deployment(batched=True),
    Deployment(lora=True),
)


@pytest.mark.parametrize("name", sorted(REVISIONS))
def test_a_copied_row_selects_like_the_row_it_copies(name):
    row = REVISIONS[name]
    copy = _copy(row)
    for profile in BUILTIN_PROFILES:
        for deployment in DEPLOYMENTS:
            if "mxfp4" in row.formats:

                def mx(r, profile=profile, deployment=deployment):
                    return select_backend(profile, r, deployment, hidden_size=2880)

                assert _same_text(_selection_text(mx, copy), copy, row) == _selection_text(mx, row)
            if "nvfp4" in row.formats:

                def nv(r, profile=profile, deployment=deployment):
                    return select_nvfp4_backend(profile, r, deployment, hidden_size=2048, intermediate_size=768)

                assert _same_text(_selection_text(nv, copy), copy, row) == _selection_text(nv, row)
