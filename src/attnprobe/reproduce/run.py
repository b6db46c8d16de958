"""Run the claims and write ``results.json``, ``report.html`` (figures embedded) and ``figures/*.png``."""

from __future__ import annotations

import json
import time
from pathlib import Path

from attnprobe.errors import ConfigError
from attnprobe.reports import HtmlReport, Table
from attnprobe.reproduce.claims import CLAIMS, Claim, timed


def figure_name(claim: str) -> str:
    """``Thm 5.1`` -> ``thm5.1.png``."""
    return claim.lower().replace(" ", "").replace("..", ".") + ".png"


def select(names: str | None) -> list[str]:
    if not names:
        return list(CLAIMS)
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in CLAIMS]
    if unknown:
        raise ConfigError(f"unknown claim(s) {', '.join(unknown)}; choose from: {', '.join(CLAIMS)}")
    return chosen


def write_report(claims: list[Claim], out: Path, quick: bool, seconds: float) -> Path:
    rep = HtmlReport("attnprobe reproduce: Provably Learning Attention with Queries")
    rep.paragraph(f"{'Quick' if quick else 'Full'} run, {seconds:.1f} s. Each claim: the paper's statement, what "
                  "this machine measured, and whether the claim holds.")
    overview = Table(["claim", "what", "holds", "measured"])
    for c in claims:
        overview.add(c.claim, c.title, "not run" if c.holds is None else c.holds, c.measured)
    rep.table(overview)
    for c in claims:
        rep.heading(f"{c.claim}: {c.title}")
        rep.paragraph(f"Paper: {c.paper}")
        rep.paragraph(f"Measured: {c.measured}")
        verdict = "not yet available" if c.holds is None else ("holds" if c.holds else "DOES NOT HOLD")
        rep.paragraph(f"Verdict: {verdict} ({c.seconds:.1f} s)", cls="ok" if c.holds else "fail")
        if c.figure:
            rep.image(c.figure, alt=f"{c.claim} figure")
        if c.table is not None:
            rep.table(c.table)
    return rep.write(out / "report.html")


def run_claims(out: str | Path, *, quick: bool = False, names: str | None = None, log=print) -> list[Claim]:
    """Run the chosen claims (all by default) and write their results, figures and report under ``out``."""
    out = Path(out)
    chosen = select(names)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    claims = []
    for name in chosen:
        c = timed(CLAIMS[name], quick)
        claims.append(c)
        if c.figure:
            (out / "figures" / figure_name(c.claim)).write_bytes(c.figure)
        state = "not yet available" if c.holds is None else ("holds" if c.holds else "DOES NOT HOLD")
        log(f"{c.claim}: {state} ({c.seconds:.1f} s): {c.measured}")
    seconds = time.perf_counter() - t0
    results = {"quick": quick, "seconds": seconds, "claims": [c.summary() for c in claims]}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_report(claims, out, quick, seconds)
    return claims
