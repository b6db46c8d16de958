"""The joint polish on every-position rows, streamed over chunks of sequences (docs/positional.md, "The polish at
LLaMA-3-8B's size").

A causal layer answers N rows per sequence of length N (row i is its last-position answer on ``X[:i+1]``), and
computing all N rows costs about what the last one costs: the keys and values of every token are needed either
way, and the queries and output map of N rows are the same products as the keys'. So a fit on every-position rows
needs ~N-fold fewer sequences and ~N-fold less arithmetic for the same number of answered numbers.

:class:`StreamedRows` is the least-squares problem ``r(p) = w ⊙ (f_p(X) − Y)`` over every row of the data, with the
products the Gauss–Newton step needs — the cost ``‖r‖²``, ``Jᵀr``, ``Jv``, ``Jᵀu`` and ``JᵀJv`` — computed chunk by
chunk (``chunk_rows`` rows at a time, summed; ``JᵀJv`` from one forward pass with dual numbers and one backward),
so memory is bounded by a chunk, the answers and the parameter vectors, never by the data's graph. The model keeps
its factored storage throughout (``W_Q`` per head ``d_h × d``, ``W_K`` and ``W_V`` per key/value group, ``W_O``):
no ``d × d`` matrix per head is formed. :func:`polish_rows` is Levenberg–Marquardt on it, the step of
:func:`~.polish.polish` (a dense ladder of dampings for a small Jacobian, else conjugate gradients on the
Jacobi-scaled normal equations, damping raised until the cost falls), with progress reported.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from attnprobe.learners.core.conjugate_gradients import conjugate_gradients
from attnprobe.errors import ConfigError
from attnprobe.learners.core.estimate import duration
from attnprobe.learners.positional.polish import (CG_STEPS, DENSE_LIMIT, LADDER, MIN_GAIN, NULL_COLUMN, ROUNDS,
                                                  PolishReport, fitted_names, held_at_zero, length_weights,
                                                  marquardt_step, one_torch_thread)
from attnprobe.models.positional import PositionalAttention, rotation_pairs, t5_buckets
from attnprobe.models.positional_gauge import balanced

#: rows per chunk of the streamed products: a chunk's graph, not the data, bounds the memory
CHUNK_ROWS = 1024
#: the precisions a chunk can be computed in
COMPUTE = ("float64", "float32")
#: the length of the fresh sequences (each answers every row up to it: the check's lengths 1 … 256)
ROW_LENGTH = 256
#: seconds per multiply–add of the rows' forward pass that one conjugate-gradient step (``JᵀJv`` over every row: a
#: dual-number forward pass and a backward) takes here, per chunk precision: float32 measured at d = 2048 (23.7 s
#: for 10,496 rows of 11.5 M multiply–adds; docs/benchmarks/positional-precision.md, "the row polish's cost"),
#: float64 twice that (d = 1024 under load: 11.1 s against float32's 6.6 s; the matrix products' own ratio is 2.1)
STEP_SECONDS_PER_MAC = {"float32": 2.0e-10, "float64": 4.0e-10}
#: the polish's memory: bytes per fitted number (float64 parameter vectors — the start, the step, the conjugate
#: gradients' four, the products' copies), per chunk row and score (a chunk's graph), and the interpreter's own;
#: fitted to the measured peaks at d = 512, 1024, 2048 (660, 1,132, 2,660 MB) within 10 %
BYTES_PER_UNKNOWN, BYTES_PER_SCORE, BASE_BYTES = 160, 10, 450 * 2**20


@dataclass(frozen=True)
class RowPolishPlan:
    """What :func:`polish_rows` on fresh every-position answers will take: ``sequences`` of ``length`` tokens
    (``rows`` rows), ``unknowns`` fitted numbers, ``steps`` Jacobian products (``rounds · (cg_steps + 1)``: a
    round's gradient and cost evaluations cost about one), expected ``seconds`` and ``peak_bytes`` (the model of
    :data:`STEP_SECONDS_PER_MAC` and :data:`BYTES_PER_UNKNOWN`; the victim's own time and memory apart)."""

    sequences: int
    length: int
    rows: int
    unknowns: int
    steps: int
    seconds: float
    peak_bytes: int
    compute: str

    def describe(self) -> str:
        return (f"the row polish: {self.sequences} sequences × {self.length} tokens ({self.rows} rows) for "
                f"{self.unknowns} fitted numbers, {self.steps} Jacobian products of about "
                f"{self.seconds / max(1, self.steps):.3g} s each ({self.compute}): about {duration(self.seconds)}, "
                f"peak memory about {self.peak_bytes / 2**30:.1f} GiB")


def row_polish_plan(d: int, heads: int, kv_heads: int, outputs: int | None = None, *, rows: int | None = None,
                    rounds: int = ROUNDS, cg_steps: int = CG_STEPS, chunk_rows: int = CHUNK_ROWS,
                    compute: str = "float64", length: int = ROW_LENGTH, per: float = 2) -> RowPolishPlan:
    """The plan of :func:`polish_rows` on a layer of width ``d`` with ``heads`` query heads of width ``d/heads``,
    ``kv_heads`` key/value groups and ``outputs`` K (default d): ``rows`` fresh rows (default ``per ·
    ⌈unknowns/K⌉``, the numbers' information limit ``per`` times over) in sequences of ``length``; ``rounds`` of
    ``cg_steps``. Asks nothing."""
    if compute not in COMPUTE:
        raise ConfigError(f"compute must be one of {', '.join(COMPUTE)}; got {compute!r}", param="compute")
    if heads < 1 or d % heads or heads % max(1, kv_heads):
        raise ConfigError(f"the {heads} heads must divide d = {d} and split into {kv_heads} key/value groups",
                          param="heads")
    K = outputs or d
    dh = d // heads
    unknowns = heads * dh * d + 2 * kv_heads * dh * d + K * heads * dh + heads * dh + 2 * kv_heads * dh + K
    rows = rows or int(math.ceil(per * math.ceil(unknowns / K)))
    sequences = int(math.ceil(rows / length))
    rows = sequences * length
    mac_per_row = d * (heads + 2 * kv_heads) * dh + heads * dh * K + 2 * heads * dh * length
    steps = rounds * (cg_steps + 1)
    seconds = steps * rows * mac_per_row * STEP_SECONDS_PER_MAC[compute]
    width = 4 if compute == "float32" else 8
    peak = (BASE_BYTES + BYTES_PER_UNKNOWN * unknowns + 8 * rows * (d + K)
            + BYTES_PER_SCORE * width * min(chunk_rows, rows) * heads * length)
    return RowPolishPlan(sequences, length, rows, unknowns, steps, seconds, int(peak), compute)


def chunk_precision(precision: str | None) -> str:
    """The precision the row polish computes its chunks in for answers of ``precision``: float32 for answers no
    finer than float32 (their rounding is float32's or coarser: half the time), float64 otherwise."""
    from attnprobe.models.precision import machine_epsilon

    try:
        coarse = precision not in (None, "auto") and machine_epsilon(precision) >= machine_epsilon("float32")
    except (TypeError, ValueError):
        coarse = False
    return "float32" if coarse else "float64"


def fresh_rows(oracle, count: int, rng: np.random.Generator, length: int = ROW_LENGTH, scale: float = 1.0,
               batch: int = 8):
    """``count`` random sequences of ``length`` tokens (standard normal times ``scale``) and the oracle's rows at
    every position (``oracle.answer_rows``), asked ``batch`` sequences at a time: ``[(X (count, N, d),
    Y (count, N, K))]``."""
    if count < 1:
        raise ConfigError(f"the polish needs at least one sequence; got {count}", param="sequences")
    if length < 1:
        raise ConfigError(f"the sequences need at least one token; got length {length}", param="length")
    X = rng.standard_normal((int(count), int(length), oracle.d)) * scale
    Y = np.concatenate([np.asarray(oracle.answer_rows(X[at:at + batch]), dtype=np.float64)
                        for at in range(0, count, batch)])
    return [(X, Y)]


def rows_as_last_positions(data):
    """The same answers as last-position data of a causal layer: row ``i`` of ``X`` is the answer on
    ``X[:, :i+1]`` (one batch per prefix length)."""
    out = []
    for X, Y in data:
        for i in range(X.shape[1]):
            out.append((X[:, :i + 1], Y[:, i]))
    return out


def rows_spread(data) -> float:
    """The answers' spread over every row of ``data`` (``[(X, Y (B, N, K))]``): the root of the summed squares about
    each batch's mean row, what the polishes' misfits are relative to."""
    return math.sqrt(sum(float(((Y - Y.reshape(-1, Y.shape[-1]).mean(0)) ** 2).sum()) for _, Y in data))


def row_weights(data, spread: float) -> list[np.ndarray]:
    """Per batch, a weight per position: :func:`~.polish.length_weights` over the rows grouped by position (row i
    is a last-position answer of length i + 1), so that a row fit weighs its rows as the last-position fit weighs
    the same answers."""
    longest = max(X.shape[1] for X, _ in data)
    groups = [np.concatenate([Y[:, i] for X, Y in data if X.shape[1] > i]) for i in range(longest)]
    w = length_weights([(None, Y) for Y in groups], spread)
    return [np.asarray(w[:X.shape[1]]) for X, _ in data]


class StreamedRows:
    """``r(p) = w ⊙ (f_p(X) − Y)`` over every row of ``data`` (``[(X (B, N, d), Y (B, N, K))]``) for the arrays
    ``names`` of ``model`` (the others held at the model's values), and its Jacobian products, streamed over chunks
    of at most ``chunk_rows`` rows (whole sequences; a longer sequence is a chunk of its own). ``weights``: one
    per position per batch (None: 1). Flat parameter vectors concatenate the arrays in ``names`` order; they stay
    float64, while ``compute`` is the precision a chunk's rows and products are computed in (``float32``: half
    the time and memory, for answers no finer than float32)."""

    def __init__(self, model: PositionalAttention, names, data, *, chunk_rows: int = CHUNK_ROWS, weights=None,
                 compute: str = "float64"):
        import torch

        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ConfigError(f"chunk_rows must be a positive integer; got {chunk_rows!r}", param="chunk_rows")
        if compute not in COMPUTE:
            raise ConfigError(f"compute must be one of {', '.join(COMPUTE)}; got {compute!r}", param="compute")
        self.dtype = getattr(torch, compute)
        if not data:
            raise ConfigError("the polish needs at least one sequence; got none", param="sequences")
        self.model, self.names = model, tuple(names)
        arrays = {n: np.asarray(getattr(model, n), dtype=np.float64) for n in self.names}
        self.shapes = {n: a.shape for n, a in arrays.items()}
        self.sizes = [a.size for a in arrays.values()]
        self.start = torch.as_tensor(np.concatenate([a.ravel() for a in arrays.values()]))
        self.held = {n: torch.as_tensor(np.array(getattr(model, n), dtype=np.float64)).to(self.dtype)
                     for n in fitted_names(model, True) if n not in self.names}
        self.chunks = []
        for b, (X, Y) in enumerate(data):
            if X.ndim != 3 or Y.ndim != 3 or Y.shape[:2] != X.shape[:2]:
                raise ConfigError(f"every-position data must be X (B, N, d) with Y (B, N, K); got {X.shape} and "
                                  f"{Y.shape}", param="data")
            w = np.ones(X.shape[1]) if weights is None else np.asarray(weights[b], dtype=np.float64)
            per = max(1, chunk_rows // X.shape[1])
            for at in range(0, len(X), per):
                self.chunks.append((X[at:at + per], Y[at:at + per], w))
        self.rows = sum(X.shape[0] * X.shape[1] for X, _ in data)
        self.numbers = sum(Y.size for _, Y in data)
        self.sequences = sum(len(X) for X, _ in data)
        self._const: dict = {}

    @property
    def unknowns(self) -> int:
        return int(self.start.numel())

    # --------------------------------------------------------------------------------------- the rows
    def arrays(self, flat) -> dict:
        """The model's arrays with the fitted ones read from ``flat``."""
        import torch

        parts = dict(zip(self.names, torch.split(flat, self.sizes)))
        return {**self.held, **{n: v.reshape(self.shapes[n]) for n, v in parts.items()}}

    def _constants(self, N: int) -> dict:
        import torch

        if N not in self._const:
            m = self.model
            pos = np.arange(N)
            offs = pos[None, :] - pos[:, None]  # δ = j − i
            item = {"positions": torch.as_tensor(pos, dtype=torch.float64)}
            if m.causal:
                item["mask"] = torch.as_tensor(offs > 0)
            if m.position == "t5":
                item["buckets"] = torch.as_tensor(t5_buckets(offs, m.rel_bias.shape[1], m.max_distance,
                                                             m.bidirectional))
            if m.position == "alibi":
                item["offsets"] = torch.as_tensor(offs, dtype=torch.float64)
            if m.position == "rope":
                a, b = rotation_pairs(m.rotary_dim, m.layout)
                partner = np.arange(m.head_dim)
                partner[a], partner[b] = b, a
                sign = np.concatenate([-np.ones(len(a)), np.ones(len(b))])
                item["pairs"] = (torch.as_tensor(partner), torch.as_tensor(np.concatenate([a, b])),
                                 torch.as_tensor(sign))
            self._const[N] = item
        return self._const[N]

    def rows_of(self, p: dict, X):
        """Every row ``(B, N, K)`` of the model with the arrays ``p``, on ``X`` (a float64 tensor), in torch: the
        queries of each key/value group's heads against its one key map (never repeated per head)."""
        import torch

        m = self.model
        B, N, d = X.shape
        H, G, dh = m.H, m.G, m.head_dim
        per = H // G
        c = self._constants(N)
        q = (X @ p["Wq"].reshape(H * dh, d).T).reshape(B, N, H, dh).transpose(1, 2) + p["bq"][None, :, None]
        k = (X @ p["Wk"].reshape(G * dh, d).T).reshape(B, N, G, dh).transpose(1, 2) + p["bk"][None, :, None]
        dv = p["Wv"].shape[1]
        v = (X @ p["Wv"].reshape(G * dv, d).T).reshape(B, N, G, dv).transpose(1, 2) + p["bv"][None, :, None]
        if m.position == "rope":  # query i and key j rotated by their own positions: the score sees R(j − i)
            theta = p["inv_freq"].to(torch.float64) if "inv_freq" in p else torch.as_tensor(np.array(m.inv_freq))
            ang = c["positions"][:, None] * theta[None]  # float64 angles, the rotation in the chunk's precision
            cos, sin = torch.cos(ang).to(X.dtype), torch.sin(ang).to(X.dtype)
            partner, at, sign = c["pairs"]
            C = torch.ones(N, dh, dtype=X.dtype).index_copy(1, at, torch.cat([cos, cos], 1))
            S = torch.zeros(N, dh, dtype=X.dtype).index_copy(1, at, torch.cat([sin, sin], 1) * sign.to(X.dtype))
            q = q * C + q[..., partner] * S
            k = k * C + k[..., partner] * S
        s = m.scale * (q.reshape(B, G, per, N, dh) @ k[:, :, None].transpose(-1, -2))  # (B, G, per, N, N)
        s = s.reshape(B, H, N, N)
        if m.position == "alibi":
            s = s + p["slopes"][:, None, None] * c["offsets"].to(X.dtype)
        elif m.position == "t5":
            s = s + p["rel_bias"][:, c["buckets"]]
        if m.causal:
            s = s.masked_fill(c["mask"], float("-inf"))
        alpha = torch.softmax(s, dim=-1).reshape(B, G, per, N, N)
        ctx = (alpha @ v[:, :, None]).reshape(B, H, N, dv).transpose(1, 2).reshape(B, N, H * dv)
        return ctx @ p["Wo"].T + p["bo"]

    def _chunk_residual(self, chunk):
        import torch

        X, Y, w = chunk
        dt = self.dtype
        Xt = torch.as_tensor(X).to(dt)
        Yt = torch.as_tensor(Y).to(dt)
        wt = torch.as_tensor(w).to(dt)[None, :, None]

        def residual(flat):
            return (wt * (self.rows_of(self.arrays(flat.to(dt)), Xt) - Yt)).reshape(-1)
        return residual

    # ------------------------------------------------------------------------------------ the products
    def residual(self, flat):
        """``r(p)``, every chunk's concatenated (for tests and small problems: its size is the data's)."""
        import torch

        with torch.no_grad():
            return torch.cat([self._chunk_residual(ch)(flat) for ch in self.chunks]).double()

    def cost(self, flat) -> float:
        """``‖r(p)‖²``, streamed."""
        import torch

        total = 0.0
        with torch.no_grad():
            for ch in self.chunks:
                r = self._chunk_residual(ch)(flat)
                total += float(r.double() @ r.double())
        return total

    def gradient(self, flat):
        """``(Jᵀr, ‖r‖²)`` at ``p``, streamed."""
        import torch

        g, total = torch.zeros_like(flat), 0.0
        for ch in self.chunks:
            r, pull = torch.func.vjp(self._chunk_residual(ch), flat)
            g += pull(r.detach())[0]
            total += float(r.detach().double() @ r.detach().double())
        return g, total

    def jvp(self, flat, v):
        """``Jv`` (concatenated over chunks, as :meth:`residual`)."""
        import torch

        return torch.cat([torch.func.jvp(self._chunk_residual(ch), (flat,), (v,))[1] for ch in self.chunks]).double()

    def vjp(self, flat, u):
        """``Jᵀu`` for ``u`` laid out as :meth:`residual`."""
        import torch

        out, at = torch.zeros_like(flat), 0
        for ch in self.chunks:
            f = self._chunk_residual(ch)
            n = ch[1].size
            _, pull = torch.func.vjp(f, flat)
            out += pull(u[at:at + n].to(self.dtype))[0]
            at += n
        return out

    def normal(self, flat, v, chunks=None):
        """``JᵀJv``, chunk by chunk: one forward pass carrying ``v``'s tangent (forward-mode: the rows and ``Jv``
        at once), then ``Jᵀ`` of ``Jv`` by reverse mode through the same graph; ``chunks``: only the first so many
        chunks (a cheap probe). (``torch.func``'s ``jvp`` then ``vjp`` does two forward passes: 1.9× the time.)"""
        import torch

        out = torch.zeros_like(flat)
        for ch in self.chunks[:chunks]:
            r, jv, x = self._with_tangent(ch, flat, v, graph=True)
            out += torch.autograd.grad(r, x, jv)[0]
        return out

    def _with_tangent(self, chunk, flat, v, graph: bool = False):
        """The chunk's residual and its ``Jv`` from one forward pass (dual numbers), and the leaf it hangs on."""
        import torch
        import torch.autograd.forward_ad as fwd

        x = flat.detach().clone().requires_grad_(graph)
        with torch.set_grad_enabled(graph), fwd.dual_level():
            r, jv = fwd.unpack_dual(self._chunk_residual(chunk)(fwd.make_dual(x, v)))
        return r, jv.detach(), x

    def jacobian(self, flat) -> np.ndarray:
        """The Jacobian (numbers × unknowns) formed densely, chunk by chunk (small problems only): forward mode
        over the unknowns when a chunk answers more numbers, reverse mode over its numbers otherwise."""
        import torch

        blocks = []
        for ch in self.chunks:
            f = self._chunk_residual(ch)
            if ch[1].size > self.unknowns:
                def column(e, f=f):
                    return torch.func.jvp(f, (flat,), (e,))[1]
                eye = torch.eye(self.unknowns, dtype=flat.dtype)
                blocks.append(torch.func.vmap(column, chunk_size=32)(eye).T)
            else:
                blocks.append(torch.func.jacrev(f, chunk_size=256)(flat))
        return np.concatenate([J.detach().double().numpy() for J in blocks])

    def block_scales(self, flat, probe_chunks: int = 2) -> list[float]:
        """Per fitted array, the inverse RMS size of its Jacobian columns (one random probe each, on the first
        ``probe_chunks`` chunks); 0 (held) for a null array, as the last-position polish does."""
        import torch

        out, at = [], 0
        gen = torch.Generator().manual_seed(0)
        for n in self.sizes:
            v = torch.zeros_like(flat)
            v[at:at + n] = torch.randn(n, dtype=flat.dtype, generator=gen)
            jv = torch.cat([self._with_tangent(ch, flat, v)[1] for ch in self.chunks[:probe_chunks]])
            out.append(float(jv.double() @ jv.double()) / float(v @ v))
            at += n
        top = max(out)
        return [1.0 / math.sqrt(size) if size > NULL_COLUMN**2 * top else 0.0 for size in out]


def polish_rows(model: PositionalAttention, data, *, frequencies: bool = False, rounds: int = ROUNDS,
                cg_steps: int = CG_STEPS, chunk_rows: int = CHUNK_ROWS, relative: bool = False,
                dense: bool | None = None, compute: str = "float64", held=(), min_gain: float = MIN_GAIN,
                progress=None, log=None) -> tuple[PositionalAttention, PolishReport]:
    """Fit every parameter of ``model`` to every-position answers ``data`` (``[(X (B, N, d), Y (B, N, K))]``; a
    causal or bidirectional model's rows, as the model is) by Levenberg–Marquardt, every product streamed over
    chunks of ``chunk_rows`` rows (:class:`StreamedRows`); the rest as :func:`~.polish.polish`: gauge balanced
    first; a small Jacobian (numbers × unknowns ≤ :data:`~.polish.DENSE_LIMIT`, or ``dense``) formed and solved
    for a ladder of dampings, a larger one matrix-free (Jacobi-scaled conjugate gradients); ``relative``: each
    position's rows relative to their spread; ``compute``: the chunks' precision (:class:`StreamedRows`);
    ``held``: biases held at zero (:func:`~.polish.absent_biases`); ``min_gain``: stop early after a round whose
    cost fell by less than this fraction (0: run every round — on bfloat16 rows the fit gains in bursts, a round
    of 1e-3 followed by one of 70 %).
    ``progress(done, total)``: Jacobian products done of the planned
    ``rounds · cg_steps``; ``log(line)``: a line per round. Returns the polished model (float64) and a
    :class:`PolishReport` (``sequences``: the sequences, ``numbers``: every row's numbers)."""
    with one_torch_thread():
        return _fit_rows(held_at_zero(model, held), data, frequencies=frequencies, rounds=rounds,
                         cg_steps=cg_steps, chunk_rows=chunk_rows, relative=relative, dense=dense, compute=compute,
                         held=held, min_gain=min_gain, progress=progress, log=log)


def _fit_rows(model, data, *, frequencies, rounds, cg_steps, chunk_rows, relative, dense, compute, held, min_gain,
              progress, log):
    import torch

    names = fitted_names(model, frequencies, held)
    model = balanced(model)
    spread = rows_spread(data)
    weights = row_weights(data, spread) if relative else None
    problem = StreamedRows(model, names, data, chunk_rows=chunk_rows, weights=weights, compute=compute)
    p = problem.start
    cost = problem.cost(p)
    before = math.sqrt(cost) / spread
    if dense is None:
        dense = problem.numbers * problem.unknowns <= DENSE_LIMIT
    total, done_steps, t0 = rounds * (1 if dense else cg_steps), 0, time.perf_counter()
    lam, done = 1e-6, 0

    def tick():
        nonlocal done_steps
        done_steps += 1
        if progress is not None:
            progress(min(done_steps, total), total)

    if not dense:
        scale = torch.cat([torch.full((n,), v, dtype=torch.float64)
                           for n, v in zip(problem.sizes, problem.block_scales(p))])
    for done in range(1, rounds + 1):
        start, moved, gain = cost, False, 0.0
        if dense:  # the best of a ladder of dampings on the formed Jacobian
            r = problem.residual(p).numpy()
            step_at = marquardt_step(problem.jacobian(p), r)
            tick()
            for trial_lam in LADDER:
                step = torch.as_tensor(step_at(trial_lam))
                new = problem.cost(p + step)
                if new < cost:
                    moved, best, cost = True, p + step, new
            if moved:
                p, gain = best, 1 - cost / start
        else:
            g = problem.gradient(p)[0] * scale

            def apply(v):
                tick()
                return problem.normal(p, v * scale) * scale + lam * v
        while not dense and not moved and lam < 1e6:
            step = conjugate_gradients(apply, -g, cg_steps) * scale
            new = problem.cost(p + step)
            moved = new < cost
            if moved:
                gain = 1 - new / cost
                p, cost = p + step, new
                lam /= 4
            else:
                lam *= 16
        if log is not None:
            log(f"row polish round {done}/{rounds}: misfit {math.sqrt(cost) / spread:.2e} (from {before:.2e}), "
                + ("dense step" if dense else f"damping {lam:.0e}, {done_steps} CG steps")
                + f", {time.perf_counter() - t0:.0f} s")
        if not moved or gain < min_gain:
            break
    out = dict(zip(names, torch.split(p.detach(), problem.sizes)))
    report = PolishReport(problem.sequences, problem.numbers, problem.unknowns, before, math.sqrt(cost) / spread,
                          done)
    polished = replace(model, dtype="float64", **{n: v.reshape(problem.shapes[n]).numpy() for n, v in out.items()})
    return polished, report
