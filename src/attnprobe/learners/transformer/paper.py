"""One-layer transformers ``TF(X) = w_oᵀ ReLU(α(X)ᵀ X A)`` from value queries (paper Sec. 4.1).

(ii) the antisymmetric oracle ``TF(X) − TF(−X) = α(X)ᵀ X v`` with ``v = A w_o`` is a bias-free single-head oracle,
so Thm 4.1 (:func:`extract_exact` with ``bias=False``) recovers ``W`` and ``v``; each of its queries costs two.
(i) length-1 queries ``[x] ↦ w_oᵀReLU(Aᵀx)`` expose the FFN, learned by :func:`extract_ffn` (which reuses v).
"""

from __future__ import annotations

import numpy as np

from attnprobe._validation import check_option, check_seed
from attnprobe.errors import UnidentifiableError
from attnprobe.learners.head.exact import PROBES, extract_exact
from attnprobe.learners.ffn import extract_ffn, require_fine_answers
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.attention import AttentionHead
from attnprobe.models.transformer import OneLayerTransformer
from attnprobe.oracles.antisymmetric import AntisymmetricOracle

#: the transformer's check: fresh random sequences of every length 1..8
TRANSFORMER_CHECK_LENGTHS = tuple(range(1, 9))


def extract_transformer(oracle, *, probes: str = "orthogonal", seed: int = 0, check: bool = True,
                        check_lengths=TRANSFORMER_CHECK_LENGTHS, progress=None, asked_before=None,
                        **ffn_options) -> Extraction:
    """Recover ``(W, A, w_o)`` of a one-layer single-head transformer (Sec. 4.1).

    ``W`` is exact (Thm 4.1 on the antisymmetric oracle; ``probes`` as in :func:`extract_exact`); the FFN is
    recovered up to permutation and positive scaling of its neurons (see :func:`extract_ffn`, which receives
    ``ffn_options``). Raises :class:`UnidentifiableError` when ``v = A w_o = 0``: the antisymmetric oracle is then
    identically 0 and W is invisible to it. Queries are charged to phases ``"attention"`` (underlying queries,
    two per antisymmetric query) and ``"ffn"``; ``details['query_breakdown']`` repeats them with the number of
    antisymmetric queries. The FFN part is adaptive: only the attention part is known up front. ``asked_before``:
    queries this extraction asked before this route, by phase (:class:`Run`).
    """
    check_option(probes, "probes", PROBES)
    require_fine_answers(oracle, "the one-layer transformer learner")
    d = oracle.d
    run = Run(oracle, "transformer-paper", scalar=True, seed=[check_seed(seed), 1], check=check,
              check_lengths=check_lengths, progress=progress, asked_before=asked_before)
    n_att = AttentionHead.unknowns(d, bias=False)
    run.plan(2 * n_att, f"one-layer transformer at d={d} (Thm 4.1 on TF(X) − TF(−X): {n_att} antisymmetric "
                        "queries of 2 each; the FFN part is adaptive)", at_least=True)
    anti = AntisymmetricOracle(oracle)
    with run.phase("attention", absorb=True):
        try:
            head = extract_exact(anti, probes=probes, bias=False, seed=seed, check=False, progress=progress)
        except UnidentifiableError as exc:
            raise UnidentifiableError(
                "TF(X) − TF(−X) is 0 on every length-1 query, so v = A w_o = 0: the attention output never reaches "
                "the antisymmetric oracle and W cannot be identified (Sec. 4.1 needs A w_o ≠ 0). The FFN alone can "
                f"still be learned with extract_ffn. ({exc})") from exc
    v = head.model.v
    with run.phase("ffn", absorb=True):
        ffn = extract_ffn(oracle, seed=seed, v=v, check=False, progress=progress, **ffn_options)
    model = OneLayerTransformer(head.model.W, ffn.model.A, ffn.model.w_o)
    by_phase = run.queries_by_phase()
    details = {
        "probes": probes, "seed": seed, "neurons": model.m,
        "query_breakdown": {"attention": by_phase.get("attention", 0), "antisymmetric_queries": head.queries,
                            "ffn": by_phase.get("ffn", 0), "attention_phases": head.queries_by_phase},
        "v_consistency": float(np.linalg.norm(model.v - v) / max(np.linalg.norm(v), 1e-300)),
        "attention": head.details, "ffn": ffn.details,
    }
    return run.finish(model, unknowns=OneLayerTransformer.unknowns(d, model.m), details=details,
                      notes=list(head.notes) + list(ffn.notes), hint=" (a one-layer single-head transformer)")
