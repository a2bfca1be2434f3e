"""Cases as users bring them: plain random inputs, nothing placed, and planted localised bugs.

The registry's rows draw inputs from each layer's domain; a user draws x ~ N(0, 1) and weights
of scale 1/sqrt(fan-in) and checks.  These cases are written apart from the kernels (nothing
here knows where a kink lies), for the checker's own tests and ``calibrate --wild``.

``plant`` wraps a correct backward so that one tensor's gradient carries a localised bug: one
element scaled by 1.5, one element negated, or one row (the first axis's slice) scaled by 1.05,
at an element whose gradient is at least the tensor's median magnitude (a bug on a gradient that
is zero is no bug at all).
"""
from __future__ import annotations

import numpy as np

BUGS = ("x1.5", "negated", "row x1.05")


def plain_ff(rng, dtype, B=8, T=64, D=128, F=512):
    """A feed-forward layer's (x, params) as a user draws them: standard-normal x, weights of
    scale 1/sqrt(fan-in), biases of scale 0.1; nothing kept away from leaky ReLU's kink."""
    normal = lambda shape, scale=1.0: (scale * rng.standard_normal(shape)).astype(dtype)
    return normal((B, T, D)), {"W1": normal((D, F), 1 / np.sqrt(D)), "b1": normal((F,), 0.1),
                               "W2": normal((F, D), 1 / np.sqrt(F)), "b2": normal((D,), 0.1)}


def plant(backward, tensor, bug, seed, input_names=("x",)):
    """backward with one localised bug (``BUGS``) in the gradient of `tensor` (an input's name
    or a parameter's key), at an element chosen by `seed`."""
    if bug not in BUGS:
        raise ValueError(f"bug: expected one of {BUGS}, got {bug!r}")

    def planted(dout, cache):
        dinputs, dparams = backward(dout, cache)
        single = not isinstance(dinputs, (tuple, list))
        dinputs = [dinputs] if single else list(dinputs)
        if tensor in input_names:
            i = list(input_names).index(tensor)
            dinputs[i] = _broken(dinputs[i], bug, seed)
        else:
            dparams = {**dparams, tensor: _broken(dparams[tensor], bug, seed)}
        return (dinputs[0] if single else tuple(dinputs)), dparams
    return planted


def _broken(g, bug, seed):
    g = np.array(g)
    flat = np.abs(g.astype(np.float64)).reshape(-1)
    large = np.flatnonzero(flat >= np.median(flat))
    at = np.unravel_index(int(np.random.default_rng(seed).choice(large)), g.shape)
    if bug == "x1.5":
        g[at] = g[at] * 1.5
    elif bug == "negated":
        g[at] = -g[at]
    else:
        g[at[0]] = g[at[0]] * 1.05
    return g


def mha_inf_oracle(x, params, *, causal=True):
    """Causal self-attention as users write its oracle: future keys masked with -inf (every
    masked logit, its softmax term and its gradient are exact: -inf, 0 and 0)."""
    import jax
    import jax.numpy as jnp
    B, T, D = x.shape
    H, P, _ = params["WQ"].shape
    xh = x.reshape(B, T, H, P)
    q = jnp.einsum("bthp,hpq->bhtq", xh, params["WQ"])
    k = jnp.einsum("bthp,hpq->bhtq", xh, params["WK"])
    v = jnp.einsum("bthp,hpq->bhtq", xh, params["WV"])
    logits = jnp.einsum("bhtp,bhsp->bhts", q, k) / np.sqrt(P).astype(x.dtype)
    if causal:
        logits = jnp.where(jnp.tril(jnp.ones((T, T), bool)), logits, -jnp.inf)
    a = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhts,bhsp->bthp", a, v).reshape(B, T, D) @ params["WO"]


def attention_params(rng, dtype, D, H):
    """WQ, WK, WV (H, P, P) and WO (D, D), each of scale 1/sqrt(fan-in)."""
    P = D // H
    w = lambda shape: (rng.standard_normal(shape) / np.sqrt(shape[-2])).astype(dtype)
    return {"WQ": w((H, P, P)), "WK": w((H, P, P)), "WV": w((H, P, P)), "WO": w((D, D))}


# --- a recurrence: h_t = tanh(x_t W + h_{t-1} U), h_0 = 0, out = (h_1 ... h_T) -------------

def rnn_forward(x, params):
    """x: (B, T, D) -> hs: (B, T, D), in the inputs' dtype.  The cache holds every state."""
    W, U = params["W"], params["U"]
    h = np.zeros(x.shape[:1] + x.shape[2:], x.dtype)                          # (B, D)
    hs = []
    for t in range(x.shape[1]):
        h = np.tanh(x[:, t] @ W + h @ U)                                        # (B, D)
        hs.append(h)
    hs = np.stack(hs, axis=1)                                                  # (B, T, D)
    return hs, (x, W, U, hs)


def rnn_backward(dhs, cache):
    """Back-propagation through time: (dx, {"W": dW, "U": dU})."""
    x, W, U, hs = cache
    dx, dW, dU = np.zeros_like(x), np.zeros_like(W), np.zeros_like(U)
    dh = np.zeros_like(hs[:, 0])                                               # (B, D)
    for t in range(x.shape[1] - 1, -1, -1):
        dz = (dh + dhs[:, t]) * (1 - hs[:, t] * hs[:, t])                      # (B, D)
        prev = hs[:, t - 1] if t > 0 else np.zeros_like(dh)
        dx[:, t] = dz @ W.T
        dW += x[:, t].T @ dz
        dU += prev.T @ dz
        dh = dz @ U.T
    return dx, {"W": dW, "U": dU}


def rnn_oracle(x, params):
    """The same recurrence as users write it in JAX: lax.scan over time."""
    import jax
    import jax.numpy as jnp

    def step(h, x_t):
        h = jnp.tanh(x_t @ params["W"] + h @ params["U"])
        return h, h
    _, hs = jax.lax.scan(step, jnp.zeros((x.shape[0], x.shape[2]), x.dtype),
                         jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(hs, 0, 1)


def rnn_case(rng, dtype, B=4, T=12, D=8):
    w = lambda: (rng.standard_normal((D, D)) / np.sqrt(D)).astype(dtype)
    return rng.standard_normal((B, T, D)).astype(dtype), {"W": w(), "U": w()}


# --- the article's loss: float64 in, summed in float32, returned as float64 ------------------

def article_cross_entropy(logits, targets, params):
    """Mean cross-entropy as the article writes it: the log-softmax in the inputs' dtype, the
    sum over positions in float32, a float64 scalar returned."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)
    loss = -np.sum(picked.astype(np.float32), dtype=np.float32) / np.float32(targets.size)
    return np.float64(loss), (np.exp(log_p), targets)


def article_cross_entropy_backward(dloss, cache):
    probs, targets = cache
    onehot = targets[..., None] == np.arange(probs.shape[-1])
    return ((probs - onehot) * dloss / targets.size, None), {}
