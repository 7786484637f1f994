"""`inspect --plot`: a picture of where a layout puts each element of a small canonical tile.

Every weight and block-scale layout is a move of elements (the layout's gather plan: buffer
position -> canonical element, or padding). The picture colours the elements of the canonical
tile `rows < 16, columns < 16` of one expert by their source row (hue) and column (brightness),
draws every other source element light grey and padding black, and shows the part of the kernel
buffer the tile lands in (rows x columns of the buffer as the kernel's memory order lays it out),
so a swizzle, an interleave or a transpose can be seen. The first panel is the canonical tile
itself, with the colour key beside it; one panel per tensor follows, its axes in elements of the
tensor's dtype (a uint8 weight element holds two FP4 values); a tensor of one dimension per expert
(a bias) is a one-row strip, its element i coloured as canonical row i. Tensors computed by
arithmetic (NVFP4 folded scales) have no move: they are named on one line under the panels, not
drawn. Two inputs stand side by side.

matplotlib is an optional dependency (`pip install mxconvert[plot]`).
"""

from __future__ import annotations

import textwrap
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
DPI = 80
#: The colour key, one short line each, so that it fits beside the reference tile at any width.
KEY = (
    f"hue: canonical row 0..{TILE - 1}",
    f"brightness: canonical column 0..{TILE - 1}",
    "light grey: other elements",
    "black: padding",
    "(the same move for every layer",
    " and every expert)",
)


@dataclass
class Panel:
    title: str
    image: np.ndarray | None  # H x W x 3 floats in [0, 1]; a 1 x W strip for a 1-D tensor
    note: str = ""  # what the line of tensors not drawn calls it
    dtype: str = ""  # the buffer's element dtype (the axes' unit)
    name: str = ""  # the tensor's short name (w13_weight_scale)

    @property
    def strip(self) -> bool:
        return self.image is not None and self.image.shape[0] == 1


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


def strip_image(forward: np.ndarray, numel: int) -> np.ndarray:
    """The picture of one expert's move of a 1-D tensor (a bias): a 1 x W strip of the buffer's
    first elements, canonical element i < 16 coloured as canonical row i (hue), others grey,
    padding (`numel`) black; cropped after the tile's last element (at least 32 wide)."""
    src = np.asarray(forward).reshape(-1)
    pad = src >= numel
    in_tile = ~pad & (src < TILE)
    image = np.empty((1, len(src), 3))
    image[...] = OTHER_RGB
    image[0, pad] = PAD_RGB
    image[0, in_tile] = _colours(src[in_tile], np.zeros(int(in_tile.sum())))
    xs = np.nonzero(in_tile)[0]
    x1 = max(int(xs.max()) + 1, MIN_SIDE) if len(xs) else MAX_SIDE
    return image[:, : min(x1, len(src), MAX_SIDE)]


def reference_tile() -> np.ndarray:
    """The canonical tile itself (rows x columns < 16), coloured as the panels colour it."""
    rows, cols = np.meshgrid(np.arange(TILE), np.arange(TILE), indexing="ij")
    return _colours(rows.reshape(-1), cols.reshape(-1)).reshape(TILE, TILE, 3)


def _picture(forward: np.ndarray, arranged_shape: tuple[int, ...], element_shape: tuple[int, ...]) -> np.ndarray:
    """A strip for a tensor of one dimension per expert, else the 2-D picture of `move_image`."""
    if len(element_shape) == 1:
        return strip_image(forward, element_shape[0])
    return move_image(forward, arranged_shape, element_shape)


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
            panels.append(Panel(title, None, f"{label}: {name}"))
            continue
        lt = layout.tensors[name]
        dtype, shape = specs[name]
        elements = lt.split.split(torch.empty(shape, dtype=torch_dtype(dtype), device="meta"))
        plan = gather_plan(lt, tuple(elements.shape[1:]))
        image = _picture(plan.forward, plan.arranged_shape, tuple(elements.shape[1:]))
        buffer_dtype = layout.buffer_spec(name, specs)[0]  # what the kernel reads (a bias: float32)
        panels.append(Panel(title, image, dtype=str(buffer_dtype).removeprefix("torch."), name=name))
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
        title = f"{label}: {name} (as stored)"
        if len(shape) == 1:
            panels.append(Panel(title, strip_image(np.arange(shape[0]), shape[0]), dtype=v["dtype"], name=name))
            continue
        rows, cols = shape[0], int(np.prod(shape[1:]))
        forward = np.arange(rows * cols)
        panels.append(Panel(title, move_image(forward, (cols,), (rows, cols)), dtype=v["dtype"], name=name))
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


def _unit(name: str, dtype: str) -> str:
    """What one buffer element is, for the axes: a byte of two packed FP4 values (a weight), an
    E8M0 scale in a byte (an MXFP4 block scale), or one value of `dtype`."""
    if dtype == "uint8":
        return "uint8 elements: E8M0 scales" if "scale" in name else "uint8 elements: 2 FP4 values each"
    return f"{dtype} elements"


def _draw_reference(ax_tile, ax_key) -> None:
    ax_tile.imshow(reference_tile(), interpolation="nearest")
    ax_tile.set_title("canonical tile (expert 0)", fontsize=8)
    ax_tile.set_xlabel("canonical column (element)", fontsize=7)
    ax_tile.set_ylabel("canonical row", fontsize=7)
    ax_tile.tick_params(labelsize=6)
    ax_key.axis("off")
    ax_key.set_title("colour key", fontsize=8, loc="left")
    for i, line in enumerate(KEY):  # top-down, left-aligned inside its own axes: never clipped
        ax_key.text(0.0, 1.0 - i / len(KEY), line, fontsize=8, va="top", ha="left", transform=ax_key.transAxes)


def _draw_panel(ax, panel: Panel) -> None:
    ax.set_title(panel.title, fontsize=8)
    assert panel.image is not None
    ax.imshow(panel.image, interpolation="nearest", aspect="auto")
    unit = _unit(panel.name, panel.dtype)
    ax.set_xlabel(f"buffer position ({unit})" if panel.strip else f"buffer column ({unit})", fontsize=7)
    if panel.strip:
        ax.set_yticks([])
        ax.set_ylabel("1-D", fontsize=7)
    else:
        ax.set_ylabel("buffer row", fontsize=7)
    ax.tick_params(labelsize=6)


def plot_layouts(descs: list, out: Path, tensor: str | None = None) -> dict:
    """Draw the panels of one or two inputs (inspect descriptions) into `out` (PNG)."""
    fig, drawn, undrawn = layout_figure(descs, tensor)
    out = Path(out)
    fig.savefig(out, dpi=DPI)
    width, height = (int(v) for v in fig.get_size_inches() * DPI)
    _matplotlib().pyplot.close(fig)
    return {"plot": str(out), "panels": drawn, "width": width, "height": height, "not_drawn": undrawn}


def layout_figure(descs: list, tensor: str | None = None) -> tuple:
    """The figure of `plot_layouts`: the canonical tile and the colour key first, one row per
    tensor with a move, and one line naming the tensors with nothing to draw (computed, not
    moved). Returns (figure, panels drawn, tensors not drawn as "LABEL: NAME")."""
    plt = _matplotlib().pyplot
    columns, undrawn = [], []
    for label, desc in zip("AB", descs):
        label = label if len(descs) > 1 else Path(desc.path).name
        panels = (
            _artifact_panels(Path(desc.path), tensor, label)
            if desc.kind == "artifact"
            else _checkpoint_panels(desc, tensor, label)
        )
        if not panels:
            raise InputError(f"{desc.path}: no tensor {tensor!r} to draw")
        columns.append([p for p in panels if p.image is not None])
        undrawn += [p.note for p in panels if p.image is None]
    rows = max(len(c) for c in columns)
    note = textwrap.fill(
        "not drawn, computed from whole tensors (no move): " + ", ".join(undrawn), width=95 * len(columns)
    )
    # row 0: the reference tile and the key; a tensor row: short for a strip, tall for a tile;
    # the last row (if any): the tensors not drawn, on one (wrapped) line
    heights = [2.6] + [max((1.2 if c[i].strip else 3.4) for c in columns if i < len(c)) for i in range(rows)]
    if undrawn:
        heights.append(0.2 + 0.16 * note.count("\n"))
    fig = plt.figure(figsize=(5.5 * len(columns), sum(heights)), layout="constrained")
    grid = fig.add_gridspec(len(heights), 2 * len(columns), height_ratios=heights)
    _draw_reference(fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]))
    drawn = 0
    for j, panels in enumerate(columns):
        for i, panel in enumerate(panels):
            _draw_panel(fig.add_subplot(grid[i + 1, 2 * j : 2 * j + 2]), panel)
            drawn += 1
    if undrawn:
        ax = fig.add_subplot(grid[-1, :])
        ax.axis("off")
        ax.text(0.0, 0.5, note, fontsize=7, ha="left", va="center", transform=ax.transAxes)
    return fig, drawn, undrawn
