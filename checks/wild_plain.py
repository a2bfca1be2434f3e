"""Kernels as users write them in plain NumPy, for half precision as NumPy computes it.

No decorator, no upcast: on float16 and bfloat16 arrays NumPy accumulates a matrix product in
float32 (ml_dtypes' bfloat16 ``@`` returns float32, rounded back here with ``astype``), rounds every
element-wise result to the format, and sums term by term in the format (``kernels.precision``,
``PLAIN``).  They declare no compute format, so the checker judges them by that model.  They are
correct maths in every dtype (float64 and float32 too), for ``calibrate --wild`` and the tests;
``checks.calibrate_wild`` pairs each with its oracle in ``reference``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


def _mm(a, b):
    """a @ b in a's dtype (bfloat16's product comes back as float32 and is rounded once)."""
    return (a @ b).astype(a.dtype)


def _rows(a):
    return a.reshape(-1, a.shape[-1])                                          # (M, N)


# --- linear: y = x W + b ------------------------------------------------------------------

class LinearCache(NamedTuple):
    x: np.ndarray  # (..., N_in)
    W: np.ndarray  # (N_in, N_out)


def linear_forward(x, params):
    return _mm(x, params["W"]) + params["b"], LinearCache(x, params["W"])       # (..., N_out)


def linear_backward(dy, cache):
    dx = _mm(dy, cache.W.T)                                                     # (..., N_in)
    dW = _mm(_rows(cache.x).T, _rows(dy))                                       # (N_in, N_out)
    db = _rows(dy).sum(axis=0)                                                  # (N_out,)
    return dx, {"W": dW, "b": db}


# --- leaky ReLU ---------------------------------------------------------------------------

def leaky_relu_forward(x, params, *, slope=0.1):
    positive = x > 0                                                            # (...) bool
    return np.where(positive, x, slope * x), positive


def leaky_relu_backward(dy, positive, *, slope=0.1):
    return np.where(positive, dy, slope * dy), {}                               # (...)


# --- feed-forward: leaky_relu(x W1 + b1) W2 + b2 -------------------------------------------

class FfCache(NamedTuple):
    first: LinearCache
    positive: np.ndarray  # (..., F) bool
    second: LinearCache


def ff_forward(x, params, *, slope=0.1):
    h, first = linear_forward(x, {"W": params["W1"], "b": params["b1"]})       # (..., F)
    a, positive = leaky_relu_forward(h, {}, slope=slope)                        # (..., F)
    y, second = linear_forward(a, {"W": params["W2"], "b": params["b2"]})      # (..., D)
    return y, FfCache(first, positive, second)


def ff_backward(dy, cache, *, slope=0.1):
    da, g2 = linear_backward(dy, cache.second)                                  # (..., F)
    dh, _ = leaky_relu_backward(da, cache.positive, slope=slope)                # (..., F)
    dx, g1 = linear_backward(dh, cache.first)                                   # (..., D)
    return dx, {"W1": g1["W"], "b1": g1["b"], "W2": g2["W"], "b2": g2["b"]}


# --- layer norm: g (x - mean) / sqrt(var + eps) + b -----------------------------------------

class LayernormCache(NamedTuple):
    xhat: np.ndarray    # (..., D) normalised x
    inv: np.ndarray     # (..., 1) 1 / sqrt(var + eps)
    g: np.ndarray       # (D,)


def layernorm_forward(x, params, *, eps=1e-5):
    centred = x - x.mean(axis=-1, keepdims=True)                                # (..., D)
    inv = 1 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)   # (..., 1)
    xhat = centred * inv                                                        # (..., D)
    return params["g"] * xhat + params["b"], LayernormCache(xhat, inv, params["g"])


def layernorm_backward(dy, cache):
    dxhat = dy * cache.g                                                        # (..., D)
    dx = cache.inv * (dxhat - dxhat.mean(axis=-1, keepdims=True)               # (..., D)
                      - cache.xhat * (dxhat * cache.xhat).mean(axis=-1, keepdims=True))
    dg = _rows(dy * cache.xhat).sum(axis=0)                                     # (D,)
    db = _rows(dy).sum(axis=0)                                                  # (D,)
    return dx, {"g": dg, "b": db}


# --- softmax over the last axis --------------------------------------------------------------

def softmax_forward(x, params):
    e = np.exp(x - x.max(axis=-1, keepdims=True))                               # (..., V)
    p = e / e.sum(axis=-1, keepdims=True)                                       # (..., V)
    return p, p


def softmax_backward(dy, p):
    return p * (dy - (dy * p).sum(axis=-1, keepdims=True)), {}                  # (..., V)


# --- cross-entropy: mean over positions of -log softmax(logits)[target] -------------------

class CrossEntropyCache(NamedTuple):
    probs: np.ndarray    # (..., V)
    targets: np.ndarray  # (...) integer ids


def cross_entropy_forward(logits, targets, params):
    shifted = logits - logits.max(axis=-1, keepdims=True)                       # (..., V)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))       # (..., V)
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)             # (..., 1)
    return -picked.mean(), CrossEntropyCache(np.exp(log_p), targets)            # ()


def cross_entropy_backward(dloss, cache):
    onehot = cache.targets[..., None] == np.arange(cache.probs.shape[-1])       # (..., V)
    scale = np.asarray(dloss, cache.probs.dtype) / cache.targets.size           # ()
    return ((cache.probs - onehot) * scale, None), {}                           # (..., V)
