"""RoPE attention (LLaMA, Mistral: rotary, GQA, no biases) from last-position output rows (docs/positional.md).

``f(X) = Σ_h V_h Σ_j α_hj x_j + c`` with ``α_h = softmax_j(x_Nᵀ B_h(j − N) x_j)``, ``B_h(δ) = Qᵀ_h R(δ) K_h``.

1. **values** — ``[±x] ↦ ±M x + c`` with ``M = Σ_h V_h`` (2d queries).
2. **offsets** — the zero-key pair probe (:mod:`.heads`): moving two keys apart changes the answer only when the
   logits depend on the offset (reported as ``offset_signal``); its rank is H and Jennrich's method gives each
   head's direction ``V_h z``; nearby queries span each head's output space ``C_h``.
3. **heads' values** — the spaces ``C_h`` split ``M``: ``V_h = C_h G_h``.
4. **logits** — in a head's own coordinates an answer is ``Σ_j α_hj G_h x_j``: with fewer nonzero tokens than
   ``d_h`` the weights come out exactly, and ``log α_hk/α_hN`` is the logit difference. Keys ``±ρ x`` at a set of
   offsets up to the longest sequence give ``zᵀ B_h(δ) x`` (2 queries per (z, x) pair, every offset at once); a
   query basis against ``r`` random keys and ``r`` random queries against a key basis sketch every ``B_h(δ)``.
5. **rotation** — :mod:`.rotation`: the shared row and column spaces, the rotation's eigen-angles, far offsets to
   refine them, hence ``B_h(δ)`` for every δ.

Identifiable and returned: per head and frequency pair, ``W_Q`` and ``W_K`` up to a scaled rotation of the pair
(the returned factors fix one), the frequencies, ``V_h = W_O,h W_V,h`` (returned as ``W_O,h = C_h`` and
``W_V,h = G_h``), and ``c`` (as ``b_O``). Heads sharing keys and values (GQA) are returned as independent heads
(the same function); the groups found are reported.

With q/k biases (``key_bias``: Qwen2) stage 2 moves one key inside the kernel of ``M`` instead of two zero keys apart
(:func:`~.heads.key_jacobian`: rank H whatever the biases; with a value map per head and no kernel, the additive
route's zero-query pencil), and stage 4 also returns ``b_Q`` (half-sums over ``±z``) and ``b_K`` (half-sums over
the keys' signs, :func:`fit_key_bias`) in the factors' gauge; ``b_V`` is a constant of the output, in ``c``.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError, UnidentifiableError
from attnprobe.learners.positional.heads import (BIASES_REFUSED, LEVELS, STEP, head_directions, key_jacobian,
                                                 match)
from attnprobe.learners.positional.rotation import RotaryFactors, factor_rotary
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.positional.method import CHECK_LENGTHS, METHOD
from attnprobe.models.positional import PositionalAttention

#: offsets whose logit matrices are sketched (the two nearest give the pair bases; the far ones refine the angles)
OFFSETS = (-1, -2, -3, -4, -6, -8, -12, -16, -24, -32, -64)
#: sketch width beyond the head dimension
OVERSAMPLE = 8
#: query scales of the pair probe and the step between nearby queries
SETTINGS, NEARBY = ((1.0, 0), (1.5, 0), (1.0, 8), (1.5, 8)), 0.4
#: the pair probe's settings when every query has rms 1 (``unit_queries``: a norm in front of the attention fixes
#: the query's scale, docs/block.md): zero keys alone separate the heads
UNIT_SETTINGS = ((1.0, 0), (1.0, 4), (1.0, 8), (1.0, 16))
#: the pair probe's key step with unit queries (relative to √d): answers through a block carry ~1e-12 errors, so a
#: longer step (Richardson's extrapolation keeps the truncation at O(η⁶)) than float64 answers need
UNIT_STEP = 0.01
#: queries of the walk per ⌈K/H⌉ (more queries span each head's output space better: the function error at d = 128
#: fell from 2.9e-8 to 1.7e-8 going from 1 to 3, docs/positional.md)
WALK = 1
#: target size of the median logit difference in the logits stage
TARGET_LOGIT = 1.5
#: the largest key rms of the logits stage with unit queries (keys inside an RMSNorm's ball: rows of rms < 1)
UNIT_KEY_RMS = 0.5
#: the same for the keys' odd part with q/k biases (Qwen2 d = 128, 8/2, seed 0, dense heads: the function 5.3e-8
#: off at 1.5, 8.3e-9 at 16; docs/positional.md, "Q/K biases")
BIASED_TARGET_LOGIT = 16.0
#: the pair probe's change, relative to the answer, below which the logits do not depend on the offset (finite
#: differences of float64 answers are good to ~1e-11 of it; RoPE layers measured 1e-2)
SIGNAL_FLOOR = 1e-8
#: the coarsest answers the learner reads (float64's machine epsilon and a little)
FINEST = 1e-15
#: the coarsest answers the float32 route reads (:mod:`.coarse`)
COARSEST = 1e-6
#: the coarsest answers any RoPE route reads: bfloat16 (:mod:`.bfloat16`, its result held to its claim)
BFLOAT16_ROUNDING = 2.0**-7  # its machine epsilon (the gap after 1)
#: numbers per batch of long sequences sent at once (memory: 8 bytes each)
BATCH_TOKENS = 1 << 23


def coarse_refusal(precision: str, rounding: float) -> str:
    """The one-line refusal of answers coarser than bfloat16 or noisy (docs/positional.md, "Coarse answers"): the
    zero-key probes (the float32 route's pair probe, the bfloat16 route's sweep) read exact rounding only."""
    return (f"the RoPE learner reads answers rounded to bfloat16 or finer, without noise; these are {precision} "
            f"(rounding {rounding:.1e}), which its zero-key probes do not read (docs/positional.md, "
            "\"Coarse answers\")")


def _coarse_route(oracle, rounding: float, **kw):
    """The route for coarse answers: float32 (:mod:`.coarse`) or, coarser, bfloat16 (:mod:`.bfloat16`)."""
    if rounding > COARSEST:
        from attnprobe.learners.positional.bfloat16 import extract_bfloat16_positional

        return extract_bfloat16_positional(oracle, **kw)
    from attnprobe.learners.positional.coarse import extract_coarse_positional

    return extract_coarse_positional(oracle, **kw)


def _values(oracle, rng, rho):
    d = oracle.d
    P = rho * random_orthogonal(d, rng)
    y = oracle(np.concatenate([P, -P])[:, None, :])
    M = ((y[:d] - y[d:]) / 2).T @ P / rho**2
    c = (y[:d] + y[d:]).mean(axis=0) / 2
    return M, c


def attention_weights(Pc: np.ndarray, G: np.ndarray, toks: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Each head's weights on the nonzero tokens ``toks (B, T, d)`` (T ≤ d_h) of answers ``Y (B, K)`` (``c``
    removed): in head h's coordinates ``Pc_h Y = Σ_j α_hj G_h x_j``, solved by least squares. (B, H, T)"""
    out = []
    step = 4096
    for i in range(0, len(Y), step):
        coords = np.einsum("hjk,bk->bhj", Pc, Y[i:i + step])  # (B, H, d_h)
        A = np.einsum("hjd,bnd->bhjn", G, toks[i:i + step])  # (B, H, d_h, T)
        out.append(np.einsum("bhnj,bhj->bhn", np.linalg.pinv(A), coords))
    alpha = np.concatenate(out)
    if np.any(alpha <= 0):
        raise RecoveryError("a head's attention weight came out ≤ 0 in the logits stage; the heads' output spaces "
                            "found by the pair probe are not the layer's")
    return alpha


def positional_queries(d: int, H: int, head_dim: int, *, outputs: int | None = None, heads_known: bool = True,
                       oversample: int = OVERSAMPLE, walk_only: bool = False, walk: int = WALK,
                       query_bias: bool = False) -> int:
    """Queries the learner asks (the check apart): values 2d; the pair probe, 2·LEVELS queries per direction and
    setting, on ``2H + 8`` directions at the first query (32 when H is not given; with key biases at most that) and
    ``H + 4`` at each of the ``walk·⌈K/H⌉ + 4`` queries of the walk (``walk_only``: those alone); 8 to calibrate
    the logits, and the two sketches ``4d(d_h + oversample)`` (twice with ``query_bias``: ``±z``)."""
    K = outputs or d
    per = 2 * LEVELS * len(SETTINGS)
    first = min(d, 2 * (H if heads_known else 12) + 8)
    if walk_only:  # the walk's queries (a halved step asks its query again)
        return per * (H + 4) * (walk * math.ceil(K / H) + 4)
    return (2 * d + per * first + per * (H + 4) * (walk * math.ceil(K / H) + 4) + (16 if query_bias else 8)
            + 4 * d * (head_dim + oversample) * (2 if query_bias else 1))


def _biased_rows_result(applies: bool) -> str:
    """What the bfloat16 refusal of q/k biases adds: the every-position rows' research result."""
    from attnprobe.learners.positional.bias_rows import ROWS_RESULT
    return "; q/k biases at this precision: " + ROWS_RESULT if applies else ""


def extract_positional(oracle, *, heads=None, seed=0, check=True, progress=None, offsets=OFFSETS,
                       oversample: int = OVERSAMPLE, walk: int = WALK, query_rms: float | None = None,
                       query_bias: bool = False, key_bias: bool = False):
    """Recover a RoPE attention layer from its last-position output rows (module docstring); ``walk``: queries of
    the pair probe's walk per ⌈K/H⌉ (:data:`WALK`); ``query_rms``: every query token (the last row) of this rms
    exactly, the scales carried by the keys (an oracle behind an RMSNorm, whose queries cannot be rescaled:
    docs/block.md); ``query_bias``: the queries may carry a bias (keys must not: :mod:`.neutral` shifts the
    tokens by a neutral key first): the pair probe keeps the query's scale fixed and the sketches ask ``±z``, whose
    half-sum is the bias's term, fitted as ``b_Q``; ``key_bias``: keys and queries may carry biases (Qwen2): the
    heads are read through the kernel of ``M`` (:func:`~.heads.key_jacobian`), and the key bias from the sketches'
    half-sums over the keys' signs (:func:`fit_key_bias`)."""
    if not (isinstance(walk, int) and walk >= 1):
        raise ConfigError(f"walk must be an integer ≥ 1; got {walk!r}", param="walk")
    d = oracle.d
    before = oracle.queries
    with oracle.phase("precision"):  # a float64 module rounding inside (a float32 softmax) is read as float32
        oracle.read_kernel_rounding()
    asked = {"precision": oracle.queries - before}
    noise = max(oracle.eps, 1e-16)
    if noise > FINEST or not oracle.noise.exact:
        kind = oracle.precision if oracle.noise.exact else f"noisy {oracle.precision}"
        if noise > BFLOAT16_ROUNDING or not oracle.noise.exact:
            raise UnidentifiableError(coarse_refusal(kind, noise))
        biased = query_bias or key_bias
        if query_rms is not None or tuple(offsets) != OFFSETS or oversample != OVERSAMPLE or (
                biased and noise > COARSEST):
            raise UnidentifiableError(f"these answers are {kind} (rounding {noise:.1e}): the RoPE route for them "
                                      "(learners/positional/coarse.py, bfloat16.py) reads heads with free query "
                                      "scales and its own offsets only (q/k biases from float32 answers only), not "
                                      "unit queries" + (", q/k biases" if noise > COARSEST else "") +
                                      " or given offsets" + _biased_rows_result(biased and noise > COARSEST))
        return _coarse_route(oracle, noise, heads=heads, seed=seed, check=check, progress=progress,
                             asked_before=asked, **({"biases": True} if biased else {}))
    run = Run(oracle, METHOD, seed=seed, check=check, check_lengths=CHECK_LENGTHS, progress=progress,
              asked_before=asked)
    guess = heads or 8
    run.plan(positional_queries(d, guess, max(2, d // guess), heads_known=heads is not None, walk=walk,
                                query_bias=query_bias or key_bias),
             f"the positional learner at d={d}", at_least=heads is None)
    rng = run.rng
    offsets = tuple(sorted({int(o) for o in offsets}, reverse=True))
    if offsets[:2] != (-1, -2):
        raise RecoveryError("the offsets must start with -1 and -2 (the pair bases come from their ratio)")
    unit_queries = query_rms is not None
    query_bias = query_bias or key_bias
    rho = math.sqrt(d) * (query_rms or 1.0)  # tokens with entries of order one
    with run.phase("values"):
        M, c = _values(oracle, rng, rho)
    K = M.shape[0]
    if K < 2:
        raise UnidentifiableError("the positional learner reads whole output rows (K ≥ 2 outputs per sequence)")
    kernel = value_kernel(M, heads) if key_bias else None
    with run.phase("offsets"):
        if key_bias and kernel is None:  # a value map per head: the zero-query pencil separates them (additive.py)
            Cb, G, signal = _zero_query_heads(oracle, M, rng, heads, noise)
        else:
            dirs, signal = _pair_probe(oracle, M, rng, heads, noise, walk, query_rms=query_rms,
                                       query_bias=query_bias, kernel=kernel)
            Cb, G, _ = _output_spaces(dirs, M, (d // dirs[0].shape[1]) if unit_queries else None)
    H, dh = G.shape[:2]
    with run.phase("logits"):
        Xs, Ys, Om, rho_l, bias, even = _sketches(oracle, rng, Cb, G, c, np.array(offsets), dh + oversample,
                                                  query_rms=query_rms, query_bias=query_bias, key_bias=key_bias)
    Wq, Wk, thetas, steps, bq, bk = [], [], [], [], [], []
    for h in range(H):
        U = _basis(np.concatenate(list(Xs[h]), axis=1), dh)
        V = _basis(np.concatenate(list(Ys[h]), axis=1), dh)
        Mk = {int(o): U.T @ Xs[h, k] @ np.linalg.pinv(V.T @ Om[k].T) for k, o in enumerate(offsets)}
        f = factor_rotary(Mk, U, V, -1, -2)
        Wq.append(f.Q.T)
        Wk.append(f.K)
        thetas.append(f.theta)
        if bias is not None:  # b_hᵀ R(δ_k) K_h Ω_k[a]ᵀ = the sketch's query-bias term, every offset and key
            A = np.concatenate([(f.rotation(o) @ f.K @ Om[k].T).T for k, o in enumerate(offsets)])
            bq.append(np.linalg.lstsq(A, bias[:, h].T.reshape(-1), rcond=None)[0])
        if key_bias:
            bk.append(fit_key_bias(f, bq[-1], offsets, even[0], even[1][:, h]))
        steps.append(float(np.linalg.norm(f.matrix(-1) - f.matrix(0)) / np.linalg.norm(f.matrix(0))))
    thetas = np.array(thetas)
    theta = thetas.mean(axis=0)
    model = PositionalAttention(np.array(Wq), np.array(Wk), G, Cb, bq=np.array(bq) if bq else None,
                                bk=np.array(bk) if bk else None, bo=c,
                                position="rope", inv_freq=theta,
                                layout="half", scale=1.0, causal=True)
    spread = float(np.max(np.abs(thetas - theta) / theta))
    details = {"heads": H, "head_dim": dh, "offset_signal": signal, "offsets": list(offsets),
               "theta": theta.tolist(), "theta_spread": spread, "base_estimate": _base(theta),
               "offset_change": steps, "token_scale": rho_l, "kv_groups": _groups(model)}
    notes = [f"offset dependence detected: moving two keys apart changed the answer by {signal:.1e} of its size; "
             f"‖B_h(−1) − B_h(0)‖/‖B_h(0)‖ = {min(steps):.2f} … {max(steps):.2f}"]
    if key_bias:  # the key probe moves one key: its signal is not an offset's; the logit matrices' change is
        details["offset_signal"] = max(steps)
        if max(steps) <= SIGNAL_FLOOR:
            raise UnidentifiableError(f"the logits do not depend on the offset between positions (‖B_h(−1) − "
                                      f"B_h(0)‖/‖B_h(0)‖ ≤ {max(steps):.1e}); use the multihead learner")
        notes = [f"offset dependence detected: ‖B_h(−1) − B_h(0)‖/‖B_h(0)‖ = {min(steps):.2f} … {max(steps):.2f}; "
                 "query and key biases read (the heads through " + ("the kernel of the value maps)" if kernel is
                                                                     not None else "the zero-query weights)")]
    unknowns = PositionalAttention.unknowns(d, H, len(set(details["kv_groups"])), dh, K, bias=query_bias)
    return run.finish(model, unknowns=unknowns, details=details, notes=notes)


def _pair_probe(oracle, M, rng, heads, noise, walk, *, query_rms=None, query_bias=False, kernel=None):
    """Stage 2: the heads' directions ``V_h z`` along a walk of queries (:mod:`.heads`) and the offset signal;
    refuses offset-free answers and answers with more directions than bias-free heads show. ``kernel``: rows
    spanning the kernel of ``M``; the probe then moves one key inside it (:func:`~.heads.key_jacobian`)."""
    d, K = oracle.d, M.shape[0]
    z0 = rng.standard_normal(d)
    unit_queries = query_rms is not None
    # a query bias turns the probe's rows with the query's scale: only the zero keys may change between settings
    settings = UNIT_SETTINGS if unit_queries or query_bias else SETTINGS
    if unit_queries:
        z0 *= query_rms * math.sqrt(d) / np.linalg.norm(z0)
    want = 2 * (heads or 12) + 8
    if kernel is None:
        E, jacobian = random_orthogonal(d, rng)[: min(d, want)], None
    else:
        E, jacobian = random_orthogonal(len(kernel), rng)[: min(len(kernel), want)] @ kernel, key_jacobian
    probe = {} if jacobian is None else {"jacobian": jacobian}
    eta = (UNIT_STEP if unit_queries else STEP) * math.sqrt(d)
    base = np.linalg.norm(M @ z0)
    W0, s, H = head_directions(oracle, z0, E, settings=settings, eta=eta, rank=heads, noise=noise, rng=rng,
                               floor=SIGNAL_FLOOR * base, **probe)
    signal = float(s[0] / base) if base > 0 else 0.0
    if W0 is None:
        raise UnidentifiableError(f"the answers do not depend on the offset between positions (moving two keys apart "
                                  f"changed the answer by {signal:.1e} of its size); use the multihead learner")
    if H >= min(K, len(E)):
        if kernel is not None:
            raise RecoveryError(f"moving one key inside the kernel of the value maps changed the answer in {H} "
                                f"independent directions (of {len(E)} probed), more than a sum of softmax heads "
                                "shows: not a sum of RoPE heads with shared keys and values")
        raise RecoveryError(f"moving two keys apart changed the answer in {H} independent directions, more than a "
                            f"sum of softmax heads without biases shows; {BIASES_REFUSED}")
    E = E[: H + 4]
    dirs = [W0]
    z = z0
    for _ in range(walk * math.ceil(K / H) + 4):  # a walk: each query near the last keeps the labels and spans C_h well
        q = rng.standard_normal(d)
        step = NEARBY
        while True:  # a step too long to keep the labels is halved (ambiguous matches are refused in match)
            znew = z + step * q * np.linalg.norm(z0) / np.linalg.norm(q)
            znew *= np.linalg.norm(z0) / np.linalg.norm(znew)
            W, _, _ = head_directions(oracle, znew, E, settings=settings, eta=eta, rank=H, noise=noise, rng=rng,
                                      **probe)
            try:
                dirs.append(match(dirs[-1], W))
                break
            except RecoveryError:
                if step < NEARBY / 8:
                    raise
                step /= 2
        z = znew
    return dirs, signal


def _output_spaces(dirs, M, head_dim=None):
    """Stage 3: each head's output space ``C_h`` (the span of its directions), stacked ``Cb (K, H·d_h)``, and the
    token images ``G_h`` with ``V_h = C_h G_h`` (the split of ``M``); ``head_dim``: the spaces' dimension when
    known (unit queries, through a block: the answers' ~1e-12 errors leave singular values above the gap's
    threshold, so each head keeps its ``d/H`` largest, LLaMA's head width)."""
    H, K = dirs[0].shape[1], M.shape[0]
    C = []
    for h in range(H):
        Uh, sh, _ = np.linalg.svd(np.stack([w[:, h] for w in dirs], axis=1), full_matrices=False)
        C.append(Uh[:, :head_dim] if head_dim else Uh[:, sh > sh[0] * 1e-7])
    dims = [x.shape[1] for x in C]
    if len(set(dims)) != 1 or sum(dims) > K:
        raise RecoveryError(f"the heads' output spaces have dimensions {dims} (sum {sum(dims)} for K = {K} outputs); "
                            "they must be equal and fit in the output row")
    dh = dims[0]
    Cb = np.concatenate(C, axis=1)
    return Cb, np.linalg.pinv(Cb).reshape(H, dh, K) @ M, dh


def _sketches(oracle, rng, Cb, G, c, offs, r, *, query_rms=None, query_bias=False, key_bias=False):
    """Stage 4: the token scale, then ``X_k = B_h(δ_k) Ω_kᵀ`` (a query basis against ``r`` random keys per offset)
    and ``Y_k = B_h(δ_k)ᵀ Zᵀ`` (``r`` random queries against a key basis) for every head, from the log-ratios of
    the weights solved in each head's coordinates. Returns ``Xs, Ys (H, m, d, r)``, ``Ω (m, r, d)``, the scale,
    and with ``query_bias`` the bias's term ``b_hᵀ R(δ_k) K_h Ω_k[a]ᵀ`` (r, H, m) and the half-sums over the keys'
    signs with their query tokens ``(Z (B, d), (B, H, m))`` (:func:`fit_key_bias`) (else None, None); with
    ``key_bias`` the token scale is set on the keys' odd part of the log-ratios (8 more sequences)."""
    d, K = oracle.d, Cb.shape[0]
    H, dh = G.shape[:2]
    m = len(offs)
    if m + 1 > dh:
        raise RecoveryError(f"{m} offsets need heads of dimension ≥ {m + 1}; this layer's heads have {dh}")
    Pc = np.linalg.pinv(Cb).reshape(H, dh, K)
    N = int(-offs.min()) + 1
    pos = N - 1 + offs

    def log_ratios(Z, keys):
        """``log α_hk/α_hN`` (B, H, m) for queries ``Z (B, d)`` and keys ``keys (B, m, d)`` at the offsets."""
        chunk = max(1, BATCH_TOKENS // (N * d))
        out = []
        for i in range(0, len(Z), chunk):
            X = np.zeros((len(Z[i:i + chunk]), N, d))
            X[:, pos] = keys[i:i + chunk]
            X[:, -1] = Z[i:i + chunk]
            out.append(oracle(X) - c)
        toks = np.concatenate([keys, Z[:, None]], axis=1)
        la = np.log(attention_weights(Pc, G, toks, np.concatenate(out)))
        return la[..., :-1] - la[..., -1:]

    unit_queries = query_rms is not None
    Zc = rng.standard_normal((8, d))
    if unit_queries:
        Zc *= query_rms * math.sqrt(d) / np.linalg.norm(Zc, axis=1, keepdims=True)
    kc = 0.5 if unit_queries else 1.0  # keys of rms 1/2 (inside an RMSNorm's ball); logits are linear in them
    Kc = kc * rng.standard_normal((8, m, d))
    lr = log_ratios(Zc, Kc)
    if key_bias or unit_queries:  # the key bias's terms (and a fixed query's self-logit) do not grow with the keys:
        lr = (lr - log_ratios(Zc, -Kc)) / 2  # the scale from the keys' odd part alone
    med = float(np.median(np.abs(lr))) / kc
    rho = float(np.clip(math.sqrt((BIASED_TARGET_LOGIT if key_bias else TARGET_LOGIT) / max(med, 1e-12)), 1e-3, 1e3))
    Qb = random_orthogonal(d, rng)
    Om = rng.standard_normal((m, r, d)) / math.sqrt(d)
    Zs = rng.standard_normal((r, d)) / math.sqrt(d)
    # the query's scale and the keys' (their product ρ² is what the logits see): with unit queries the query has
    # the rms query_rms and the keys carry the rest: keys of rms TARGET_LOGIT/med (at most UNIT_KEY_RMS), whose
    # odd logits are of order one (keys of ρ²/(√d·rms), 1/d of that, read every head's weight off a share of
    # the answer 1/d of the query's and its logit matrices ~1e-3 off through a block at d = 128, measured)
    rq = query_rms * math.sqrt(d) if unit_queries else rho
    if unit_queries:
        rk = min(TARGET_LOGIT / max(med, 1e-12), UNIT_KEY_RMS) * math.sqrt(d)
        rho = math.sqrt(rq * rk)
    else:
        rk = rho**2 / rq
    if unit_queries:
        Zs *= 1 / np.linalg.norm(Zs, axis=1, keepdims=True)
    # (a) query basis q_i against keys ±Ω[k, a]; (b) random queries Z[a] against keys ±q_j (shifted per offset)
    Za = np.repeat(Qb, r, axis=0) * rq  # (d·r, d)
    Ka = np.tile(Om.transpose(1, 0, 2), (d, 1, 1)) * rk  # (d·r, m, d)
    shift = (np.arange(d)[:, None] + np.arange(m)[None]) % d  # (d, m): basis index per key slot
    Zb = np.repeat(Zs, d, axis=0) * rq  # (r·d, d)
    Kb = np.tile(Qb[shift], (r, 1, 1)) * rk  # (r·d, m, d)
    Zall, Kall = np.concatenate([Za, Za, Zb, Zb]), np.concatenate([Ka, -Ka, Kb, -Kb])
    ell = log_ratios(Zall, Kall)  # (B, H, m)
    n = d * r
    bias = keys_even = None
    if query_bias:  # the bias's term is the same for ±z: half the difference is bilinear, the half-sum the bias's
        flip = log_ratios(-Zall, Kall)
        halves = [(e[:n] + e[n:2 * n]) / 2 for e in (ell, flip)] + [(e[2 * n:3 * n] + e[3 * n:]) / 2
                                                                       for e in (ell, flip)]
        keys_even = np.concatenate([Za, -Za, Zb, -Zb]), np.concatenate(halves)
        ell, even = (ell - flip) / 2, (ell + flip) / 2
        bias = rq * ((even[:n] - even[n:2 * n]) / (2 * rho**2)).reshape(d, r, H, m).mean(axis=0)  # (r, H, m)
    ea = (ell[:n] - ell[n:2 * n]) / (2 * rho**2)
    eb = (ell[2 * n:3 * n] - ell[3 * n:]) / (2 * rho**2)
    Xs = np.einsum("id,iahk->hkda", Qb, ea.reshape(d, r, H, m))  # (H, m, d, r): B(δ_k) Ω_kᵀ
    Ys = np.einsum("jkd,ajhk->hkda", Qb[shift], eb.reshape(r, d, H, m))  # (H, m, d, r): B(δ_k)ᵀ Zᵀ
    return Xs, Ys, Om, rho, bias, keys_even


def value_kernel(M: np.ndarray, heads: int | None) -> np.ndarray | None:
    """Rows spanning the kernel of ``M = Σ_h V_h`` (exact to float64: length-1 answers hold no softmax rounding),
    the inputs no head's value map sees (the key probe of :func:`~.heads.key_jacobian` moves a key inside it: heads
    sharing keys and values, ``G·d_h < d``); None when it has fewer than ``H + 4`` dimensions."""
    _, s, Vt = np.linalg.svd(M)
    r = int(np.sum(s > s[0] * 1e-10))
    return Vt[r:] if M.shape[1] - r >= (heads or 1) + 4 else None


def _zero_query_heads(oracle, M, rng, heads, noise):
    """The heads' output spaces of RoPE with q/k biases and a value map per head (no kernel of ``M`` to probe in):
    the zero-query Jacobians' pencil of the additive route, whose weights are ``softmax_δ(b_Qᵀ R(δ) b_K)`` here
    (:func:`~.additive.zero_query_heads`); refused naming both when the biases do not separate the heads."""
    from attnprobe.learners.positional.additive import zero_query_heads

    r = int(np.linalg.matrix_rank(M, tol=1e-10 * np.linalg.norm(M, 2)))
    try:
        Cb, G, signal, _ = zero_query_heads(oracle, M, rng, heads, noise, step=STEP, levels=LEVELS)
    except (RecoveryError, UnidentifiableError) as exc:
        raise type(exc)(f"RoPE with key biases: the value maps have rank {r} of d = {M.shape[1]} (no kernel with "
                        f"H + 4 dimensions to move a key in: no key/value sharing with G·d_h < d), and the "
                        f"zero-query weights did not separate the heads either: {exc}") from exc
    return Cb, G, signal


def fit_key_bias(f: RotaryFactors, bq: np.ndarray, offsets, Z: np.ndarray, even: np.ndarray) -> np.ndarray:
    """A head's key bias ``b_K`` (d_h,) in the gauge of ``f``: the sketches' half-sums over the keys' signs are
    ``e_k = q̃ᵀ(R(δ_k) − I) b_K − q̃ᵀK z`` (``q̃ = Qᵀz + b_Q``; the query's own logit subtracted), linear in
    ``b_K``: least squares over every query ``Z (B, d)`` and offset (``even (B, m)``). The coordinates no offset
    rotates cancel in the softmax and come out 0."""
    q = Z @ f.Q + bq  # (B, d_h)
    A = np.concatenate([q @ (f.rotation(o) - np.eye(len(bq))) for o in offsets])
    rhs = np.concatenate([even[:, k] + np.einsum("bi,ib->b", q, f.K @ Z.T) for k in range(len(offsets))])
    return np.linalg.lstsq(A, rhs, rcond=None)[0]


def _basis(A: np.ndarray, rank: int) -> np.ndarray:
    U, _, _ = np.linalg.svd(A, full_matrices=False)
    return U[:, :rank]


def _base(theta: np.ndarray) -> float | None:
    """The RoPE base fitted to ``θ_k = base^(−2k/d_h)`` (None when the angles are not geometric to 1e-6)."""
    h = len(theta)
    k = np.arange(h)
    slope, icpt = np.polyfit(2 * k / (2 * h), np.log(theta), 1)
    fit = np.exp(icpt + slope * 2 * k / (2 * h))
    if np.max(np.abs(fit / theta - 1)) > 1e-6 or abs(icpt) > 1e-6:
        return None
    return float(np.exp(-slope))


def _groups(model: PositionalAttention) -> list[int]:
    """Heads whose key row spaces and value row spaces agree (GQA groups), as a group index per head."""
    H = model.H
    labels = [-1] * H
    nxt = 0
    for h in range(H):
        if labels[h] >= 0:
            continue
        labels[h] = nxt
        for g in range(h + 1, H):
            if labels[g] < 0 and _same_rows(model.Wk[h], model.Wk[g]) and _same_rows(model.Wv[h], model.Wv[g]):
                labels[g] = nxt
        nxt += 1
    return labels


def _same_rows(A: np.ndarray, B: np.ndarray, tol: float = 1e-6) -> bool:
    Qa = np.linalg.qr(A.T)[0]
    return bool(np.linalg.norm(B.T - Qa @ (Qa.T @ B.T)) <= tol * np.linalg.norm(B))
