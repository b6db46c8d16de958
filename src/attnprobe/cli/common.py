"""What every subcommand shares: the summary printout and per-parameter relative errors."""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError


def relative_errors(true_model, result_model) -> dict[str, float]:
    """Per-parameter relative error ‖x̂ − x‖/‖x‖ (absolute error where ‖x‖ = 0)."""
    t, r = true_model.arrays(), result_model.arrays()
    out = {}
    for name in t:
        if name not in r:
            continue
        a, b = np.asarray(r[name], float), np.asarray(t[name], float)
        if a.shape != b.shape:
            raise ConfigError(f"parameter {name} has shape {a.shape} in the result but {b.shape} in the target")
        n = np.linalg.norm(b)
        out[name] = float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a))
    return out


def print_summary(res, out=None) -> None:
    s = res.summary()
    chk = s["check"] or {}
    print(f"method {s['method']}  d={s['d']}  queries {s['queries']} for {s['unknowns']} unknowns "
          f"({s['queries_per_unknown']:.4f} per unknown)  {s['seconds']:.2f} s")
    if chk:
        print(f"functional check: relative error {chk['relative_error']:.3e} on {chk['queries']} fresh sequences "
              f"of lengths {chk['lengths']}")
    for note in s["notes"]:
        print(f"note: {note}")
    if out:
        print(f"wrote {out[0]} and {out[1]}")
