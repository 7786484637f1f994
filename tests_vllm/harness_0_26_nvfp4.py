"""vLLM 0.26.0's own NVFP4 MoE blocks on a CPU (path A) or through the plugin (path B): harness_nvfp4.py's
paths for the vLLM 0.26.0 venv (.venv-vllm-0.26), with harness_0_26.py's stand-ins for this release.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import harness as H
import harness_0_26 as V
import harness_nvfp4 as N


@contextlib.contextmanager
def release_0_26() -> Iterator[None]:
    V.use_cpu_platform()
    original = H.cuda_only_ops

    @contextlib.contextmanager
    def cuda_only_ops_0_26():
        with original(), V.marlin_repack():
            yield

    from vllm.model_executor.layers.fused_moe import all2all_utils
    from vllm.model_executor.layers.fused_moe.prepare_finalize.batched import BatchedPrepareAndFinalize

    with (
        H.patched(H, cuda_only_ops=cuda_only_ops_0_26),
        H.patched(all2all_utils, BatchedPrepareAndFinalize=BatchedPrepareAndFinalize),
    ):
        yield


def path_a(target: N.Target):
    with release_0_26():
        return N.path_a(target)


def path_b(target: N.Target, artifact, **kwargs):
    with release_0_26():
        return N.path_b(target, artifact, **kwargs)
