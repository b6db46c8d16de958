"""Mutation harness: single-line changes to core code that a wrong result would come from, each of which the
default tests must catch.

    PYTHONPATH=src python benchmarks/mutations.py [--only NAME ...] [--list] [--write]

Every mutation is a (file, exact code snippet, replacement) triple (or a tuple of snippets and one of their
replacements, for a line moved from one place to another): each snippet must occur exactly once in the
file (sites are found by text, so the table survives refactors that move lines; a site that is gone is reported,
not skipped silently). The tree is copied once to a temporary folder (the working tree is never edited); each
mutation is applied there, the relevant test files run (``pytest -x``, default markers), and the file is restored.
A mutation is *killed* when a test fails; the table names the first failing test. ``--write`` replaces this
script's section in docs/benchmarks/hardening.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = "hardening"  # its results file: docs/benchmarks/hardening.md
TITLE = "Mutation testing: single-line changes to core code the default tests must catch"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # under src/attnprobe/
    snippet: str | tuple[str, ...]
    replacement: str | tuple[str, ...]
    tests: tuple[str, ...]  # test files (or node ids) run against the mutant
    what: str
    markers: str = "not slow"  # pytest -m: "" for a mutation only a slow test (named by node id) reaches


M = Mutation
MUTATIONS = [
    # the functional check: the verdict every "passed" rests on
    M("check-eps-factor", "learners/core/check.py", "CHECK_EPS_FACTOR = 1e4", "CHECK_EPS_FACTOR = 1e7",
      ("tests/test_hostile_check.py",), "a 1000x looser rounding tolerance"),
    M("check-verdict", "learners/core/check.py", "    if error + resolution <= tolerance:\n        return \"passed\"",
      "    if error + resolution <= 10 * tolerance:\n        return \"passed\"",
      ("tests/test_hostile_check.py",), "passes models 10x beyond their tolerance"),
    M("check-bias-tolerance", "learners/core/check.py",
      "tolerance = check_tolerance(oracle, rms_signal, rms_signal, noise)",
      "tolerance = check_tolerance(oracle, rms_answer, rms_signal, noise)",
      ("tests/test_hostile_verdicts.py",), "a large output bias stretches the tolerance (to its cap)"),
    M("check-resolution", "learners/core/check.py",
      "    return \"uncertified\" if coarse else \"failed\"", "    return \"passed\"",
      ("tests/test_hostile_verdicts.py",), "answers too coarse to certify the bound pass the model"),
    M("check-cap", "learners/core/check.py", "CHECK_CAP = 0.1", "CHECK_CAP = 1.0",
      ("tests/test_hostile_check.py",), "no cap on the tolerance"),
    M("check-model-c", "learners/core/check.py", "c_hat = np.mean(np.concatenate([y for _, y, _ in answers]), axis=0)",
      "c_hat = np.asarray(getattr(model, 'c', 0.0), dtype=np.float64)",
      ("tests/test_hostile_check.py",), "the model's own c as the constant part"),
    # the oracle: counting, budgets, validation
    M("oracle-count", "oracles/base.py", "        self.queries += n", "        self.queries += max(n - 1, 0)",
      ("tests/test_oracle.py",), "one query per batch goes uncounted"),
    M("oracle-budget", "oracles/base.py", "if n > self.remaining + credit:", "if n > self.remaining + credit + 1:",
      ("tests/test_oracle.py", "tests/test_membership.py"), "one query past the budget"),
    M("oracle-nonfinite", "oracles/base.py", "        bad = ~np.isfinite(y)", "        bad = np.isnan(y)",
      ("tests/test_oracle.py", "tests/test_hostile_oracle.py"), "infinite answers accepted"),
    # loaders
    M("npz-dtype-header", "models/io.py", "if dtype.kind not in REAL_KINDS and not is_tag:",
      "if False and dtype.kind not in REAL_KINDS and not is_tag:",
      ("tests/test_hostile_files.py",), "complex and string members read"),
    M("npz-size-limit", "models/io.py", "if total > max_bytes:", "if False and total > max_bytes:",
      ("tests/test_hostile_files.py",), "no size limit before decompressing"),
    # learners
    M("exact-bfloat16-W", "learners/head/exact.py", "    W = M @ cols.B  # M = W Bᵀ",
      "    W = (M @ cols.B) * (0.8 if oracle.precision == 'bfloat16' else 1.0)  # M = W Bᵀ",
      ("tests/test_hostile_check.py",), "W 20 % off on bfloat16 answers"),
    M("exact-u-sign", "learners/head/exact.py", "return run.finish(AttentionHead(W, v, u, c)",
      "return run.finish(AttentionHead(W, v, -u, c)", ("tests/test_exact.py",), "query bias u flipped"),
    M("sigmoid-logit", "learners/head/sigmoid.py",
      "np.log(np.where(saturated, 1.0, p)) - np.log(np.where(saturated, 1.0, q))",
      "np.log(np.where(saturated, 1.0, p)) - 0.999 * np.log(np.where(saturated, 1.0, q))",
      ("tests/test_exact.py",), "the sigmoid inversion 0.1 % off"),
    M("membership-no-rebisect", "learners/head/membership.py", "    for attempt in range(6):",
      "    for attempt in range(1):", ("tests/test_membership.py",), "saturated entries never bisected again"),
    M("lowrank-certificate", "learners/head/lowrank.py", "        if certificate:", "        if False:",
      ("tests/test_lowrank.py",), "an under-estimated rank is not caught"),
    M("probe-householder", "learners/head/probes.py", "        Q -= np.outer(2.0 * (Q @ w1), w1)",
      "        Q -= np.outer(1.0 * (Q @ w1), w1)", ("tests/test_probes.py",),
      "equal-projection probes no longer orthogonal"),
    M("grid-position-value", "learners/head/sigmoid.py",
      "        np.add((probes[:, 0, 0, :] @ v)[:, None], yb, out=y1.reshape(m, k))",
      "        np.add((probes[:, 0, 0, :] @ v)[:, None], 0.0, out=y1.reshape(m, k))", ("tests/test_query_blocks.py",),
      "a grid's y1 misses the second row's value"),
    M("lowrank-rank-safety", "learners/head/lowrank.py", "RANK_SAFETY = 10.0", "RANK_SAFETY = 1e6",
      ("tests/test_lowrank.py",), "rank detection blind below 1e6 roundings"),
    M("ffn-one-line", "learners/ffn/more_lines.py", "MAX_LINES = 3", "MAX_LINES = 1",
      ("tests/test_ffn.py",), "float32 answers searched on one line only"),
    M("ffn-orientation-tol", "learners/ffn/settle.py", "tol = max(1e-6 if coarse else 1e-8, 1e4 * eps) * scale_v",
      "tol = max(1e-6 if coarse else 1e-8, 1e4 * eps) * scale_v * 1e6",
      ("tests/test_ffn.py",), "any neuron orientation accepted"),
    M("ffn-kink-chord", "learners/ffn/kinks.py", "    return all(abs(L.f + (x - L.t) * slope - y) <= 3 * tol_f",
      "    return all(abs(L.f + (x - L.t) * slope - y) <= 3e3 * tol_f", ("tests/test_ffn.py",),
      "a chord 1000 roundings off still counts as linear"),
    M("ffn-pin-piece", "learners/ffn/pinning.py", "all(abs(f - value_on(line, t)) <= tol for t, f in pts)",
      "all(abs(f - value_on(line, t)) <= 1e6 * tol for t, f in pts)",
      ("tests/test_ffn_kink_search.py",), "a kink pinned though the answers beside it miss its two lines"),
    M("ffn-clean-end", "learners/ffn/kinks.py",
      "return tol_f is not None and abs(S.slope_out_right - S.slope_out_left) <= 4 * tol_f / S.delta",
      "return tol_f is not None", ("tests/test_ffn_kink_search.py", "tests/test_ffn.py"),
      "an end whose stencil straddles a kink taken for a clean one"),
    M("ffn-clean-end-zoom", "learners/ffn/kinks.py",
      "t = None if clean_r else meet_lines((l, L.f, sl_in), (r, R.f, sr_out))",
      "t = meet_lines((l, L.f, sl_in), (r, R.f, sr_out))", ("tests/test_ffn_kink_search.py",),
      "a kink looked for inside an end whose stencil shows none"),
    M("ffn-repair-contradicted", "learners/ffn/repair.py", "        bad |= (t > lo) & (t < hi) & ~match",
      "        bad |= (t > lo) & (t < hi) & match", ("tests/test_ffn_float32_repair.py",),
      "the repair keeps the neurons its line contradicts and drops the confirmed ones"),
    M("ffn-repair-straight", "learners/ffn/repair.py", "abs(y[i, 1] - 0.5 * (y[i, 0] + y[i, 2])) > 3 * tol_f}",
      "abs(y[i, 1] - 0.5 * (y[i, 0] + y[i, 2])) > 3e6 * tol_f}", ("tests/test_ffn_float32_repair.py",),
      "an interval bent by a missed kink passes for straight"),
    M("ffn-repaired-kept", "learners/ffn/mending.py",
      "    if repaired is not None and repaired.rank(m.eps) < best.rank(m.eps):", "    if False:",
      ("tests/test_ffn_float32_repair.py::test_a_budget_that_stops_the_lines_after_the_repair_keeps_the_repaired_set",),
      "a better repaired set discarded when the budget stops the lines after it", markers=""),
    M("ffn-found-projection", "learners/ffn/missing.py", "    G = G - Q @ (Q.T @ G)", "    G = G",
      ("tests/test_ffn_found_in_answers.py",),
      "a missing neuron fitted to answers the found neurons' moves could give (their compensation pulls it off)"),
    M("ffn-found-accept", "learners/ffn/mending.py",
      "    if not found.explains(eps):\n        return None",
      "    if False:\n        return None", ("tests/test_ffn_found_in_answers.py",),
      "neurons found in the answers kept although they do not explain every answer"),
    M("ffn-open-intervals", "learners/ffn/kinks.py", "        if len(frontier) > MAX_OPEN:",
      "        if len(frontier) > 1000 * MAX_OPEN:", ("tests/test_ffn_kink_search.py",),
      "answers noisier than their precision split the line without bound"),
    M("ffn-pin-order", "learners/ffn/pinning.py", "        if t is not None and max(p[0] for p in lp) <= t <= min(",
      "        if t is not None and -np.inf <= t <= min(", ("tests/test_ffn_kink_search.py",),
      "a kink pinned left of answers its left piece holds"),
    # the served API
    M("server-batch-limit", "service/app.py", "if B > options.max_batch:", "if B > options.max_batch + 1:",
      ("tests/test_service.py",), "one sequence past the batch limit"),
    M("server-refund", "service/app.py", "        if not np.all(np.isfinite(y)):\n            keys.refund(kh, B)",
      "        if not np.all(np.isfinite(y)):\n            pass", ("tests/test_service.py",),
      "non-finite answers charged"),
    M("keys-rate", "service/keys.py", "if n > u.tokens:", "if n > u.tokens + 4:", ("tests/test_service.py",),
      "the rate limit lets 4 more queries through"),
    M("keys-charge-before-rate", "service/keys.py",
      ("            if self.rate is not None:\n", "                u.tokens -= n\n            u.queries += n\n"),
      ("            u.queries += n\n            if self.rate is not None:\n", "                u.tokens -= n\n"),
      ("tests/test_service.py",), "a batch charged before the rate limit refuses it (the charge moved up)"),
    M("server-charge-before-checks", "service/app.py",
      ("        B = len(body.inputs)\n", "        return answer_array(np.asarray(body.inputs"),
      ("        B = len(body.inputs)\n        keys.charge(kh, B)\n",
       "        keys.refund(kh, B)\n        return answer_array(np.asarray(body.inputs"), ("tests/test_service.py",),
      "a JSON batch charged before its shape is validated (and refunded once it is valid)"),
    M("keys-budget", "service/keys.py", "u.queries + n > self.budget", "u.queries + n > self.budget + 1",
      ("tests/test_service.py",), "one query past a key's budget"),
    # the query log
    M("querylog-identity", "oracles/querylog.py", "or meta[k] == v:", "or True:",
      ("tests/test_querylog.py", "tests/test_hostile_querylog.py"), "a log of another oracle accepted"),
    M("querylog-fingerprint", "oracles/querylog.py", "            if np.any(gap > allowed):",
      "            if False:", ("tests/test_hostile_querylog.py", "tests/test_querylog.py"),
      "a log whose recorded probes another model answers differently accepted"),
    M("querylog-from-log-count", "oracles/base.py", "y = log.answer(X, self._ask_paid)", "y = log.answer(X, self.fn)",
      ("tests/test_querylog.py",), "missing answers neither counted nor validated"),
    M("querylog-roundings", "oracles/querylog.py", "VERIFY_ROUNDINGS = 64", "VERIFY_ROUNDINGS = 1000",
      ("tests/test_hostile_verdicts.py",), "identity probes compared at ~1e-4 of the scale: a float32 log of other "
                                           "weights (W × 1.0001) accepted"),
    M("audit-journal-cut", "audit/run.py", "return _NO_IDENTITY if _holds_records(path) else None", "return None",
      ("tests/test_hostile_verdicts.py",), "a journal whose identity line is cut is trusted"),
    M("audit-task-key-learner", "audit/run.py",
      "return json.dumps([asdict(task.head), task.method, task.defense.name,",
      "return json.dumps([asdict(task.head), task.defense.name,", ("tests/test_hostile_verdicts.py",),
      "two learners' tasks of one head collide on resume"),
    M("vector-near-tie", "learners/multihead/vector.py", "    return float(eps) ** 0.25", "    return 0.0",
      ("tests/test_hostile_verdicts.py",), "nearly tied heads returned apart with value maps 100 % off"),
    M("server-idempotency-shape", "service/app.py", "{zlib.crc32(np.ascontiguousarray(X)):08x}:{B}x{N}\"",
      "{zlib.crc32(np.ascontiguousarray(X)):08x}\"", ("tests/test_service.py",),
      "the idempotency key without the batch shape: another batch of the same bytes gets the cached answer"),
    M("lowrank-declared-noise", "learners/head/lowrank.py",
      "    if not (noise.tolerance or noise.sigma):\n        return \"\"", "    if True:\n        return \"\"",
      ("tests/test_hostile_learner_choice.py",),
      "lowrank on declared rounding blames the rank"),
    M("audit-untried-learners", "audit/report.py", "    return [n for n in fits if n not in tried and",
      "    return [] and [n for n in fits if n not in tried and", ("tests/test_hostile_learner_choice.py",),
      "a verdict from a narrowed learner list called strong"),
    M("hf-declared-precision", "oracles/hf_attention.py",
      '        kwargs["precision"] = coarser(dtype, module.spec.softmax_dtype or dtype)',
      '        kwargs["precision"] = "float64"', ("tests/test_hf_attention.py",),
      "a float32 Hugging Face module declared float64"),
    M("hf-readout-dtype", "oracles/hf_attention.py", "np.asarray(readout, dtype=np.float64),\n"
      "                                                                    dtype=dtype)",
      "np.asarray(readout, dtype=np.float64),\n                                                                    "
      "dtype=torch.float64)", ("tests/test_hf_attention.py",), "the readout always float64"),
    M("estimate-vector-restart", "learners/multihead/vector.py", "    return 4 * H", "    return 2 * H",
      ("tests/test_multihead_vector.py",), "a vector restart priced at 2H queries (the plan and the estimate)"),
    M("estimate-ffn-odd-part", "learners/ffn/learner.py", "    return 2 * d\n", "    return d\n",
      ("tests/test_ffn.py",), "the bias-free odd part priced at d queries (the plan and the estimate)"),
    M("vector-clipping-range", "learners/multihead/vector.py", "        refuse_clipping(oracle, 3 * rho,",
      "        refuse_clipping(oracle, 0.3 * rho,", ("tests/test_multihead_vector.py",),
      "clipping checked only below the probes' norms"),
    M("vector-fit-tolerance", "learners/multihead/vector.py", "    return max(1e4 * eps, 1e-11)",
      "    return max(1e7 * eps, 1e-8)", ("tests/test_multihead_vector.py",),
      "the separation accepts misfits 1000x above the answers' rounding"),
    M("transformer-crossing-order", "learners/transformer/frames.py",
      "    order = np.argsort(np.argsort(vals.crossings))", "    order = np.argsort(vals.crossings)",
      ("tests/test_transformer_multihead.py",), "head maps in the inverse permutation of the crossings (H ≥ 3)"),
    M("transformer-match-angle", "learners/transformer/regions.py", "    if worst > 1e-4:", "    if worst > 1e-1:",
      ("tests/test_transformer_multihead.py",), "heads matched across FFN regions with a 1000x looser angle"),
    M("transformer-well-seen", "learners/transformer/regions.py", "WELL_SEEN = 0.2", "WELL_SEEN = 2e-4",
      ("tests/test_transformer_multihead.py",), "regions stopped 1000x earlier (scores from ill-conditioned bases)"),
    M("vector-column-space-span", "learners/multihead/vector.py",
      "    if np.linalg.norm(M - E @ coef) > 1e3 * eps * np.linalg.norm(M):",
      "    if np.linalg.norm(M - E @ coef) > 1e6 * eps * np.linalg.norm(M):", ("tests/test_multihead_vector.py",),
      "column spaces accepted though they miss M by 1000x more (d = 48)"),
    M("polish-held-out", "learners/transformer/polish.py", "            if rf < best_fit and rv < best_val:",
      "            if rf < best_fit:", ("tests/test_transformer_polish.py",),
      "a polish step kept without its held-out check"),
    M("polish-escalate", "learners/transformer/polish.py", "ESCALATE = 3e-9", "ESCALATE = 1e9",
      ("tests/test_transformer_polish.py",), "polish auto never escalates to every parameter"),
    M("polish-reserve", "learners/transformer/polish.py", "oracle.remaining - reserve >=", "oracle.remaining >=",
      ("tests/test_transformer_polish.py",), "the polish spends the check's reserved budget"),
    # reports
    M("report-scale", "audit/report.py", 'colorbar="‖Ŵ−W‖/‖W‖", vmin=-16, vmax=1,',
      'colorbar="‖Ŵ−W‖/‖W‖", vmin=-12, vmax=1,', ("tests/test_audit.py::test_report_shows_the_verdicts_and_maps_"
                                                  "of_the_results",), "the maps' colour scale shifted"),
]


def _first_failure(output: str) -> str:
    m = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", output, re.M)
    return m.group(1) if m else ""


def run_one(tree: Path, mut: Mutation, timeout: float) -> tuple[str, str, float]:
    """Apply ``mut`` in ``tree``, run its tests, restore the file: (status, killed by, seconds)."""
    path = tree / "src" / "attnprobe" / mut.path
    text = path.read_text()
    edits = (list(zip(mut.snippet, mut.replacement, strict=True)) if isinstance(mut.snippet, tuple)
             else [(mut.snippet, mut.replacement)])
    mutant = text
    for snippet, replacement in edits:
        if mutant.count(snippet) != 1:
            return f"site not found ({mutant.count(snippet)} matches)", "", 0.0
        mutant = mutant.replace(snippet, replacement)
    path.write_text(mutant)
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OPENBLAS_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", mut.markers,
                              *mut.tests],
                             cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        status = "killed" if out.returncode != 0 else "SURVIVED"
        who = _first_failure(out.stdout) if out.returncode != 0 else ""
    except subprocess.TimeoutExpired:
        status, who = "killed (timeout)", ""
    finally:
        path.write_text(text)
    return status, who, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", help="run these mutations only (by name)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not a.only or m.name in a.only]
    if a.list:
        for m in chosen:
            print(f"{m.name:26s} {m.path:28s} {m.what}")
        return 0
    from attnprobe.reports import Table
    from sections import write_section

    table = Table(["mutation", "file", "what it breaks", "result", "killed by", "seconds"])
    with tempfile.TemporaryDirectory(prefix="attnprobe-mutants-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc",
                                                                  "results", "research", "*.png"))
        for m in chosen:
            status, who, secs = run_one(tree, m, a.timeout)
            table.add(m.name, m.path, m.what, status, who, round(secs, 1))
            print(f"{m.name:26s} {status:10s} {who}", flush=True)
    survived = [r[0] for r in table.rows if r[3] != "killed"]
    print(table.markdown())
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations killed" +
          (f"; not killed: {', '.join(survived)}" if survived else ""))
    if a.write:
        cmd = "PYTHONPATH=src python benchmarks/mutations.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_section(TITLE, table.markdown() + f"\n\n{len(chosen) - len(survived)} of {len(chosen)} killed.",
                      cmd.strip(), doc=DOC)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
