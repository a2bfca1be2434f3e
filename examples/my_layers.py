"""A user's own layers, for ``python -m checks mutate --module examples/my_layers.py``.

Two layers the lab does not have, each a forward above its backward and a ``jax.numpy`` oracle,
and ``ROWS``: one ``checks.registry.Row`` per layer (how to draw a case, the axis names).  The
mutation test generates mistakes from these backwards and says which ones this module's checks
catch, blame on the hand and explain.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from checks.registry import Row

CAP = 6.0  # the soft-cap of the logits


class SoftcapCache(NamedTuple):
    t: object  # (...) tanh(x / cap)


def softcap_forward(x, params, *, cap=CAP):
    """y = cap tanh(x / cap): logits soft-capped to (-cap, cap).  x: (...) -> (...)."""
    t = np.tanh(x / x.dtype.type(cap))              # (...)
    return x.dtype.type(cap) * t, SoftcapCache(t)


def softcap_backward(dy, cache):
    """dx = dy (1 - t^2)."""
    return dy * (1 - cache.t * cache.t), {}


def softcap_oracle(x, params, *, cap=CAP):
    return cap * jnp.tanh(x / cap)


class GluCache(NamedTuple):
    x: object   # (B, T, D) the input
    a: object   # (B, T, F) x Wa, the value
    s: object   # (B, T, F) sigmoid(x Wb), the gate
    Wa: object  # (D, F)
    Wb: object  # (D, F)


def glu_forward(x, params):
    """y = (x Wa) * sigmoid(x Wb).  x: (B, T, D); Wa, Wb: (D, F) -> (B, T, F)."""
    a = x @ params["Wa"]                             # (B, T, F)
    s = 1 / (1 + np.exp(-(x @ params["Wb"])))        # (B, T, F)
    return a * s, GluCache(x, a, s, params["Wa"], params["Wb"])


def glu_backward(dy, cache):
    """Through the value (dy s) and through the gate (dy a s (1 - s))."""
    x, a, s = cache.x, cache.a, cache.s
    D, F = cache.Wa.shape
    da = dy * s                                      # (B, T, F)
    db = dy * a * s * (1 - s)                        # (B, T, F)
    dx = da @ cache.Wa.T + db @ cache.Wb.T           # (B, T, D)
    x2 = x.reshape(-1, D)                            # (B*T, D)
    return dx, {"Wa": x2.T @ da.reshape(-1, F), "Wb": x2.T @ db.reshape(-1, F)}


def glu_oracle(x, params):
    return (x @ params["Wa"]) * jax.nn.sigmoid(x @ params["Wb"])


def _normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


ROWS = [
    Row("softcap", softcap_forward, softcap_backward, softcap_oracle,
        lambda rng, dt, s: ([_normal(rng, (s["B"], s["T"], s["V"]), dt, 8.0)], {}),
        axes={"x": ("batch", "token", "class")}, analytic=True),
    Row("glu", glu_forward, glu_backward, glu_oracle,
        lambda rng, dt, s: ([_normal(rng, (s["B"], s["T"], s["D"]), dt)],
                            {"Wa": _normal(rng, (s["D"], s["F"]), dt, s["D"] ** -0.5),
                             "Wb": _normal(rng, (s["D"], s["F"]), dt, s["D"] ** -0.5)}),
        axes={"x": ("batch", "token", "feature"), "Wa": ("row", "col"), "Wb": ("row", "col")},
        analytic=True),
]
