"""`inspect --plot` (issue 12 item 11): a picture of a layout from the layout's own gather plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import EXAMPLE, run_cli

pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

from mxconvert.pipeline.plot import PAD_RGB, TILE, move_image  # noqa: E402

NVFP4 = Path(__file__).resolve().parents[1] / "examples" / "tiny-nvfp4-modelopt-qwen3"


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    root = tmp_path_factory.mktemp("plot")
    out = {}
    for name, model, profile in (
        ("h100", EXAMPLE, "h100"),
        ("b200", EXAMPLE, "b200"),
        ("xpu", EXAMPLE, "intel-xpu"),
        ("nvfp4", NVFP4, "b200"),
    ):
        assert run_cli("convert", model, "-p", profile, "-o", root / name).exit_code == 0
        out[name] = root / name
    return out


def _plot(tmp_path, *paths, extra=()):
    png = tmp_path / "p.png"
    result = run_cli("inspect", *paths, "--plot", png, "--json", *extra)
    assert result.exit_code in (0, 1), result.output
    return png, imread(png)


def test_move_image_colours_the_tile_and_marks_padding():
    # a 2 x 40 canonical expert written transposed into a 40 x 3 buffer with one padding column
    rows, cols = 2, 40
    forward = np.full((cols, 3), rows * cols)
    forward[:, :2] = np.arange(rows * cols).reshape(rows, cols).T
    image = move_image(forward.reshape(-1), (3,), (rows, cols))
    assert image.shape == (32, 3, 3)  # cropped to the tile's rows (min 32), all 3 columns
    assert (image[:, 2] == PAD_RGB).all()
    assert not np.allclose(image[0, 0], image[0, 1])  # rows 0 and 1 differ in hue
    assert not np.allclose(image[0, 0], image[TILE - 1, 0])  # columns differ in brightness


def test_plot_of_one_artifact_has_one_panel_per_tensor(tmp_path, arts):
    png, pixels = _plot(tmp_path, arts["h100"])
    assert png.stat().st_size > 10_000
    assert pixels.shape[0] > 1000 and pixels.shape[1] > 300  # 6 rows of panels
    result = run_cli("inspect", arts["h100"], "--plot", tmp_path / "q.png")
    assert "drew 6 panel(s)" in result.stderr


def test_distinct_layouts_give_distinct_pictures_and_the_same_layout_the_same(tmp_path, arts):
    pics = {}
    for name in ("h100", "b200", "xpu"):
        (tmp_path / name).mkdir()
        pics[name] = _plot(tmp_path / name, arts[name], extra=("--tensor", "w13_weight_scale"))[1]
    assert not np.array_equal(pics["h100"], pics["b200"])
    assert not np.array_equal(pics["b200"], pics["xpu"])
    (tmp_path / "again").mkdir()
    assert np.array_equal(
        _plot(tmp_path / "again", arts["h100"], extra=("--tensor", "w13_weight_scale"))[1], pics["h100"]
    )


def test_two_artifacts_side_by_side(tmp_path, arts):
    _, one = _plot(tmp_path, arts["h100"])
    (tmp_path / "two").mkdir()
    _, two = _plot(tmp_path / "two", arts["h100"], arts["b200"])
    assert two.shape[1] >= 2 * one.shape[1] - 10 and two.shape[0] == one.shape[0]


def test_arithmetic_tensors_are_listed_not_drawn(tmp_path, arts):
    result = run_cli("inspect", arts["nvfp4"], "--plot", tmp_path / "n.png")
    assert result.exit_code == 0
    manifest = json.loads((arts["nvfp4"] / "mxconvert.json").read_text())
    kernel = {t["name"] for t in manifest["ranks"][0]["tensors"].values()}
    drawn = int(result.stderr.split("drew ")[1].split(" ")[0])
    assert 0 < drawn < len(kernel)  # global/input scales are computed, not moved


# ---- issue 23 item 6: a picture a person can read ---------------------------------------------------------
def _figure(*paths, tensor=None):
    from mxconvert.pipeline.inspect import describe
    from mxconvert.pipeline.plot import layout_figure

    return layout_figure([describe(str(p)) for p in paths], tensor)


def _texts(fig):
    """The figure's texts but tick labels (matplotlib keeps labels of ticks beyond an axis's limits
    and does not draw them): titles, axis labels, the colour key, the line of tensors not drawn."""
    from matplotlib.text import Text

    ticks = {id(t) for ax in fig.axes for t in (*ax.get_xticklabels(), *ax.get_yticklabels())}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in ticks]


def _image_axes(fig):
    return [ax for ax in fig.axes if ax.images]


@pytest.mark.parametrize("names", [("h100",), ("nvfp4",), ("h100", "nvfp4")])
def test_the_colour_key_and_every_label_lie_inside_the_picture(arts, names):
    from mxconvert.pipeline.plot import KEY

    fig, _, _ = _figure(*(arts[n] for n in names))
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    box = fig.bbox
    texts = _texts(fig)
    for line in KEY:
        assert any(t.get_text() == line for t in texts), f"the key line {line!r} is not drawn"
    for t in texts:
        extent = t.get_window_extent(renderer)
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, f"cut at the side: {t.get_text()!r}"
        assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, f"cut at the top or bottom: {t.get_text()!r}"


def test_the_first_panel_is_the_canonical_tile_itself(arts):
    from mxconvert.pipeline.plot import reference_tile

    fig, drawn, _ = _figure(arts["b200"])
    first = _image_axes(fig)[0]
    assert np.array_equal(first.images[0].get_array(), reference_tile())
    assert reference_tile().shape == (TILE, TILE, 3)
    assert "canonical" in first.get_title() and "canonical" in first.get_xlabel()
    assert len(_image_axes(fig)) == drawn + 1  # the reference, then one panel per tensor drawn


def test_axes_say_their_unit_in_elements_of_the_dtype(arts):
    fig, _, _ = _figure(arts["h100"], arts["nvfp4"])
    labels = {ax.get_title(): ax.get_xlabel() for ax in _image_axes(fig)[1:]}
    assert labels["A: w13_weight (TRITON)"] == "buffer column (uint8 elements: 2 FP4 values each)"
    assert labels["A: w13_weight_scale (TRITON)"] == "buffer column (uint8 elements: E8M0 scales)"
    assert labels["A: w13_bias (TRITON)"] == "buffer position (float32 elements)"  # the kernel's dtype, as stored
    assert labels["B: w13_weight_scale (FLASHINFER_TRTLLM)"] == "buffer column (float8_e4m3fn elements)"
    assert all("elements" in label for label in labels.values())


def test_one_dimensional_tensors_are_a_strip(arts):
    from mxconvert.pipeline.plot import strip_image

    fig, _, _ = _figure(arts["h100"], tensor="w13_bias")
    (_, bias) = _image_axes(fig)
    assert bias.images[0].get_array().shape[0] == 1 and bias.get_ylabel() == "1-D"
    strip = strip_image(np.array([3, 0, 40, 1, 40] + [5] * 30), numel=40)  # 40 = padding
    assert strip.shape == (1, 35, 3)
    assert (strip[0, 2] == PAD_RGB).all() and (strip[0, 4] == PAD_RGB).all()
    assert not np.allclose(strip[0, 0], strip[0, 1])  # elements 3 and 0: different hues


def test_tensors_with_nothing_to_draw_are_named_on_one_line(arts, tmp_path):
    fig, drawn, undrawn = _figure(arts["nvfp4"])
    assert drawn == 4 and undrawn  # the folded global and input scales
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert not any(name.split(": ")[1] + " (" in title for name in undrawn for title in titles)
    (line,) = [t.get_text() for t in _texts(fig) if t.get_text().startswith("not drawn")]
    assert all(name in " ".join(line.split()) for name in undrawn)
    assert len(fig.axes) == drawn + 3  # reference tile, colour key, the tensors, the line
    png = tmp_path / "nv.png"
    assert run_cli("inspect", arts["nvfp4"], "--plot", png).exit_code == 0
    assert imread(png).shape[0] < 1400  # no empty panel is drawn for each computed tensor
