"""MXFP4 round-up rules: how each vLLM release pads the hidden and intermediate sizes per backend.

One tuple of `RoundUpRule` per distinct `mxfp4_round_up_hidden_size_and_intermediate_size` of vLLM
(fused_moe/oracle/mxfp4.py), evaluated for the backends mxconvert writes. A revision row
(target/revisions.py) names its tuple; `RuntimeRevision.round_up` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mxconvert.target.backends import CUTLASS_BACKENDS, MARLIN_BACKENDS, TRTLLM_BACKENDS, Backend
from mxconvert.target.backends import Mxfp4Backend as B


@dataclass(frozen=True)
class RoundUpRule:
    """One row of `mxfp4_round_up_hidden_size_and_intermediate_size`: first match wins.

    `backends=None` matches any backend; `platforms=None` any platform. `hidden_align=None`
    leaves the hidden size unchanged.
    """

    backends: frozenset[B] | None
    platforms: frozenset[str] | None
    intermediate_align: int
    hidden_align: int | None

    def matches(self, backend: Backend, platform: str) -> bool:
        return (self.backends is None or backend in self.backends) and (
            self.platforms is None or platform in self.platforms
        )


def _rule(backends, platforms, i_align: int, h_align: int | None) -> RoundUpRule:
    return RoundUpRule(
        frozenset(backends) if backends is not None else None,
        frozenset(platforms) if platforms is not None else None,
        i_align,
        h_align,
    )


ANY = None

# vLLM 0.33.0 `mxfp4_round_up_hidden_size_and_intermediate_size` (GPT-OSS passes activation=None).
ROUND_UP_0_33 = (
    _rule({B.EMULATION}, ANY, 32, 32),
    _rule({B.CUTLASS_MXFP4_MXFP4}, ANY, 128, 128),
    _rule(MARLIN_BACKENDS, {"xpu"}, 128, 128),
    _rule(MARLIN_BACKENDS, ANY, 128, 256),
    _rule(TRTLLM_BACKENDS, ANY, 128, 256),
    _rule(CUTLASS_BACKENDS, ANY, 128, 128),
    _rule({B.AITER_MXFP4_MXFP4}, {"rocm"}, 128, 256),
    _rule(ANY, {"rocm"}, 256, 256),
    _rule({B.CPU}, ANY, 32, 32),
    _rule(ANY, ANY, 64, None),
)


# vLLM 0.26.0 `mxfp4_round_up_hidden_size_and_intermediate_size` (its DEEPGEMM_MXFP4 rule, 128/128,
# is left out: DEEPGEMM is no GPT-OSS backend). Differs from 0.33.0 in TRTLLM (I -> 256, not 128)
# and in having no CUTLASS_MXFP4_MXFP4 or AITER_MXFP4_MXFP4 rule.
ROUND_UP_0_26 = (
    _rule({B.EMULATION}, ANY, 32, 32),
    _rule(MARLIN_BACKENDS, {"xpu"}, 128, 128),
    _rule(MARLIN_BACKENDS, ANY, 128, 256),
    _rule(TRTLLM_BACKENDS, ANY, 256, 256),
    _rule(CUTLASS_BACKENDS, ANY, 128, 128),
    _rule(ANY, {"rocm"}, 256, 256),
    _rule({B.CPU}, ANY, 32, 32),
    _rule(ANY, ANY, 64, None),
)

# vLLM 0.19-0.20 `mxfp4_round_up_hidden_size_and_intermediate_size`.
ROUND_UP_0_20 = (
    _rule(MARLIN_BACKENDS, {"xpu"}, 128, 128),
    _rule(MARLIN_BACKENDS, ANY, 128, 256),
    _rule(TRTLLM_BACKENDS, ANY, 256, 256),
    _rule(CUTLASS_BACKENDS, ANY, 128, 128),
    _rule(ANY, {"rocm"}, 256, 256),
    _rule(ANY, ANY, 64, None),
)

# vLLM 0.22.0-0.25.1 `mxfp4_round_up_hidden_size_and_intermediate_size` (one function in all five):
# 0.20.0's plus the CPU rule (32/32); no EMULATION rule yet (0.26.0 added it).
ROUND_UP_0_22 = tuple(rule for rule in ROUND_UP_0_26 if rule.backends != frozenset({B.EMULATION}))
