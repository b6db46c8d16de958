"""RoPE layers with q/k/v biases (Qwen2) from bfloat16 every-position rows: a *zero token* read from the answers
(docs/positional.md, "bfloat16 answers", "Qwen2 (q/k/v biases) from every-position rows").

The bias-free row stages (:mod:`.span_sweep`, the row logits, :mod:`.row_polish`) need zero tokens: logit 0 at every
offset and no value. With biases a zero token carries the key bias's logit ``q̃ᵀ R(δ) b_K`` and the value bias. A
token ``x₀`` with every group's key **and value** zero (``W_K,g x₀ + b_K,g = 0``, ``W_V,g x₀ + b_V,g = 0``:
``2·G·d_h`` equations, ``d − 2·G·d_h`` free dimensions; :mod:`.neutral` zeroes the keys alone) turns the layer on
``u = x − x₀`` into a bias-free one but for a query bias ``b' = W_Q x₀ + b_Q`` and the output bias ``b_O`` (none in
Qwen2): its copies are zero tokens and a sequence of them answers ``b_O``. The value half matters at bfloat16: the
rows are rounded relative to their size, and with the keys' half alone (Qwen2 d = 64, 4/1) a sequence of copies
answers a constant ~1.1× the output bias's norm, the span's gap (:func:`~.value_span.value_span`) closes and the
value maps come out 9 … 28 % off, against 0.7 … 1.1 % with both halves (measured: docs).

1. **the value half** (:func:`zero_value_token`) — one token weighs 1, ``y = M x + c``: ``x_v = −M⁺ c`` off ``M``'s
   kernel (from the values stage, no query).
2. **the key half** (:func:`neutral_token`) — inside ``M``'s kernel (the values stay zero), Levenberg–Marquardt on the
   residual of the *identical-token probe* (:func:`identical_token_residual`): ``N`` copies of ``x₀``, token ``j``
   moved by ``s·u_j``. At ``s = 0`` every token is ``x₀`` (every value the same), so row ``i``'s odd slope in ``s``
   is exactly ``Σ_h Σ_{j≤i} a_h(i, j) V_h u_j``, with ``a_h(i, j)`` the weights among ``i + 1`` copies —
   ``1/(i + 1)`` in every head when the copies' logits ``q̃_h(x₀)ᵀ R(δ) k_g(x₀)`` do not change with the offset
   (``k_g(x₀) = 0``), so the slope is ``M ū_i`` (``ū_i`` the mean move so far). The Jacobian in ``x₀`` by central
   differences along the kernel, formed again every few steps.

What the probe does not see: a key residual in the slowest frequency pairs, whose logits barely change over the
probe's offsets (their part of every logit is a row constant). The sweep's longer offsets see some of it (docs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.positional import coarse
from attnprobe.models.positional import PositionalAttention

#: what the bfloat16 refusals of q/k biases name (docs/positional.md, "The every-row route with biases"): measured
#: with benchmarks/research/qwen2_rows_route.py
ROWS_RESULT = ("the every-row route with biases (a token with every key and value zero read from the rows, the stages "
               "behind it, mapped back; the slow pairs' signs tested again after the hook's polish) reads Qwen2 "
               "d = 128, 8/2 to 1.4e-2 … 1.7e-2 of its float64 module at every length (check 2.1e-2 … 2.2e-2 against "
               "the answers, claim 3e-2)")
#: the probe's sequence length, move patterns, Chebyshev steps per sign and longest move (of √d per unit entry)
PROBE_LENGTH, PATTERNS, NODES, MOVE = 256, 4, 4, 1.0
#: the last token's kernel offset's entries (its query: a row whose weights tell a zero key from a zero query)
QUERY_SCALE = 1.5
#: Levenberg–Marquardt steps, the Jacobian's difference step (token units) and how often it is formed again
STEPS, DIFFERENCE, REFRESH = 8, 0.2, 3
#: the dampings tried at each step (fractions of the Jacobian's largest singular value)
DAMPINGS = (0.0, 1e-2, 1e-1, 1.0)


def zero_value_token(M: np.ndarray, c: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``x_v`` with ``M x_v + c = 0`` (every group's value zero when ``c`` is ``Σ_h W_O,h b_V,g``), orthogonal to the
    rows of ``kernel`` (M's kernel: the key half moves there)."""
    x = -np.linalg.pinv(M, rcond=1e-3) @ c
    return x - kernel.T @ (kernel @ x)


def probe_moves(rng: np.random.Generator, patterns: int, length: int, kernel: np.ndarray,
                query_scale: float = QUERY_SCALE):
    """The probe's moves ``U (P, N, d)`` (every token but the last, summing to zero) and each pattern's last token's
    offset ``z`` in ``M``'s kernel (entries of size ``query_scale``; value zero): the query the last row asks."""
    d = kernel.shape[1]
    U = rng.standard_normal((patterns, length, d)) / math.sqrt(d)
    U[:, -1] = 0.0
    U[:, :-1] -= U[:, :-1].mean(axis=1, keepdims=True)
    Z = rng.standard_normal((patterns, len(kernel))) @ kernel * query_scale
    return U, Z


def identical_token_residual(oracle, x0: np.ndarray, U: np.ndarray, Z: np.ndarray, M: np.ndarray, *,
                             move: float = MOVE, nodes: int = NODES) -> np.ndarray:
    """The identical-token probe's residual (module docstring, step 2) at ``x0`` for the moves ``U (P, N, d)`` and last
    tokens ``x0 + Z`` (:func:`probe_moves`): every row's odd slope less ``M ū_i`` (the last row's: itself, the moves
    summing to zero), relative to the moves' ``‖M u‖``: (P, N, K), the last row weighted by ``√N``. Asks
    ``2·nodes·P`` sequences of ``N`` tokens."""
    P, N, d = U.shape
    u = coarse.chebyshev_nodes(nodes)
    step = move * math.sqrt(d)
    X = np.broadcast_to(np.asarray(x0, dtype=np.float64), (2, nodes, P, N, d)).copy()
    X[:, :, :, -1] += Z
    for s, sign in enumerate((1.0, -1.0)):
        X[s] += sign * step * u[:, None, None, None] * U
    Y = np.asarray(oracle.answer_rows(X.reshape(-1, N, d)), dtype=np.float64).reshape(2, nodes, P, N, -1)
    K = Y.shape[-1]
    slope = coarse.odd_slope(((Y[0] - Y[1]) / 2).reshape(nodes, P, N * K), u, min(2 * nodes - 1, coarse.DEGREE))
    L = slope.reshape(N, K, P).transpose(2, 0, 1) / step
    F = L - (np.cumsum(U, axis=1) / np.arange(1, N + 1)[None, :, None]) @ M.T
    F[:, -1] *= math.sqrt(N)
    return F / np.linalg.norm(U @ M.T) * math.sqrt(P * N)


def neutral_token_queries(d: int, rank: int, *, steps: int = STEPS, patterns: int = PATTERNS, nodes: int = NODES,
                          refresh: int = REFRESH) -> int:
    """Sequences :func:`neutral_token` asks at most (it stops early when no damping lowers the residual) for a kernel of
    ``d − rank`` rows (``rank = G·d_h``): each probe residual ``2·nodes·patterns``, one at the start, the Jacobian's
    two a kernel row every ``refresh`` steps and one a damping each step."""
    jacobians = -(-steps // refresh)
    return 2 * nodes * patterns * (1 + 2 * (d - rank) * jacobians + len(DAMPINGS) * steps)


def neutral_token(oracle, M: np.ndarray, c: np.ndarray, kernel: np.ndarray, rng: np.random.Generator, *,
                  steps: int = STEPS, length: int = PROBE_LENGTH, patterns: int = PATTERNS,
                  difference: float = DIFFERENCE, refresh: int = REFRESH, move: float = MOVE,
                  query_scale: float = QUERY_SCALE, log=None):
    """``x₀`` with every group's key and value zero (module docstring), from ``M``, ``c`` (the values stage) and the
    rows of ``kernel`` (M's kernel, ``d − G·d_h`` of them). Refused in one line when the kernel leaves no room past
    the keys' ``G·d_h`` equations (``d ≤ 2·G·d_h``: the value half then fixes ``x₀`` whole, ~5× the tokens' norm at
    Qwen2 d = 32, 4/2, and its rows are rounded far above their signal). ``query_scale`` 0: no query row (its
    residual then also vanishes where queries, not keys, are zero: measured, docs). Returns ``x₀`` and what was
    measured: the probe's residual before and after, the steps taken, the sequences asked."""
    d = M.shape[1]
    rank = d - len(kernel)
    if len(kernel) <= rank:
        raise UnidentifiableError(
            f"RoPE with q/k/v biases from bfloat16 rows: a token with every key and value zero takes 2·G·d_h = "
            f"{2 * rank} equations of d = {d} (no room past the keys' {rank}: measured at Qwen2 d = 32, 4/2, the "
            "value maps 9.5 … 20 % off behind the truth's own token); not recovered at bfloat16")
    before = oracle.queries
    U, Z = probe_moves(rng, patterns, length, kernel, query_scale)

    def residual(x):
        return identical_token_residual(oracle, x, U, Z, M, move=move).ravel()

    x0 = zero_value_token(M, c, kernel)
    F = residual(x0)
    first, taken = float(np.linalg.norm(F)), 0
    for it in range(steps):
        if it % refresh == 0:
            J = np.array([(residual(x0 + difference * e) - residual(x0 - difference * e)) / (2 * difference)
                          for e in kernel]).T
            left, s, right = np.linalg.svd(J, full_matrices=False)
        g = left.T @ F
        best = (float(np.linalg.norm(F)), None, None)
        for lam in DAMPINGS:
            step = -(right.T @ (g * s / (s ** 2 + (lam * s[0]) ** 2))) @ kernel
            Ft = residual(x0 + step)
            if np.linalg.norm(Ft) < best[0]:
                best = (float(np.linalg.norm(Ft)), step, Ft)
        if best[1] is None:
            break
        x0, F, taken = x0 + best[1], best[2], it + 1
        if log is not None:
            log(f"neutral token step {taken}: probe residual {best[0]:.3e}")
    return x0, {"probe_residual": (first, float(np.linalg.norm(F))), "steps": taken,
                "sequences": oracle.queries - before}


def biased_row_value_maps(oracle, heads: int, rng: np.random.Generator, *, M: np.ndarray, c: np.ndarray, log=None,
                          value_options: dict | None = None, **probe):
    """Every ``V_h`` (H, K, d) of a layer with q/k/v biases from every-position rows: :func:`neutral_token`, then
    :func:`~.span_sweep.row_value_maps` on the rows of the tokens shifted by it (``shift_inputs``; a sequence of
    copies answers ``M x₀ + c``). Returns ``V``, ``x₀`` (the later stages run on the same shifted rows, their model
    mapped back by :func:`shifted_back`) and what was measured. ``probe``: :func:`neutral_token`'s
    settings; ``value_options``: :func:`~.span_sweep.row_value_maps`' beyond its defaults."""
    from attnprobe.learners.positional import coarse_bias
    from attnprobe.learners.positional.span_sweep import row_value_maps
    from attnprobe.oracles.subspace import shift_inputs

    kernel = coarse_bias.coarse_kernel(M, heads)
    x0, found = neutral_token(oracle, M, c, kernel, rng, log=log, **probe)
    V, info = row_value_maps(shift_inputs(oracle, x0, name="shifted by a zero token"), heads, rng, M=M, c=c + M @ x0,
                             **(value_options or {}))
    return V, x0, {**info, "neutral_token": found}


def shifted_back(model: PositionalAttention, x0: np.ndarray) -> PositionalAttention:
    """A model learned on inputs ``u = x − x₀`` as a model of ``x``: every projection's bias moves by ``−W x₀``."""
    def moved(W, b):
        return (0 if b is None else b) - np.einsum("gkd,d->gk", W, x0)
    return dataclasses.replace(model, bq=moved(model.Wq, model.bq), bk=moved(model.Wk, model.bk),
                               bv=moved(model.Wv, model.bv))
