"""Self-contained HTML reports: headings, paragraphs, tables and PNG figures embedded as base64."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from attnprobe.reports.tables import Table

STYLE = """body{font-family:system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}img{max-width:100%;display:block;margin:1em 0}.fail{color:#b00}.ok{color:#070}
code{background:#f5f5f5;padding:0 .2em}"""


class HtmlReport:
    """Build a page piece by piece, then :meth:`write` it as one file with every image inside it."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = [f"<h1>{html.escape(title)}</h1>"]
        self.images = 0

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def paragraph(self, text: str, cls: str | None = None) -> None:
        attr = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{attr}>{html.escape(text)}</p>")

    def code(self, text: str) -> None:
        self.parts.append(f"<p><code>{html.escape(text)}</code></p>")

    def table(self, table: Table) -> None:
        self.parts.append(table.html())

    def image(self, png: bytes, alt: str) -> None:
        data = base64.b64encode(png).decode("ascii")
        self.parts.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')
        self.images += 1

    def render(self) -> str:
        return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(self.title)}</title>"
                f"<style>{STYLE}</style></head><body>\n" + "\n".join(self.parts) + "\n</body></html>\n")

    def write(self, path: str | Path) -> Path:
        """Write the page atomically (a full disk leaves the old page, never a cut one)."""
        from attnprobe.models.io import write_files

        path = Path(path)
        text = self.render().encode("utf-8")
        write_files([(path, lambda f: f.write(text))])
        return path
