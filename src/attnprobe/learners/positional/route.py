"""Which positional learner reads a layer: RoPE (:mod:`.rope`) or an additive position bias (:mod:`.additive`).

The position term is the oracle's when it declares one (a Hugging Face folder's family: attribute
``position_term`` of the callable, ``"rope"``, ``"t5"`` or ``"alibi"``), the ``position`` option, or read from the
answers: with the query token zero, a key's weight depends on its position only through an additive bias (T5,
ALiBi); RoPE without biases weighs every zero-query key alike (its scores are ``0ᵀR(δ)k = 0``). Eight sequences.

RoPE with q/k biases (Qwen2) also weighs zero-query keys by position (``b_Qᵀ R(δ) b_K``): read from the answers, the
additive route is tried first and RoPE with biases (:func:`~.rope.extract_positional` with ``key_bias``) after it;
a declared RoPE layer is probed the same way (eight sequences): spread, it is read with biases; else bias-free, and
with biases when the bias-free learner refuses (a key bias alone leaves zero-query answers flat).

Coarse answers (float32, bfloat16) count as additive only at a spread above ``1e3·√ε`` (0.35 for float32); below it,
a spread above ``max(ADDITIVE_SIGNAL, 10·ε)`` is RoPE with q/k biases (bias-free RoPE's zero queries weigh every key
exactly alike: its spread is 0 in any precision, measured; Qwen2 at float32: 0.05 … 0.11), which the float32 route
reads (:mod:`.coarse_bias`) and the bfloat16 route refuses in one line. A Hugging Face folder declares its biases
(``qk_biases``): its coarse route reads them without the probe.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import AttnprobeError, RecoveryError, UnidentifiableError
from attnprobe.learners.core.registry import Option
from attnprobe.oracles.wrappers import declared_attribute
from attnprobe.learners.positional.additive import extract_additive
from attnprobe.learners.positional.heads import BIASES_REFUSED
from attnprobe.learners.positional.polish import HOOK_ROUNDS, POLISH_MODES, POLISH_TARGET
from attnprobe.learners.positional.polish_hook import polish_extraction

#: the position terms a positional learner reads
POSITION_TERMS = ("rope", "t5", "alibi")
POSITION = Option("position", str, "the position term: auto (default: the oracle's family, else read from the "
                                   "answers), rope, t5 (relative buckets) or alibi", default="auto",
                  choices=("auto",) + POSITION_TERMS)
POLISH = Option("polish", str, "the joint least-squares polish on fresh sequences after the learner's stages: auto "
                               "(default: when the check's error is above polish_target), always, never",
                default="auto", choices=POLISH_MODES)
POLISH_TARGET_OPTION = Option("polish_target", float, "the check error (relative RMS) above which polish auto "
                                                      "polishes", default=POLISH_TARGET, low=0)
POLISH_SEQUENCES_OPTION = Option("polish_sequences", int, "fresh sequences of the polish (default 2·⌈unknowns/K⌉; "
                                 "rows, asked in sequences of 256 tokens, when the oracle answers causal rows)",
                                 low=1)
#: relative spread of the zero-query answers over the key's position above which the bias is additive
ADDITIVE_SIGNAL = 1e-4
#: length of the detection probe
PROBE_LENGTH = 8


def declared_position(fn) -> str | None:
    """The position term the callable ``fn`` (or one it wraps) declares (attribute ``position_term``)."""
    value = declared_attribute(fn, "position_term", accept=lambda v: v in POSITION_TERMS)
    return None if value is None else str(value)


def detect_position(oracle, rng: np.random.Generator) -> tuple[str, float]:
    """``"additive"`` or ``"rope"`` from :data:`PROBE_LENGTH` sequences: a key ``e`` at each position before a zero
    query, and the zero sequence (``c``). Returns the kind and the relative spread of the answers over positions."""
    d, N = oracle.d, PROBE_LENGTH
    e = rng.standard_normal(d) * 0.2
    X = np.zeros((N, N, d))
    for p in range(N - 1):
        X[p, p] = e
    y = oracle(X)
    f = y[:N - 1] - y[N - 1]
    scale = float(np.max(np.abs(f)))
    spread = float(np.max(np.abs(f - f.mean(axis=0))) / scale) if scale > 0 else 0.0
    return ("additive" if spread > max(ADDITIVE_SIGNAL, 1e3 * math.sqrt(max(oracle.eps, 1e-16))) else "rope"), spread


def extract_any_positional(oracle, *, heads=None, seed=0, check=True, progress=None, position="auto", walk=None,
                           polish="auto", polish_target=POLISH_TARGET, polish_sequences=None):
    """The positional learner for this oracle's position term (module docstring); the route and why are in
    ``details`` and the notes; ``walk``: the RoPE learner's walk length (:func:`extract_positional`); ``polish``,
    ``polish_target``, ``polish_sequences``: the joint polish after the learner's stages
    (:func:`~.polish_hook.polish_extraction`)."""
    from attnprobe.learners.positional.rope import FINEST, WALK, extract_positional

    walk = WALK if walk is None else walk

    kind = None if position in (None, "auto") else position
    source = "declared"
    spent, spread, found = 0, None, None
    if kind is None:
        kind = declared_position(oracle.fn)
        source = "the oracle's family"
    fine = max(oracle.eps, 1e-16) <= FINEST and oracle.noise.exact  # coarse answers: the RoPE learner refuses first
    if kind is None or kind == "rope" and fine:  # RoPE declared: the same probe tells whether it has q/k biases
        before = oracle.queries
        with oracle.phase("route"):
            found, spread = detect_position(oracle, np.random.default_rng(seed))
        spent = oracle.queries - before
        if kind is None:
            kind = "rope" if found == "rope" else None
            source = "read from the answers"
    # coarse answers' probe counts as additive only far above the rounding (1e3·√ε): a smaller spread still tells
    # RoPE with q/k biases from bias-free RoPE, whose zero queries weigh every key exactly alike
    biased = kind == "rope" and (found == "additive" or not fine and spread is not None
                                 and spread > max(ADDITIVE_SIGNAL, 10 * oracle.eps))
    if biased:
        try:
            res = extract_positional(oracle, heads=heads, seed=seed, check=check, progress=progress, walk=walk,
                                     key_bias=True)
        except AttnprobeError as exc:
            raise type(exc)(f"RoPE with q/k biases (zero-query answers spread {spread:.1e} over the key's "
                            f"position): {exc}") from exc
        _share_groups(res)
    elif kind == "rope":
        start = oracle.queries
        try:
            res = extract_positional(oracle, heads=heads, seed=seed, check=check, progress=progress, walk=walk)
        except RecoveryError as first:
            if declared_attribute(oracle.fn, "qk_biases") is False:  # a folder that declares none: its refusal
                raise type(first)(str(first).replace(BIASES_REFUSED, "the oracle's family declares no q/k biases, "
                                                                     "so the biased route is not tried")) from first
            res = _after(oracle, start, first, "the bias-free RoPE learner refused", "bias-free tried", heads=heads,
                         seed=seed, check=check, progress=progress, walk=walk)
        _share_groups(res)
    elif source == "read from the answers":  # a zero-query bias may also be RoPE with biases (Qwen2): then the
        start = oracle.queries  # additive route fails, and the RoPE learner's answer (or refusal) is the one
        try:  # that counts
            res = extract_additive(oracle, heads=heads, seed=seed, check=check, progress=progress)
        except (RecoveryError, UnidentifiableError) as first:
            if not fine:  # from coarse answers a spread this far above the rounding is read as additive only
                raise type(first)(f"an additive position bias (read from the answers) did not fit these coarse "
                                  f"answers (rounding {oracle.eps:.1e}; zero-query answers spread {spread:.1e}: "
                                  f"RoPE with q/k biases, read from coarse answers below that spread, not tried): "
                                  f"{first}") from first
            res = _after(oracle, start, first, "an additive position bias did not fit", "additive tried",
                         heads=heads, seed=seed, check=check, progress=progress, walk=walk)
            _share_groups(res)
    else:
        try:
            res = extract_additive(oracle, heads=heads, seed=seed, check=check, progress=progress, position=kind)
        except (RecoveryError, UnidentifiableError) as exc:
            if fine:
                raise
            raise type(exc)(f"these answers are {oracle.precision} (rounding {oracle.eps:.1e}), and the additive "
                            f"position bias ({kind}) read from them did not fit: {exc}") from exc
    if spent:
        res.queries += spent
        res.queries_by_phase = {"route": spent, **res.queries_by_phase}
    plan = res.details.get("polish_plan", {})  # a route's own polish (the coarse RoPE route's: more of it)
    polish_extraction(oracle, res, mode=polish, target=polish_target, seed=seed, progress=progress,
                      sequences=polish_sequences or plan.get("sequences"), rounds=plan.get("rounds", HOOK_ROUNDS),
                      relative=plan.get("relative", False), work=plan.get("work"),
                      **{k: plan[k] for k in ("cg_steps", "rows", "frequencies", "slow_mixing", "pair_signs",
                                              "min_gain") if k in plan})
    claim_verdict(oracle, res)  # a route that claims an error (the bfloat16 route's) held to it
    route = res.details.get("position", kind or "rope")
    if (oracle.eps > FINEST and oracle.noise.exact and kind != "rope" and res.check is not None
            and not res.check.passed):  # an additive bias from coarse answers: refused naming the precision
        polished = " after the polish" if res.details.get("polish", {}).get("ran") else " (not polished)"
        raise UnidentifiableError(f"these answers are {oracle.precision} (rounding {oracle.eps:.1e}): the additive "
                                  f"position bias ({route}) read from them is {res.check.error:.1e} off on fresh "
                                  f"sequences{polished} (tolerance {res.check.tolerance:.1e}); its stages "
                                  "difference answers at their rounding (the zero-query Jacobians, the log-weights): "
                                  f"not recovered at {oracle.precision}; "
                                  f"{res.queries + res.check.queries} queries spent")
    res.details["position_route"] = {"position": route, "source": source, "zero_query_spread": spread}
    biased = biased or bool(res.details.get("qk_biases"))  # the coarse route reads a folder's declared biases
    res.notes.append(f"position term {route}" + (" with q/k biases" if biased else "") + f" ({source}" +
                     (f": zero-query answers spread {spread:.1e} over the key's position" if spread is not None
                      else "") + ")")
    return res


def claim_verdict(oracle, res) -> None:
    """Hold a route's result, after the polish hook, to the error it claims: a route that puts
    ``details["claim"] = {"error": e, "norm": n, "cause": …}`` in its result (the bfloat16 RoPE route) is refused
    in one line naming the answers' precision and the claim when its check (in norm ``n``) is above ``e`` or is not
    finite, or when the check is in another norm (it would not bound the claim). The functional check's own
    tolerance at coarse precisions is its cap, 0.1 — it would pass models farther than a route claims."""
    claim = res.details.get("claim")
    if claim is None or res.check is None:
        return
    bound, norm = float(claim["error"]), claim.get("norm", "rms")
    route = res.details.get("route", "positional")
    have = res.check.extra.get("norm", "rms") if isinstance(getattr(res.check, "extra", None), dict) else "rms"
    if have != norm:
        raise RecoveryError(f"the {route} route claims its {norm} error but its check measured the {have}: the "
                            "check does not bound the claim")
    if not (res.check.error <= bound):
        polished = " after the polish" if res.details.get("polish", {}).get("ran") else ""
        cause = f" ({claim['cause']})" if claim.get("cause") else ""
        raise UnidentifiableError(f"{oracle.precision} answers: the {route} RoPE route's result is "
                                  f"{res.check.error:.1e} from the answers ({norm} over the checked lengths)"
                                  f"{polished}, "
                                  f"above the {bound:.0e} it claims{cause}")


def _after(oracle, start: int, first: Exception, why: str, phase: str, **kw):
    """RoPE with q/k biases (``key_bias``) after a route that refused (``first``, asked from query ``start``): its
    queries counted in ``phase``, and ``why`` in the notes or, when this fails too, in its one-line refusal."""
    from attnprobe.learners.positional.rope import extract_positional

    tried = oracle.queries - start
    try:
        res = extract_positional(oracle, key_bias=True, **kw)
    except AttnprobeError as exc:
        raise type(exc)(f"RoPE with q/k biases: {exc} ({why}: {first})") from exc
    res.notes.append(f"read as RoPE with q/k biases after {why}: {first}")
    res.queries += tried
    res.queries_by_phase = {phase: tried, **res.queries_by_phase}
    return res


def _share_groups(res) -> None:
    """Write a RoPE result's heads that share keys and values (the GQA groups the learner reports) with one key and
    value map per group (:func:`~attnprobe.models.positional_gauge.share_kv`), when that answers like the dense
    result to within its check error (else the dense heads stay, and a note says why)."""
    from attnprobe.errors import ConfigError
    from attnprobe.models.positional_gauge import share_kv

    labels = res.details.get("kv_groups")
    if not labels or len(set(labels)) == len(labels) or res.model.rotary_dim != res.model.head_dim:
        return
    G = len(set(labels))
    try:
        grouped, misfit = share_kv(res.model, G)
    except ConfigError as exc:
        res.notes.append(f"GQA groups kept as independent heads: {exc}")
        return
    X = np.random.default_rng(0).standard_normal((8, 16, res.model.d))
    y = res.model.every_position(X)
    moved = float(np.linalg.norm(grouped.every_position(X) - y) / np.linalg.norm(y - y.mean(axis=(0, 1))))
    bound = max(1e-9, 10 * (res.check.error if res.check is not None else 0.0))
    if moved > bound:
        res.notes.append(f"GQA groups kept as independent heads: sharing keys and values moved the answers by "
                         f"{moved:.1e} > {bound:.1e}")
        return
    res.model = grouped
    res.details["kv_shared"] = {"groups": G, "misfit": misfit, "answers_moved": moved}
    res.notes.append(f"heads sharing keys and values stored once per group ({G} KV groups; misfit {misfit:.1e}, "
                     f"answers moved {moved:.1e})")


def additive_estimate(setting):
    """The plan of the additive-bias route (option ``position`` t5 or alibi): :func:`~.additive.additive_queries`
    for last-position answers, the check on lengths up to 256 (T5 read at every row asks its positive offsets too:
    up to ~8·256/(d_h − 2) more)."""
    from attnprobe.learners.core.check import check_queries
    from attnprobe.learners.core.estimate import QueryCount
    from attnprobe.learners.positional.additive import CHECK_LENGTHS, additive_queries

    H = setting.needs("heads", "a positional estimate needs the number of heads H")
    dh = setting.d // H
    checks = check_queries(CHECK_LENGTHS) if setting.check else 0
    q = additive_queries(setting.d, H, dh) + checks
    both = additive_queries(setting.d, H, dh, both=True) + checks
    return QueryCount(q, q, both, f"values 2d, zero-query Jacobians 12d, sketches "
                                  f"4(d⌈r/T⌉ + r⌈d/T⌉) with r = d_h + 8, T ≤ d_h − 2 keys per sequence, the bias at "
                                  f"offsets up to 255, check {checks}")
