"""Tables, figures and self-contained HTML: the one report layer shared by benchmarks, ``attnprobe reproduce``
and ``attnprobe audit`` (docs/architecture.md, "Layers"). The library writes no repository files: the writer of
the results docs is ``benchmarks/sections.py``."""

from attnprobe.reports.figures import figure_png, heatmap_png
from attnprobe.reports.html import HtmlReport
from attnprobe.models.compare import relative_error, relative_errors
from attnprobe.reports.tables import Table, fmt

__all__ = ["HtmlReport", "Table", "figure_png", "fmt", "heatmap_png", "relative_error", "relative_errors"]
