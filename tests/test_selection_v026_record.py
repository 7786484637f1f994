"""mxconvert's `vllm-0.26` row selects what vLLM 0.26.0 itself selects, for every entry of the record.

tests/golden/selection/vllm-0.26.0-mxfp4.json was made by running vLLM 0.26.0's own
`select_mxfp4_moe_backend` (GPT-OSS MXFP4) on CPU with the device stood in per profile
(tools/golden/record_mxfp4_selection_v026.py): every built-in profile x `--moe-backend` request
("auto" and every 0.26.0 name) x deployment (TP, EP, DP, EPLB, LoRA, an mxfp8 activation request,
and the all2all kinds, batched included). No vLLM is needed here.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mxconvert.core.errors import UnsupportedError
from mxconvert.selection import Deployment, moe_backend_names, select_backend
from mxconvert.target.profiles import BUILTIN_PROFILES, get_profile
from mxconvert.target.revisions import get_revision

RECORD = json.loads((Path(__file__).resolve().parent / "golden" / "selection" / "vllm-0.26.0-mxfp4.json").read_text())
V026 = get_revision("vllm-0.26")

#: Backends vLLM 0.26.0 can pick that mxconvert has no layout (and no enum) for: its selection
#: refuses the names that lead to them.
NOT_LAID_OUT = {"DEEPGEMM_MXFP4"}


def test_the_record_is_vllm_0_26_0_and_complete():
    assert RECORD["vllm"] == "0.26.0"
    profiles = {p.name for p in BUILTIN_PROFILES}
    keys = Counter((e["profile"], e["deployment"], e["moe_backend"]) for e in RECORD["entries"])
    assert set(keys.values()) == {1}
    assert {k[0] for k in keys} == profiles
    assert len(keys) == len(profiles) * len(RECORD["deployments"]) * len(RECORD["moe_backend_names"])
    # Every name 0.26.0 accepts is one mxconvert's row knows (or refuses as not laid out).
    assert set(RECORD["moe_backend_names"]) == set(moe_backend_names(V026)) | {"deep_gemm"}


def _entries():
    for e in RECORD["entries"]:
        yield pytest.param(e, id=f"{e['profile']}-{e['deployment']}-{e['moe_backend']}")


@pytest.mark.parametrize("entry", list(_entries()))
def test_mxconvert_reproduces_vllm_0_26_0(entry):
    deployment = Deployment(**RECORD["deployments"][entry["deployment"]])
    profile = get_profile(entry["profile"])
    if "backend" in entry and entry["backend"] not in NOT_LAID_OUT:
        s = select_backend(profile, V026, deployment, entry["moe_backend"])
        assert (s.backend.value, s.kernel_class) == (entry["backend"], entry["kernel_class"])
        return
    with pytest.raises(UnsupportedError):
        select_backend(profile, V026, deployment, entry["moe_backend"])


def test_record_spans_choices_and_refusals():
    """The record is not one answer repeated: it holds the backends 0.26.0 picks across profiles."""
    picked = {e["backend"] for e in RECORD["entries"] if "backend" in e}
    assert {
        "TRITON",
        "MARLIN",
        "BATCHED_MARLIN",
        "FLASHINFER_TRTLLM_MXFP4_BF16",
        "FLASHINFER_TRTLLM_MXFP4_MXFP8",
        "FLASHINFER_CUTLASS_MXFP4_BF16",
        "AITER_MXFP4_BF16",
        "XPU",
        "CPU",
        "EMULATION",
    } <= picked
    assert any("refused" in e for e in RECORD["entries"])


def test_sm90_flashinfer_cutlass_is_refused_under_vllm_0_26():
    """0.26.0 pins FlashInfer 0.6.14, whose SM90 weight interleave (a CUDA kernel) has no recorded
    bytes: the row selects it as vLLM does but the layout refuses to write it."""
    from mxconvert.layouts import resolve_layout
    from mxconvert.target.backends import Mxfp4Backend

    s = select_backend(get_profile("h100"), V026, Deployment(), "flashinfer_cutlass")
    assert s.backend == Mxfp4Backend.FLASHINFER_CUTLASS_MXFP4_BF16
    with pytest.raises(UnsupportedError, match="0.6.14"):
        resolve_layout(s.backend, V026, get_profile("h100"), tp=1)
    # The 0.33 row's layout of the same backend is unaffected.
    assert resolve_layout(s.backend, get_revision("vllm-0.33"), get_profile("h100"), tp=1).tensors
