"""``extract --subspaces FILE``: read through the safe npz loader, never overwritten by ``--out`` (it is an input),
and a model file given as subspaces refused in one line. Every refusal: exit 2, one stderr line, no file harmed."""

import os
import zipfile

import numpy as np
import pytest
from hostile import refused, run

from attnprobe.models import save_model
from attnprobe.targets import random_orthogonal_multihead


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, E = random_orthogonal_multihead(8, 2, 4, seed=4)
    save_model(model, tmp_path / "mh.npz")
    np.savez(tmp_path / "sub.npz", subspaces=E)
    return tmp_path


def extract(*extra):
    return ["extract", "--target", "mh.npz", "--method", "multihead", "--quiet", *extra]


def test_known_subspaces_still_work(folder, capsys):
    rc, _, err = run(capsys, *extract("--subspaces", "sub.npz", "--out", "o.npz"))
    assert rc == 0, err
    assert (folder / "o.npz").exists()


@pytest.mark.parametrize("out", ["sub.npz", "sub", "./sub.npz"])
def test_out_may_not_overwrite_the_subspaces(folder, capsys, out):
    refused(capsys, folder, *extract("--subspaces", "sub.npz", "--out", out), says="would overwrite the input")


def test_a_fifo_is_refused_without_waiting(folder, capsys):
    os.mkfifo(folder / "pipe.npz")
    refused(capsys, folder, *extract("--subspaces", "pipe.npz", "--out", "o.npz"), says="not a regular file")


def test_a_small_file_declaring_a_huge_array_is_refused_before_decompressing(folder, capsys):
    """A 128 MiB array of zeros deflates to about 128 KiB; its header declares the size, which is refused."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 1)))
    header["shape"] = (2**24,)
    with zipfile.ZipFile(folder / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("subspaces.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, header)
            chunk = bytes(2**20)
            for _ in range(128):
                f.write(chunk)
    assert os.path.getsize(folder / "bomb.npz") < 2**19
    refused(capsys, folder, *extract("--subspaces", "bomb.npz", "--out", "o.npz"), says="refusing to load it")


def test_a_model_file_given_as_subspaces_is_refused(folder, capsys):
    refused(capsys, folder, *extract("--subspaces", "mh.npz", "--out", "o.npz"),
            says="is a saved multi_head model, not head subspaces")


@pytest.mark.parametrize("arrays, says", [
    ({"subspaces": np.ones(3)}, "must be (H, d, d_h)"),
    ({"subspaces": np.full((2, 8, 4), "x")}, "real numbers"),
    ({}, "holds no arrays"),
])
def test_malformed_subspaces_are_refused(folder, capsys, arrays, says):
    np.savez(folder / "bad.npz", **arrays)
    refused(capsys, folder, *extract("--subspaces", "bad.npz", "--out", "o.npz"), says=says)


def test_known_subspaces_fix_the_learner(folder, capsys):
    refused(capsys, folder, *extract("--subspaces", "sub.npz", "--multihead-learner", "generic", "--out", "o.npz"),
            says="drop the --multihead-learner option")
