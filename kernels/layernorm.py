"""Layer normalisation with a gain and a bias over the last axis (the guide's worked example:
docs/adding-a-layer.md adds it the way any new layer is added)."""
from typing import NamedTuple

from kernels.activations import row_sum
from kernels.backend import array_module, check_float, check_params
from kernels.precision import half_precision_backward, half_precision

EPS = 1e-5


class LayerNormCache(NamedTuple):
    xhat: object     # (..., D) the normalised input, before gain and bias
    inv_std: object  # (..., 1) 1 / sqrt(var(x) + eps)
    g: object        # (D,) the gain, for dxhat


def standardise(x, eps=EPS):
    """(x - mean(x)) / sqrt(var(x) + eps) over the last axis: (xhat (..., D), inv_std (..., 1)).
    Shared by the layer norm and the QK-norm of attention (kernels/attention.py).  The means are
    row sums by a product (row_sum: measured 15x faster than mean(axis=-1) on attention's rows of
    P = 8 features)."""
    xp = array_module(x)
    inv_D = x.dtype.type(1 / x.shape[-1])
    centred = x - row_sum(x) * inv_D                                            # (..., D)
    inv_std = row_sum(centred * centred)                                        # (..., 1) then in place:
    inv_std *= inv_D
    inv_std += x.dtype.type(eps)
    xp.sqrt(inv_std, out=inv_std)
    xp.reciprocal(inv_std, out=inv_std)                                         # 1 / sqrt(var + eps)
    return centred * inv_std, inv_std                                           # (..., D), (..., 1)


def standardise_backward(dxhat, xhat, inv_std):
    """dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / std: the direct term, the term
    through the mean and the term through the variance.  (..., D) -> (..., D)."""
    inv_D = dxhat.dtype.type(1 / dxhat.shape[-1])
    dx = dxhat - row_sum(dxhat) * inv_D                                         # through the mean
    dx -= xhat * (row_sum(dxhat * xhat) * inv_D)                                # through the variance
    dx *= inv_std                                                               # (..., D)
    return dx


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
