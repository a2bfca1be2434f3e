"""Softmax over the last axis and leaky ReLU."""
from typing import NamedTuple

from kernels.backend import array_module, check_float, check_params


class SoftmaxCache(NamedTuple):
    y: object  # (..., N) the probabilities; backward needs nothing else


def softmax_forward(x, params):
    """Softmax over the last axis.  x: (..., N) -> (..., N).  No parameters."""
    check_float("x", x)
    check_params("softmax", params, {}, x.dtype)
    xp = array_module(x)
    e = xp.exp(x - x.max(axis=-1, keepdims=True))  # (..., N) shifted for overflow safety
    y = e / e.sum(axis=-1, keepdims=True)           # (..., N)
    return y, SoftmaxCache(y)


def softmax_backward(dy, cache):
    """dx = y * (dy - <dy, y>): the diagonal term minus the outer-product term."""
    y = cache.y
    dx = y * (dy - (dy * y).sum(axis=-1, keepdims=True))  # (..., N)
    return dx, {}


def softmax_rows_backward(dy, y):
    """The same Jacobian-vector product, for kernels that keep their own probabilities."""
    return softmax_backward(dy, SoftmaxCache(y))[0]


class LeakyReluCache(NamedTuple):
    positive: object  # (...) boolean, x > 0
    slope: float


def leaky_relu_forward(x, params, *, slope=0.1):
    """y = x where x > 0, slope * x elsewhere.  No parameters."""
    check_float("x", x)
    check_params("leaky_relu", params, {}, x.dtype)
    xp = array_module(x)
    positive = x > 0                          # (...)
    y = xp.where(positive, x, x * slope)      # (...)
    return y, LeakyReluCache(positive, slope)


def leaky_relu_backward(dy, cache):
    """dx = dy where x > 0, slope * dy elsewhere."""
    xp = array_module(dy)
    dx = xp.where(cache.positive, dy, dy * cache.slope)  # (...)
    return dx, {}
