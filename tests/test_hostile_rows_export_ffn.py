"""Hostile cases of the every-position answers (``--positions``), ``attnprobe export`` and the FFN learner on
smooth FFNs (``--hidden``): an option the oracle would ignore, an export into the victim's own folder, a width
no machine can hold. Each: the exit code, the one stderr line, the files left alone."""

import os

import pytest

from hostile import refused, run

pytest.importorskip("transformers")
pytest.importorskip("torch")

@pytest.fixture
def work(tmp_path, monkeypatch):
    from attnprobe.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["target", "random", "--d", "6", "--out", "t.npz"]) == 0
    assert main(["target", "smooth-ffn", "--d", "4", "--m", "8", "--activation", "silu", "--out", "s.npz"]) == 0
    return tmp_path


@pytest.mark.parametrize("positions", ["causal", "bidirectional", "positional"])
def test_declared_rows_from_an_oracle_answering_the_last_position_only_are_refused(capsys, work, positions):
    """``--positions causal`` with a saved head (it answers the last position only) was silently ignored (exit 0,
    OUT.json saying "last"): refused at its first answer, nothing written."""
    line = refused(capsys, work, "extract", "--target", "t.npz", "--positions", positions, "--out", "o.npz",
                   says=f"--positions {positions} declares answers at every position")
    assert "answers the last position only" in line and "queries spent" in line


def test_a_declared_row_kind_from_a_last_position_hugging_face_layer_is_refused(capsys, work, small_bert):
    refused(capsys, work, "extract", "--hf-dir", str(small_bert), "--layer", "1", "--method", "multihead",
            "--positions", "causal", "--out", "o.npz", says="answers the last position only")


@pytest.mark.parametrize("inside", ["", "sub", "sub/deeper"])
def test_export_never_writes_into_the_victims_folder(capsys, work, small_bert, inside):
    """``export --out DIR`` with DIR the ``--hf-dir`` itself replaced the victim's model.safetensors (exit 0):
    refused before anything is read or written, also for a folder inside it and through a symlink."""
    out = small_bert / inside if inside else small_bert
    refused(capsys, small_bert, "export", "--result", "anything.npz", "--hf-dir", str(small_bert), "--layer", "1",
            "--out", str(out), says="is the input folder")
    os.symlink(small_bert, work / "link")
    refused(capsys, small_bert, "export", "--result", "anything.npz", "--hf-dir", str(small_bert), "--layer", "1",
            "--out", str(work / "link" / inside), says="is the input folder")


def test_export_to_an_existing_file_is_refused_before_any_work(capsys, work, small_bert):
    refused(capsys, work, "export", "--result", "anything.npz", "--hf-dir", str(small_bert), "--layer", "1",
            "--out", "s.npz", says="exists and is not a folder")


@pytest.mark.parametrize("hidden, activation", [(10**9, "silu"), (10**7, "silu"), (10**12, None)])
def test_a_hidden_width_no_memory_holds_is_refused_before_any_query(capsys, work, hidden, activation):
    """``--hidden 1000000000`` ran 147 s and was killed by the kernel (exit 137, no line): the first layer alone
    holds d·m floats, a smooth activation's first derivatives ≥ 1.6m²; refused at once."""
    args = ["--activation", activation] if activation else []
    line = refused(capsys, work, "extract", "--target", "s.npz", "--method", "ffn", "--hidden", str(hidden), *args,
                   "--out", "o.npz", says=f"an FFN of --hidden {hidden} units at d = 4 needs about")
    assert "no queries spent" in line


@pytest.mark.parametrize("argv, says", [
    (["target", "random", "--d", "4", "--m", "8"],
     "--m (hidden units) is for target relu, transformer, smooth-ffn and gated-ffn"),
    (["target", "smooth-ffn", "--d", "4", "--m", "8", "--heads", "3"], "--heads is for target multihead and"),
    (["target", "relu", "--d", "4", "--heads", "2"], "--heads is for target multihead and"),
])
def test_target_options_the_kind_would_ignore_are_refused(capsys, work, argv, says):
    """``target smooth-ffn --heads 3`` wrote a smooth FFN without a word about the heads: refused, nothing written."""
    refused(capsys, work, *argv, "--out", "x.npz", says=says)


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    from hf_models import tiny_family_dir

    return tiny_family_dir(tmp_path_factory.mktemp("llama"), "llama", hidden=16, heads=2, kv_heads=1, layers=2)


def test_a_block_of_a_folder_takes_its_head_count_from_the_folder(capsys, work, small_llama):
    """``extract --hf-dir DIR --block L`` stopped at "--method block needs --heads (number of heads (detected when
    omitted))" although config.json names H, and before checking L: L is checked first, H read from the folder."""
    refused(capsys, work, "extract", "--hf-dir", small_llama, "--block", "5", "--out", "o.npz",
            says="--block must be in 0..1")
    rc, out, err = run(capsys, "extract", "--hf-dir", small_llama, "--block", "1", "--estimate")
    assert rc == 0 and "block at d=16" in out, err
    rc, out2, _ = run(capsys, "extract", "--hf-dir", small_llama, "--block", "1", "--estimate", "--heads", "1")
    assert rc == 0 and out2 != out  # a given --heads is used, not overridden by the folder's


def test_an_estimate_of_a_folders_attention_layer_takes_its_head_count_from_the_folder(capsys, work, small_llama):
    """``extract --estimate --hf-dir DIR --layer L`` said "a positional estimate needs the number of heads H (give
    --heads)" although config.json names H (the run itself reads it from the folder): the estimate takes the
    folder's heads and key/value groups; a given --heads is used."""
    rc, out, err = run(capsys, "extract", "--hf-dir", small_llama, "--layer", "1", "--estimate")
    assert rc == 0 and "positional at d=16" in out, err
    rc, out2, _ = run(capsys, "extract", "--hf-dir", small_llama, "--layer", "1", "--estimate", "--heads", "1")
    assert rc == 0 and out2 != out
