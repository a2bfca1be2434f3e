"""Layer normalisation with a gain and a bias over the last axis (the guide's worked example:
docs/adding-a-layer.md adds it the way any new layer is added)."""
from typing import NamedTuple

from kernels.backend import array_module, check_float, check_params
from kernels.precision import half_precision_backward, half_precision

EPS = 1e-5


class LayerNormCache(NamedTuple):
    xhat: object     # (..., D) the normalised input, before gain and bias
    inv_std: object  # (..., 1) 1 / sqrt(var(x) + eps)
    g: object        # (D,) the gain, for dxhat


@half_precision
def layernorm_forward(x, params, *, eps=EPS):
    """y = g * (x - mean(x)) / sqrt(var(x) + eps) + b over the last axis.

    x: (..., D); params g: (D,) gain, b: (D,) bias -> (..., D).
    """
    check_float("x", x)
    D = x.shape[-1]
    check_params("layernorm", params, {"g": (D,), "b": (D,)}, x.dtype)
    xp = array_module(x)
    centred = x - x.mean(axis=-1, keepdims=True)                               # (..., D)
    inv_std = 1 / xp.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = centred * inv_std                                                    # (..., D)
    return xhat * params["g"] + params["b"], LayerNormCache(xhat, inv_std, params["g"])


@half_precision_backward
def layernorm_backward(dy, cache):
    """dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / std, with dxhat = dy * g: the
    direct term, the term through the mean and the term through the variance."""
    xhat, inv_std, g = cache
    D = xhat.shape[-1]
    dxhat = dy * g                                                              # (..., D)
    dx = (dxhat - dxhat.mean(axis=-1, keepdims=True)                            # through the mean
          - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)) * inv_std       # through the variance
    dg = (dy * xhat).reshape(-1, D).sum(axis=0)                                 # (D,) over every position
    db = dy.reshape(-1, D).sum(axis=0)                                          # (D,)
    return dx, {"g": dg, "b": db}
