"""Property: whatever a callable answers, the Oracle returns exactly its B real finite numbers as float64 or
raises a typed error; it never reshapes, drops an imaginary part, parses strings or lets an exception escape."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnprobe import Oracle
from attnprobe.errors import OracleError

_DTYPES = st.sampled_from(["<f8", "<f4", "<f2", "<i8", "|u1", "|b1", "<c16", "<c8", "<U4", "|S3", "|O"])


@st.composite
def _answers(draw):
    dtype = np.dtype(draw(_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5))
    if dtype.kind == "O":
        return np.array(draw(st.lists(st.one_of(st.floats(), st.none(), st.text(max_size=2), st.integers()),
                                      min_size=0, max_size=5)), dtype=object)
    elements = None if dtype.kind in "USc" else hnp.from_dtype(dtype, allow_nan=True, allow_infinity=True)
    return draw(hnp.arrays(dtype, shape, elements=elements))


@settings(max_examples=150, deadline=None)
@given(raw=_answers(), B=st.integers(1, 5), as_list=st.booleans())
def test_oracle_validates_every_answer(raw, B, as_list):
    answer = raw.tolist() if as_list and raw.dtype.kind != "O" else raw
    oracle = Oracle(lambda X: answer, 2)
    ref = np.asarray(raw)
    well_formed = (ref.dtype.kind in "iuf" and (ref.shape == (B,) or (ref.ndim == 2 and ref.shape[0] == B
                                                                      and ref.shape[1] >= 1))
                   and bool(np.all(np.isfinite(ref.astype(np.float64)))))
    try:
        y = oracle(np.zeros((B, 1, 2)))
    except OracleError as exc:
        # refused: only answers that are not one finite real number (or K) per sequence may be
        assert str(exc) and oracle.queries == B and not well_formed, (ref.dtype, ref.shape, str(exc))
        return
    # one number per sequence, or K numbers per sequence (a classifier's logits)
    assert y.dtype == np.float64 and (y.shape == (B,) or (y.ndim == 2 and y.shape[0] == B and y.shape[1] >= 1))
    assert ref.shape == y.shape and ref.dtype.kind in "biufO" and np.all(np.isfinite(y))
    assert np.array_equal(y, ref.astype(np.float64))


@given(code=st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3)))
def test_an_oracle_calling_exit_is_an_error(code):
    def quit_(X):
        raise SystemExit(code)

    oracle = Oracle(quit_, 3)
    try:
        oracle(np.zeros((2, 1, 3)))
    except OracleError as exc:
        assert "exit" in str(exc) and oracle.queries == 2
    else:  # pragma: no cover - the assertion below documents the failure
        raise AssertionError("SystemExit from an oracle was not turned into an OracleError")
