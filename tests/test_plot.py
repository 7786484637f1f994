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
