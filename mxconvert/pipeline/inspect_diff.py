"""How `inspect` diffs two described inputs: target fields, missing tensors, descriptor fields
(row order, padding, scale encoding and swizzle, view) and, where descriptors agree, the bytes;
then the non-expert tensors, copied files and sources. The byte comparisons import torch."""

from __future__ import annotations

from mxconvert.core.dtypes import dtype_named
from mxconvert.pipeline.inspect_describe import Description, load_tensor, tensor_order

#: Descriptor fields compared by the diff, with the words used to report them.
DIFF_FIELDS = {
    "dtype": "dtype",
    "shape": "stored shape",
    "view_shape": "view shape",
    "view_stride": "view strides",
    "row_order": "row order",
    "hidden_padded": "hidden padded to",
    "intermediate_padded": "intermediate padded to",
    "scale_encoding": "scale encoding",
    "swizzle": "swizzle",
    "layout_class": "layout class",
    "steps": "steps",
}

TARGET_FIELDS = (
    "profile",
    "platform",
    "capability",
    "gfx",
    "backend",
    "kernel_class",
    "activation",
    "runtime_revision",
    "runtime_release",
    "tp_size",
    "ep_size",
    "hidden_size_padded",
    "intermediate_size_padded",
)


def diff_descriptions(a: Description, b: Description, progress=None) -> dict:
    """Differences between two descriptions; `same` is True only when nothing differs: target,
    expert tensors (presence, descriptors, bytes), non-expert tensors (presence, dtype, shape,
    bytes), copied files (config, tokenizer) and the sources (identity, layout, file hashes).
    `progress`: an object with `total` and `advance(nbytes, detail)` for the byte comparisons."""
    target = [
        {"field": k, "a": a.target.get(k), "b": b.target.get(k)}
        for k in TARGET_FIELDS
        if a.target.get(k) != b.target.get(k)
    ]
    only_a = sorted(set(a.tensors) - set(b.tensors))
    only_b = sorted(set(b.tensors) - set(a.tensors))
    descriptors, bytes_differ = [], []
    common = sorted(set(a.tensors) & set(b.tensors), key=tensor_order)
    if progress is not None:
        progress.total = sum(_nbytes(a.tensors[k]) for k in common) + sum(
            _nbytes(a.others[k]) for k in set(a.others) & set(b.others)
        )
    for key in common:
        if progress is not None:
            progress.advance(_nbytes(a.tensors[key]), f"layer {a.tensors[key].get('layer')}")
        da, db = a.tensors[key], b.tensors[key]
        changes = [
            {
                "field": f,
                "a": da.get(f),
                "b": db.get(f),
                "text": f"{_short(key)} {label}: {_fmt(da.get(f))} vs {_fmt(db.get(f))}",
            }
            for f, label in DIFF_FIELDS.items()
            if da.get(f) != db.get(f)
        ]
        if changes:
            descriptors.append({"tensor": key, "changes": changes})
            continue
        where = _first_byte_difference(a, b, key)
        if where is not None:
            bytes_differ.append({"tensor": key, **where})
    others = _diff_others(a, b, progress)
    copied = _diff_maps(a.copied, b.copied, "file")
    source = _diff_source(a.source, b.source)
    same = not (target or only_a or only_b or descriptors or bytes_differ or others or copied or source)
    return {
        "same": same,
        "a": a.path,
        "b": b.path,
        "target": target,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "descriptors": descriptors,
        "bytes": bytes_differ,
        "other_tensors": others,
        "copied_files": copied,
        "source": source,
    }


def _nbytes(entry: dict) -> int:
    count = 1
    for dim in entry.get("shape") or []:
        count *= int(dim)
    try:
        itemsize = dtype_named(entry.get("dtype")).itemsize
    except ValueError:  # a dtype mxconvert does not know: count its elements as bytes
        itemsize = 1
    return count * itemsize


def _diff_others(a: Description, b: Description, progress=None) -> list[dict]:
    """Non-expert tensors: presence, dtype, shape and bytes."""
    import torch

    out = [{"tensor": k, "text": f"{k}: only in A"} for k in sorted(set(a.others) - set(b.others))]
    out += [{"tensor": k, "text": f"{k}: only in B"} for k in sorted(set(b.others) - set(a.others))]
    for key in sorted(set(a.others) & set(b.others)):
        da, db = a.others[key], b.others[key]
        if progress is not None:
            progress.advance(_nbytes(da), "non-expert tensors")
        if (da["dtype"], da["shape"]) != (db["dtype"], db["shape"]):
            out.append({"tensor": key, "text": f"{key}: {da['dtype']} {da['shape']} vs {db['dtype']} {db['shape']}"})
            continue
        if a._other_reader is None or b._other_reader is None:
            continue
        ta, tb = a._other_reader(key), b._other_reader(key)
        ba = ta.contiguous().view(torch.uint8) if ta.dim() else ta.reshape(1).view(torch.uint8)
        bb = tb.contiguous().view(torch.uint8) if tb.dim() else tb.reshape(1).view(torch.uint8)
        if not torch.equal(ba, bb):
            out.append({"tensor": key, "text": f"{key}: same dtype and shape, different bytes"})
    return out


def _diff_maps(a: dict, b: dict, what: str) -> list[dict]:
    out = [{what: k, "text": f"{what} {k}: only in A"} for k in sorted(set(a) - set(b))]
    out += [{what: k, "text": f"{what} {k}: only in B"} for k in sorted(set(b) - set(a))]
    out += [{what: k, "text": f"{what} {k}: different content"} for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    return out


def _diff_source(a: dict, b: dict) -> list[dict]:
    """Sources: identity and layout, and the source files' hashes where both record them."""
    out = [
        {"field": k, "a": a.get(k), "b": b.get(k), "text": f"source {k}: {_fmt(a.get(k))} vs {_fmt(b.get(k))}"}
        for k in ("identity", "layout")
        if a.get(k) != b.get(k)
    ]
    if "files" in a and "files" in b:
        out += [dict(d, field="files", text="source " + d["text"]) for d in _diff_maps(a["files"], b["files"], "file")]
    return out


def _short(key: str) -> str:
    parts = key.split(".")
    return f"layer {parts[2]} {parts[-1]}" if len(parts) > 4 else key


def _fmt(value) -> str:
    return "-" if value is None else str(value)


def _first_byte_difference(a: Description, b: Description, key: str) -> dict | None:
    if a._data is None or b._data is None:  # an NVFP4 checkpoint holds experts per expert: no one tensor
        return None
    import torch

    ta, tb = load_tensor(a, key), load_tensor(b, key)
    ba, bb = ta.contiguous().view(torch.uint8), tb.contiguous().view(torch.uint8)
    if ba.shape != bb.shape:
        return {"text": f"{_short(key)}: different sizes"}
    if torch.equal(ba, bb):
        return None
    idx = torch.nonzero(ba != bb)[0].tolist()
    if ta.dtype != torch.uint8:
        idx[-1] //= ta.element_size()
    expert = idx[0]
    row = idx[1] if len(idx) > 1 else None
    return {
        "expert": expert,
        "index": idx,
        "text": f"{_short(key)}: same layout, different bytes; first at expert {expert}"
        + (f" row {row}" if row is not None else "")
        + f" (index {idx})",
    }
