"""Figures a reader can read: a bar chart's legend covers no bar, and no two tick labels of a short log axis
overlap (matplotlib labels its minor ticks there: 3×10¹ and 4×10¹ collided)."""

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from attnprobe.reports.figures import labelled_png, new_figure, paired_bars  # noqa: E402


def _renderer(fig):
    """A renderer of the figure as it was saved (the saved figure is closed: draw it on a fresh Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_a_bar_charts_legend_covers_no_bar():
    fig, ax = paired_bars(["a", "b", "c", "d"], ("parameters: a long legend entry", [1.0, 1.0, 0.9, 1.0]),
                          ("function: another long legend entry", [1e-15, 1e-15, 1e-15, 1e-15]))
    png = labelled_png(fig, ax, title="t", xlabel="x", ylabel="y")
    assert png.startswith(b"\x89PNG")
    renderer = _renderer(fig)
    legend = ax.get_legend().get_window_extent(renderer)
    assert not any(_overlap(legend, bar.get_window_extent(renderer)) for bar in ax.patches)


@pytest.mark.parametrize("lo, hi", [(4, 64), (20, 4200), (1e-3, 5e-2)])
def test_tick_labels_of_a_short_log_axis_do_not_collide(lo, hi):
    fig, ax = new_figure()
    xs = np.geomspace(lo, hi, 5)
    ax.loglog(xs, xs**2, "o", label="data")
    labelled_png(fig, ax, title="t", xlabel="x", ylabel="y")
    renderer = _renderer(fig)
    for axis in (ax.xaxis, ax.yaxis):
        boxes = [t.get_window_extent(renderer) for t in axis.get_ticklabels(which="both")
                 if t.get_visible() and t.get_text()]
        assert len(boxes) >= 2
        assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
