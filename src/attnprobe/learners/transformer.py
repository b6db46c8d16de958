"""One-layer transformers ``TF(X) = w_oᵀ ReLU(α(X)ᵀ X A)`` from value queries (paper Sec. 4.1).

(ii) the antisymmetric oracle ``TF(X) − TF(−X) = α(X)ᵀ X v`` with ``v = A w_o`` is a bias-free single-head oracle,
so Thm 4.1 (:func:`extract_exact` with ``bias=False``) recovers ``W`` and ``v``; each of its queries costs two.
(i) length-1 queries ``[x] ↦ w_oᵀReLU(Aᵀx)`` expose the FFN, learned by :func:`extract_ffn` (which reuses v).
"""

from __future__ import annotations

import time

import numpy as np

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.check import functional_check
from attnprobe.learners.exact import extract_exact
from attnprobe.learners.ffn import extract_ffn, require_fine_answers
from attnprobe.learners.result import Extraction
from attnprobe.models.transformer import OneLayerTransformer
from attnprobe.oracles.antisymmetric import AntisymmetricOracle

#: the issue's check: fresh random sequences of every length 1..8
TRANSFORMER_CHECK_LENGTHS = tuple(range(1, 9))


def extract_transformer(oracle, *, probes: str = "orthogonal", seed: int = 0, check: bool = True,
                        check_lengths=TRANSFORMER_CHECK_LENGTHS, progress=None, **ffn_options) -> Extraction:
    """Recover ``(W, A, w_o)`` of a one-layer single-head transformer (Sec. 4.1).

    ``W`` is exact (Thm 4.1 on the antisymmetric oracle; ``probes`` as in :func:`extract_exact`); the FFN is
    recovered up to permutation and positive scaling of its neurons (see :func:`extract_ffn`, which receives
    ``ffn_options``). Raises :class:`UnidentifiableError` when ``v = A w_o = 0``: the antisymmetric oracle is then
    identically 0 and W is invisible to it. ``details['query_breakdown']`` separates the attention part
    (underlying queries, two per antisymmetric query) from the FFN part.
    """
    require_fine_answers(oracle, "the one-layer transformer learner")
    t0 = time.perf_counter()
    start = oracle.queries
    anti = AntisymmetricOracle(oracle)
    try:
        head = extract_exact(anti, probes=probes, bias=False, seed=seed, check=False, progress=progress)
    except UnidentifiableError as exc:
        raise UnidentifiableError(
            "TF(X) − TF(−X) is 0 on every length-1 query, so v = A w_o = 0: the attention output never reaches the "
            "antisymmetric oracle and W cannot be identified (Sec. 4.1 needs A w_o ≠ 0). The FFN alone can still be "
            f"learned with --method ffn. ({exc})") from exc
    q_att = oracle.queries - start
    v = head.model.v
    ffn = extract_ffn(oracle, seed=seed, v=v, check=False, progress=progress, **ffn_options)
    q_ffn = oracle.queries - start - q_att
    model = OneLayerTransformer(head.model.W, ffn.model.A, ffn.model.w_o)
    d, m = model.d, model.m
    vhat = model.v
    details = {
        "probes": probes, "seed": seed, "neurons": m,
        "query_breakdown": {"attention": q_att, "antisymmetric_queries": anti.queries, "ffn": q_ffn},
        "v_consistency": float(np.linalg.norm(vhat - v) / max(np.linalg.norm(v), 1e-300)),
        "attention": head.details, "ffn": ffn.details,
    }
    res = Extraction("transformer", model, oracle.queries - start, OneLayerTransformer.unknowns(d, m), 0.0,
                     details=details, notes=list(head.notes) + list(ffn.notes))
    if check:
        res.check = functional_check(oracle, model, np.random.default_rng([seed, 1]), check_lengths)
    res.seconds = time.perf_counter() - t0
    return res
