"""Parameter-free RMS normalisation over the last axis."""
from typing import NamedTuple

from kernels.activations import row_sum
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
    D = x.shape[-1]
    squares = x * x                           # (..., D)
    inv_rms = row_sum(squares)                # (..., 1) sum of squares (a product: faster than mean)
    inv_rms *= x.dtype.type(1 / D)            # mean of squares, then in place on the small array:
    inv_rms += x.dtype.type(eps)
    xp.sqrt(inv_rms, out=inv_rms)
    xp.reciprocal(inv_rms, out=inv_rms)       # 1 / sqrt(mean(x^2) + eps)
    y = xp.multiply(x, inv_rms, out=squares)  # (..., D), over the squares: one fresh array
    return y, RmsNormCache(y, inv_rms)


@half_precision_backward
def rms_norm_backward(dy, cache):
    """dx = (dy - y * mean(dy * y)) / rms: the direct term minus the term through the rms."""
    y, inv_rms = cache.y, cache.inv_rms
    mean_dy_y = row_sum(dy * y)                               # (..., 1) sum over D ...
    mean_dy_y *= dy.dtype.type(1 / y.shape[-1])               # ... then the mean
    dx = dy - y * mean_dy_y                                   # (..., D) direct minus through the rms
    dx *= inv_rms                                             # (..., D), in place on the fresh array
    return dx, {}
