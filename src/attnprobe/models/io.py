"""Save and load models as ``.npz`` files: the parameter arrays plus a ``kind`` tag.

Loading is safe against hostile files: only regular files (a FIFO would block forever), only zip archives of
``.npy`` members, and every member's shape and dtype are read from its header before anything is decompressed,
so a small archive cannot expand to gigabytes and strings, objects or complex numbers are refused up front.
Saving is atomic: each file is written to a temporary file in the same directory, flushed to disk and renamed
over the destination, so a full disk or a crash leaves the old files whole; the JSON summary is renamed last.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from attnprobe.errors import ConfigError

_KINDS: dict[str, type] = {}

#: largest total size of the arrays a model file may declare (a d = 8192 head is 0.5 GiB)
MAX_MODEL_BYTES = 2 * 1024**3
#: dtype kinds a parameter array may hold: bool, signed and unsigned integers, real floats
REAL_KINDS = "biuf"


def register(cls: type) -> type:
    """Make a model class loadable by its ``kind``; each model class has ``arrays``/``from_arrays``."""
    _KINDS[cls.kind] = cls
    return cls


def model_class(kind: str) -> type:
    """The registered model class of ``kind``."""
    if kind not in _KINDS:
        raise ConfigError(f"unknown model kind {kind!r}; known: {sorted(_KINDS)}", param="kind")
    return _KINDS[kind]


def npz_path(path: str | Path) -> Path:
    """The ``.npz`` path a model is saved to: ``path`` itself, or ``path.npz`` when it has no suffix."""
    path = Path(path)
    if path.suffix == ".npz":
        return path
    if path.suffix:
        raise ConfigError(f"a model file must end in .npz; got {path} (its {path.suffix} suffix would be replaced)",
                          param="path")
    return path.with_suffix(".npz")


def write_files(writers: list[tuple[Path, Callable[[BinaryIO], None]]]) -> list[Path]:
    """Write several files atomically: each ``write(f)`` fills a temporary file in the destination's directory,
    which is flushed to disk; only when all are complete are they renamed over their destinations, in order
    (put the file that marks completion, e.g. the JSON summary, last). On any error no destination changes."""
    temps: list[tuple[str, Path]] = []
    try:
        for path, write in writers:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
        for tmp, path in temps:
            os.replace(tmp, path)
        for d in {path.parent for _, path in temps}:
            _fsync_dir(d)
    except OSError as exc:
        raise ConfigError(f"cannot write {exc.filename or [str(p) for p, _ in writers]}: {exc.strerror or exc}; "
                          "existing files were left unchanged", param="out") from exc
    finally:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return [path for path, _ in writers]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def model_writer(model, positions: str | None = None) -> Callable[[BinaryIO], None]:
    """Write ``model``'s arrays and ``kind``; ``positions`` (``"causal"``, ``"bidirectional"``) records that the
    victim answered every row, so :func:`load_model` answers every row too."""
    from attnprobe.models.rows import POSITION_CODES

    extra = {} if positions in (None, "last") else {"positions": np.asarray(POSITION_CODES[positions])}
    return lambda f: np.savez(f, kind=np.asarray(model.kind), **model.arrays(), **extra)


def json_writer(obj) -> Callable[[BinaryIO], None]:
    return lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode())


def save_model(model, path: str | Path) -> Path:
    """Save ``model`` to ``path`` (``.npz``; a path without suffix gets one) atomically."""
    path = npz_path(path)
    write_files([(path, model_writer(model))])
    return path


def regular_file(path: str | Path, what: str = "model file") -> Path:
    """``path`` if it is an existing regular file (following symlinks); a FIFO, device or folder is refused."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist", param="path") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}", param="path") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file (a folder, FIFO or device); give a saved .npz file",
                          param="path")
    return path


def npz_header(path: str | Path, max_bytes: int = MAX_MODEL_BYTES,
               what: str = "model file") -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in an ``.npz`` file, read from the ``.npy`` headers without loading data.

    Refuses (with :class:`ConfigError`) anything that is not a zip of ``.npy`` members, members whose dtype is
    not real numbers (the ``kind`` tag may be a short string), and declared sizes above ``max_bytes``."""
    path = regular_file(path, what)
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"cannot read {what} {path} as an .npz file (it is not a zip archive)", param="path")
    out = {}
    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise ConfigError(f"{path} holds {info.filename!r}, which is not an .npy array", param="path")
                name = info.filename[:-4]
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = {(1, 0): np.lib.format.read_array_header_1_0,
                            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if read is None:
                        raise ConfigError(f"array {name!r} in {path} has unsupported .npy version {version}",
                                          param="path")
                    shape, _, dtype = read(f)
                if dtype.hasobject:
                    raise ConfigError(f"array {name!r} in {path} holds Python objects; model files hold numbers",
                                      param="path")
                is_tag = name == "kind" and dtype.kind == "U" and shape == () and dtype.itemsize <= 400
                if dtype.kind not in REAL_KINDS and not is_tag:
                    raise ConfigError(f"array {name!r} in {path} holds {dtype} values; model parameters must be "
                                      "real numbers (no strings, complex numbers or records)", param="path")
                total += int(np.prod(shape, dtype=object)) * dtype.itemsize
                if total > max_bytes:
                    raise ConfigError(f"{path} declares arrays of more than {_size(max_bytes)} (array {name!r} has "
                                      f"shape {shape}); refusing to load it", param="path")
                out[name] = (tuple(shape), dtype)
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as exc:
        raise ConfigError(f"cannot read {what} {path} as an .npz file: {exc}", param="path") from exc
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def load_arrays(path: str | Path, max_bytes: int = MAX_MODEL_BYTES, what: str = "model file") -> dict:
    """Every array of an ``.npz`` file, loaded only after its headers passed :func:`npz_header` (a regular file,
    real numbers, at most ``max_bytes`` declared); ``what`` names the file in errors."""
    path = Path(path)
    header = npz_header(path, max_bytes, what)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:
        raise ConfigError(f"cannot read {what} {path} as an .npz file: {exc}", param="path") from exc
    if any(arrays[k].shape != header[k][0] for k in arrays if k in header):  # pragma: no cover - file changed
        raise ConfigError(f"{what} {path} changed while it was read; try again", param="path")
    return arrays


def load_model(path: str | Path, dtype: str = "float64", max_bytes: int = MAX_MODEL_BYTES):
    """Load a model saved by :func:`save_model`, checking the file's headers first (:func:`npz_header`): a callable
    answering like the victim, at the last position ``(B, K)``, or at every row ``(B, N, K)``
    (:class:`~attnprobe.models.rows.AnswerRows`) when the result records that the victim answered every row."""
    path = Path(path)
    arrays = load_arrays(path, max_bytes)
    from attnprobe.models.rows import POSITION_CODES, AnswerRows

    kind = str(arrays.pop("kind", "attention_head"))
    if kind not in _KINDS:
        raise ConfigError(f"{path} holds a model of unknown kind {kind!r}; known: {sorted(_KINDS)}", param="path")
    code = arrays.pop("positions", None)
    names = {v: k for k, v in POSITION_CODES.items()}
    if code is not None and (np.shape(code) != () or int(code) not in names):
        raise ConfigError(f"{path}: 'positions' must be one of {sorted(names)} ({', '.join(POSITION_CODES)}); "
                          f"got {code!r}", param="path")
    try:
        model = _KINDS[kind].from_arrays(arrays, dtype=dtype)
    except ConfigError as exc:
        raise ConfigError(f"{path} does not hold a valid {kind}: {exc}", param="path") from exc
    positions = "last" if code is None else names[int(code)]
    return model if positions == "last" else AnswerRows(model, positions)
