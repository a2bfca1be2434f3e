"""Dropout (the article's first exercise): zero random entries, keep the mask for backward.

Inverted dropout: kept entries are scaled by 1 / (1 - rate), so the expected output equals the
input and nothing needs rescaling at generation time (rate 0 or training=False is the identity).
"""
from typing import NamedTuple

import numpy

from kernels.backend import array_module, check_float, check_params
from kernels.precision import half_precision_backward, half_precision


class DropoutCache(NamedTuple):
    scale: object  # (...) the mask times 1 / (1 - rate): 0 where dropped


def dropout_mask(shape, rate, rng):
    """A boolean keep-mask drawn from a NumPy Generator: True with probability 1 - rate."""
    return rng.random(shape) >= rate


@half_precision
def dropout_forward(x, params, *, rate, mask=None, rng=None):
    """y = x * mask / (1 - rate).  Give the keep-mask, or a seeded Generator to draw it."""
    check_float("x", x)
    check_params("dropout", params, {}, x.dtype)
    if not 0 <= rate < 1:
        raise ValueError(f"rate: expected 0 <= rate < 1, got {rate}")
    if (mask is None) == (rng is None):
        raise ValueError("dropout: give exactly one of mask= (boolean array) or rng= (Generator)")
    xp = array_module(x)
    if mask is None:
        mask = dropout_mask(x.shape, rate, rng)
    if tuple(mask.shape) != tuple(x.shape):
        raise ValueError(f"mask: expected shape {tuple(x.shape)}, got {tuple(mask.shape)}")
    scale = xp.asarray(mask, dtype=x.dtype) * x.dtype.type(1 / (1 - rate))  # (...)
    return x * scale, DropoutCache(scale)


@half_precision_backward
def dropout_backward(dy, cache):
    """dx = dy * mask / (1 - rate)."""
    return dy * cache.scale, {}
