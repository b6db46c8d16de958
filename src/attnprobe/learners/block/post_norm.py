"""Post-norm (BERT) blocks, ``y = n2(h + F(h))`` with ``h = n1(x + A(X))``: the stages a learner has so far
(docs/block.md, "Post-norm blocks"), each checked against a transformers ``BertLayer`` and MiniLM layer 2 in
``tests/test_post_norm_stages.py`` and measured in ``benchmarks/post_norm_stages.py``.

- ``output norm`` (:func:`output_norm`): n2's weight (the sign gauge fixed by ``Σ w > 0``) and bias from the
  answers' rows (:func:`.levers.output_layernorm`), ``4(d + 3)`` single tokens.
- ``first-norm centre`` (:func:`first_norm_centre`): a single token attends to itself, so its n1 input is the
  affine map ``K x + c`` (``K = I + Σ_h W_O,h W_V,h``, ``c`` the value and output biases) and its answer
  ``g(x) = G(n1(K x + c))`` depends on ``x`` only through the direction of ``P(K x + c)`` (``P`` the centring; ε
  aside). So every Jacobian ``J = g'(x₀)`` (central differences, ``2d`` single tokens) is blind to the ray from the
  centre ``x*`` (``P(K x* + c) = 0``) through ``x₀`` and to ``K⁻¹1``: ``J x* = J x₀``, stacked over a few points
  and solved by least squares, near the centre again; then Newton steps along rays: a token ``x̂ + R u`` answers
  like ``x̂ + 10R u + 9w`` where ``w`` is the centre's error, so ``g'(x̂ + 10Ru) w = (g(x̂ + Ru) − g(x̂ + 10Ru))/9``
  reads ``w`` from answer differences (the Jacobians' own error multiplies only ``w``; R = 1: the ε effect
  ``~ε/2R`` is the floor). ``x*`` (up to ``K⁻¹1``, returned too) is free of the ones-direction gauges
  (``W_O + 1vᵀ``, ``b_O + c1``).
- ``first-norm input`` (:func:`first_norm_input`): the whole affine map ``K``, ``c`` up to those gauges. In the
  sequence ``[b + s e, b]`` the second row's n1 input is ``K b + c + (s/2) V e + O(s²)`` (two equal keys weigh ½
  each whatever the logits; ``V = K − I``), i.e. that of the single token ``b + (s/2) K⁻¹V e``: its derivative in
  ``s`` is ``g'(b)(I − K⁻¹)e/2``. With ``g'(b)`` from single tokens, ``I − K⁻¹`` follows by least squares over two
  tokens ``b`` (each ``g'(b)`` is blind to its own ray; only ``K⁻¹1`` stays free: the ones gauge); then
  ``c = −K x*``. The residual's identity fixes the scale of ``K`` (single tokens alone fix ``K`` only up to any
  linear map, which the unknown FFN behind the norm could absorb). Then every n1 input ``v`` is reachable: the
  token ``K⁻¹(v − c)`` (:meth:`FirstNormInput.token`), tiny ones (``|v| ~ √ε``) inside n1's ball — the door to
  the FFN stage.
- the lever toward the attention (:func:`pair_curvature`, not a stage yet): the same pair's second order in ``s``
  carries the heads' logits, ``v₂(s) = K b + c + (s/2) V e + (s²/4) Σ_h β_h V_h e + O(s³)`` with
  ``β_h = (W_Q,h b + b_Q,h)ᵀ W_K,h e / √d_h`` (the softmax's ``σ(t) = ½ + t/4 + …``): with ``p = ½K⁻¹V e`` and
  ``r`` the single token's second-order term, ``y₂'' = g''(b)[p, p] + 2 g'(b) r``, both read from answers;
  :func:`logit_value_matrix` fits it, affine in b, over d + 8 tokens b: the rank-H matrix
  ``Σ_h (V_h e)(W_Q,hᵀ W_K,h e)ᵀ/√d_h`` for one direction e.
- ``attention`` (:mod:`.post_norm_attention`): the heads' value maps and logits through the FFN and both norms,
  each answered row traced back to its n1 input.
- ``neurons``, ``ffn`` (the FFN behind n2's per-row scale, on n1's sphere): the neurons from first derivatives on
  the sphere (:mod:`.post_norm_neurons`), then every row's scale, n1's weight, the second layer and the joint bias
  as one null vector (:mod:`.post_norm_ffn`), and the assembled block polished jointly (:mod:`.post_norm_polish`).

:mod:`.post_norm_learner` chains them all (``extract_block`` on a block told apart as post-norm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.block.levers import output_layernorm

#: relative step of the central differences (float64 answers: truncation ``h²`` against rounding ``1e-16/h``)
STEP = 1e-5
#: single tokens of the output norm stage per d + 3 (twice as many were not always enough: a random post-norm
#: block at d = 16 failed the fit from 38 rows at three seeds and passed from 76, measured)
ROWS = 4
#: how far the output norm stage's rows may be from mean 0 and rms 1 once read through the fitted LayerNorm
#: (ε = 1e-12 against var u ~ 0.5: ~1e-12; measured 2e-11 on MiniLM layer 2's weights)
SPHERE = 1e-8
#: (radius, points) of the centre's rounds: first around random tokens of rms 1, then near the estimate
ROUNDS = ((None, 3), (1e-1, 3), (1e-1, 3))
#: (radius R, steps) of the centre's Newton steps along rays (tokens at R and 10R)
RAY_NEWTON = (1.0, 1)
#: single tokens b of the first-norm input stage
INPUT_POINTS = 2
#: the stacked Jacobians' second-smallest singular value must exceed this share of the largest (one blind
#: direction, ``K⁻¹1``, common to all; more means the answers do not come from one affine map then a norm)
GAP = 1e-9


def centred_unit(V: np.ndarray) -> np.ndarray:
    """Rows of ``V`` (or the vector ``V``) centred and scaled to rms 1 (LayerNorm without weight, bias or ε)."""
    V = V - V.mean(axis=-1, keepdims=True)
    return V / np.sqrt(np.mean(V * V, axis=-1, keepdims=True))


def single_tokens(answer_rows, X: np.ndarray) -> np.ndarray:
    """The answers (B, d) to the single tokens ``X`` (B, d)."""
    return np.asarray(answer_rows(np.asarray(X, dtype=np.float64)[:, None, :]), dtype=np.float64)[:, 0]


def output_norm(answer_rows, d: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Stage ``output norm``: ``(w2, b2)`` of n2 from ``4(d + 3)`` single tokens of rms 1, the sign gauge fixed by
    ``Σ w2 > 0`` (negating ``w2`` is the post-norm sign gauge, ``models.block.flip_post_norm_sign``); refused
    (one line, naming the stage) when the rows do not lie on one LayerNorm's surface."""
    Y = single_tokens(answer_rows, rng.standard_normal((ROWS * (d + 3), d)))
    try:
        w, b = output_layernorm(Y)
    except ConfigError as exc:
        raise UnidentifiableError(f"stage output norm: {exc}") from exc
    except ValueError as exc:  # the fitted sphere's squared scale came out negative
        raise UnidentifiableError("stage output norm: the answers' rows lie on no LayerNorm's sphere (the fitted "
                                  "scale is imaginary): the last norm's ε is not negligible or it is not a "
                                  "LayerNorm") from exc
    Z = (Y - b) / w
    off = max(float(np.abs(Z.mean(axis=1)).max()), float(np.abs(np.sqrt(np.mean(Z**2, axis=1)) - 1).max()))
    if not off <= SPHERE:
        raise UnidentifiableError(f"stage output norm: the answers' rows, read through the fitted LayerNorm, are "
                                  f"{off:.1e} off mean 0 and rms 1: the last norm's ε is not negligible or it is "
                                  "not a LayerNorm")
    return (w if w.sum() > 0 else -w), b


def single_token_jacobian(answer_rows, x0: np.ndarray, step: float) -> np.ndarray:
    """``g'(x₀)`` (d × d) of the single-token map by central differences of step ``step`` (2d single tokens)."""
    d = x0.size
    E = np.eye(d) * step
    y = single_tokens(answer_rows, np.concatenate([x0 + E, x0 - E]))
    return (y[:d] - y[d:]).T / (2 * step)


@dataclass(frozen=True)
class FirstNormCentre:
    """``centre``: a token whose n1 input ``K x + c`` is a multiple of the ones vector (orthogonal to
    ``ones_preimage``); ``ones_preimage``: the unit ``K⁻¹1`` (up to sign); ``misfit``: the last round's relative
    residual of ``J x* = J x₀``; ``gap``: the stacked Jacobians' second-smallest singular value over the largest;
    ``queries``: single tokens asked."""

    centre: np.ndarray
    ones_preimage: np.ndarray
    misfit: float
    gap: float
    queries: int


def _centre_round(answer_rows, points: np.ndarray, radius: float):
    A, b = [], []
    for x0 in points:
        J = single_token_jacobian(answer_rows, x0, STEP * radius)
        s = np.linalg.norm(J)
        A.append(J / s)
        b.append(J @ x0 / s)
    A, b = np.concatenate(A), np.concatenate(b)
    _, sv, Vt = np.linalg.svd(A, full_matrices=False)
    n = Vt[-1]
    x = np.linalg.lstsq(A, b, rcond=None)[0]
    x -= (x @ n) * n
    misfit = float(np.linalg.norm(A @ x - b) / np.linalg.norm(b))
    return x, n, misfit, float(sv[-2] / sv[0])


def first_norm_centre(answer_rows, d: int, rng, rounds=ROUNDS, newton=RAY_NEWTON) -> FirstNormCentre:
    """Stage ``first-norm centre`` (module docstring): ``Σ points·2d`` single tokens over ``rounds`` (radius None:
    random tokens of rms 1; else tokens at that rms around the last estimate), then ``newton[1]`` Newton steps
    along three rays at radius ``newton[0]`` (``3(2d + 2)`` single tokens each). Refused (one line) when the
    stacked Jacobians are blind to more than one direction (:data:`GAP`): not one affine map then a LayerNorm."""
    x, queries = None, 0
    for radius, points in rounds:
        U = rng.standard_normal((points, d))
        U /= np.sqrt(np.mean(U**2, axis=1, keepdims=True))
        pts = U if radius is None or x is None else x + radius * U
        x, n, misfit, gap = _centre_round(answer_rows, pts, 1.0 if radius is None else radius)
        queries += 2 * d * points
        if gap < GAP:
            raise UnidentifiableError(f"stage first-norm centre: the single-token map's Jacobians are blind to more "
                                      f"than one common direction (second-smallest singular value {gap:.1e} of the "
                                      "largest): not an affine map then a LayerNorm")
    radius, steps = newton
    for _ in range(steps):
        x = x - _ray_step(answer_rows, x, n, radius, rng)
        queries += 3 * (2 * d + 2)
    return FirstNormCentre(x, n, misfit, gap, queries)


def _ray_step(answer_rows, x, n, radius: float, rng, ratio: float = 10.0, rays: int = 3) -> np.ndarray:
    """The centre's error ``w`` (orthogonal to ``n``): ``x̂ + R u`` answers like ``x̂ + ratio·R u + (ratio − 1) w``."""
    A, b = [], []
    for u in rng.standard_normal((rays, x.size)):
        far = x + ratio * radius * u / np.sqrt(np.mean(u**2))
        J = single_token_jacobian(answer_rows, far, STEP * ratio * radius)
        y = single_tokens(answer_rows, np.stack([x + (far - x) / ratio, far]))
        s = np.linalg.norm(J)
        A.append(J / s)
        b.append((y[0] - y[1]) / ((ratio - 1) * s))
    w = np.linalg.lstsq(np.concatenate(A), np.concatenate(b), rcond=None)[0]
    return w - (w @ n) * n


@dataclass(frozen=True)
class FirstNormInput:
    """The single token's n1 input ``x ↦ K x + c`` up to the ones-direction gauges (``K + 1aᵀ``, ``c + γ1``):
    ``K`` (d × d), ``c`` (d,); ``misfit``: the relative residual of ``g'(b)(I − K⁻¹) = 2·∂_s``; ``queries``."""

    K: np.ndarray
    c: np.ndarray
    misfit: float
    queries: int

    def token(self, v: np.ndarray) -> np.ndarray:
        """Tokens (B, d) whose n1 inputs are the rows of ``v`` (B, d) up to the ones vector."""
        return np.linalg.solve(self.K, (np.asarray(v, dtype=np.float64) - self.c).T).T


def pair_derivative(answer_rows, b: np.ndarray, step: float) -> np.ndarray:
    """``∂_s y_2([b + s e_k, b])`` at ``s = 0`` for every coordinate k (d × d), central differences (2d sequences of
    length 2)."""
    d = b.size
    E = np.eye(d) * step
    X = np.stack([np.concatenate([b + E, b - E]), np.tile(b, (2 * d, 1))], axis=1)
    y = np.asarray(answer_rows(X), dtype=np.float64)[:, 1]
    return (y[:d] - y[d:]).T / (2 * step)


def first_norm_input(answer_rows, centre: FirstNormCentre, rng, points: int = INPUT_POINTS) -> FirstNormInput:
    """Stage ``first-norm input`` (module docstring): ``points·4d`` queries (a Jacobian of single tokens and the
    pair derivative at each of ``points`` tokens b of rms 1). ``K`` in the gauge where ``I − K⁻¹`` has no component
    along ``K⁻¹1``; ``c = −K x*``."""
    d = centre.centre.size
    A, R = [], []
    for b in rng.standard_normal((points, d)):
        b /= np.sqrt(np.mean(b**2))
        J = single_token_jacobian(answer_rows, b, STEP)
        s = np.linalg.norm(J)
        A.append(J / s)
        R.append(2 * pair_derivative(answer_rows, b, STEP) / s)
    A, R = np.concatenate(A), np.concatenate(R)
    Q = np.linalg.lstsq(A, R, rcond=None)[0]
    n = centre.ones_preimage
    Q -= np.outer(n, n @ Q)
    misfit = float(np.linalg.norm(A @ Q - R) / np.linalg.norm(R))
    K = np.linalg.inv(np.eye(d) - Q)
    return FirstNormInput(K, -K @ centre.centre, misfit, points * 4 * d)


#: step of :func:`pair_curvature`'s five-point second differences (truncation ``h⁴``, rounding ``1e-16/h²``)
CURVATURE_STEP = 1e-2
_FIVE = np.array([-1.0, 16.0, -30.0, 16.0, -1.0]) / 12


def pair_curvature(answer_rows, affine: FirstNormInput, b: np.ndarray, e: np.ndarray,
                   step: float = CURVATURE_STEP) -> np.ndarray:
    """``Σ_h β_h(b, e) V_h e`` (d,), ``β_h = (W_Q,h b + b_Q,h)ᵀ W_K,h e/√d_h``, up to the span of the token's n1
    input ``K b + c`` and the ones vector (what ``g'(b)`` is blind to), from the pair ``[b + s e, b]``'s second
    row at five ``s``, single tokens along ``p = ½K⁻¹(K − I)e`` at five more and ``g'(b)`` (``2d``): ``10 + 2d``
    queries. The logits' lever toward the attention stage (module docstring)."""
    b, e = np.asarray(b, dtype=np.float64), np.asarray(e, dtype=np.float64)
    d, K = b.size, affine.K
    s = step * np.array([2.0, 1.0, 0.0, -1.0, -2.0])
    pairs = np.stack([np.stack([b + t * e, b]) for t in s])
    y2 = _FIVE @ np.asarray(answer_rows(pairs), dtype=np.float64)[:, 1] / step**2
    p = 0.5 * np.linalg.solve(K, (K - np.eye(d)) @ e)
    gpp = _FIVE @ single_tokens(answer_rows, b + s[:, None] * p) / step**2
    J = single_token_jacobian(answer_rows, b, STEP)
    r = np.linalg.lstsq(J, (y2 - gpp) / 2, rcond=1e-10)[0]
    return 4 * K @ r


def logit_value_matrix(answer_rows, affine: FirstNormInput, e: np.ndarray, rng, points: int | None = None):
    """``(P A_e, P a_e)`` with ``A_e = Σ_h (V_h e)(ℓ_h(e))ᵀ``, ``ℓ_h(e) = W_Q,hᵀ W_K,h e/√d_h`` (rank H: the heads'
    value directions and logit forms) and ``a_e = Σ_h V_h e (b_Q,hᵀ W_K,h e)/√d_h``: :func:`pair_curvature` is
    ``A_e b + a_e`` up to ``γ_b (K b + c) + δ_b 1``, so over ``points`` tokens b (default d + 8) the centred
    ``Π_b(A_e b + a_e) = Π_b·curvature`` (``Π_b`` off that span) fixes ``(A_e, a_e)`` up to ``γ(K, c)`` and the ones
    gauge; γ is where ``A_e + γK`` drops to its rank: the repeated eigenvalue (``d − H`` of d) of
    ``(PK)⁺ P A_e``, read as the median. ``points·(10 + 2d)`` queries; a dense least squares over ``d² + d``
    unknowns, so small d only (MiniLM's 147,840 would need ``γ_b, δ_b`` eliminated instead: not built)."""
    K, c = affine.K, affine.c
    d = K.shape[0]
    e = np.asarray(e, dtype=np.float64)
    rows, rhs = [], []
    for b in rng.standard_normal((points or d + 8, d)):
        Q = np.linalg.qr(np.stack([K @ b + c, np.ones(d)], axis=1))[0]
        Pi = np.eye(d) - Q @ Q.T
        rows.append(np.hstack([Pi @ np.kron(b[None], np.eye(d)), Pi]))
        rhs.append(Pi @ pair_curvature(answer_rows, affine, b, e))
    sol = np.linalg.lstsq(np.concatenate(rows), np.concatenate(rhs), rcond=1e-12)[0]
    A, a = sol[:d * d].reshape(d, d, order="F"), sol[d * d:]
    P = np.eye(d) - 1.0 / d
    gamma = -float(np.median(np.linalg.eigvals(np.linalg.pinv(P @ K) @ P @ A).real))
    return P @ (A + gamma * K), P @ (a + gamma * c)
