"""The vLLM releases CI runs the plugin's path A = path B in, besides the two full venvs (0.33.0 in
.venv-vllm, 0.26.0 in .venv-vllm-0.26): the oldest and the newest release of every row the plugin
serves (mxconvert/runtimes/vllm/dependency.py PLUGIN_PROVEN), one per line, oldest first. The
releases between them run in `tools/vllm_releases/plugin_check.py`, whose committed records
(tests/golden/plugin/) tests/test_plugin_records.py holds the table to.

    python tools/vllm_env/ci_releases.py     # e.g. 0.20.0, 0.20.2, 0.21.0, ...
"""

from __future__ import annotations

from mxconvert.runtimes.vllm.dependency import PLUGIN_PROVEN
from mxconvert.target.releases import release_key

#: Releases with a venv of their own in `make test-vllm` (tools/vllm_env/setup.sh), run there anyway.
FULL_VENVS = ("0.33.0", "0.26.0")


def ci_releases() -> list[str]:
    """Oldest and newest release of each served row, for any format, minus `FULL_VENVS`."""
    picked: set[str] = set()
    for formats in PLUGIN_PROVEN.values():
        releases = sorted({r for rs in formats.values() for r in rs}, key=release_key)
        picked.update({releases[0], releases[-1]})
    return sorted(picked - set(FULL_VENVS), key=release_key)


if __name__ == "__main__":
    print("\n".join(ci_releases()))
