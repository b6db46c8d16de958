"""Run the claims and write ``results.json``, ``report.html`` (figures embedded) and ``figures/*.png``."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from attnprobe.errors import ConfigError
from attnprobe.reports import HtmlReport, Table
from attnprobe.reproduce.claims import CLAIMS, Claim, timed


def figure_name(claim: str) -> str:
    """``Thm 5.1`` -> ``thm5.1.png``."""
    return claim.lower().replace(" ", "").replace("..", ".") + ".png"


def select(names: str | None) -> list[str]:
    """The claims named in ``names`` (comma-separated; None: all), each once, in the order given."""
    if names is None:
        return list(CLAIMS)
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    if not chosen:
        raise ConfigError(f"the list of claims is empty; name at least one of: {', '.join(CLAIMS)} (or leave the "
                          "option out to run them all)", param="names")
    unknown = [n for n in chosen if n not in CLAIMS]
    if unknown:
        raise ConfigError(f"unknown claim(s) {', '.join(unknown)}; choose from: {', '.join(CLAIMS)}", param="names")
    twice = sorted({n for n in chosen if chosen.count(n) > 1})
    if twice:
        raise ConfigError(f"claim(s) named more than once: {', '.join(twice)}; name each claim once", param="names")
    return chosen


#: solver warnings a claim's experiment may raise; counted in the report instead of printed
QUIET_WARNINGS = ("Solution may be inaccurate",)


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


def run_claims(out: str | Path, *, quick: bool = False, names: str | None = None, log=print,
               written: list | None = None) -> list[Claim]:
    """Run the chosen claims (all by default) and write their results, figures and report under ``out``.

    Every file written is appended to ``written`` as soon as it exists (so an interrupted run can say what it
    left behind). Warnings are recorded in ``results.json`` (solver warnings counted, others listed), not
    printed."""
    out = Path(out)
    chosen = select(names)
    written = written if written is not None else []
    t0 = time.perf_counter()
    claims = []
    with warnings.catch_warnings(record=True) as caught:  # forked solver processes inherit the recording
        warnings.simplefilter("default")
        for name in chosen:
            c = timed(name, quick)
            claims.append(c)
            if c.figure:
                _write(out / "figures" / figure_name(c.claim), c.figure, written)
            state = "not yet available" if c.holds is None else ("holds" if c.holds else "DOES NOT HOLD")
            log(f"{c.claim}: {state} ({c.seconds:.1f} s): {c.measured}")
    seconds = time.perf_counter() - t0
    solver = [w for w in caught if any(t in str(w.message) for t in QUIET_WARNINGS)]
    other = sorted({f"{w.category.__name__}: {w.message}" for w in caught if w not in solver})
    results = {"quick": quick, "seconds": seconds, "claims": [c.summary() for c in claims],
               "solver_warnings": len(solver), "other_warnings": other[:20]}
    _write(out / "results.json", (json.dumps(results, indent=2) + "\n").encode(), written)
    try:
        written.append(write_report(claims, out, quick, seconds))
    except OSError as exc:
        raise ConfigError(f"cannot write {out / 'report.html'}: {exc.strerror or exc}", param="out") from None
    return claims


def _write(path: Path, data: bytes, written: list) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; choose another folder", param="out") from None
    written.append(path)
