import os

# One BLAS/OpenMP thread per test process, set before numpy and torch load: `pytest -n auto` runs one process per
# core, and each BLAS spinning up a thread per core on top of that (oversubscribed) made numpy-heavy tests up to
# 25x slower on a busy 2-core machine. A caller's own setting is kept.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings)
import pytest  # noqa: E402


from attnprobe.models.compare import relative_error as rel  # noqa: E402, F401  (the library's one formula)


@pytest.fixture(autouse=True)
def _forget_victim_modules(tmp_path_factory):
    """Tests write victim modules (``victim.py``, ...) into their tmp folders and import them by name through
    ``--oracle module:attr``; a worker's ``sys.modules`` outlives the test, so a later test's ``victim.py`` would get
    the stale module. Modules loaded from the tmp tree are dropped after each test."""
    import sys

    yield
    base = str(tmp_path_factory.getbasetemp())
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(base):
            del sys.modules[name]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def small_bert(tmp_path_factory):
    """One tiny BERT checkpoint (d = 12, 2 layers of 2 heads, seed 1) written once per process for every test that
    only reads it (the hostile command-line cases)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_models import tiny_bert_dir

    return tiny_bert_dir(tmp_path_factory.mktemp("bert"), hidden=12, heads=2, layers=2, seed=1)


# CI runs must be reproducible: hypothesis draws its examples from a fixed seed (explore more with
# `pytest --hypothesis-profile=explore`, which is randomized and tries 20x as many examples).
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=500, print_blob=True)
settings.load_profile("ci")
