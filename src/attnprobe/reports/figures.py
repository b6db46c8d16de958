"""Figures as PNG bytes (matplotlib, Agg backend: no display needed), ready to embed or to write to docs/."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from attnprobe.errors import MissingDependencyError


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependencyError("figures need matplotlib: pip install 'attnprobe[plots]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_figure(width: float = 6.0, height: float = 4.0):
    """A fresh (figure, axes) pair on the Agg backend."""
    plt = _pyplot()
    return plt.subplots(figsize=(width, height))


def figure_png(fig, path: str | Path | None = None, dpi: int = 110) -> bytes:
    """Render ``fig`` to PNG bytes (and to ``path`` when given), then close it."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    data = buf.getvalue()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    return data


def paired_bars(labels, first: tuple[str, list], second: tuple[str, list], *, log: bool = True):
    """Two bars per label (``(legend, values)`` each), on a log scale by default; returns ``(fig, ax)`` for
    :func:`labelled_png`. Zeros are drawn at 1e-18 so a log axis can show an exact result."""
    fig, ax = new_figure()
    xs = np.arange(len(labels))
    for shift, (name, values) in ((-0.2, first), (0.2, second)):
        ax.bar(xs + shift, [max(float(x), 1e-18) if log else x for x in values], 0.4, label=name)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(xs, labels, fontsize=7)
    return fig, ax


def readable_log_ticks(ax) -> None:
    """A log axis spanning under three decades gets plain labels at 1, 2, 5 × 10^k and none at the other minor
    ticks (matplotlib otherwise labels every minor tick there, and neighbours such as 3×10¹ and 4×10¹ collide)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        lo, hi = sorted(limits)
        if axis.get_scale() != "log" or not (lo > 0 and np.log10(hi / lo) < 3):
            continue
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def labelled_png(fig, ax, *, title: str, xlabel: str, ylabel: str, legend: bool = True, **legend_kw) -> bytes:
    """Title, axis labels and legend on ``ax``, then :func:`figure_png`. The legend of a bar chart goes beside the
    axes (inside, it covers bars), unless ``legend_kw`` places it; short log axes get readable ticks."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    readable_log_ticks(ax)
    if legend:
        if ax.patches and "loc" not in legend_kw:
            legend_kw.update(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
        ax.legend(**legend_kw)
    return figure_png(fig)


#: a map whose values span less than this share of their size gets a colour scale this wide around them
NARROW_SPAN = 0.05


def colour_range(shown: np.ndarray, vmin: float | None, vmax: float | None) -> tuple[float | None, float | None]:
    """The colour scale of a heatmap: ``vmin``/``vmax`` when given; for values that nearly agree (e.g. every
    task of a defence asking 148,668–148,729 queries) ±``NARROW_SPAN`` of their size around them, so the ticks
    are a few readable numbers instead of offsets crowding a scale of width 61; else matplotlib's own."""
    if vmin is not None or vmax is not None:
        return vmin, vmax
    finite = shown[np.isfinite(shown)]
    if finite.size == 0:
        return None, None
    lo, hi = float(finite.min()), float(finite.max())
    size = max(abs(lo), abs(hi))
    if size == 0 or hi - lo >= NARROW_SPAN * size:
        return None, None
    mid = 0.5 * (lo + hi)
    return mid - NARROW_SPAN * size, mid + NARROW_SPAN * size


def heatmap_png(values: np.ndarray, *, title: str, xlabel: str, ylabel: str, colorbar: str,
                log: bool = True, annotate: bool = True, vmin: float | None = None,
                vmax: float | None = None, rows=None, cols=None) -> bytes:
    """A heatmap of a (rows, cols) array; NaN cells (failed or missing) are drawn grey and marked ×.
    ``vmin``/``vmax`` fix the colour scale (in log10 units when ``log``) so several maps compare; ``rows`` /
    ``cols`` label the rows and columns (default 0, 1, ...)."""
    values = np.asarray(values, dtype=float)
    fig, ax = new_figure(max(4.0, 0.55 * values.shape[1] + 2.5), max(2.5, 0.45 * values.shape[0] + 1.5))
    shown = np.log10(np.maximum(values, 1e-300)) if log else values
    masked = np.ma.masked_invalid(shown)
    cmap = _pyplot().get_cmap("viridis").with_extremes(bad="lightgrey")
    vmin, vmax = colour_range(shown, vmin, vmax)
    im = ax.imshow(masked, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    bar = fig.colorbar(im, ax=ax, label=("log10 " if log else "") + colorbar)
    if hasattr(bar.formatter, "set_useOffset"):  # ticks as numbers, never "+1.487e5" offsets over each other
        bar.formatter.set_useOffset(False)
        bar.update_ticks()
    ax.set_xticks(range(values.shape[1]), labels=None if cols is None else [str(c) for c in cols])
    ax.set_yticks(range(values.shape[0]), labels=None if rows is None else [str(r) for r in rows])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if annotate and values.size <= 144:
        for (i, j), x in np.ndenumerate(values):
            ax.text(j, i, "×" if not np.isfinite(x) else f"{x:.0e}" if log else f"{x:.3g}",
                    ha="center", va="center", fontsize=6, color="black" if not np.isfinite(x) else "white")
    return figure_png(fig)
