"""Sinusoidal positional encoding, added to the embeddings.  No parameters."""
import functools
from typing import NamedTuple

import numpy

from kernels.backend import array_module, check_float, check_params
from kernels.precision import half_precision_backward, half_precision


@functools.lru_cache(maxsize=64)
def _float64_table(T, D):
    """The (T, D) table in float64, built once per shape (the model asks for it on every step)
    and read-only, so that no caller can change what the next one gets."""
    pos = numpy.arange(T, dtype=numpy.float64)[:, None]            # (T, 1)
    freq = 10000.0 ** (-2 * numpy.arange(D // 2) / D)               # (D/2,)
    angle = pos * freq                                               # (T, D/2)
    table = numpy.empty((T, D))                                      # (T, D)
    table[:, 0::2] = numpy.sin(angle)
    table[:, 1::2] = numpy.cos(angle)
    table.setflags(write=False)
    return table


def positional_encoding(T, D, dtype=numpy.float64, xp=numpy):
    """The (T, D) table: angle(pos, i) = pos * 10000^(-2i/D); sin at even, cos at odd features."""
    if D % 2:
        raise ValueError(f"D: the positional encoding needs an even width, got D = {D}")
    # built in float64, then cast to the data's dtype: a fresh array, the caller's to change
    return xp.array(_float64_table(int(T), int(D)), dtype=dtype)


class PosencCache(NamedTuple):
    pass  # the encoding is an addition of a constant: backward needs nothing


@half_precision
def posenc_forward(x, params):
    """x + PE[:T].  x: (B, T, D) -> (B, T, D)."""
    check_float("x", x, ndim=3)
    check_params("posenc", params, {}, x.dtype)
    _, T, D = x.shape
    out = x + positional_encoding(T, D, x.dtype, array_module(x))  # (B, T, D)
    return out, PosencCache()


@half_precision_backward
def posenc_backward(dout, cache):
    """The gradient passes through unchanged."""
    return dout, {}
