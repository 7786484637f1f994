"""`inspect --plot`: a picture of where a layout puts each element of a small canonical tile.

Every weight and block-scale layout is a move of elements (the layout's gather plan: buffer
position -> canonical element, or padding). The picture colours the elements of the canonical
tile `rows < 16, columns < 16` of one expert by their source row (hue) and column (brightness),
draws every other source element light grey and padding black, and shows the part of the kernel
buffer the tile lands in (rows x columns of the buffer as the kernel's memory order lays it out),
so a swizzle, an interleave or a transpose can be seen. One panel per tensor; two inputs side by
side. Tensors computed by arithmetic (NVFP4 folded scales) have no move and are listed, not drawn.

matplotlib is an optional dependency (`pip install mxconvert[plot]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mxconvert.core.dtypes import torch_dtype
from mxconvert.core.errors import InputError

TILE = 16
MAX_SIDE = 256
MIN_SIDE = 32
PAD_RGB = (0.0, 0.0, 0.0)
OTHER_RGB = (0.86, 0.86, 0.86)


@dataclass
class Panel:
    title: str
    image: np.ndarray | None  # H x W x 3 floats in [0, 1]
    note: str = ""


def _colours(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    hsv_to_rgb = _matplotlib().colors.hsv_to_rgb

    hsv = np.stack([rows / TILE * 0.85, np.full(rows.shape, 0.9), 0.45 + 0.55 * cols / TILE], axis=-1)
    return hsv_to_rgb(hsv)


def move_image(forward: np.ndarray, arranged_shape: tuple[int, ...], element_shape: tuple[int, ...]) -> np.ndarray:
    """The picture of one expert's move. `forward[i]`: canonical element at buffer position i
    (`numel` = padding); `element_shape`: the canonical expert's element shape (rows first)."""
    numel = int(np.prod(element_shape))
    rows_total = element_shape[0]
    cols_total = numel // rows_total
    width = arranged_shape[-1] if arranged_shape else 1
    height = len(forward) // width
    src = forward.reshape(height, width)
    pad = src >= numel
    safe = np.where(pad, 0, src)
    row, col = safe // cols_total, safe % cols_total
    in_tile = ~pad & (row < TILE) & (col < TILE)
    image = np.empty((height, width, 3))
    image[...] = OTHER_RGB
    image[pad] = PAD_RGB
    image[in_tile] = _colours(row[in_tile], col[in_tile])
    ys, xs = np.nonzero(in_tile)
    if len(ys) == 0:
        return image[:MAX_SIDE, :MAX_SIDE]
    y1 = min(height, max(int(ys.max()) + 1, MIN_SIDE))
    x1 = min(width, max(int(xs.max()) + 1, MIN_SIDE))
    return image[: min(y1, MAX_SIDE), : min(x1, MAX_SIDE)]


def _artifact_panels(root: Path, tensor: str | None, label: str) -> list[Panel]:
    from mxconvert.artifact.manifest import read_manifest, target_format
    from mxconvert.formats.registry import Geometry, format_named
    from mxconvert.layouts.engine.plans import gather_plan

    target = read_manifest(root)["target"]
    fmt = format_named(target_format(target))
    layout = fmt.layout_from_target(target)
    specs = Geometry.from_target(target).specs(1)
    panels = []
    for name in layout.kernel_names:
        if tensor is not None and tensor != name:
            continue
        title = f"{label}: {name} ({target['backend']})"
        if name in layout.derived:
            panels.append(Panel(title, None, "computed from whole tensors (no move to draw)"))
            continue
        lt = layout.tensors[name]
        dtype, shape = specs[name]
        elements = lt.split.split(torch.empty(shape, dtype=torch_dtype(dtype), device="meta"))
        plan = gather_plan(lt, tuple(elements.shape[1:]))
        panels.append(Panel(title, move_image(plan.forward, plan.arranged_shape, tuple(elements.shape[1:]))))
    return panels


def _checkpoint_panels(desc, tensor: str | None, label: str) -> list[Panel]:
    """A checkpoint holds its tensors as stored: the identity move."""
    panels, seen = [], set()
    for v in desc.tensors.values():
        name = v["name"]
        if name in seen or (tensor is not None and tensor != name):
            continue
        seen.add(name)
        shape = tuple(v["shape"][1:]) or (1,)
        rows, cols = shape[0], int(np.prod(shape[1:])) if len(shape) > 1 else 1
        forward = np.arange(rows * cols)
        panels.append(Panel(f"{label}: {name} (as stored)", move_image(forward, (cols,), (rows, cols))))
    return panels


def _matplotlib():
    """matplotlib (an optional extra), set to draw without a display; refused with what to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.colors
        import matplotlib.pyplot
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'mxconvert[plot]'") from None
    return matplotlib


def plot_layouts(descs: list, out: Path, tensor: str | None = None) -> dict:
    """Draw the panels of one or two inputs (inspect descriptions) into `out` (PNG)."""
    plt = _matplotlib().pyplot
    columns = []
    for label, desc in zip("AB", descs):
        label = label if len(descs) > 1 else Path(desc.path).name
        panels = (
            _artifact_panels(Path(desc.path), tensor, label)
            if desc.kind == "artifact"
            else _checkpoint_panels(desc, tensor, label)
        )
        if not panels:
            raise InputError(f"{desc.path}: no tensor {tensor!r} to draw")
        columns.append(panels)
    rows = max(len(c) for c in columns)
    fig, axes = plt.subplots(rows, len(columns), figsize=(5.5 * len(columns), 3.4 * rows), squeeze=False)
    drawn = 0
    for j, panels in enumerate(columns):
        for i in range(rows):
            ax = axes[i][j]
            if i >= len(panels):
                ax.axis("off")
                continue
            p = panels[i]
            ax.set_title(p.title, fontsize=8)
            if p.image is None:
                ax.text(0.5, 0.5, p.note, ha="center", va="center", fontsize=8, wrap=True)
                ax.axis("off")
                continue
            ax.imshow(p.image, interpolation="nearest", aspect="auto")
            ax.set_xlabel("buffer column (element)", fontsize=7)
            ax.set_ylabel("buffer row", fontsize=7)
            ax.tick_params(labelsize=6)
            drawn += 1
    fig.suptitle(
        f"canonical tile rows < {TILE} (hue), columns < {TILE} (brightness); grey: other elements; black: padding",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out = Path(out)
    fig.savefig(out, dpi=80)
    width, height = (int(v) for v in fig.get_size_inches() * 80)
    plt.close(fig)
    return {"plot": str(out), "panels": drawn, "width": width, "height": height}
