"""`--all2all` is checked against the all2all backends of the chosen runtime revision (a field of
its row, copied from that vLLM release's `All2AllBackend`), and the error names them."""

from __future__ import annotations

import pytest
from helpers import EXAMPLE, run_cli

from mxconvert.core.errors import InputError
from mxconvert.target.revisions import REVISIONS, check_all2all


def test_every_revision_row_lists_its_all2all_backends():
    for rev in REVISIONS.values():
        assert rev.all2all_backends and len(set(rev.all2all_backends)) == len(rev.all2all_backends), rev.name
        assert "naive" in rev.all2all_backends  # vLLM's default, in every release


_NVFP4_0_15_TO_0_17 = {"vllm-0.15.1", "vllm-0.16", "vllm-0.17"}
#: rows of releases 0.18.0-0.22.1 only (vllm-0.22-nvfp4 also covers 0.23.0, which has no `mori`)
_WITH_MORI = {"vllm-0.18", "vllm-0.19", "vllm-0.19-nvfp4", "vllm-0.20", "vllm-0.20-nvfp4", "vllm-0.21",
              "vllm-0.21-nvfp4", "vllm-0.22"}  # fmt: skip
_FROM_0_18 = set(REVISIONS) - {"vllm-0.15", *_NVFP4_0_15_TO_0_17}


@pytest.mark.parametrize(
    "name, accepted_by",
    [
        # vllm/config/parallel.py `All2AllBackend` of each release (the rows' comment says which)
        ("moonep", {"vllm-0.33", "vllm-0.32", "vllm-0.31"}),  # added in 0.31.0
        ("passthrough", {"vllm-0.33", "vllm-0.32"}),  # added in 0.32.0
        # split into mori_high_throughput / mori_low_latency in 0.23.0
        ("mori", {*_WITH_MORI, "vllm-0.15", *_NVFP4_0_15_TO_0_17}),
        ("nixl_ep", _FROM_0_18),  # added in 0.18.0
        ("flashinfer_nvlink_one_sided", _FROM_0_18),
        ("deepep_low_latency", set(REVISIONS)),
    ],
)
def test_all2all_is_checked_against_the_row_of_the_revision(name, accepted_by):
    for rev in REVISIONS.values():
        if rev.name in accepted_by:
            assert check_all2all(name.upper().replace("_", "-"), rev) == name
        else:
            with pytest.raises(InputError) as err:
                check_all2all(name, rev)
            assert rev.name in str(err.value) and ", ".join(rev.all2all_backends) in str(err.value)


def test_cli_refuses_an_all2all_backend_the_chosen_revision_lacks():
    old = run_cli("select", EXAMPLE, "-p", "b200", "--runtime", "vllm-0.20", "--ep", "2", "--all2all", "moonep")
    assert (
        old.exit_code == 2
        and "vllm-0.20" in old.stderr
        and "mori" in old.stderr
        and "moonep" not in old.stderr.split("valid:")[-1]
    )
    new = run_cli("select", EXAMPLE, "-p", "b200", "--ep", "2", "--all2all", "moonep", "--json")
    assert new.exit_code == 0, new.output
    gone = run_cli("select", EXAMPLE, "-p", "b200", "--ep", "2", "--all2all", "mori")
    assert gone.exit_code == 2 and "mori_low_latency" in gone.stderr
