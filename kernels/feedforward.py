"""The feed-forward block: x W1 + b1 (D -> F), leaky ReLU, then W2 + b2 (F -> D).

One kernel pair with the block's maths written out (kernels.linear's affine pieces and
activations.leaky_gain), validated once at its edge: calling linear_forward, leaky_relu_forward
and linear_forward again would validate and wrap each of the three.  The activation is computed
in place on the first product's fresh array.  The cache keeps the three layers' caches.
"""
from typing import NamedTuple

from kernels.activations import LeakyReluCache, leaky_gain
from kernels.backend import check_float, check_params
from kernels.linear import LinearCache, affine, affine_backward
from kernels.precision import half_precision_backward, half_precision


class FeedForwardCache(NamedTuple):
    first: object   # LinearCache of x W1 + b1: x (..., D), W1
    act: object     # LeakyReluCache: gain (..., F)
    second: object  # LinearCache of a W2 + b2: a = leaky(x W1 + b1) (..., F), W2


@half_precision
def ff_forward(x, params, *, slope=0.1):
    """x: (B, T, D); W1 (D, F), b1 (F,), W2 (F, D), b2 (D,) -> (B, T, D)."""
    keys = {"W1", "b1", "W2", "b2"}
    if not isinstance(params, dict) or set(params) != keys:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"ff params: expected keys {sorted(keys)}, got {got}")
    check_float("x", x)
    W1, W2 = params["W1"], params["W2"]
    D = x.shape[-1]
    if getattr(W1, "ndim", None) != 2:
        raise ValueError(f"ff params['W1']: expected shape (D, F) = ({D}, F), got "
                         f"{tuple(getattr(W1, 'shape', ()))}")
    F = W1.shape[1]
    check_params("ff", params, {"W1": (D, F), "b1": (F,), "W2": (F, D), "b2": (D,)}, x.dtype)
    lead = x.shape[:-1]
    h = affine(x.reshape(-1, D), W1, params["b1"])   # (M, F), M = B*T
    gain = leaky_gain(h, slope)                      # (M, F) 1 or slope
    h *= gain                                        # (M, F) the activation a, in place
    y = affine(h, W2, params["b2"])                  # (M, D)
    return y.reshape(x.shape), FeedForwardCache(LinearCache(x, W1),
                                                LeakyReluCache(gain.reshape(*lead, F)),
                                                LinearCache(h.reshape(*lead, F), W2))


@half_precision_backward
def ff_backward(dy, cache):
    """The three backwards in reverse order; the activation's in place on da."""
    x, W1 = cache.first.x, cache.first.W
    a, W2 = cache.second.x, cache.second.W
    D, F = W1.shape
    da, dW2, db2 = affine_backward(dy.reshape(-1, D), a.reshape(-1, F), W2)  # (M, F), (F, D), (D,)
    da *= cache.act.gain.reshape(-1, F)                                     # (M, F) dh, in place
    dx, dW1, db1 = affine_backward(da, x.reshape(-1, D), W1)                # (M, D), (D, F), (F,)
    return dx.reshape(x.shape), {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2}
