"""The transcription of SGLang 0.5.23's Marlin repack kernel (tools/golden/sglang_mxfp4_marlin.py
`repack_as_sglang_kernel`), which stands in for the CUDA op in tests_sglang (an environment without
vLLM), equals vLLM's repack test reference on random words: the check the goldens were made with,
kept in CI where vLLM is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

VLLM_RELEASES = ("0.33.0",)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "golden"))


@pytest.mark.parametrize("size_k, size_n", [(64, 64), (128, 192), (256, 128)])
def test_the_sglang_kernel_transcription_equals_vllms_reference(size_k, size_n):
    from mxfp4_vllm_backends import marlin_repack_reference
    from sglang_mxfp4_marlin import repack_as_sglang_kernel

    words = torch.randint(
        -(2**31),
        2**31 - 1,
        (size_k // 8, size_n),
        dtype=torch.int32,
        generator=torch.Generator().manual_seed(size_k + size_n),
    )
    assert torch.equal(
        repack_as_sglang_kernel(words, size_k, size_n), marlin_repack_reference(words, size_k, size_n, 4)
    )


def test_a_changed_word_changes_the_transcription():
    """The comparison can fail: one flipped bit of the input moves the transcription's output."""
    from sglang_mxfp4_marlin import repack_as_sglang_kernel

    words = torch.zeros(8, 64, dtype=torch.int32)
    flipped = words.clone()
    flipped[3, 5] = 1 << 4
    assert not torch.equal(repack_as_sglang_kernel(words, 64, 64), repack_as_sglang_kernel(flipped, 64, 64))
