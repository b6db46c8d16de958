"""A joint least-squares polish of a :class:`PositionalAttention` on answers (docs/positional.md, "The polish").

Every parameter the model's function depends on — each head's ``W_Q``, each group's ``W_K``, ``W_V``, the output
map, the biases, and the position term (RoPE frequencies optionally, ALiBi slopes, T5 bucket values) — is fitted
at once to last-position answers ``y_b`` of sequences of varied lengths: ``min_p Σ_b ‖f_p(X_b) − y_b‖²`` by
Levenberg–Marquardt with a matrix-free Gauss–Newton step (conjugate gradients on ``(JᵀJ + λI) s = −Jᵀr``, the
products ``Jv`` and ``Jᵀu`` from ``torch.func``). The model's gauge freedoms (a scaled rotation per head and
frequency pair, the split ``V_h = W_O,h W_V,g``) are null directions of ``J``: conjugate gradients from zero never
move along them, and the damping keeps the step bounded. Averaging over many answers is what beats their rounding:
with ``m`` numbers for ``P`` unknowns, the fitted function's error is about the rounding times ``√(P/m)``.

:func:`polish_extraction` is the learners' hook: after their stages, when the functional check's error is above a
target, the polish runs on fresh sequences and its model is kept only when a fresh check improves.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.positional import PositionalAttention, rotation_pairs, t5_buckets
from attnprobe.models.positional_gauge import balanced

#: lengths of the fresh sequences (cycled), up to the longest the check reads
POLISH_LENGTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64, 128, 256)
#: Levenberg–Marquardt rounds, conjugate-gradient steps per round
ROUNDS, CG_STEPS = 12, 60
#: the learners' hook: fewer rounds of longer conjugate-gradient solves (LLaMA d = 128 from the learner's 1.9e-8:
#: 3 × 300 steps reach 7.4e-9 in 208 s, 6 × 100 steps 1.0e-8 in 164 s; docs/positional.md)
HOOK_ROUNDS, HOOK_CG_STEPS = 4, 300
#: the largest Jacobian (numbers × unknowns) the polish forms densely; past it, conjugate gradients
DENSE_LIMIT = 4e7
#: the dampings tried per round with a dense Jacobian (relative to the unit-scaled columns' squared singular values)
LADDER = (1e-14, 1e-11, 1e-8, 1e-5, 1e-2, 1.0)
#: a Jacobian column this much smaller than the median column is null (left out of the dense step)
NULL_COLUMN = 1e-9
#: the fitted arrays besides the position term
WEIGHTS = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
#: when the learners' hook polishes: ``auto`` when the check's error is above the target, ``always``, ``never``
POLISH_MODES = ("auto", "always", "never")
#: the check error (relative RMS) above which ``auto`` polishes
POLISH_TARGET = 1e-9
#: the check's lengths when the result has no check to copy them from
CHECKED = (1, 2, 8, 64, 256)
#: fresh sequences per ⌈unknowns / K⌉ (the fewest whose answers hold as many numbers as the unknowns)
POLISH_SEQUENCES = 2


@dataclass
class PolishReport:
    """What the polish did: sequences and numbers fitted, the unknowns, the RMS misfit relative to the answers'
    spread before and after, and the rounds taken."""

    sequences: int
    numbers: int
    unknowns: int
    misfit_before: float
    misfit_after: float
    rounds: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def fresh_answers(oracle, count: int, rng: np.random.Generator, lengths=POLISH_LENGTHS, scale: float = 1.0):
    """``count`` random sequences (standard normal tokens times ``scale``), lengths cycled from ``lengths``,
    and the oracle's last-position answers: a list of ``(X (B, N, d), Y (B, K))`` per length."""
    if count < 1:
        raise ConfigError(f"the polish needs at least one sequence; got {count}", param="sequences")
    per = np.bincount(np.arange(count) % len(lengths), minlength=len(lengths))
    out = []
    for N, b in zip(lengths, per):
        if b:
            X = rng.standard_normal((int(b), int(N), oracle.d)) * scale
            out.append((X, np.asarray(oracle(X), dtype=np.float64)))
    return out


def fitted_names(model: PositionalAttention, frequencies: bool = False) -> tuple[str, ...]:
    """The arrays the polish fits: the weights and biases, and the position term's own numbers (RoPE
    frequencies only when ``frequencies``)."""
    extra = {"alibi": ("slopes",), "t5": ("rel_bias",), "rope": ("inv_freq",) if frequencies else ()}
    return WEIGHTS + extra.get(model.position, ())


def polish(model: PositionalAttention, data, *, frequencies: bool = False, rounds: int = ROUNDS,
           cg_steps: int = CG_STEPS, only: tuple[str, ...] | None = None,
           relative: bool = False) -> tuple[PositionalAttention, PolishReport]:
    """Fit every parameter of ``model`` to the answers ``data`` (list of ``(X, Y)``, last positions) by
    Levenberg–Marquardt (module docstring); ``only``: fit these arrays of :func:`fitted_names` alone, the others
    held (a staged fit: the logit maps with the value maps held); ``relative``: each length's residuals relative to
    its answers' spread (:func:`length_weights`). The start's gauge scales are balanced first
    (:func:`~attnprobe.models.positional_gauge.balanced`). Returns the polished model (float64) and a
    :class:`PolishReport`. Runs torch on one thread (many small products: threads only contend)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _fit(model, data, frequencies, rounds, cg_steps, only, relative)
    finally:
        torch.set_num_threads(threads)


def _fit(model, data, frequencies, rounds, cg_steps, only=None, relative=False):
    import torch

    names = fitted_names(model, frequencies)
    if only is not None:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"the polish fits {', '.join(names)}; cannot fit {', '.join(unknown)}", param="only")
        names = tuple(n for n in names if n in only)
    # the same function, its gauge scales balanced where both arrays are fitted: a better-conditioned Jacobian
    model = balanced(model, keys={"Wq", "Wk", "bq", "bk"} <= set(names),
                     values={"Wv", "Wo", "bv"} <= set(names))
    held = {n: torch.as_tensor(np.array(getattr(model, n), dtype=np.float64))
            for n in fitted_names(model, True) if n not in names}
    arrays = {n: np.asarray(getattr(model, n), dtype=np.float64) for n in names}
    shapes = {n: a.shape for n, a in arrays.items()}
    sizes = [a.size for a in arrays.values()]
    p = torch.as_tensor(np.concatenate([a.ravel() for a in arrays.values()]))
    batches = [(torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(Y, dtype=torch.float64)) for X, Y in data]
    spread = math.sqrt(sum(float(((Y - Y.mean(0)) ** 2).sum()) for _, Y in batches))
    weight = length_weights(data, spread) if relative else [1.0] * len(batches)
    const = row_constants(model, [X.shape[1] for X, _ in batches])

    def residual(flat):
        parts = dict(zip(names, torch.split(flat, sizes)))
        parts = {**held, **{n: v.reshape(shapes[n]) for n, v in parts.items()}}
        return torch.cat([(w * (last_row(model, parts, const, X) - Y)).reshape(-1)
                          for w, (X, Y) in zip(weight, batches)])

    r = residual(p).detach()
    cost = float(r @ r)
    before = math.sqrt(cost) / spread
    dense = r.numel() * p.numel() <= DENSE_LIMIT
    if not dense:  # unknowns scaled by their arrays' Jacobian column size (one probe per array): Jacobi on blocks
        scale = torch.cat([torch.full((n,), v) for n, v in zip(sizes, _block_sizes(residual, p, sizes))])
    lam, done = 1e-6, 0
    for done in range(1, rounds + 1):
        if dense:
            J = torch.func.jacrev(residual, chunk_size=256)(p).detach().numpy()
            step_at = marquardt_step(J, r.numpy())
        else:
            apply, g = _normal_equations(residual, p, scale)

            def step_at(lam):
                return conjugate_gradients(lambda v: apply(v) + lam * v, -g, cg_steps) * scale
        moved, start = False, cost
        for trial_lam in (LADDER if dense else ()):  # dense: the best of a ladder of dampings
            step = torch.as_tensor(step_at(trial_lam))
            trial = residual(p + step).detach()
            new = float(trial @ trial)
            if new < cost:
                moved, best, cost = True, (p + step, trial, new), new
        if moved:
            p, r, cost = best
            gain = 1 - cost / start
        while not dense and not moved and lam < 1e6:
            step = torch.as_tensor(step_at(lam))
            trial = residual(p + step).detach()
            new = float(trial @ trial)
            moved = new < cost
            if moved:
                gain = 1 - new / cost
                p, r, cost = p + step, trial, new
                lam /= 4
            else:
                lam *= 16
        if not moved or gain < 1e-3:
            break
    out = dict(zip(names, torch.split(p.detach(), sizes)))
    numbers = sum(int(Y.numel()) for _, Y in batches)
    report = PolishReport(sum(len(X) for X, _ in batches), numbers, int(p.numel()), before,
                          math.sqrt(cost) / spread, done)
    polished = replace(model, dtype="float64", **{n: v.reshape(shapes[n]).numpy() for n, v in out.items()})
    return polished, report


def length_weights(data, spread: float) -> list[float]:
    """Per batch of ``data`` (one length each), the weight that makes its residuals relative to its own answers'
    spread (RMS of ``Y − mean``), scaled so that the misfit stays relative to the whole ``spread``: long sequences
    average their keys' values and answer less, and unweighted they hardly count where the function error is read
    relative to each length's answers."""
    rms = [math.sqrt(float(((Y - Y.mean(0)) ** 2).mean())) if len(Y) > 1 else float(np.sqrt((Y**2).mean()))
           for _, Y in data]
    raw = [1.0 / max(v, 1e-300) for v in rms]
    norm = math.sqrt(sum(w * w * float(((Y - Y.mean(0)) ** 2).sum()) for w, (_, Y) in zip(raw, data)))
    return [w * spread / norm for w in raw] if norm > 0 else [1.0] * len(data)


def marquardt_step(J: np.ndarray, r: np.ndarray):
    """``λ ↦ s`` solving ``min ‖J s + r‖² + λ ‖diag(JᵀJ)^½ s‖²`` (Marquardt's scaling; SVD of the scaled J once)."""
    col = np.sqrt(np.einsum("ij,ij->j", J, J))
    live = col > NULL_COLUMN * np.median(col)  # a null column (a key bias under a shift-invariant softmax) holds only
    U, sv, Vt = np.linalg.svd(J[:, live] / col[live], full_matrices=False)  # rounding: scaled to unit size it
    beta = U.T @ r  # would read as a direction and steer the step

    def solve(lam):
        step = np.zeros(J.shape[1])
        step[live] = -(Vt.T @ (sv * beta / (sv**2 + lam))) / col[live]
        return step
    return solve


def _block_sizes(residual, p, sizes):
    """Per fitted array, the inverse RMS size of its Jacobian columns (one random probe each); 0 (held) for a null
    array (below :data:`NULL_COLUMN` of the largest: rounding, as in :func:`marquardt_step`)."""
    import torch

    out, at = [], 0
    apply, _ = _normal_equations(residual, p, torch.ones_like(p))
    for n in sizes:
        v = torch.zeros_like(p)
        v[at:at + n] = torch.randn(n, dtype=p.dtype)
        out.append(float(v @ apply(v)) / float(v @ v))
        at += n
    top = max(out)
    return [1.0 / math.sqrt(size) if size > NULL_COLUMN**2 * top else 0.0 for size in out]


def _normal_equations(residual, p, scale):
    """``v ↦ DJᵀJDv`` and ``DJᵀr`` at ``p`` (``D = diag(scale)``), the Jacobian products by reverse-mode autograd:
    ``Jᵀu`` directly, ``Jv`` as the gradient of ``u ↦ vᵀJᵀu`` (one graph per round)."""
    import torch

    x = p.detach().clone().requires_grad_(True)
    r = residual(x)
    u = torch.zeros_like(r, requires_grad=True)
    (jt_u,) = torch.autograd.grad(r, x, u, create_graph=True)

    def apply(v):
        (jv,) = torch.autograd.grad(jt_u, u, v * scale, retain_graph=True)
        (out,) = torch.autograd.grad(r, x, jv, retain_graph=True)
        return out * scale

    (g,) = torch.autograd.grad(r, x, r.detach(), retain_graph=True)
    return apply, g * scale


def conjugate_gradients(apply, b, steps):
    """Conjugate gradients on ``apply(x) = b`` from zero (``apply`` symmetric positive definite)."""
    import torch

    x = torch.zeros_like(b)
    res = b.clone()
    d = res.clone()
    rr = float(res @ res)
    stop = 1e-20 * rr
    for _ in range(steps):
        Ad = apply(d)
        a = rr / float(d @ Ad)
        x = x + a * d
        res = res - a * Ad
        new = float(res @ res)
        if new < stop:
            break
        d = res + (new / rr) * d
        rr = new
    return x


def row_constants(model: PositionalAttention, lengths) -> dict:
    """Per length: the offsets ``δ = j − (N − 1)`` of the last row and, for T5, their buckets."""
    import torch

    out = {}
    for N in set(lengths):
        offs = np.arange(N) - (N - 1)
        item = {"offsets": torch.as_tensor(offs, dtype=torch.float64)}
        if model.position == "t5":
            item["buckets"] = torch.as_tensor(t5_buckets(offs, model.rel_bias.shape[1], model.max_distance,
                                                         model.bidirectional))
        out[N] = item
    if model.position == "rope":
        a, b = rotation_pairs(model.rotary_dim, model.layout)
        partner = np.arange(model.head_dim)
        partner[a], partner[b] = b, a
        sign = np.concatenate([-np.ones(len(a)), np.ones(len(b))])
        out["pairs"] = (torch.as_tensor(partner), torch.as_tensor(np.concatenate([a, b])), torch.as_tensor(sign))
    return out


def last_row(model: PositionalAttention, p: dict, const: dict, X):
    """The model's last-position answer (B, K) in torch, with the arrays ``p`` in place of the model's."""
    import torch

    B, N, _ = X.shape
    H, G = model.H, model.G
    offs = const[N]["offsets"]
    q = torch.einsum("bd,hkd->bhk", X[:, -1], p["Wq"]) + p["bq"]
    k = torch.einsum("bnd,gkd->bgnk", X, p["Wk"]) + p["bk"][None, :, None]
    v = torch.einsum("bnd,gkd->bgnk", X, p["Wv"]) + p["bv"][None, :, None]
    k = k.repeat_interleave(H // G, dim=1)
    v = v.repeat_interleave(H // G, dim=1)
    if model.position == "rope":
        theta = p["inv_freq"] if "inv_freq" in p else torch.as_tensor(np.array(model.inv_freq))
        ang = offs[:, None] * theta[None]  # (N, r/2)
        cos, sin = torch.cos(ang), torch.sin(ang)
        partner, at, sign = const["pairs"]
        C = torch.ones(N, k.shape[-1], dtype=k.dtype).index_copy(1, at, torch.cat([cos, cos], 1))
        S = torch.zeros(N, k.shape[-1], dtype=k.dtype).index_copy(1, at, torch.cat([sin, sin], 1) * sign)
        k = k * C + k[..., partner] * S
    s = model.scale * torch.einsum("bhk,bhnk->bhn", q, k)
    if model.position == "alibi":
        s = s + p["slopes"][:, None] * offs[None]
    elif model.position == "t5":
        s = s + p["rel_bias"][:, const[N]["buckets"]]
    alpha = torch.softmax(s, dim=-1)
    ctx = torch.einsum("bhn,bhnk->bhk", alpha, v)
    return ctx.reshape(B, -1) @ p["Wo"].T + p["bo"]


def causal_rows(oracle, model) -> bool:
    """Whether ``oracle`` is known to answer every position of a causal layer (declared, or already read from its
    answers: reading it here would ask queries) and ``model`` is causal: the polish can read every row."""
    known = getattr(oracle, "every_position", False) is True and getattr(oracle, "positions_source", None)
    return bool(known) and oracle.positions == "causal" and bool(getattr(model, "causal", False))


def polish_sequences(unknowns: int, outputs: int, per: float = POLISH_SEQUENCES) -> int:
    """The hook's default number of fresh sequences: ``per · ⌈unknowns / K⌉`` (each answers K numbers)."""
    return int(math.ceil(per * math.ceil(unknowns / max(1, outputs))))


def polish_queries(unknowns: int, outputs: int, check_queries: int, sequences: int | None = None) -> int:
    """Queries :func:`polish_extraction` asks when it polishes: the fresh sequences and the polished model's check."""
    return (sequences or polish_sequences(unknowns, outputs)) + check_queries


def polish_extraction(oracle, res, *, mode: str = "auto", target: float = POLISH_TARGET, sequences: int | None = None,
                      seed: int = 0, lengths=POLISH_LENGTHS, rounds: int = HOOK_ROUNDS, cg_steps: int = HOOK_CG_STEPS,
                      frequencies: bool = True, relative: bool = False, progress=None, rows: bool | None = None):
    """The learners' hook: polish ``res.model`` (a :class:`PositionalAttention` result of ``oracle``) on
    ``sequences`` fresh last-position answers (default :func:`polish_sequences`) when ``mode`` is ``always``, or
    ``auto`` and the check's error is above ``target``; then a fresh functional check (the lengths and count of
    ``res.check``, in its norm) of the polished model, kept only when its error is below the learner's;
    ``relative``: residuals weighed relative to each length's spread (:func:`length_weights`); ``rows``: polish on
    every-position answers (:func:`~.row_polish.polish_rows`: ``sequences`` counts rows, asked in sequences of
    :data:`~.row_polish.ROW_LENGTH` tokens, computed in float32 for answers no finer; default: when the oracle is
    known to answer causal rows and the model is causal). The result's check is
    the returned model's (counted apart, as every learner's); every other query the hook asks, and the learner's
    check when its model is replaced, is counted in ``res.queries`` and ``res.queries_by_phase`` (``polish``,
    ``polish check``); ``res.details["polish"]`` and a note say what happened. Returns ``res`` (changed in
    place)."""
    from attnprobe.learners.core.check import functional_check
    from attnprobe.learners.core.skeleton import without_check_notes

    if mode not in POLISH_MODES:
        raise ConfigError(f"polish must be one of {', '.join(POLISH_MODES)}; got {mode!r}", param="polish")
    if not (isinstance(target, (int, float)) and math.isfinite(target) and target >= 0):
        raise ConfigError(f"polish_target must be a finite number ≥ 0; got {target!r}", param="polish_target")
    if mode == "never" or not isinstance(res.model, PositionalAttention):
        return res
    learner_check = check = res.check
    if mode == "auto":
        if check is None:
            res.details["polish"] = {"ran": False, "why": "no functional check to compare with"}
            return res
        if check.error <= target:
            res.details["polish"] = {"ran": False, "why": f"check error {check.error:.1e} ≤ target {target:.1e}"}
            return res
    n = sequences or polish_sequences(res.unknowns, res.model.outputs)
    rng = np.random.default_rng([int(seed), 0x9011])
    lengths_checked = tuple(check.lengths) if check is not None else CHECKED
    per_length = max(1, check.queries // max(1, len(check.lengths))) if check is not None else 8
    before = oracle.queries
    t0 = time.perf_counter()
    if rows is None:
        rows = causal_rows(oracle, res.model)
    with oracle.phase("polish", fresh=True):
        if rows:
            from attnprobe.learners.positional.row_polish import ROW_LENGTH, fresh_rows

            n = -(-n // ROW_LENGTH)
            data = fresh_rows(oracle, n, rng)
        else:
            data = fresh_answers(oracle, n, rng, lengths)
    if progress is not None:
        progress(res.queries + oracle.queries - before, res.queries + oracle.queries - before)
    if rows:
        from attnprobe.learners.positional.row_polish import chunk_precision, polish_rows

        model, report = polish_rows(res.model, data, frequencies=frequencies, rounds=rounds, cg_steps=cg_steps,
                                    relative=relative, compute=chunk_precision(oracle.precision))
    else:
        model, report = polish(res.model, data, frequencies=frequencies, rounds=rounds, cg_steps=cg_steps,
                               relative=relative)
    with oracle.phase("check", fresh=True):
        if check is None:
            check = functional_check(oracle, res.model, rng, lengths_checked, per_length)
        norm = check.extra.get("norm", "rms")  # the learner's check's norm: the error it claims
        new = functional_check(oracle, model, rng, lengths_checked, per_length, norm=norm)
    kept = bool(np.isfinite(new.error) and new.error < check.error)
    # the result carries one check, counted apart (Extraction); every other query is the extraction's own: what the
    # hook asked, plus the check counted apart before, less the check counted apart now
    returned = new if kept else check
    other = (oracle.queries - before - n + (learner_check.queries if learner_check is not None else 0)
             - returned.queries)
    res.queries += n + other
    for phase, count in (("polish", n), ("polish check", other)):
        if count:
            res.queries_by_phase[phase] = res.queries_by_phase.get(phase, 0) + count
    res.check = returned
    res.details["polish"] = {"ran": True, "kept": kept, "check_before": check.error, "check_after": new.error,
                             "seconds": time.perf_counter() - t0, **report.to_dict()}
    if kept:
        res.model = model
        if not check.passed:  # the learner's failed-check note no longer describes the result
            res.notes = without_check_notes(res.notes)
        if not new.passed:
            res.notes.append(f"functional check FAILED after the polish: {new.describe()}")
    res.seconds += time.perf_counter() - t0
    res.notes.append(f"joint polish on {report.sequences} fresh sequences ({report.unknowns} unknowns, "
                     f"{report.rounds} rounds): misfit {report.misfit_before:.1e} → {report.misfit_after:.1e}, "
                     f"fresh check {check.error:.1e} → {new.error:.1e}; "
                     + ("kept" if kept else "not kept (no better on fresh sequences)"))
    return res
