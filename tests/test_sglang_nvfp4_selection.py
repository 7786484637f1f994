"""SGLang 0.5.23's NVFP4 MoE runner choice (selection/sglang/nvfp4_0_5_23.py), `--runtime sglang==0.5.23`
on NVFP4 checkpoints, and the row's refusal to write NVFP4 bytes (docs/sglang.md, "NVFP4").

`test_mirror_agrees_with_sglangs_own_method` runs SGLang's own `ModelOptNvFp4FusedMoEMethod.__init__`
and `create_moe_runner` (modelopt_quant.py) and the `MoeRunnerBackend` enum (layers/moe/utils.py),
compiled from the cached wheel, for every CUDA profile and runner name, and holds the mirror to it.
"""

from __future__ import annotations

import ast
import enum
import functools
import glob
import json
import os
import sys
import types
import zipfile
from dataclasses import replace

import pytest
from helpers import ROOT, run_cli

from mxconvert.core.errors import InputError
from mxconvert.layouts.registry import LayoutTarget, build_layout
from mxconvert.selection.deployment import Deployment
from mxconvert.selection.nvfp4 import nvfp4_moe_backend_names, select_nvfp4_backend
from mxconvert.selection.report import SelectionRefused
from mxconvert.selection.sglang import nvfp4_0_5_23 as mirror
from mxconvert.target.backends import Mxfp4Backend, Nvfp4Backend
from mxconvert.target.profiles import BUILTIN_PROFILES, get_profile
from mxconvert.target.releases import resolve_runtime
from mxconvert.target.sglang_revisions import unproven_layout_reason

B = Nvfp4Backend
ROW = resolve_runtime("sglang==0.5.23", "nvfp4").revision
MODELOPT_QWEN3 = ROOT / "examples" / "tiny-nvfp4-modelopt-qwen3"
CT_DEEPSEEK = ROOT / "examples" / "tiny-nvfp4-ct-deepseek"
MODELOPT_DEEPSEEK = ROOT / "examples" / "tiny-nvfp4-modelopt-deepseek"
CUDA_PROFILES = [p.name for p in BUILTIN_PROFILES if p.platform == "cuda"]


def _select(profile: str, backend: str = "auto", producer="modelopt", model_type="qwen3_moe", w4a16=False, **dep):
    return select_nvfp4_backend(
        get_profile(profile),
        ROW,
        Deployment(**dep),
        backend,
        w4a16=w4a16,
        producer=producer,
        model_type=model_type,
    )


def test_nvfp4_pin_resolves_to_the_sglang_row():
    resolved = resolve_runtime("sglang==0.5.23", "nvfp4")
    assert (resolved.revision.name, resolved.release) == ("sglang-0.5.23", "0.5.23")
    assert resolved.revision is resolve_runtime("sglang==0.5.23", "mxfp4").revision
    assert nvfp4_moe_backend_names(ROW) == mirror.RUNNER_NAMES


@pytest.mark.parametrize("profile", ["b200", "gb200", "b300"])
def test_sm100_auto_for_an_overridden_model_is_flashinfer_trtllm(profile):
    s = _select(profile)
    assert (s.backend, s.activation, s.use_global_sf, s.use_a16, s.format) == (
        B.FLASHINFER_TRTLLM,
        "nvfp4",
        True,
        False,
        "nvfp4",
    )
    assert [c.chosen for c in s.considered] == [True]
    assert "override" in s.considered[-1].reason


@pytest.mark.parametrize("profile", ["a100", "a10g", "l40s", "h100", "h200"])
def test_ampere_to_hopper_auto_is_marlin_with_16_bit_activations(profile):
    s = _select(profile)
    assert (s.backend, s.activation, s.use_a16, s.use_global_sf) == (B.MARLIN, "bf16", True, False)
    passed = [c for c in s.considered if not c.chosen]
    assert passed and "SM100 only" in passed[0].reason  # the Qwen3 override, reported


@pytest.mark.parametrize("profile", ["b200", "rtx-pro-6000", "thor"])
def test_blackwell_auto_without_an_override_is_refused_as_incoherent(profile):
    with pytest.raises(SelectionRefused, match="not coherent") as err:
        _select(profile, model_type="llama")
    assert any("CUTLASS bytes" in c.reason for c in err.value.considered)


def test_sm120_auto_even_for_qwen3_is_refused():
    with pytest.raises(SelectionRefused, match="not coherent"):
        _select("rtx-5090")


@pytest.mark.parametrize("profile", ["mi300x", "intel-xpu", "cpu"])
def test_non_cuda_devices_are_refused(profile):
    with pytest.raises(SelectionRefused, match="does not support NVFP4"):
        _select(profile)


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        ("flashinfer_trtllm", B.FLASHINFER_TRTLLM),
        ("flashinfer_trtllm_routed", B.FLASHINFER_TRTLLM),
        ("flashinfer_cutlass", B.FLASHINFER_CUTLASS),
        ("flashinfer_cutedsl", B.FLASHINFER_CUTEDSL),
        ("marlin", B.MARLIN),
    ],
)
def test_requested_names_on_b200(name, backend):
    s = _select("b200", name)
    assert (s.backend, s.requested) == (backend, name)


def test_trtllm_on_sm120_is_refused_but_cutlass_runs():
    with pytest.raises(SelectionRefused, match="cannot run"):
        _select("rtx-pro-6000", "flashinfer_trtllm")
    assert _select("rtx-pro-6000", "flashinfer-cutlass").backend is B.FLASHINFER_CUTLASS


def test_flashinfer_names_on_hopper_are_refused():
    for name in ("flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl"):
        with pytest.raises(SelectionRefused, match="does not support NVFP4"):
            _select("h100", name)


def test_other_runner_names_are_refused_and_unknown_ones_are_input_errors():
    with pytest.raises(SelectionRefused, match="cutlass is not supported for NVFP4"):
        _select("b200", "cutlass")
    with pytest.raises(InputError, match="unknown SGLang --moe-runner-backend"):
        _select("b200", "nonsense")
    with pytest.raises(InputError, match="all2all"):
        _select("b200", all2all="deepep_low_latency")


def test_w4a16_modelopt_runs_marlin_only():
    assert _select("h100", w4a16=True).backend is B.MARLIN
    with pytest.raises(SelectionRefused, match="W4A16"):
        _select("b200", w4a16=True)
    assert _select("b200", "marlin", w4a16=True).backend is B.MARLIN


def test_compressed_tensors_schemes():
    ct = {"producer": "compressed-tensors", "model_type": "deepseek_v3"}
    s = _select("b200", **ct)
    assert (s.backend, s.kernel_class, s.use_global_sf) == (B.FLASHINFER_CUTLASS, mirror._CT_CUTLASS, False)
    assert _select("b200", "flashinfer_trtllm", **ct).backend is B.FLASHINFER_TRTLLM
    assert _select("rtx-pro-6000", **ct).backend is B.FLASHINFER_CUTLASS  # capability 120 >= 100
    h = _select("h100", **ct)
    assert (h.backend, h.kernel_class) == (B.MARLIN, mirror._CT_MARLIN)
    assert _select("b200", w4a16=True, **ct).kernel_class == mirror._CT_MARLIN
    with pytest.raises(SelectionRefused, match="TRT-LLM or CUTLASS only"):
        _select("b200", "flashinfer_cutedsl", **ct)


def test_trtllm_marlin_cutlass_and_cutedsl_are_written():
    # tests/test_sglang_nvfp4_golden.py, tests/test_sglang_nvfp4_cutlass.py, tests/test_sglang_nvfp4_cutedsl.py
    for backend in (B.FLASHINFER_TRTLLM, B.MARLIN, B.FLASHINFER_CUTLASS, B.FLASHINFER_CUTEDSL):
        assert unproven_layout_reason(ROW, "nvfp4", backend.value) is None
        assert build_layout("nvfp4", LayoutTarget(backend, ROW, get_profile("b200"), 2048, 768, 4)).tensors
    assert unproven_layout_reason(ROW, "mxfp4", Mxfp4Backend.MARLIN.value) is None


def test_a_format_qualified_unproven_key_names_one_formats_backend():
    row = replace(ROW, unproven_layouts=(("nvfp4:MARLIN", "why"),))
    assert unproven_layout_reason(row, "nvfp4", "MARLIN") == "why"
    assert unproven_layout_reason(row, "mxfp4", "MARLIN") is None
    assert unproven_layout_reason(replace(ROW, unproven_layouts=(("MARLIN", "both"),)), "mxfp4", "MARLIN") == "both"


def test_backends_lists_the_nvfp4_rows():
    proc = run_cli("backends", "--json")
    assert proc.exit_code == 0, proc.stderr
    rows = [
        r for r in json.loads(proc.stdout)["backends"] if r["revision"] == "sglang-0.5.23" and r["format"] == "nvfp4"
    ]
    by = {r["backend"]: r for r in rows}
    assert set(by) == {"FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "FLASHINFER_CUTEDSL", "MARLIN"}
    assert by["FLASHINFER_TRTLLM"]["selected_on"] == ["b200", "gb200", "b300"]
    assert by["MARLIN"]["selected_on"] == ["a100", "a10g", "l40s", "h100", "h200"]
    assert {b: r["writable"] for b, r in by.items()} == {
        "FLASHINFER_TRTLLM": True,
        "FLASHINFER_CUTLASS": True,
        "FLASHINFER_CUTEDSL": True,
        "MARLIN": True,
    }
    mx = [r for r in json.loads(proc.stdout)["backends"] if r["revision"] == "sglang-0.5.23" and r["format"] == "mxfp4"]
    assert {r["backend"]: r["writable"] for r in mx}["MARLIN"] is True


@pytest.mark.parametrize(
    ("example", "profile", "backend", "why"),
    [
        (CT_DEEPSEEK, "b200", "FLASHINFER_CUTLASS", "compressed-tensors NVFP4"),
        (CT_DEEPSEEK, "h100", "MARLIN", "compressed-tensors NVFP4"),
        (MODELOPT_DEEPSEEK, "b200", "FLASHINFER_CUTEDSL", "interleave_w13_halves"),  # I 96: SGLang raises
    ],
)
def test_select_and_convert_refuse_what_is_not_proven(tmp_path, example, profile, backend, why):
    extra = ["--backend", "flashinfer_cutedsl"] if backend == "FLASHINFER_CUTEDSL" else []
    proc = run_cli("select", str(example), "--runtime", "sglang==0.5.23", "--profile", profile, *extra)
    assert proc.exit_code == 2 and why in proc.output
    out = tmp_path / "out"
    proc = run_cli("convert", str(example), "--runtime", "sglang==0.5.23", "--profile", profile, *extra, "-o", out)
    assert proc.exit_code == 2 and why in proc.output
    assert not out.exists() or not any(out.iterdir())


# ---- against SGLang's own code ---------------------------------------------------------------------
WHEEL = sorted(glob.glob(os.path.expanduser("~/.cache/mxconvert-wheels/sglang-0.5.23-*.whl")))


@functools.cache
def _class_code(wheel: str, path: str, name: str, keep: tuple[str, ...] | None):
    """The compiled class `name` of `path` in the wheel (all members, or only the named methods)."""
    tree = ast.parse(zipfile.ZipFile(wheel).read(path).decode())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    if keep is not None:
        node.body = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in keep]
        node.bases, node.decorator_list = [], []
    return compile(ast.Module([node], []), path, "exec")


def _compile_from_wheel(wheel: str, path: str, classes: dict[str, tuple[str, ...] | None], ns: dict) -> None:
    """Exec the named classes of `path` (all members, or only the named methods) into `ns`."""
    for name, keep in classes.items():
        exec(_class_code(wheel, path, name, keep), ns)


class _A2A:
    def is_megamoe(self):
        return False

    def is_deepep(self):
        return False


def _sglang_method(wheel: str, profile, name: str):
    """(bytes-preparation branch, runner) of SGLang's ModelOptNvFp4FusedMoEMethod for a global runner
    `name` on `profile`, or None where `__init__` raises."""
    ns: dict = {"Enum": enum.Enum}
    _compile_from_wheel(
        wheel, "sglang/srt/layers/moe/utils.py", {"_MoeRunnerBackendPredicates": None, "MoeRunnerBackend": None}, ns
    )
    backend_enum = ns["MoeRunnerBackend"]
    cap = profile.cap if profile.platform == "cuda" and profile.capability is not None else None
    ns.update(
        get_moe_runner_backend=lambda: backend_enum(name),
        get_moe_a2a_backend=_A2A,
        is_cuda=lambda: profile.platform == "cuda",
        get_device_capability=lambda: cap,
        get_platform=lambda: types.SimpleNamespace(is_blackwell=cap is not None and cap[0] in (10, 11, 12)),
        MoeRunner=lambda backend, config: ("runner", backend),
        MoeRunnerBackend=backend_enum,
        is_flashinfer_cutedsl_v1_path=lambda: False,
    )
    _compile_from_wheel(
        wheel,
        "sglang/srt/layers/quantization/modelopt_quant.py",
        {"ModelOptNvFp4FusedMoEMethod": ("__init__", "create_moe_runner")},
        ns,
    )
    cls = ns["ModelOptNvFp4FusedMoEMethod"]
    try:
        method = cls(types.SimpleNamespace())
    except ValueError:
        return None
    layer = types.SimpleNamespace()
    try:
        method.create_moe_runner(layer, types.SimpleNamespace())
    except NotImplementedError:
        return None
    runner = method._moe_runner_backend.value
    # process_weights_after_loading's branch order (modelopt_quant.py): marlin, TRT-LLM, CuTe DSL v2, CUTLASS.
    if method._moe_runner_backend.is_marlin():
        prepared = "marlin"
    elif method.enable_flashinfer_trtllm_moe:
        prepared = "flashinfer_trtllm"
    elif backend_enum(name).is_flashinfer_cutedsl():  # the property, less its `from sglang... import`
        prepared = "flashinfer_cutedsl"
    else:
        prepared = "flashinfer_cutlass"
    return prepared, runner


_RUNNER_OF = {
    B.FLASHINFER_TRTLLM: ("flashinfer_trtllm", "flashinfer_trtllm_routed"),
    B.FLASHINFER_CUTLASS: ("flashinfer_cutlass",),
    B.FLASHINFER_CUTEDSL: ("flashinfer_cutedsl",),
    B.MARLIN: ("marlin",),
}
#: Refusals the mirror adds to what SGLang's Python checks (kernels built for fewer devices).
_KERNEL_LIMITS = ("capability major 10", "capability 8.0 or newer")


@pytest.mark.skipif(not WHEEL, reason="the sglang 0.5.23 wheel is not cached (~/.cache/mxconvert-wheels)")
@pytest.mark.parametrize("name", ["auto", "flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutlass",
                                  "flashinfer_cutedsl", "marlin", "cutlass"])  # fmt: skip
def test_mirror_agrees_with_sglangs_own_method(name, monkeypatch):
    # create_moe_runner imports the runner modules for their registration only: empty modules stand in.
    runners = "sglang.srt.layers.moe.moe_runner"
    for module in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe", runners,
                   f"{runners}.flashinfer_cutlass", f"{runners}.flashinfer_cutedsl"):  # fmt: skip
        monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
    checked = 0
    for profile_name in [*CUDA_PROFILES, "mi300x", "cpu"]:
        profile = get_profile(profile_name)
        sglang = _sglang_method(WHEEL[-1], profile, name)
        try:
            # model_type None: no override runs, the method sees the name as given (as SGLang's own code here)
            picked = _select(profile_name, name, model_type=None)
        except SelectionRefused as err:
            coherent = sglang is not None and (sglang[0] == sglang[1] or sglang[1].startswith(sglang[0]))
            if coherent:  # SGLang runs it: the mirror may refuse only for a kernel's device limit
                assert any(limit in c.reason for c in err.considered for limit in _KERNEL_LIMITS), (profile_name, err)
            checked += 1
            continue
        assert sglang is not None, (profile_name, name, picked)
        prepared, runner = sglang
        assert prepared == runner or runner.startswith(prepared), (profile_name, name, sglang)
        assert runner in _RUNNER_OF[picked.backend], (profile_name, name, sglang, picked.backend)
        checked += 1
    assert checked == len(CUDA_PROFILES) + 2


def test_expert_parallelism_and_per_token_activations_are_not_mirrored():
    # expert parallelism is mirrored for TRT-LLM, CUTLASS and Marlin (tests/test_sglang_nvfp4_ep.py), not CuTe DSL
    with pytest.raises(SelectionRefused, match="expert parallelism"):
        _select("b200", "flashinfer_cutedsl", tp=2, ep=2)
    with pytest.raises(InputError, match="PER_TOKEN_ACTIVATION"):
        _select("b200", env={"SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION": "1"})
    with pytest.raises(InputError, match="SwiGLU clamp"):
        select_nvfp4_backend(get_profile("b200"), ROW, Deployment(), "auto", swiglu_limit=7.0, producer="modelopt")
