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


def standardise(x, eps=EPS):
    """(x - mean(x)) / sqrt(var(x) + eps) over the last axis: (xhat (..., D), inv_std (..., 1)).
    Shared by the layer norm and the QK-norm of attention (kernels/attention.py)."""
    xp = array_module(x)
    centred = x - x.mean(axis=-1, keepdims=True)                               # (..., D)
    inv_std = 1 / xp.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    return centred * inv_std, inv_std                                           # (..., D), (..., 1)


def standardise_backward(dxhat, xhat, inv_std):
    """dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / std: the direct term, the term
    through the mean and the term through the variance.  (..., D) -> (..., D)."""
    return (dxhat - dxhat.mean(axis=-1, keepdims=True)                          # through the mean
            - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)) * inv_std     # through the variance


@half_precision
def layernorm_forward(x, params, *, eps=EPS):
    """y = g * (x - mean(x)) / sqrt(var(x) + eps) + b over the last axis.

    x: (..., D); params g: (D,) gain, b: (D,) bias -> (..., D).
    """
    check_float("x", x)
    D = x.shape[-1]
    check_params("layernorm", params, {"g": (D,), "b": (D,)}, x.dtype)
    xhat, inv_std = standardise(x, eps)                                         # (..., D), (..., 1)
    return xhat * params["g"] + params["b"], LayerNormCache(xhat, inv_std, params["g"])


@half_precision_backward
def layernorm_backward(dy, cache):
    """dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / std, with dxhat = dy * g: the
    direct term, the term through the mean and the term through the variance."""
    xhat, inv_std, g = cache
    D = xhat.shape[-1]
    dxhat = dy * g                                                              # (..., D)
    dx = standardise_backward(dxhat, xhat, inv_std)                             # (..., D)
    dg = (dy * xhat).reshape(-1, D).sum(axis=0)                                 # (D,) over every position
    db = dy.reshape(-1, D).sum(axis=0)                                          # (D,)
    return dx, {"g": dg, "b": db}
