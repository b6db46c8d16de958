"""Tables, figures, docs sections and self-contained HTML: the one report layer shared by benchmarks,
``attnprobe reproduce`` and ``attnprobe audit`` (docs/architecture.md, "Layers")."""

from attnprobe.reports.figures import figure_png, heatmap_png
from attnprobe.reports.html import HtmlReport
from attnprobe.models.compare import relative_error, relative_errors
from attnprobe.reports.sections import (
           BENCHMARKS_MD,
           DOCS,
           command_line,
           machine,
           measured,
           write_section,
)
from attnprobe.reports.tables import Table, fmt

__all__ = ["BENCHMARKS_MD", "DOCS", "HtmlReport", "Table", "command_line", "figure_png", "fmt", "heatmap_png",
           "machine", "measured", "relative_error", "relative_errors", "write_section"]
