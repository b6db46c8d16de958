"""Hostile model files: headers are checked before anything is decompressed, only regular files are opened,
and whatever the file holds the loader returns a valid model or raises ConfigError: never a traceback, never a
silent reshape or a dropped imaginary part."""

from __future__ import annotations

import io
import os
import threading
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnprobe.errors import ConfigError
from attnprobe.models import AttentionHead, load_model, save_model
from attnprobe.models.io import npz_header
from attnprobe.targets import random_head
from hostile import refused


def _zip_bomb(path, n: int) -> None:
    """An npz whose W member declares (n, n) float64 and is a few KB of deflated zeros per MB declared."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (n, n)})
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("W.npy", "w", force_zip64=True) as f:
            f.write(header.getvalue())
            chunk = bytes(1 << 20)
            for _ in range(64):  # only 64 MB of the declared size is actually written: the header decides
                f.write(chunk)
        zf.writestr("v.npy", _npy(np.ones(n)))


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_a_small_archive_declaring_gigabytes_is_refused_from_its_header(tmp_path, capsys, monkeypatch):
    _zip_bomb(tmp_path / "bomb.npz", 30_000)  # declares 7.2 GB
    assert (tmp_path / "bomb.npz").stat().st_size < 1_000_000
    monkeypatch.chdir(tmp_path)
    refused(capsys, tmp_path, "extract", "--target", "bomb.npz", "--out", "o.npz", "--quiet", says="GiB")
    with pytest.raises(ConfigError, match="refusing to load"):
        npz_header(tmp_path / "bomb.npz")


def test_a_fifo_target_is_refused_without_blocking(tmp_path, capsys, monkeypatch):
    os.mkfifo(tmp_path / "pipe.npz")
    monkeypatch.chdir(tmp_path)
    done = []
    t = threading.Thread(target=lambda: done.append(
        refused(capsys, tmp_path, "extract", "--target", "pipe.npz", "--out", "o.npz", "--quiet",
                says="not a regular file")), daemon=True)
    t.start()
    t.join(30)
    if not done:  # unblock the reader so the test process can end, then fail
        with open(tmp_path / "pipe.npz", "wb"):
            pass
        pytest.fail("loading a FIFO blocked")


def test_folder_and_missing_targets(tmp_path, capsys, monkeypatch):
    (tmp_path / "d.npz").mkdir()
    monkeypatch.chdir(tmp_path)
    refused(capsys, tmp_path, "extract", "--target", "d.npz", "--out", "o.npz", "--quiet", says="not a regular file")
    refused(capsys, tmp_path, "verify", "--target", "gone.npz", "--result", "d.npz", says="does not exist")


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    np.savez(tmp_path / "p.npz", W=np.array([{"a": 1}, None], dtype=object), v=np.ones(2))
    with pytest.raises(ConfigError, match="objects"):
        load_model(tmp_path / "p.npz")


def test_roundtrip_keeps_every_array_exactly(tmp_path):
    h = random_head(5, seed=4)
    save_model(h, tmp_path / "h.npz")
    g = load_model(tmp_path / "h.npz")
    assert np.array_equal(g.W, h.W) and np.array_equal(g.v, h.v) and np.array_equal(g.u, h.u) and g.c == h.c
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


_DTYPES = st.sampled_from(["<f8", "<f4", "<f2", "<i8", "<i4", "|u1", "|b1", "<c16", "<U3", "|S2", "<M8[s]"])


@st.composite
def _member(draw, name):
    dtype = np.dtype(draw(_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    arr = draw(hnp.arrays(dtype, shape, elements=None if dtype.kind in "USMc" else
                          hnp.from_dtype(dtype, allow_nan=True, allow_infinity=True)))
    return name, arr


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(members=st.lists(st.one_of(_member("W"), _member("v"), _member("u"), _member("c"), _member("A"),
                                  _member("w_o"), _member("junk")), max_size=5, unique_by=lambda m: m[0]),
       kind=st.sampled_from([None, "attention_head", "relu_net", "one_layer_transformer", "bogus"]))
def test_loader_never_crashes_and_never_reshapes(tmp_path, members, kind):
    arrays = dict(members)
    if kind is not None:
        arrays["kind"] = np.asarray(kind)
    path = tmp_path / "m.npz"
    np.savez(path, **arrays)
    try:
        model = load_model(path)
    except ConfigError as exc:
        assert str(exc)
        return
    # accepted: every parameter array was real, finite and of exactly the model's shape
    for name, arr in model.arrays().items():
        if name in arrays and not (name == "v" and model.kind == "one_layer_transformer"):
            src = arrays[name]
            assert src.dtype.kind in "biuf" and src.shape == arr.shape
            assert np.array_equal(src.astype(np.float64), arr)
    if isinstance(model, AttentionHead):
        assert model.W.shape == (model.d, model.d) and model.v.shape == (model.d,) and np.ndim(arrays.get("c", 0)) == 0


@pytest.mark.parametrize("name, bad", [("W", lambda h: h.W.astype(np.complex128)),
                                       ("W", lambda h: h.W + 1j),
                                       ("v", lambda h: h.v.astype(str)),
                                       ("u", lambda h: h.u.astype(np.complex64)),
                                       ("kind", lambda h: np.asarray(["attention_head", "x"]))])
def test_non_real_members_are_refused_from_their_header(tmp_path, name, bad):
    """Complex or string parameters are refused by the header check, before any member is read (a complex W with
    zero imaginary part too: the file is not what it claims)."""
    h = random_head(4, seed=0)
    arrays = {**h.arrays(), "kind": np.asarray("attention_head"), name: bad(h)}
    path = tmp_path / "m.npz"
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match=rf"array '{name}' in .* holds .* values; model parameters must be real"):
        npz_header(path)
    with pytest.raises(ConfigError, match="must be real"):
        load_model(path)
