"""`verify`'s tensor checks: every stored expert tensor, a chunk of experts at a time, through its
inverse layout against the canonical tensor rebuilt from the source, bit for bit (computed tensors
by recomputation); the dequantized experts of sampled layers; and the pass-through tensors, byte
for byte. Each check returns the problems it finds, naming the file, tensor, expert and the first
differing index; the orchestration (mxconvert/pipeline/verify.py) runs them on its workers."""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxconvert.artifact.manifest import artifact_file
from mxconvert.artifact.parts import StoredRows, stored_files, stored_parts
from mxconvert.core.bits import first_index, host_bits, is_host_bits, to_torch
from mxconvert.core.errors import InputError, MxconvertError
from mxconvert.core.parallel import ordered_map
from mxconvert.formats.base import RankPlan
from mxconvert.formats.registry import Geometry
from mxconvert.layouts import InverseError
from mxconvert.layouts.device import HOST, AnyCompute
from mxconvert.layouts.errors import PaddingError
from mxconvert.pipeline.verify_report import Problem, VerifyReport
from mxconvert.storage.safetensors_io import ShardReader

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # the host path compares numpy arrays of bits (mxconvert/bits.py); torch where a device runs
    from mxconvert.core.lazy_import import np, torch


def tensor_checks(
    root,
    readers,
    ckpt,
    fmt,
    layout,
    plan: RankPlan,
    rank: int,
    key: str,
    info: dict,
    geometry: Geometry,
    chunk_bytes: int,
    compute: AnyCompute = HOST,
):
    """The checks of one stored tensor as `(key, job)` pairs: `job()` returns `(problems, stop)`;
    `stop` drops the tensor's later chunks (it is unreadable). The descriptor and header checks
    run here, on the caller's thread; the chunk comparisons run on the workers."""
    name, layer, rel = info["name"], info["layer"], " + ".join(stored_files(info))
    specs = geometry.specs(plan.num_experts)
    if name not in layout.tensors and name not in layout.derived:
        problem = Problem("layout", f"{rel}: {key}: the target's layout has no tensor {name}", rel, key, rank)
        yield key, lambda: ([problem], True)
        return
    expected_desc = layout.describe_tensor(name, specs)
    if info.get("layout") != expected_desc:
        problem = Problem(
            "layout", f"{rel}: {key}: recorded layout descriptor differs from the target's layout", rel, key, rank
        )
        yield key, lambda: ([problem], False)
    try:
        want_dtype, want_shape = layout.buffer_spec(name, specs)
        for part in stored_parts(info):  # a split tensor: each part is experts of the layout's buffer
            part_key, part_shape = (
                part.key or key,
                (part.stop - part.start, *want_shape[1:]) if part.key else want_shape,
            )
            meta = _reader(readers, root, part.file).tensors.get(part_key)
            if meta is None:
                raise InputError(f"{part.file}: tensor {part_key} is missing")
            if meta.dtype != want_dtype or tuple(meta.shape) != tuple(part_shape):
                raise InputError(
                    f"{part.file}: {part_key} is {meta.dtype} {list(meta.shape)}, the layout gives "
                    f"{want_dtype} {list(part_shape)}"
                )
        stored_slice = StoredRows(info, key, _slices(readers, root))
    except MxconvertError as exc:
        problem = Problem("tensor", str(exc), rel, key, rank)
        yield key, lambda: ([problem], True)
        return
    if name in layout.derived:  # arithmetic from whole tensors: recompute and compare the bytes
        yield (
            key,
            lambda: _check_derived(
                ckpt, fmt, layout, plan, geometry, stored_slice, rank, key, name, layer, rel, compute
            ),
        )
        return
    t_layout = layout.tensors[name]
    dtype, _ = specs[name]
    per_expert = max(1, math.prod(want_shape[1:]) * want_dtype.itemsize)
    step = max(1, chunk_bytes // per_expert)
    for e0 in range(plan.expert_start, plan.expert_end, step):
        experts = range(e0, min(e0 + step, plan.expert_end))
        yield (
            key,
            (
                lambda experts=experts: _check_chunk(
                    ckpt,
                    fmt,
                    t_layout,
                    plan,
                    geometry,
                    stored_slice,
                    rank,
                    key,
                    name,
                    layer,
                    rel,
                    dtype,
                    experts,
                    compute,
                )
            ),
        )


def _check_derived(
    ckpt, fmt, layout, plan, geometry, stored_rows, rank, key, name, layer, rel, compute: AnyCompute = HOST
):
    derived = layout.derived[name]
    specs = fmt.canonical_specs(geometry, 1)
    expected, _ = compute.derive(
        derived,
        fmt.load_bits(ckpt, layer, plan, geometry, None, derived.inputs),
        {n: specs[n][0] for n in derived.inputs},
        where=f"{ckpt.root}: layer {layer}",
    )
    try:
        stored = stored_rows[:]
    except Exception as exc:
        return [Problem("tensor", f"{rel}: {key}: unreadable ({exc})", rel, key, rank)], True
    if stored.shape != expected.shape or not same_bytes(stored, expected):
        idx = first_difference(stored, expected) if stored.shape == expected.shape else []
        return [
            Problem(
                "tensor",
                f"rank {rank} {key} ({rel}): differs from the value computed from the source at index {idx}",
                rel,
                key,
                rank,
                None,
                idx,
            )
        ], False
    return [], False


def _check_chunk(
    ckpt,
    fmt,
    t_layout,
    plan: RankPlan,
    geometry: Geometry,
    stored_slice,
    rank: int,
    key: str,
    name: str,
    layer: int,
    rel: str,
    dtype,
    experts: range,
    compute: AnyCompute = HOST,
) -> tuple[list[Problem], bool]:
    """Inverse layout of one chunk of stored experts == the canonical chunk rebuilt from the source
    (inverted and compared on `compute`'s device)."""
    local = slice(experts.start - plan.expert_start, experts.stop - plan.expert_start)
    try:
        buffer = stored_slice[local]
    except Exception as exc:
        return [Problem("tensor", f"{rel}: {key}: unreadable ({exc})", rel, key, rank)], True
    expected = compute.put(fmt.load_bits(ckpt, layer, plan, geometry, experts, (name,))[name], dtype)
    try:
        actual = compute.inverse(t_layout, buffer, tuple(expected.shape), dtype)
    except InverseError as exc:  # wrong padding, or bytes no source value gives (a widened bias)
        kind = "padding" if isinstance(exc, PaddingError) else "tensor"
        return [
            Problem(
                kind,
                f"rank {rank} {key} ({rel}), experts {experts.start}..{experts.stop - 1}: {exc}",
                rel,
                key,
                rank,
                experts.start,
            )
        ], False
    if same_bytes(actual, expected):
        return [], False
    idx = first_difference(actual, expected)
    expert, where = _describe_index(name, idx, plan, experts.start)
    in_padding = _CANONICAL_PADDING.get(fmt.name)
    if in_padding is not None and in_padding(name, idx[1:], ckpt.facts.hidden_size, plan.i_end - plan.i_start):
        return [
            Problem(
                "padding", f"rank {rank} {key} ({rel}): padding is not zero at {where}", rel, key, rank, expert, idx[1:]
            )
        ], False
    return [
        Problem(
            "tensor",
            f"rank {rank} {key} ({rel}): {where} differs from the source after the inverse layout",
            rel,
            key,
            rank,
            expert,
            idx[1:],
        )
    ], False


def first_difference(actual: Any, expected: Any) -> list[int]:
    """Index of the first element whose bits differ (host bit arrays, or tensors on a device)."""
    actual, expected = host_bits(actual), host_bits(expected)
    a, b = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    if a.ndim == 0:
        return []
    diff = first_index(a.view(np.uint8) != b.view(np.uint8))
    diff[-1] //= actual.itemsize  # back from bytes to element index
    return diff


def _describe_index(name: str, idx: list[int], plan: RankPlan, expert0: int) -> tuple[int, str]:
    expert = expert0 + idx[0]
    where = f"expert {expert}"
    if len(idx) >= 2:
        row = idx[1]
        if name.startswith("w13"):
            half = "gate" if row % 2 == 0 else "up"
            where += f" row {row} ({half}_{plan.i_start + row // 2})"
        else:
            where += f" row {row}"
    if len(idx) >= 3:
        where += f" column {idx[2]}"
    return expert, where


def _in_mxfp4_padding(name: str, idx: list[int], hidden: int, inter: int) -> bool:
    """Whether a GPT-OSS MXFP4 canonical index lies in the zero padding its reader appends
    (mxconvert/formats/mxfp4/canonical.py)."""
    rows, cols = {
        "w13_weight": (2 * inter, hidden // 2),
        "w13_weight_scale": (2 * inter, hidden // 32),
        "w13_bias": (2 * inter, None),
        "w2_weight": (hidden, inter // 2),
        "w2_weight_scale": (hidden, inter // 32),
        "w2_bias": (hidden, None),
    }[name]
    return idx[0] >= rows or (cols is not None and len(idx) > 1 and idx[1] >= cols)


#: Format name -> whether a canonical index lies in padding the format's reader appends, so that a
#: difference there is reported as non-zero padding. Formats whose canonical tensors are not
#: padded (NVFP4: its layouts pad, and their inverse checks the padding) have no entry.
_CANONICAL_PADDING: dict[str, Callable[[str, list[int], int, int], bool]] = {"mxfp4": _in_mxfp4_padding}


def dequant_check(
    root,
    readers,
    ckpt,
    fmt,
    layout,
    plan: RankPlan,
    entry: dict,
    layer: int,
    geometry: Geometry,
    report: VerifyReport,
    jobs: int = 1,
    chunk_bytes: int = 64 << 20,
    proven: AbstractSet[str] = frozenset(),
    compute: AnyCompute = HOST,
) -> None:
    """Dequantize weight+scale from the artifact (through the inverse layout) and from the source,
    a chunk of experts at a time (chunks on the workers), and record the largest difference.
    Dequantization is a pure function of the (weight, scale) bytes, so where the restored bytes
    equal the source's the difference is exactly 0 and NaNs sit at the same places: the float
    tensors are then not built (they are 8x the bytes; building them for every expert of every
    worker made verify slower than convert and its memory grow with the thread count).
    `proven`: keys the bit-exact check already compared in full without a problem (inverse of the
    stored bytes == the source's canonical bytes, every expert): where weight and scale are both
    proven, the difference is 0 without inverting and reloading the layer a second time."""
    specs = geometry.specs(1)
    for weight in ("w13_weight", "w2_weight"):
        scale = weight.replace("weight", "weight_scale")
        keys = [f"model.layers.{layer}.mlp.experts.{n}" for n in (weight, scale)]
        infos = [entry["tensors"].get(k) for k in keys]
        if None in infos or not all(n in layout.tensors for n in (weight, scale)):
            continue  # a rescaled scale (NVFP4 Marlin) has no inverse: the bit-exact check covers it
        try:
            slices = [StoredRows(i, k, _slices(readers, root)) for k, i in zip(keys, infos)]
        except Exception:  # already reported by the bit-exact check
            continue
        if all(k in proven for k in keys):
            report.max_dequant_diff[f"rank {entry['rank']} layer {layer} {weight}"] = 0.0
            continue
        per_expert = sum(math.prod(specs[n][1]) * specs[n][0].itemsize for n in (weight, scale))
        step = max(1, chunk_bytes // max(1, per_expert))

        def one_chunk(e0: int, weight=weight, scale=scale, slices=slices, step=step) -> float | None:
            experts = range(e0, min(e0 + step, plan.expert_end))
            local = slice(e0 - plan.expert_start, experts.stop - plan.expert_start)
            try:
                restored: list[Any] = [
                    compute.inverse(layout.tensors[n], sl[local], (len(experts), *specs[n][1][1:]), specs[n][0])
                    for n, sl in zip((weight, scale), slices)
                ]
            except Exception:  # already reported by the bit-exact check
                return None
            source_bits = fmt.load_bits(ckpt, layer, plan, geometry, experts, (weight, scale))
            if all(same_bytes(r, compute.put(source_bits[n], specs[n][0])) for r, n in zip(restored, (weight, scale))):
                return 0.0
            # rare (the bytes differ): dequantize on the host, with torch
            values: list[Any] = [
                to_torch(r, specs[n][0]) if is_host_bits(r) else r.cpu() for r, n in zip(restored, (weight, scale))
            ]
            source = {n: to_torch(b, specs[n][0]) for n, b in source_bits.items()}
            worst = 0.0
            for i in range(len(experts)):  # the bytes differ: the real values, one expert at a time
                a = fmt.dequantize(values[0][i], values[1][i])
                b = fmt.dequantize(source[weight][i], source[scale][i])
                if not torch.equal(a.isnan(), b.isnan()):
                    return float("inf")
                worst = max(worst, float((a - b).abs().nan_to_num(0.0).max()))
            return worst

        worst = 0.0
        for diff in ordered_map(
            lambda e0: compute.run(one_chunk, e0), range(plan.expert_start, plan.expert_end, step), jobs
        ):
            if diff is None:
                return
            worst = max(worst, diff)
        report.max_dequant_diff[f"rank {entry['rank']} layer {layer} {weight}"] = worst


def check_passthrough(root: Path, readers: dict, ckpt, key: str, rel: str, chunk_bytes: int) -> list[Problem]:
    """A pass-through tensor is byte-identical to the source's: dtype and shape from both headers,
    then the bytes, `chunk_bytes` of rows at a time (an embedding can be over a GB; never held
    whole, nor twice)."""
    try:
        reader = _reader(readers, root, rel)
        stored = reader.get_slice(key).as_bits()
        if key not in ckpt.weight_map:
            raise InputError(f"{rel}: {key} is not a tensor of the source")
        original = ckpt.slice(key).as_bits()
        same = (stored.info.dtype, stored.info.shape) == (original.info.dtype, original.info.shape)
        if same:
            shape = stored.info.shape
            row_bytes = (stored.info.end - stored.info.begin) // shape[0] if shape and shape[0] else 0
            step = max(1, chunk_bytes // row_bytes) if row_bytes else 0
            if not step:  # 0-dim or empty: one read
                same = same_bytes(stored[()], original[()])
            else:
                same = all(
                    same_bytes(stored[r0 : r0 + step], original[r0 : r0 + step]) for r0 in range(0, shape[0], step)
                )  # stops at the first difference
    except MxconvertError as exc:
        return [Problem("passthrough", str(exc), rel, key)]
    except Exception as exc:  # unreadable tensor data
        return [Problem("passthrough", f"{rel}: {key}: unreadable ({exc})", rel, key)]
    if not same:
        return [Problem("passthrough", f"{rel}: {key} is not byte-identical to the source", rel, key)]
    return []


def _reader(readers: dict, root: Path, rel: str) -> ShardReader:
    if rel not in readers:
        readers[rel] = ShardReader(artifact_file(root, rel))
    return readers[rel]


def _slices(readers: dict, root: Path):
    """The `fetch` of mxconvert/parts.py over this run's readers: lazy slices of stored tensors."""
    return lambda rel, key: _reader(readers, root, rel).get_slice(key).as_bits()


def same_bytes(a: Any, b: Any) -> bool:
    """Bit-exact equality of the bytes of two host bit arrays (or two tensors on a device) of the
    same shape and element size (a NaN equals the same NaN; 0-dim included); False for different
    shapes or element sizes.

    The bytes are compared as 8-byte integers (the tail of fewer than 8 bytes, and storage that
    is not 8-byte aligned, byte by byte): torch.equal on uint8 runs at about 0.5 GB/s on one core,
    as slow as sha256 and the largest single cost of verify's chunk checks; on int64 views it is
    about 10x faster (bench/README.md, session 5). Contiguous arrays are not copied."""
    if is_host_bits(a) and is_host_bits(b):
        if a.shape != b.shape or a.itemsize != b.itemsize:
            return False
        ab, bb = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
        cut = ab.size - ab.size % 8
        return bool(
            np.array_equal(ab[:cut].view(np.int64), bb[:cut].view(np.int64)) and np.array_equal(ab[cut:], bb[cut:])
        )
    if a.shape != b.shape or a.element_size() != b.element_size():
        return False
    x, y = _flat_bytes(a), _flat_bytes(b)
    head = x.numel() - x.numel() % 8
    try:
        wide = torch.equal(x[:head].view(torch.int64), y[:head].view(torch.int64))
    except RuntimeError:  # a storage offset that is not a multiple of 8
        return torch.equal(x, y)
    return wide and torch.equal(x[head:], y[head:])


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t` as a 1-d uint8 tensor (a view where `t` is contiguous)."""
    return t.contiguous().reshape(-1).view(torch.uint8)
