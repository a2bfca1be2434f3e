"""Parameter-free RMS normalisation over the last axis."""
from typing import NamedTuple

from kernels.backend import array_module, check_float, check_params
from kernels.precision import half_precision_backward, half_precision

EPS = 1e-8


class RmsNormCache(NamedTuple):
    y: object       # (..., D) normalised output
    inv_rms: object  # (..., 1) 1 / sqrt(mean(x^2) + eps)


@half_precision
def rms_norm_forward(x, params, *, eps=EPS):
    """y = x / sqrt(mean(x^2, last axis) + eps).  x: (..., D) -> (..., D)."""
    check_float("x", x)
    check_params("rms_norm", params, {}, x.dtype)
    xp = array_module(x)
    inv_rms = 1 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    y = x * inv_rms                                                      # (..., D)
    return y, RmsNormCache(y, inv_rms)


@half_precision_backward
def rms_norm_backward(dy, cache):
    """dx = (dy - y * mean(dy * y)) / rms: the direct term minus the term through the rms."""
    y, inv_rms = cache
    dx = (dy - y * (dy * y).mean(axis=-1, keepdims=True)) * inv_rms  # (..., D)
    return dx, {}
