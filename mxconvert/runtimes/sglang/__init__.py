"""SGLang 0.5.23 loader: `--load-format mxconvert` loads an mxconvert artifact (GPT-OSS MXFP4,
FlashInfer TRT-LLM on SM100) with SGLang's MoE post-processing skipped for the artifact's layers.

Registered as an SGLang general plugin (entry point group `sglang.srt.plugins`, which SGLang's
`load_plugins()` runs in every process: launcher, engine, schedulers), or started through the
launcher `python -m mxconvert.runtimes.sglang ARGS` (launcher.py). docs/sglang.md, "Loader", says
why this route and what is checked. Nothing here imports SGLang at module import time; the checks
(checks.py), the installer (installer.py) and the install (install.py) import none at all.
"""

from __future__ import annotations

from mxconvert.runtimes.sglang.dependency import LOAD_FORMAT
from mxconvert.runtimes.sglang.plugin import register

__all__ = ["LOAD_FORMAT", "register"]
