"""Why the precision is coarser than the module's dtype (a float64 LLaMA module whose eager kernel computes its
softmax in float32) is said in every message that names the precision, also behind an answer chain: the cause is
declared by the innermost callable and read through every wrapper's ``inner``."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from attnprobe.cli.common import assumed_precision, spent  # noqa: E402
from attnprobe.oracles.chain import AnswerChain  # noqa: E402
from attnprobe.oracles.hf_attention import oracle_from_hf  # noqa: E402
from attnprobe.oracles.wrappers import declared_attribute  # noqa: E402
from hf_models import tiny_family_dir  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_family_dir(tmp_path_factory.mktemp("llama") / "llama", "llama", hidden=16, heads=4, layers=1,
                           kv_heads=2, seed=0)


@pytest.mark.parametrize("chain", [None, AnswerChain(noise="avq:1e-9"), AnswerChain(noise="avq:1e-9", clip=50.0)])
def test_the_softmax_cause_is_named_behind_an_answer_chain(llama, chain):
    oracle = oracle_from_hf(llama, 0, dtype="float64", positional=True, chain=chain)
    assert oracle.precision == "float32"
    said = assumed_precision(oracle)
    assert said.startswith("answers taken as float32 (the float64 module's eager kernel computes its softmax")
    assert "declared" not in said and said in spent(oracle)


def test_a_declared_precision_without_a_cause_says_declared(llama):
    oracle = oracle_from_hf(llama, 0, dtype="float64", positional=True, precision="float32",
                            chain=AnswerChain(noise="avq:1e-9"))
    assert assumed_precision(oracle) == "answers taken as float32 (declared)"


def test_declared_attribute_walks_inner_and_takes_the_first_accepted_value():
    class Stage:
        def __init__(self, inner=None, **attrs):
            self.inner = inner
            self.__dict__.update(attrs)

    chain = Stage(Stage(Stage(positions="causal", tag="deep"), tag=7))
    assert declared_attribute(chain, "positions") == "causal"
    assert declared_attribute(chain, "tag") == 7
    assert declared_attribute(chain, "tag", lambda v: isinstance(v, str)) == "deep"
    assert declared_attribute(chain, "missing") is None and declared_attribute(None, "tag") is None
    loop = Stage(tag=None)
    loop.inner = loop  # a cycle ends after a bounded walk
    assert declared_attribute(loop, "tag") is None
