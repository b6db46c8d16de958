"""A joint least-squares polish of a :class:`PositionalAttention` on answers (docs/positional.md, "The polish").

Every parameter the model's function depends on — each head's ``W_Q``, each group's ``W_K``, ``W_V``, the output
map, the biases, and the position term (RoPE frequencies optionally, ALiBi slopes, T5 bucket values) — is fitted
at once to last-position answers ``y_b`` of sequences of varied lengths: ``min_p Σ_b ‖f_p(X_b) − y_b‖²`` by
Levenberg–Marquardt with a matrix-free Gauss–Newton step (conjugate gradients on ``(JᵀJ + λI) s = −Jᵀr``, the
products ``Jv`` and ``Jᵀu`` from ``torch.func``). The model's gauge freedoms (a scaled rotation per head and
frequency pair, the split ``V_h = W_O,h W_V,g``) are null directions of ``J``: conjugate gradients from zero never
move along them, and the damping keeps the step bounded. Averaging over many answers is what beats their rounding:
with ``m`` numbers for ``P`` unknowns, the fitted function's error is about the rounding times ``√(P/m)``.

:func:`~.polish_hook.polish_extraction` is the learners' hook: after their stages, when the functional check's error
is above a target, the polish runs on fresh sequences and its model is kept only when a fresh check improves.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.learners.core.conjugate_gradients import conjugate_gradients
from attnprobe.models.positional import PositionalAttention, rotation_pairs, t5_buckets
from attnprobe.models.positional_gauge import balanced

#: lengths of the fresh sequences (cycled), up to the longest the check reads
POLISH_LENGTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64, 128, 256)
#: Levenberg–Marquardt rounds, conjugate-gradient steps per round
ROUNDS, CG_STEPS = 12, 60
#: the learners' hook: fewer rounds of longer conjugate-gradient solves (LLaMA d = 128 from the learner's 1.9e-8:
#: 3 × 300 steps reach 7.4e-9 in 208 s, 6 × 100 steps 1.0e-8 in 164 s; docs/positional.md)
HOOK_ROUNDS, HOOK_CG_STEPS = 4, 300
#: the matrix-free polish's work cap (sequences × unknowns × rounds × conjugate-gradient steps; each step's products
#: cost about sequences × unknowns × mean length): past it the steps per round and then the rounds are cut, never
#: below :data:`LEAST_STEPS` (LLaMA d = 128, 8/2, float32: 1,988 sequences × 63,496 unknowns × 8 × 300 did not finish
#: within 1,300 s; 1,300 sequences × 4 rounds × 60 steps took the start's 4.2e-4 to 7.4e-5 in 170 s;
#: docs/positional.md, "The polish's cost")
POLISH_WORK = 3e10
#: the fewest rounds and conjugate-gradient steps per round the work cap leaves
LEAST_STEPS = (4, 60)
#: the largest Jacobian (numbers × unknowns) the polish forms densely; past it, conjugate gradients
DENSE_LIMIT = 4e7
#: the dampings tried per round with a dense Jacobian (relative to the unit-scaled columns' squared singular values)
LADDER = (1e-14, 1e-11, 1e-8, 1e-5, 1e-2, 1.0)
#: a Jacobian column this much smaller than the median column is null (left out of the dense step)
NULL_COLUMN = 1e-9
#: the fitted arrays besides the position term
WEIGHTS = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
#: the bias arrays by the letter a family's config names them with (``biases``: "qkv" for Qwen2, "" for LLaMA)
BIAS_ARRAYS = {"q": "bq", "k": "bk", "v": "bv", "o": "bo"}
#: a round whose cost falls by less than this fraction ends the polish (unless a caller asks for every round)
MIN_GAIN = 1e-3
#: when the learners' hook polishes: ``auto`` when the check's error is above the target, ``always``, ``never``
POLISH_MODES = ("auto", "always", "never")
#: the check error (relative RMS) above which ``auto`` polishes
POLISH_TARGET = 1e-9
#: the check's lengths when the result has no check to copy them from
CHECKED = (1, 2, 8, 64, 256)
#: fresh sequences per ⌈unknowns / K⌉ (the fewest whose answers hold as many numbers as the unknowns)
POLISH_SEQUENCES = 2


def capped_steps(sequences: int, unknowns: int, rounds: int, cg_steps: int, work: float = POLISH_WORK,
                 least: tuple[int, int] = LEAST_STEPS) -> tuple[int, int]:
    """``(rounds, cg_steps)`` within the work cap ``sequences·unknowns·rounds·cg_steps ≤ work`` (:data:`POLISH_WORK`):
    the conjugate-gradient steps cut first, then the rounds, neither below ``least`` (nor raised)."""
    per = max(1.0, float(sequences) * float(unknowns))
    cg = max(min(cg_steps, least[1]), min(cg_steps, int(work // (per * rounds))))
    return max(min(rounds, least[0]), min(rounds, int(work // (per * cg)))), cg


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


@contextmanager
def one_torch_thread():
    """torch on one thread inside (the polishes' many small products: threads only contend), as it was after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fitted_names(model: PositionalAttention, frequencies: bool = False, held=()) -> tuple[str, ...]:
    """The arrays the polish fits: the weights and biases (less the biases ``held`` at zero), and the position
    term's own numbers (RoPE frequencies only when ``frequencies``)."""
    unknown = sorted(set(held) - set(BIAS_ARRAYS.values()))
    if unknown:
        raise ConfigError(f"only biases can be held at zero ({', '.join(BIAS_ARRAYS.values())}); got "
                          f"{', '.join(unknown)}", param="held")
    extra = {"alibi": ("slopes",), "t5": ("rel_bias",), "rope": ("inv_freq",) if frequencies else ()}
    return tuple(n for n in WEIGHTS if n not in held) + extra.get(model.position, ())


def absent_biases(oracle) -> tuple[str, ...]:
    """The bias arrays the layer behind ``oracle`` declares it has not — a Hugging Face folder's family and config
    declare the letters of those it has (``biases``: "" for LLaMA, "qkv" for Qwen2) — which the polish holds at
    zero: a fitted q or k bias the layer lacks is not the layer (under RoPE neither cancels in the softmax), and
    ``export`` refuses it. ``()`` when the oracle declares nothing (every bias fitted)."""
    from attnprobe.oracles.wrappers import declared_attribute

    letters = declared_attribute(oracle.fn, "biases", accept=lambda v: isinstance(v, str))
    return () if letters is None else tuple(name for letter, name in BIAS_ARRAYS.items() if letter not in letters)


def held_at_zero(model: PositionalAttention, held) -> PositionalAttention:
    """``model`` with the bias arrays ``held`` set to zero (validated as :func:`fitted_names` does)."""
    fitted_names(model, held=held)
    return replace(model, **{n: None for n in held}) if held else model


def polish(model: PositionalAttention, data, *, frequencies: bool = False, rounds: int = ROUNDS,
           cg_steps: int = CG_STEPS, only: tuple[str, ...] | None = None,
           relative: bool = False, held=()) -> tuple[PositionalAttention, PolishReport]:
    """Fit every parameter of ``model`` to the answers ``data`` (list of ``(X, Y)``, last positions) by
    Levenberg–Marquardt (module docstring); ``only``: fit these arrays of :func:`fitted_names` alone, the others
    held (a staged fit: the logit maps with the value maps held); ``relative``: each length's residuals relative to
    its answers' spread (:func:`length_weights`); ``held``: biases held at zero (:func:`absent_biases`). The
    start's gauge scales are balanced first
    (:func:`~attnprobe.models.positional_gauge.balanced`). Returns the polished model (float64) and a
    :class:`PolishReport`. Runs torch on one thread (many small products: threads only contend)."""
    with one_torch_thread():
        return _fit(held_at_zero(model, held), data, frequencies, rounds, cg_steps, only, relative, held)


def _fit(model, data, frequencies, rounds, cg_steps, only=None, relative=False, held=()):
    import torch

    names = fitted_names(model, frequencies, held)
    if only is not None:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"the polish fits {', '.join(names)}; cannot fit {', '.join(unknown)}", param="only")
        names = tuple(n for n in names if n in only)
    # the same function, its gauge scales balanced where both arrays are fitted: a better-conditioned Jacobian
    free = set(names) | set(held)  # a bias held at zero stays zero under any gauge scale
    model = balanced(model, keys={"Wq", "Wk", "bq", "bk"} <= free, values={"Wv", "Wo", "bv"} <= free)
    fixed = {n: torch.as_tensor(np.array(getattr(model, n), dtype=np.float64))
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
        parts = {**fixed, **{n: v.reshape(shapes[n]) for n, v in parts.items()}}
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
        if not moved or gain < MIN_GAIN:
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


#: seed of :func:`_block_sizes`' random probes (torch's global generator would make two runs of one command differ)
PROBE_SEED = 0


def _block_sizes(residual, p, sizes):
    """Per fitted array, the inverse RMS size of its Jacobian columns (one random probe each); 0 (held) for a null
    array (below :data:`NULL_COLUMN` of the largest: rounding, as in :func:`marquardt_step`)."""
    import torch

    out, at = [], 0
    apply, _ = _normal_equations(residual, p, torch.ones_like(p))
    probes = torch.Generator().manual_seed(PROBE_SEED)  # the same probes every run: the polish is reproducible
    for n in sizes:
        v = torch.zeros_like(p)
        v[at:at + n] = torch.randn(n, dtype=p.dtype, generator=probes)
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
