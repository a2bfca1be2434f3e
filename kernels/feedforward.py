"""The feed-forward block: x W1 + b1 (D -> F), leaky ReLU, then W2 + b2 (F -> D)."""
from typing import NamedTuple

from kernels.activations import leaky_relu_backward, leaky_relu_forward
from kernels.linear import linear_backward, linear_forward
from kernels.precision import half_precision_backward, half_precision


class FeedForwardCache(NamedTuple):
    first: object   # LinearCache of x W1 + b1
    act: object     # LeakyReluCache
    second: object  # LinearCache of h W2 + b2


@half_precision
def ff_forward(x, params, *, slope=0.1):
    """x: (B, T, D); W1 (D, F), b1 (F,), W2 (F, D), b2 (D,) -> (B, T, D)."""
    keys = {"W1", "b1", "W2", "b2"}
    if not isinstance(params, dict) or set(params) != keys:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"ff params: expected keys {sorted(keys)}, got {got}")
    h, first = linear_forward(x, {"W": params["W1"], "b": params["b1"]})   # (B, T, F)
    a, act = leaky_relu_forward(h, {}, slope=slope)                        # (B, T, F)
    y, second = linear_forward(a, {"W": params["W2"], "b": params["b2"]})  # (B, T, D)
    return y, FeedForwardCache(first, act, second)


@half_precision_backward
def ff_backward(dy, cache):
    """The three backwards in reverse order."""
    da, g2 = linear_backward(dy, cache.second)   # (B, T, F)
    dh, _ = leaky_relu_backward(da, cache.act)   # (B, T, F)
    dx, g1 = linear_backward(dh, cache.first)    # (B, T, D)
    return dx, {"W1": g1["W"], "b1": g1["b"], "W2": g2["W"], "b2": g2["b"]}
