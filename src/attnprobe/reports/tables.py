"""The one table formatter: a :class:`Table` renders as Markdown (docs, terminal) or HTML (reports)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field


def fmt(x) -> str:
    """One cell: floats in 3 significant digits, scientific below 1e-2 or from 1e5; bools as yes/NO."""
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if math.isnan(x):
            return "—"
        return f"{x:.2e}" if (x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e5)) else f"{x:.3g}"
    if x is None:
        return "—"
    return str(x)


@dataclass
class Table:
    """Headers and rows of cells (numbers or strings); ``rows`` may be appended to as results arrive."""

    headers: list[str]
    rows: list[list] = field(default_factory=list)

    def add(self, *cells) -> None:
        self.rows.append(list(cells))

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(x))}</td>" for x in row) + "</tr>"
                       for row in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    __str__ = markdown
