import numpy as np
import pytest


def rel(a, b):
    """Relative error ‖a − b‖/‖b‖ (absolute where b = 0)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
