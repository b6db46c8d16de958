"""``attnprobe extract --method positional`` end to end on saved RoPE layers: the result file answers like the
victim at every length up to 256; a layer with key/query biases is recovered when heads share keys and values,
else refused in one line (exit 2)."""

import numpy as np

from attnprobe.cli import main
from attnprobe.models import load_model, save_model
from attnprobe.models.positional import PositionalAttention
from attnprobe.targets import random_rope_attention


def test_extract_writes_a_model_that_answers_like_the_victim(tmp_path):
    victim = random_rope_attention(32, 2, 1, seed=5)
    target = save_model(victim, tmp_path / "rope.npz")
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--method", "positional", "--out", str(out), "--quiet"]) == 0
    model = load_model(out)
    assert isinstance(model, PositionalAttention) and model.position == "rope"
    rng = np.random.default_rng(0)
    for N in (1, 5, 65, 256):
        X = rng.standard_normal((3, N, 32))
        y = victim(X)
        assert np.abs(model(X) - y).max() <= 1e-8 * np.abs(y - victim.output_bias()).max()


def test_biased_layer_is_recovered_and_without_a_value_kernel_refused_in_one_line(tmp_path, capsys):
    """q/k biases with shared keys and values (Qwen2-style GQA): recovered through the value maps' kernel; with
    H·d_h = d, no sharing and no query bias nothing separates the heads: exit 2, one line naming the cause."""
    rng = np.random.default_rng(1)
    for G, code_expected in ((1, 0), (2, 2)):
        v = random_rope_attention(32, 2, G, seed=5)
        bq = 0.5 * rng.standard_normal((2, 16)) if G == 1 else None
        biased = PositionalAttention(v.Wq, v.Wk, v.Wv, v.Wo, bq=bq,
                                     bk=0.5 * rng.standard_normal((G, 16)), position="rope", inv_freq=v.inv_freq)
        target = save_model(biased, tmp_path / f"qwen{G}.npz")
        out = tmp_path / f"r{G}.npz"
        code = main(["extract", "--target", str(target), "--method", "positional", "--out", str(out), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == code_expected
        if code == 0:
            model = load_model(out)
            X = rng.standard_normal((3, 65, 32))
            y = biased(X)
            assert np.abs(model(X) - y).max() <= 1e-7 * np.abs(y - biased.output_bias()).max()
        else:
            assert not out.exists() and len(err) == 1 and "Traceback" not in err[0]
            assert "q/k biases" in err[0] and "value maps have rank 32" in err[0] and "did not separate" in err[0]
