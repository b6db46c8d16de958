"""Hostile ``.npy`` headers on a real served API: every one is a 4xx (never a 500), uncharged, and the same
keep-alive connection answers the next request."""

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from attnprobe.oracles import npy_wire  # noqa: E402
from attnprobe.service import KeyStore, ServiceOptions, build_app  # noqa: E402
from attnprobe.service.server import BackgroundServer  # noqa: E402
from attnprobe.targets.random_heads import random_head  # noqa: E402

D, KEY = 4, "hdr-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
NPY = {**AUTH, "Content-Type": npy_wire.MEDIA_TYPE, "Accept": npy_wire.MEDIA_TYPE}


def raw(header: str, data_bytes: int = 8 * 2 * 2 * D) -> bytes:
    """A version-1 .npy body with ``header`` as its header text, verbatim (padded as numpy pads)."""
    h = header.encode()
    h += b" " * (64 - (10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + b"\0" * data_bytes


HEADERS = {
    "bool in the shape": "{'descr': '<f8', 'fortran_order': False, 'shape': (True, 2, 4), }",
    "all bools": "{'descr': '<f8', 'fortran_order': False, 'shape': (True, True, True), }",
    "dict not closed": "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2, 4), ",
    "string not closed": "{'descr': '<f8, 'fortran_order': False, 'shape': (2, 2, 4), }",
    "nested tuple": "{'descr': '<f8', 'fortran_order': False, 'shape': ((2,), 2, 4), }",
    "huge number": "{'descr': '<f8', 'fortran_order': False, 'shape': (" + "9" * 500 + ", 2, 4), }",
    "float in the shape": "{'descr': '<f8', 'fortran_order': False, 'shape': (2.0, 2, 4), }",
    "structured dtype": "{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (2, 2, 4), }",
    "object dtype": "{'descr': '|O', 'fortran_order': False, 'shape': (2, 2, 4), }",
    "extra keys": "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2, 4), 'x': 1}",
    "a set": "{'descr': '<f8', 'fortran_order': False, 'shape': {2, 4}, }",
    "not a dict": "[1, 2, 3]",
    "unicode": "{'descr': '<f8', 'fortran_order': False, 'shape': (２, 2, 4), }",
}


@pytest.fixture(scope="module")
def served():
    app = build_app(random_head(D, seed=3), ServiceOptions(d=D, max_batch=16, max_length=8),
                    KeyStore([KEY], budget=10_000))
    with BackgroundServer(app) as srv:
        yield srv


@pytest.mark.parametrize("case", list(HEADERS))
def test_a_hostile_header_is_a_4xx_and_the_connection_stays_usable(served, case):
    X = np.random.default_rng(0).standard_normal((2, 2, D))
    with httpx.Client(base_url=served.url, timeout=20) as client:
        before = client.get("/v1/usage", headers=AUTH).json()["queries"]
        r = client.post("/v1/query", content=raw(HEADERS[case]), headers=NPY)
        assert r.status_code in (413, 422), (case, r.status_code, r.text[:300])  # 413: a batch of 10^500
        assert isinstance(r.json()["detail"], str)
        ok = client.post("/v1/query", content=npy_wire.encode(X), headers=NPY)  # the same connection
        assert ok.status_code == 200
        assert np.array_equal(npy_wire.decode_answers(ok.content, 2), random_head(D, seed=3)(X))
        assert client.get("/v1/usage", headers=AUTH).json()["queries"] == before + 2  # only the good batch
