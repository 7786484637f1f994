"""The shape-only path of the layouts (layouts/shapes.py) gives exactly what `forward` gives on a
meta tensor, for every registered layout on every example checkpoint, built-in profile, runtime
revision and TP 1/2, refusals included (same exception type and message), so `buffer_spec`
cannot drift from the layouts it describes."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT

from mxconvert.core.errors import MxconvertError
from mxconvert.formats.registry import format_of, open_model
from mxconvert.layouts.base import TensorLayout
from mxconvert.layouts.engine.shapes import ShapeOnly
from mxconvert.layouts.registry import _BUILDERS
from mxconvert.selection import Deployment
from mxconvert.target.profiles import BUILTIN_PROFILES
from mxconvert.target.revisions import REVISIONS

EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if (p / "config.json").is_file())


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except (ValueError, RuntimeError, MxconvertError, IndexError) as exc:
        return (type(exc).__name__, str(exc))


@functools.cache
def _targets() -> list:
    """(label, layout, canonical specs) for every registered backend of each example's format,
    built for every built-in profile, revision, TP 1/2 (and both Marlin input dtypes) that it
    accepts (built once for the tests of this file)."""
    return list(_each_target())


def _each_target():
    for example in EXAMPLES:
        ckpt = open_model(str(example))
        fmt = format_of(ckpt)
        backends = sorted((b for (f, b) in _BUILDERS if f == fmt.name), key=lambda b: b.value)
        for revision in (r for r in REVISIONS.values() if fmt.name in r.formats):
            for backend in backends:
                for marlin in (None, "fp8"):
                    selection = SimpleNamespace(backend=backend, marlin_input_dtype=marlin)
                    for profile in BUILTIN_PROFILES:
                        for tp in (1, 2):
                            dep = Deployment(tp=tp)
                            try:
                                geometry = fmt.geometry(ckpt, selection, revision, profile, dep)
                                layout = fmt.layout_for(ckpt, selection, revision, geometry, dep, profile)
                                experts = fmt.plan_ranks(ckpt, tp, 1)[0].num_experts
                            except (MxconvertError, AssertionError):
                                continue  # this target is refused before any layout exists
                            yield (
                                f"{example.name} {revision.name} {backend.value} {profile.name} tp{tp}",
                                layout,
                                geometry.specs(experts),
                            )


def _move_key(fn) -> object:
    """What makes two moves the same: their code and what their closures hold (layout builders
    make a new closure per call, e.g. `hopper_value(64, 64)`), so each distinct move is compared once."""
    if isinstance(fn, (tuple, list)):
        return tuple(_move_key(f) for f in fn)
    if not callable(fn):
        return fn
    cells = tuple(_move_key(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ()))
    return (getattr(fn, "__code__", fn), cells)


def test_shape_only_buffer_spec_equals_meta_for_every_registered_layout():
    seen: set = set()
    compared = refused = 0
    backends = set()
    for label, layout, specs in _targets():
        backends.add((layout.kind, layout.backend))
        for name, tensor in layout.tensors.items():
            dtype, shape = specs[name]
            key = (_move_key(tensor.arrange), tensor.codec, tensor.split, tensor.pad_value, dtype, shape)
            if key in seen:
                continue
            seen.add(key)
            fast = _outcome(tensor.buffer_spec, shape, dtype)
            slow = _outcome(tensor.meta_spec, shape, dtype)
            assert fast == slow, f"{label} {name}: shape-only {fast} != meta {slow}"
            compared += 1
            refused += fast[0] != "ok"
    registered = {b for (_, b) in _BUILDERS}
    assert {b for _, b in backends} == registered, registered - {b for _, b in backends}
    print(f"compared {compared} distinct (move, shape) pairs, {refused} refused by both")
    assert compared > 100 and refused > 0, (compared, refused)


def test_declared_spec_of_every_derived_tensor_equals_meta():
    """`DerivedTensor.buffer_spec` reads its formula's declared spec (no tensor op, no torch); it
    equals what the formula computes on meta tensors, for every derived tensor of every target."""
    compared, seen = 0, set()
    for label, layout, specs in _targets():
        for name, derived in layout.derived.items():
            key = (layout.backend, layout.revision, name, *(specs[n] for n in derived.inputs))
            if key in seen:  # an NVFP4 layout depends on backend, revision and sizes only
                continue
            seen.add(key)
            fast = _outcome(derived.buffer_spec, specs)
            slow = _outcome(derived.meta_spec, specs)
            assert fast == slow and fast[0] == "ok", f"{label} {name}: declared {fast} != meta {slow}"
            compared += 1
    assert compared > 50, compared


def test_a_move_that_torch_refuses_is_refused_the_same_way():
    def move(x, fill):
        e, n, k = x.shape
        return x.reshape(e, n // 3, 3, k).permute(0, 2, 1, 3)

    layout = TensorLayout("t", move)
    for shape in ((2, 9, 4), (2, 8, 4)):
        assert _outcome(layout.buffer_spec, shape, torch.uint8) == _outcome(layout.meta_spec, shape, torch.uint8)
    assert _outcome(layout.buffer_spec, (2, 8, 4), torch.uint8)[0] == "RuntimeError"


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.reshape(3, -1),
        lambda t: t.reshape(-1),
        lambda t: t.permute(2, 0, 1),
        lambda t: t.transpose(0, -1),
        lambda t: t.flip(1),
        lambda t: t.flatten(1),
        lambda t: t.flatten(-2),
        lambda t: t.unflatten(-1, (2, -1)),
        lambda t: t.mT,
        lambda t: t.reshape(5, -1),
        lambda t: t.reshape(7, 7),
        lambda t: t.permute(0, 1),
    ],
)
def test_shape_only_ops_match_torch(op):
    real = torch.empty((6, 4, 10), device="meta")
    assert _outcome(lambda: tuple(op(ShapeOnly(real.shape)).shape)) == _outcome(lambda: tuple(op(real).shape))
