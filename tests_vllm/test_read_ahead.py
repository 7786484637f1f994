"""The plugin reads the artifact's expert tensors ahead of vLLM's layer-by-layer processing
(artifact/prefetch.py). How far ahead must not change what vLLM ends up holding: reading each
tensor when asked (0), one tensor at a time (a budget smaller than any tensor) and the default all
leave the state vLLM's own path leaves, and every tensor is handed out exactly once."""

from __future__ import annotations

import harness as H
import pytest

from mxconvert.core.errors import InputError
from mxconvert.runtimes.vllm.installer import ArtifactInstaller

VLLM_RELEASES = ("0.33.0",)


@pytest.mark.parametrize("budget", [None, 0, 1])
def test_read_ahead_budget_leaves_the_state_vllm_leaves(artifacts, budget):
    art = artifacts.get("h100", "--tp", "2")
    target = H.Target("TRITON", (9, 0), 2, 1)
    H.reset_opt_flags()
    state_a = H.state(H.path_a(target))
    H.reset_opt_flags()
    model_b, installer = H.path_b(target, art, prefetch_bytes=budget)
    assert H.state(model_b) == state_a
    expected = sum(len(source.refs()) for source in installer.sources.values())
    assert installer.reads is not None and installer.reads.taken == expected > 0


@pytest.mark.parametrize("bad", [-1, 1.5, "4G", True])
def test_a_bad_read_ahead_budget_is_refused(artifacts, bad):
    art = artifacts.get("h100", "--tp", "1")
    with pytest.raises(InputError, match="prefetch_bytes"):
        ArtifactInstaller(art, prefetch_bytes=bad)
