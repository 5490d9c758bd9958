"""Tests for sat_tf.evaluation.visualize: Gaussian smoothing, upsampled attention, figures,
summaries."""

import math
import os

import numpy as np
import pytest
from PIL import Image

from sat_tf.evaluation import visualize

GRID = (14, 14)


def _one_hot(cells, grid=GRID, weights=None):
    alpha = np.zeros(grid[0] * grid[1])
    for k, (r, c) in enumerate(cells):
        alpha[r * grid[1] + c] = 1.0 if weights is None else weights[k]
    return alpha / alpha.sum()


def _argmax_rc(values):
    return np.unravel_index(np.argmax(values), values.shape)


def test_smoothing_is_the_gaussian_by_hand():
    # A 21 x 21 grid on 21 x 21 pixels (no upsampling), sigma 1, truncate 4: an impulse
    # becomes the outer product of the taps x = -4..4, exp(-x^2 / 2) / Z, scaled to a
    # maximum of 1 (and a minimum of 0, far from the peak).
    z = 1 + 2 * (math.exp(-0.5) + math.exp(-2) + math.exp(-4.5) + math.exp(-8))
    taps = np.exp(-(np.arange(-4, 5) ** 2) / 2.0) / z
    heat = visualize.upsample_attention(
        _one_hot([(10, 10)], grid=(21, 21)), (21, 21), (21, 21), 1.0
    )
    expected = np.zeros((21, 21))
    expected[6:15, 6:15] = np.outer(taps, taps) / taps[4] ** 2
    np.testing.assert_allclose(heat, expected, atol=1e-12)
    assert heat[10, 11] == pytest.approx(math.exp(-0.5), rel=1e-12)
    assert heat[10, 14] == pytest.approx(math.exp(-8), rel=1e-12)


def test_smoothing_keeps_constant_maps_and_symmetry():
    # Mirrored edges keep a constant map constant, even for a kernel wider than it.
    flat = np.full(35, 1 / 35)
    np.testing.assert_allclose(visualize.upsample_attention(flat, (5, 7), (5, 7), 4.0), 1.0)
    rng = np.random.default_rng(0)
    x = rng.random((9, 13))
    along = visualize.upsample_attention(x.ravel(), (9, 13), (9, 13), 1.5)
    across = visualize.upsample_attention(x.T.ravel(), (13, 9), (13, 9), 1.5)
    np.testing.assert_allclose(across, along.T, atol=1e-12)


@pytest.mark.parametrize(
    "grid, image_hw, sigma",
    [((14, 14), (224, 224), None), ((7, 7), (224, 224), None), ((14, 10), (150, 97), 6.0)],
)
def test_upsampling_equals_filtering_the_upsampled_map(grid, image_hw, sigma):
    # The map as drawn by blocks, then scipy's 2-D Gaussian over it: the picture the
    # row and column matrices must reproduce.
    import scipy.ndimage

    rows, cols = grid
    h, w = image_hw
    alpha = np.random.default_rng(rows + w).random(rows * cols)
    r = np.minimum((np.arange(h) + 0.5) * rows / h, rows - 1).astype(int)
    c = np.minimum((np.arange(w) + 0.5) * cols / w, cols - 1).astype(int)
    blocks = alpha.reshape(rows, cols)[r[:, None], c[None, :]]
    spread = sigma if sigma is not None else 1.25 * max(h / rows, w / cols)
    want = scipy.ndimage.gaussian_filter(blocks, spread, mode="reflect", truncate=4.0)
    want = (want - want.min()) / (want.max() - want.min())
    got = visualize.upsample_attention(alpha, grid, image_hw, sigma)
    np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("cell", [(0, 0), (7, 7), (3, 11), (13, 2), (13, 13)])
def test_one_hot_peak_lies_in_its_cell(cell):
    heat = visualize.upsample_attention(_one_hot([cell]), GRID, (224, 224))
    assert heat.shape == (224, 224)
    assert heat.min() == pytest.approx(0.0) and heat.max() == pytest.approx(1.0)
    r, c = _argmax_rc(heat)
    assert (r // 16, c // 16) == cell


def test_interior_peak_is_symmetric_about_cell_centre():
    # Cell (7, 7) covers pixels 112..127; its centre is 119.5. The 20-pixel Gaussian
    # (radius 80) does not reach the image edge, so the map is mirror-symmetric.
    heat = visualize.upsample_attention(_one_hot([(7, 7)]), GRID, (224, 224))
    d = np.arange(40)
    np.testing.assert_allclose(heat[119 - d, 119], heat[120 + d, 119], atol=1e-12)
    np.testing.assert_allclose(heat[119, 119 - d], heat[119, 120 + d], atol=1e-12)
    np.testing.assert_allclose(heat, heat.T, atol=1e-12)


def test_two_peaks_each_in_its_cell():
    alpha = _one_hot([(2, 3), (10, 11)], weights=[0.6, 0.4])
    heat = visualize.upsample_attention(alpha, GRID, (224, 224))
    assert tuple(v // 16 for v in _argmax_rc(heat)) == (2, 3)
    lower_right = heat[112:, 112:]
    r, c = _argmax_rc(lower_right)
    assert ((r + 112) // 16, (c + 112) // 16) == (10, 11)
    assert lower_right.max() < 1.0


def test_non_square_grid_and_no_smoothing():
    # 14 x 10 grid on 112 x 80: x8 both ways. Without smoothing the map is the cell's block.
    alpha = _one_hot([(13, 9)], grid=(14, 10))
    heat = visualize.upsample_attention(alpha, (14, 10), (112, 80), sigma=0)
    expected = np.zeros((112, 80))
    expected[104:, 72:] = 1.0
    np.testing.assert_array_equal(heat, expected)
    smooth = visualize.upsample_attention(alpha, (14, 10), (112, 80))
    r, c = _argmax_rc(smooth)
    assert r >= 104 and c >= 72


def test_uniform_and_bad_attention():
    uniform = np.full(196, 1 / 196)
    np.testing.assert_array_equal(visualize.upsample_attention(uniform, GRID, (32, 32)), 1.0)
    np.testing.assert_array_equal(visualize.upsample_attention(uniform * 0, GRID, (32, 32)), 0.0)
    with pytest.raises(ValueError, match="expected \\(196,\\)"):
        visualize.upsample_attention(np.ones(195), GRID, (32, 32))


def test_overlay_is_brightest_where_alpha_is():
    image = np.full((224, 224, 3), 128, np.uint8)
    heat = visualize.upsample_attention(_one_hot([(5, 9)]), GRID, (224, 224))
    overlay = visualize.overlay_attention(image, heat)
    assert overlay.dtype == np.uint8
    r, c = _argmax_rc(overlay.sum(-1))
    assert (r // 16, c // 16) == (5, 9)
    # 25% of the image under a 75% white light: 0.25 * 128 + 0.75 * 255 = 223.25.
    assert overlay[r, c, 0] == 223
    assert overlay.min() == 32


def _picture_inputs(num_words=3):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (112, 112, 3), dtype=np.uint8)
    cells = [(1, 2), (12, 12), (6, 1), (0, 13), (9, 9)][:num_words]
    alphas = np.stack([_one_hot([c]) for c in cells] + [np.full(196, 1 / 196)])
    words = ["a", "red", "circle", "top", "left"][:num_words]
    return image, words, alphas, cells


def test_figure_has_one_panel_per_word_with_attention_where_alpha_is():
    _, words, alphas, cells = _picture_inputs(3)
    # A flat image: the brightness of a panel then comes from the attention alone.
    image = np.full((112, 112, 3), 90, np.uint8)
    fig = visualize.build_attention_figure(image, words, alphas, GRID, cols=2)
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 1 + len(words)
    assert [ax.get_title() for ax in panels] == ["", *words]
    positions = [
        (ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start) for ax in panels
    ]
    assert positions == [(0, 0), (0, 1), (1, 0), (1, 1)]
    np.testing.assert_array_equal(panels[0].get_images()[0].get_array(), image)
    for ax, cell in zip(panels[1:], cells, strict=True):
        shown = np.asarray(ax.get_images()[0].get_array()).astype(int).sum(-1)
        r, c = _argmax_rc(shown)
        assert (r // 8, c // 8) == cell


def test_caption_panels():
    alphas = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    assert visualize.caption_panels(["a", "dog"], alphas, hard=False) == (
        ["a", "dog", "<end>"],
        None,
    )
    # Cut at the length limit: three words, three maps, no <end>.
    titles, points = visualize.caption_panels(["a", "big", "dog"], alphas, hard=True)
    assert titles == ["a", "big", "dog"]
    np.testing.assert_array_equal(points, [1, 0, 2])


def test_hard_points_are_outlined():
    image, words, alphas, cells = _picture_inputs(2)
    points = [r * 14 + c for r, c in cells]
    fig = visualize.build_attention_figure(image, words, alphas, GRID, hard_points=points)
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert not panels[0].patches
    for ax, (r, c) in zip(panels[1:], cells, strict=True):
        (rect,) = ax.patches
        assert rect.get_xy() == (c * 8 - 0.5, r * 8 - 0.5)
        assert (rect.get_width(), rect.get_height()) == (8, 8)
    with pytest.raises(ValueError, match="hard points"):
        visualize.build_attention_figure(image, words, alphas, GRID, hard_points=[0])


def test_png_written_atomically_and_equal_to_returned_picture(tmp_path):
    image, words, alphas, _ = _picture_inputs(3)
    path = tmp_path / "pics" / "attention.png"
    picture = visualize.attention_figure(image, words, alphas, GRID, path=str(path))
    # 4 panels in one row of 2.2 x 2.4 inches at 100 dpi.
    assert picture.shape == (240, 880, 3) and picture.dtype == np.uint8
    with Image.open(path) as png:
        assert png.format == "PNG"
        np.testing.assert_array_equal(np.asarray(png.convert("RGB")), picture)
    assert os.listdir(path.parent) == ["attention.png"]


def test_figure_accepts_grey_image_and_rejects_bad_shapes():
    image, words, alphas, _ = _picture_inputs(2)
    picture = visualize.attention_figure(image[..., 0], words, alphas, GRID)
    assert picture.ndim == 3 and picture.shape[-1] == 3
    with pytest.raises(ValueError, match="2 words but only 1 attention maps"):
        visualize.attention_figure(image, words, alphas[:1], GRID)
    with pytest.raises(ValueError, match="expected \\(T, 196\\)"):
        visualize.attention_figure(image, words, alphas[:, :100], GRID)
    with pytest.raises(ValueError, match="uint8"):
        visualize.attention_figure(image.astype(np.float32), words, alphas, GRID)


@pytest.mark.parametrize(
    "row, col, expected",
    [
        # 14 rows: cell centres (r + 0.5) / 14 below 1/3 for r <= 4, below 2/3 for r <= 8.
        (0, 0, "top left"),
        (4, 5, "top"),
        (4, 9, "top right"),
        (5, 4, "left"),
        (8, 8, "center"),
        (6, 13, "right"),
        (13, 0, "bottom left"),
        (9, 7, "bottom"),
        (9, 9, "bottom right"),
    ],
)
def test_coarse_location(row, col, expected):
    assert visualize.coarse_location(row, col, GRID) == expected


def test_attention_summary_lines():
    _, words, alphas, _ = _picture_inputs(5)
    alphas = alphas.copy()
    alphas[2] = _one_hot([(6, 1), (7, 7)], weights=[0.75, 0.25])
    lines = visualize.attention_summary(words, alphas, GRID).splitlines()
    assert len(lines) == 1 + len(words)
    assert lines[0].split() == ["word", "cell", "max", "α", "where"]
    rows = [line.split(None, 1) for line in lines[1:]]
    assert [r[0] for r in rows] == words
    assert rows[0][1].split() == ["(1,", "2)", "1.000", "top", "left"]
    assert rows[1][1].split() == ["(12,", "12)", "1.000", "bottom", "right"]
    assert rows[2][1].split() == ["(6,", "1)", "0.750", "left"]
    assert rows[3][1].split() == ["(0,", "13)", "1.000", "top", "right"]
    assert rows[4][1].split() == ["(9,", "9)", "1.000", "bottom", "right"]
