"""The binary wire format of the served API: request and response bodies in numpy's ``.npy`` format.

``Content-Type: application/x-npy`` (request) and ``Accept: application/x-npy`` (response) select it; JSON stays
the default. Only little-endian float64 in C order is accepted, read without pickle, and the header is checked
(dtype, order, shape within the limits, exact data length) before a byte of data is looked at, so a hostile
header cannot make the reader allocate anything.
"""

from __future__ import annotations

import io

import numpy as np

MEDIA_TYPE = "application/x-npy"
FLOAT64 = np.dtype("<f8")
MAX_HEADER = 4096


class WireError(ValueError):
    """A ``.npy`` body that is not a float64 array of an accepted shape; ``too_large`` tells 413 from 422."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def encode(a: np.ndarray) -> bytes:
    """``a`` as a ``.npy`` body (little-endian float64, C order; the bytes ``numpy.save`` writes), built with one
    copy of the data."""
    a = np.ascontiguousarray(a, dtype=FLOAT64)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(a))
    return b"".join([head.getvalue(), a.reshape(-1).view(np.uint8)])


def joined(chunks: list[bytes]) -> np.ndarray:
    """A body that arrived in ``chunks`` as one writable byte buffer, in one copy (no regrowth on the way)."""
    body = np.empty(sum(len(c) for c in chunks), dtype=np.uint8)
    at = 0
    for c in chunks:
        body[at:at + len(c)] = np.frombuffer(c, dtype=np.uint8)
        at += len(c)
    return body


def _header(body: bytes) -> tuple[tuple, int]:
    """The shape a ``.npy`` body declares and where its data starts; dtype and order checked."""
    f = io.BytesIO(memoryview(body)[:12 + MAX_HEADER].tobytes())  # magic, version, length, header: no data
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=MAX_HEADER)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except Exception as exc:  # numpy parses the header with the tokenizer: any failure is the sender's
        raise WireError(f"the body is not a .npy array ({type(exc).__name__}: {exc})") from None
    if dtype != FLOAT64:
        raise WireError(f"the .npy array has dtype {dtype.str}; send little-endian float64 ('<f8')")
    if fortran:
        raise WireError("the .npy array is in Fortran order; send it in C order (numpy's default)")
    if not all(type(n) is int and n >= 0 for n in shape):  # not True/False, which are ints too
        raise WireError(f"the .npy header declares the shape {shape!r}")
    return tuple(shape), f.tell()


def _data(body: bytes, shape: tuple, start: int) -> np.ndarray:
    n = 1
    for s in shape:
        n *= s
    if len(body) - start != 8 * n:
        raise WireError(f"the .npy header declares shape {shape} ({8 * n} bytes of data) but the body carries "
                        f"{len(body) - start}; send the whole array")
    a = np.frombuffer(body, dtype=FLOAT64, offset=start).reshape(shape)
    if not np.all(np.isfinite(a)):
        raise WireError("the .npy array holds NaN or infinite numbers; send finite numbers")
    return a


def decode_queries(body, d: int, max_batch: int, max_length: int) -> np.ndarray:
    """A request body (bytes-like) as ``X (B, N, d)``: B ≤ ``max_batch``, N ≤ ``max_length`` (else ``too_large``),
    B, N ≥ 1. The array is writable (a model may work in place): a view of a writable body (:func:`joined`), else
    a copy."""
    shape, start = _header(body)
    if len(shape) != 3:
        raise WireError(f"the .npy array has shape {shape}; send (B, N, d) = (sequences, rows, {d})")
    B, N, width = shape
    if B > max_batch:
        raise WireError(f"a batch of {B} sequences is above the limit of {max_batch}", too_large=True)
    if N > max_length:
        raise WireError(f"sequences of {N} rows are above the limit of {max_length}", too_large=True)
    if B < 1 or N < 1 or width != d:
        raise WireError(f"the .npy array has shape {shape}; send (B, N, d) with B, N >= 1 and d = {d}")
    X = _data(body, shape, start)
    return X if X.flags.writeable else X.copy()


def decode_answers(body: bytes, batch: int, length: int | None = None) -> np.ndarray:
    """The answers a server sent: (B,) or (B, K), or (B, N, K) (every position) when ``length`` N is given."""
    shape, start = _header(body)
    rows = length is not None and len(shape) == 3 and shape[:2] == (batch, length) and shape[2] >= 1
    if not rows and (len(shape) not in (1, 2) or shape[0] != batch or (len(shape) == 2 and shape[1] < 1)):
        raise WireError(f"answered a .npy array of shape {shape} for {batch} sequences")
    if len(shape) >= 2 and shape[-1] > 1 << 20:
        raise WireError(f"answered a .npy array of shape {shape}: too many outputs per sequence")
    return _data(body, shape, start).copy()
