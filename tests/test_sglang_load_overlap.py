"""The SGLang loader checks the artifact's digests while it reads (issue 25), without SGLang:
`MxconvertSglangLoader.load_model` (runtimes/sglang/loader.py) over the stand-ins of
tests/test_sglang_loader_flow.py, whose post-processing loop installs every MoE layer through
`SglangArtifactInstaller.postprocess` as SGLang's would.

Held: a tampered rank file (a tensor byte, a header byte) and a tampered shared/ file make the load
raise the file's digest `MismatchError` (exit class 1, naming the file) and return no model, with
read-ahead on and off, every hashing and reading thread joined; the digests run while the tensors are
handed out (an order of events, no timing: tests/test_vr_overlapped_checks.py's `watch`); the
installed layers equal the synchronous path's (the installer alone, `prepare` without `overlapped`)
for read-ahead off, one tensor and the default; `prefetch_bytes` is validated, naming the key; the
loader logs what the reads and the checks took; `verify_checksums: false` hashes nothing. Planted
bugs: without the wait for the digests (`FileChecks.check`, or the loader's `finish`), the
tampered file loads.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLE, flip_stored_bits, run_cli
from test_sglang_loader_checks import LIVE
from test_sglang_loader_flow import CONFIG, Model, _load, sglang  # noqa: F401  (sglang: the stand-ins fixture)
from test_vr_overlapped_checks import watch

import mxconvert.runtimes.sglang.installer as installer_module
from mxconvert.core.errors import InputError, MismatchError
from mxconvert.runtimes.common.load_overlap import PREFETCH_BYTES
from mxconvert.runtimes.sglang.installer import SglangArtifactInstaller

#: read-ahead on (the default budget), one tensor at a time, off (each tensor when SGLang asks)
PREFETCH = [PREFETCH_BYTES, 1, 0]
#: the threads the loader starts (artifact/checksums.py, artifact/prefetch.py)
OUR_THREADS = ("mxconvert-leaf", "mxconvert-tree", "mxconvert-sha256", "mxconvert-prefetch")
KEY = "model.layers.1.mlp.experts.w2_weight"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sglang-overlap") / "b200"
    result = run_cli("convert", EXAMPLE, "--profile", "b200", "--runtime", "sglang==0.5.23", "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def art(made, tmp_path) -> Path:
    copy = tmp_path / "art"
    shutil.copytree(made, copy)
    return copy


def rank_file(art: Path, key: str = KEY) -> Path:
    return art / json.loads((art / "mxconvert.json").read_text())["ranks"][0]["tensors"][key]["file"]


def our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(OUR_THREADS)]


def refused(sglang, art: Path, match: str, **extra) -> MismatchError:  # noqa: F811
    returned = None
    with pytest.raises(MismatchError, match=match) as err:
        returned = _load(sglang, art, extra)
    assert returned is None  # no model for SGLang: nothing of the file is ever used
    assert err.value.exit_code == 1
    assert our_threads() == []  # hashing and read-ahead stopped and joined
    return err.value


def expert_state(model: torch.nn.Module) -> dict[str, tuple]:
    """Every tensor of every MoE layer (parameters and tensor attributes): dtype, shape, stride, bytes."""
    out = {}
    for i, block in enumerate(model.model.layers):
        for name, value in vars(block.mlp.experts).items():
            tensors = value.items() if isinstance(value, dict) else []
            if isinstance(value, torch.Tensor):
                tensors = [(name, value)]
            for sub, tensor in tensors:
                if isinstance(tensor, torch.Tensor):
                    data = tensor.detach().contiguous().view(torch.uint8) if tensor.numel() else tensor
                    out[f"{i}.{sub}"] = (type(tensor), tensor.dtype, tuple(tensor.shape), tensor.stride(), data)
    return out


def synchronous_state(sglang, art: Path) -> dict[str, tuple]:  # noqa: F811
    """The installer alone: digests checked in `prepare`, each tensor read when `postprocess` asks."""
    model = Model([], 1)
    installer = SglangArtifactInstaller(art)
    installer.check_runtime(LIVE)
    installer.prepare(sglang.loader.moe_layers(model))
    assert installer.reads is None and installer.checks is None
    for _, module in model.named_modules():
        if getattr(module, "quant_method", None) is not None:
            installer.postprocess(module, module.quant_method)
    return expert_state(model)


# ---- a tampered file --------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch_bytes", PREFETCH[::2], ids=["read-ahead", "each-when-asked"])
def test_a_tampered_rank_file_is_refused_before_the_load_returns(sglang, art, prefetch_bytes):  # noqa: F811
    file = rank_file(art)
    flip_stored_bits(file, KEY, 0, 0x01)
    refused(sglang, art, f"{file}: sha256 tree digest .* does not match the manifest", prefetch_bytes=prefetch_bytes)
    # the layers were installed meanwhile (the digests ran beside them) and the load still failed
    assert sglang.events[-1] == "own post-processing of a non-MoE module"


@pytest.mark.parametrize("prefetch_bytes", PREFETCH[::2], ids=["read-ahead", "each-when-asked"])
def test_a_broken_rank_header_is_reported_as_the_files_digest(sglang, art, prefetch_bytes):  # noqa: F811
    file = rank_file(art)
    data = bytearray(file.read_bytes())
    data[8] ^= 0x01  # the header's opening "{": no longer JSON, the reader refuses it
    file.write_bytes(bytes(data))
    err = refused(sglang, art, f"{file}: sha256 tree digest .* does not match", prefetch_bytes=prefetch_bytes)
    assert err.__cause__ is not None and str(file) in str(err.__cause__)  # the reader's own error, kept


def test_a_tampered_shared_file_sglang_reads_is_refused(sglang, art):  # noqa: F811
    manifest = json.loads((art / "mxconvert.json").read_text())
    file = art / manifest["shared"]["files"][0]["file"]
    flip_stored_bits(file, next(iter(manifest["shared"]["tensors"])), 0, 0x01)
    refused(sglang, art, f"{file}: sha256 tree digest .* does not match the manifest")


@pytest.mark.parametrize("skip", ["FileChecks.check", "finish"])
def test_mutation_without_the_digest_wait_loads_the_tampered_file(sglang, art, monkeypatch, skip):  # noqa: F811
    """Planted bug: the load does not wait for the digests; the tampered byte reaches the model."""
    good = _load(sglang, art)[1]
    flip_stored_bits(rank_file(art), KEY, 0, 0x01)
    if skip == "finish":  # stops the threads, checks nothing

        def no_wait(self):
            self.reads.close()
            self.checks.close()

        monkeypatch.setattr(SglangArtifactInstaller, "finish", no_wait)
    else:
        monkeypatch.setattr(installer_module.FileChecks, "check", lambda self: None)
    tampered = _load(sglang, art)[1]
    differs = [k for k, v in expert_state(tampered).items() if not torch.equal(v[4], expert_state(good)[k][4])]
    assert differs == ["1.w2_weight"]
    assert our_threads() == []


def test_verify_checksums_false_hashes_nothing(sglang, art, monkeypatch):  # noqa: F811
    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed with verify_checksums false")

    monkeypatch.setattr(installer_module, "FileChecks", no_hashing)
    monkeypatch.setattr(installer_module, "check_files", no_hashing)
    flip_stored_bits(rank_file(art), KEY, 0, 0x01)
    assert _load(sglang, art, {"verify_checksums": False})[1] is not None


# ---- the order of events ----------------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch_bytes", PREFETCH[::2], ids=["read-ahead", "each-when-asked"])
def test_the_hashing_runs_while_the_tensors_are_handed_out(sglang, art, monkeypatch, prefetch_bytes):  # noqa: F811
    """The first digest computed waits for the first tensor handed out: the load completes only
    because the reads do not wait for the digests; every digest is checked before the load returns."""
    events: list[str] = []
    watch(monkeypatch, events, block_until_handed_out=True)
    _load(sglang, art, {"prefetch_bytes": prefetch_bytes})
    assert "never" not in events and "first digest waited" in events
    assert events.index("digests submitted") < events.index("first tensor handed out") < events.index("hash done")
    assert events[-1] == "checked"
    assert our_threads() == []


# ---- what is installed, what is logged --------------------------------------------------------------------
@pytest.mark.parametrize("prefetch_bytes", PREFETCH, ids=["default", "one-tensor", "each-when-asked"])
def test_the_installed_layers_equal_the_synchronous_paths(sglang, art, caplog, prefetch_bytes):  # noqa: F811
    want = synchronous_state(sglang, art)
    with caplog.at_level(logging.INFO, logger="mxconvert.runtimes.sglang"):
        loader, model = _load(sglang, art, {"prefetch_bytes": prefetch_bytes, "num_threads": 2})
    assert loader.load_config.model_loader_extra_config == {"num_threads": 2}  # SGLang's loader never sees ours
    got = expert_state(model)
    assert sorted(got) == sorted(want) and len(got) >= 6 * CONFIG["num_hidden_layers"]
    for key, (kind, dtype, shape, stride, data) in want.items():
        assert got[key][:4] == (kind, dtype, shape, stride), key
        assert torch.equal(got[key][4], data), key
    reading = next(r.getMessage() for r in caplog.records if "expert tensors" in r.getMessage())
    tensors = 6 * CONFIG["num_hidden_layers"]
    assert reading.startswith(f"mxconvert: reading {tensors} expert tensors")
    assert ("each when SGLang asked for it" in reading) == (prefetch_bytes == 0)
    assert any("ahead on" in r.getMessage() for r in caplog.records) == (prefetch_bytes > 0)
    manifest = json.loads((art / "mxconvert.json").read_text())
    files = len(manifest["ranks"][0]["files"]) + len(manifest["shared"]["files"])
    assert any(f"checksums of {files} artifact files" in r.getMessage() for r in caplog.records)
    assert our_threads() == []


@pytest.mark.parametrize("bad", [-1, 1.5, "4G", True, None])
def test_prefetch_bytes_is_validated(sglang, art, bad):  # noqa: F811
    with pytest.raises(InputError, match=r"prefetch_bytes=.*expected a whole number of bytes >= 0"):
        _load(sglang, art, {"prefetch_bytes": bad})
    assert sglang.events == []  # refused before the runtime is even checked
    with pytest.raises(InputError, match="prefetch_bytes"):
        SglangArtifactInstaller(art, prefetch_bytes=bad)


def test_the_stand_in_loop_is_sglangs_module_order(sglang):  # noqa: F811
    """The read-ahead follows `prepare`'s layer order, which is the post-processing loop's (both walk
    `named_modules`); a different order would still install the same bytes, read unprefetched."""
    model = Model([], 1)
    looped = [m for _, m in model.named_modules() if getattr(m, "quant_method", None) is not None]
    prepared = [m for _, m, _ in sglang.loader.moe_layers(model)]
    assert prepared and [m for m in looped if any(m is p for p in prepared)] == prepared
