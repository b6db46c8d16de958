"""Positional families through ``--hf-dir`` (nothing declared: the family's table row picks the route) and a
recovered RoPE layer written back into a LLaMA folder (GQA keys and values once per group, in a RoPE-consistent
gauge) that ``transformers`` loads and that answers like the victim, rotations included."""

import json
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from attnprobe.cli import main  # noqa: E402
from attnprobe.errors import ConfigError  # noqa: E402
from attnprobe.models import load_model, save_model  # noqa: E402
from attnprobe.models.compare import function_error_over_lengths  # noqa: E402
from attnprobe.models.positional import PositionalAttention, rope_frequencies, rotation_pairs  # noqa: E402
from attnprobe.models.positional_gauge import share_kv  # noqa: E402
from attnprobe.oracles.hf_attention import hf_attention_layer  # noqa: E402
from attnprobe.oracles.hf_families import layer_spec  # noqa: E402
from attnprobe.targets.hf_export import export_layer  # noqa: E402
from hf_models import tiny_family_dir  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_family_dir(tmp_path_factory.mktemp("llama") / "m", "llama", hidden=64, heads=4, layers=2,
                           kv_heads=2, seed=0, std=0.125, attention_bias=False)


def _truth(folder, layer):
    spec = layer_spec(folder)
    p = hf_attention_layer(folder, layer, positional=True).projections()
    theta = rope_frequencies(spec.rotary.dims, spec.rotary.base)
    return spec, p, PositionalAttention(p["Q"], p["K"], p["V"], p["WO"], position="rope", inv_freq=theta,
                                        scale=spec.scale)


def _scrambled(spec, p, rng):
    """The layer as a learner returns it: independent heads (K, V copied per head) in random order, each in its
    own gauge (a random scaled rotation per frequency pair between W_Q and W_K, a random map between W_V and
    W_O), the frequency pairs in random order, the logit scale in W_Q."""
    H, G, dh = spec.heads, spec.kv_heads, spec.head_dim
    theta = rope_frequencies(spec.rotary.dims, spec.rotary.base)
    a_, b_ = rotation_pairs(dh, "half")
    pp = rng.permutation(dh // 2)
    cp = np.concatenate([pp, pp + dh // 2])
    WO = p["WO"].reshape(-1, H, dh)
    Wq, Wk, Wv, Wo = [], [], [], []
    for h in rng.permutation(H):
        g = h // (H // G)
        S = np.eye(dh)
        for i, j in zip(a_, b_):
            a, b = rng.normal(1, 0.3), rng.normal(0, 0.3)
            S[i, i], S[i, j], S[j, i], S[j, j] = a, -b, b, a
        T = rng.standard_normal((dh, dh)) + 3 * np.eye(dh)
        Wk.append((S @ p["K"][g])[cp])
        Wq.append((np.linalg.inv(S).T @ p["Q"][h] * spec.scale)[cp])
        Wv.append(T @ p["V"][g])
        Wo.append(WO[:, h] @ np.linalg.inv(T))
    return PositionalAttention(np.array(Wq), np.array(Wk), np.array(Wv), np.concatenate(Wo, 1), position="rope",
                               inv_freq=theta[pp], scale=1.0)


def test_share_kv_writes_one_key_and_value_map_per_group(llama):
    spec, p, truth = _truth(llama, 1)
    dense = _scrambled(spec, p, np.random.default_rng(0))
    grouped, misfit = share_kv(dense, 2)
    assert grouped.G == 2 and grouped.Wk.shape == (2, 16, 64) and grouped.Wv.shape == (2, 16, 64)
    assert misfit < 1e-12
    X = np.random.default_rng(1).standard_normal((3, 40, 64))
    y = truth.every_position(X)
    assert np.abs(grouped.every_position(X) - y).max() < 1e-12 * np.abs(y).max() * 100
    with pytest.raises(ConfigError, match="groups of sizes"):
        share_kv(dense, 3)


def test_export_a_rope_result_into_a_llama_folder(llama, tmp_path):
    """transformers loads OUT; its attention sublayer answers like the victim's at every row (rotations at
    offsets up to 63), to 1e-12; the file holds K and V per KV group, not per head."""
    spec, p, truth = _truth(llama, 1)
    dense = _scrambled(spec, p, np.random.default_rng(2))
    save_model(dense, tmp_path / "r.npz")
    out, misfit = export_layer(tmp_path / "r.npz", llama, 1, tmp_path / "out")
    q = hf_attention_layer(out, 1, positional=True).projections()
    assert q["K"].shape == (2, 16, 64) and q["bQ"] is None and q["bO"] is None
    victim = hf_attention_layer(llama, 1, positional=True, every_position=True)
    stolen = hf_attention_layer(out, 1, positional=True, every_position=True)
    X = torch.as_tensor(np.random.default_rng(3).standard_normal((4, 64, 64)))
    with torch.no_grad():
        y, y2 = victim(X).numpy(), stolen(X).numpy()
    assert np.abs(y2 - y).max() < 1e-10 * np.abs(y).max()
    assert main(["export", "--result", str(tmp_path / "r.npz"), "--hf-dir", str(llama), "--layer", "1", "--out",
                 str(tmp_path / "cli"), "--layers", "1"]) == 0


def test_export_of_a_result_that_answers_every_row_checks_every_row(llama, tmp_path, capsys):
    """A result of an every-row oracle (saved with its positions, loaded as rows): ``export`` compares the exported
    layer's every row with the result's, and says so; a layer that does not answer like it is refused."""
    from attnprobe.models.io import model_writer, write_files
    from attnprobe.targets import hf_export

    spec, p, _ = _truth(llama, 1)
    dense = _scrambled(spec, p, np.random.default_rng(5))
    write_files([(tmp_path / "rows.npz", model_writer(dense, positions="causal"))])
    assert main(["export", "--result", str(tmp_path / "rows.npz"), "--hf-dir", str(llama), "--layer", "1", "--out",
                 str(tmp_path / "cli"), "--layers", "1"]) == 0
    real = hf_export.export_layer

    def off(result, *args, **kw):  # the exported folder's layer 1 answers unlike the result
        out, misfit = real(result, *args, **kw)
        from safetensors.numpy import load_file, save_file
        weights = load_file(str(out / "model.safetensors"))
        name = next(k for k in weights if k.endswith("o_proj.weight"))
        weights[name] = weights[name] * 1.01
        save_file(weights, str(out / "model.safetensors"))
        return out, misfit

    hf_export.export_layer = off
    try:
        code = main(["export", "--result", str(tmp_path / "rows.npz"), "--hf-dir", str(llama), "--layer", "1",
                     "--out", str(tmp_path / "off"), "--layers", "1"])
    finally:
        hf_export.export_layer = real
    assert code != 0 and "answers unlike the result" in capsys.readouterr().err


def test_export_refuses_frequencies_that_do_not_fit(llama, tmp_path):
    spec, p, _ = _truth(llama, 1)
    dense = _scrambled(spec, p, np.random.default_rng(4))
    wrong = PositionalAttention(dense.Wq, dense.Wk, dense.Wv, dense.Wo, position="rope",
                                inv_freq=dense.inv_freq * 1.01, scale=1.0)
    save_model(wrong, tmp_path / "w.npz")
    with pytest.raises(ConfigError, match="rotary base"):
        export_layer(tmp_path / "w.npz", llama, 1, tmp_path / "out")


def test_load_model_of_a_positional_result_answers_every_row(tmp_path):
    """A positional result saved with every-position rows answers like the model at every row, in one pass."""
    from attnprobe.models.rows import AnswerRows

    rng = np.random.default_rng(0)
    m = PositionalAttention(rng.standard_normal((2, 8, 16)), rng.standard_normal((1, 8, 16)),
                            rng.standard_normal((1, 8, 16)), rng.standard_normal((16, 16)), position="alibi",
                            slopes=np.array([0.5, 0.1]), causal=True)
    rows = AnswerRows(m, "causal")
    X = rng.standard_normal((2, 30, 16))
    assert np.allclose(rows(X), m.every_position(X), rtol=0, atol=1e-12)
    assert np.allclose(rows(X)[:, 10], m(X[:, :11]), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_extract_hf_dir_on_t5_and_qwen2_with_nothing_declared(tmp_path, capsys):
    """T5 (relative buckets, every row read) within 1e-8; a Qwen2 folder (RoPE + q/k/v biases, float32 softmax in
    the module) through the float32 coarse route with its declared biases: its check passes, and the function at
    every length it was not checked on is within the tolerance the check passed it at (measured 9.2e-4 over every
    length 1 … 256 against 1.2e-3; the check 3.8e-4)."""
    from attnprobe.targets.positional_modules import folder_reference

    t5 = tiny_family_dir(tmp_path / "t5", "t5", hidden=64, heads=4, layers=2, seed=0, std=0.125)
    assert main(["extract", "--hf-dir", str(t5), "--layer", "1", "--out", str(tmp_path / "t5.npz"), "--quiet"]) == 0
    out = capsys.readouterr().out
    err = float(out.split("relative error ")[1].split()[0])
    assert err < 1e-8 and "31 of 32 buckets" in out and "position term t5" in out
    m = load_model(tmp_path / "t5.npz")
    assert m.position == "t5" and not m.causal
    qwen = tiny_family_dir(tmp_path / "qwen2", "qwen2", hidden=64, heads=4, layers=2, kv_heads=2, std=0.125)
    assert main(["extract", "--hf-dir", str(qwen), "--layer", "1", "--out", str(tmp_path / "q.npz")]) == 0
    assert "position term rope with q/k biases" in capsys.readouterr().out
    check = json.loads((tmp_path / "q.json").read_text())["check"]
    assert check["passed"] and check["relative_error"] <= check["tolerance"] <= 2e-3
    lengths = (1, 3, 5, 17, 33, 100, 128, 200, 256)
    err = function_error_over_lengths(load_model(tmp_path / "q.npz"), folder_reference(qwen, 1),
                                      np.random.default_rng(3), lengths)
    assert err <= check["tolerance"]


def test_a_folder_declares_the_biases_its_layer_has(llama, tmp_path):
    """The polish holds the rest at zero (:func:`absent_biases`): LLaMA without ``attention_bias`` has none, Qwen2
    has q, k and v but no output bias."""
    from attnprobe.learners.positional.polish import absent_biases
    from attnprobe.oracles.hf_attention import oracle_from_hf

    qwen2 = tiny_family_dir(tmp_path / "q", "qwen2", hidden=32, heads=4, layers=1, kv_heads=2, seed=0)
    assert absent_biases(oracle_from_hf(llama, 0, positional=True)) == ("bq", "bk", "bv", "bo")
    assert absent_biases(oracle_from_hf(qwen2, 0, positional=True)) == ("bo",)
