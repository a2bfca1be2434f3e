"""Affine map x W + b over the last axis (the output projection D -> V is one).

Leading axes are flattened first: (B, T, N_in) @ (N_in, N_out) in NumPy is B products of
(T, N_in) by (N_in, N_out); one (B*T, N_in) product measured 1.2-1.6x faster (float32, one
BLAS thread, the bench's feed-forward shapes: D 32 -> F 128 and D 256 -> F 1024, both ways).
"""
from typing import NamedTuple

from kernels.backend import check_float, check_params
from kernels.precision import half_precision_backward, half_precision


class LinearCache(NamedTuple):
    x: object  # (..., N_in) the input, for dW
    W: object  # (N_in, N_out), for dx


@half_precision
def linear_forward(x, params):
    """y = x W + b.  x: (..., N_in); W: (N_in, N_out); b: (N_out,) -> (..., N_out)."""
    check_float("x", x)
    W = params.get("W") if isinstance(params, dict) else None
    if W is None or W.ndim != 2:
        raise ValueError("linear params: expected 'W' of shape (N_in, N_out) and 'b' (N_out,)")
    check_params("linear", params, {"W": W.shape, "b": (W.shape[1],)}, x.dtype)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(f"x: expected last axis {W.shape[0]} (W's rows), got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, W.shape[0])                # (M, N_in): one product, not one per leading index
    y = (x2 @ W + params["b"]).reshape(*x.shape[:-1], W.shape[1])  # (..., N_out)
    return y, LinearCache(x, W)


@half_precision_backward
def linear_backward(dy, cache):
    """dx = dy W^T;  dW = x^T dy summed over every leading axis;  db = dy summed likewise."""
    x, W = cache
    x2 = x.reshape(-1, W.shape[0])                          # (M, N_in), M = product of leading axes
    dy2 = dy.reshape(-1, W.shape[1])                        # (M, N_out)
    dx = (dy2 @ W.T).reshape(x.shape)                       # (..., N_in)
    return dx, {"W": x2.T @ dy2, "b": dy2.sum(axis=0)}      # (N_in, N_out), (N_out,)
