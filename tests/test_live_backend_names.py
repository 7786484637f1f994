"""The plugin compares a live vLLM layer's MXFP4 backend with the artifact's under the artifact's name
(`Mxfp4Backend.artifact_name`, runtimes/vllm/loader.py `live_layer` and install.py): vLLM 0.19.x calls AITER
CK "CK" and 0.20.0-0.21.0 "AITER" in their `Mxfp4MoeBackend`, so an AITER_MXFP4_BF16 artifact was refused
there before (tests_vllm/test_release_rows_backends.py `test_rocm_backend_leaves_the_state_the_release_leaves`
runs it in those releases' venvs)."""

from __future__ import annotations

import pytest

from mxconvert.target.backends import Mxfp4Backend


@pytest.mark.parametrize("live", ["CK", "AITER", "AITER_MXFP4_BF16"])
def test_every_release_name_of_aiter_ck_is_the_artifacts_name(live):
    assert Mxfp4Backend.artifact_name(live) == "AITER_MXFP4_BF16"


@pytest.mark.parametrize("backend", list(Mxfp4Backend))
def test_a_backend_mxconvert_names_keeps_its_name(backend):
    assert Mxfp4Backend.artifact_name(backend.value) == backend.value


@pytest.mark.parametrize("live", ["NONE", "DEEPGEMM_MXFP4", "None"])
def test_a_name_mxconvert_lacks_is_kept_so_the_backend_check_refuses_it_by_that_name(live):
    assert Mxfp4Backend.artifact_name(live) == live
