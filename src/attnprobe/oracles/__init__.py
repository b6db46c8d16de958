"""Black-box access: the Oracle protocol, budgets, validation, adapters and wrappers."""

from attnprobe.oracles.antisymmetric import AntisymmetricOracle
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.load import load_callable, oracle_from_file, oracle_from_spec

__all__ = ["AntisymmetricOracle", "Oracle", "load_callable", "oracle_from_file", "oracle_from_spec"]
