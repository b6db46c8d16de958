import numpy as np
import pytest


from attnprobe.models.compare import relative_error as rel  # noqa: F401  (the library's one formula)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# CI runs must be reproducible: hypothesis draws its examples from a fixed seed (explore more with
# `pytest --hypothesis-profile=explore`, which is randomized and tries 20x as many examples).
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=500, print_blob=True)
settings.load_profile("ci")
