"""Multi-head self- and cross-attention in the article's per-head form.

The input (B, T, D) is split into H heads of width P = D / H *before* projecting; head h has its
own P x P matrices W_Q[h], W_K[h], W_V[h], so those have shape (H, P, P).  Heads are concatenated
back to (B, T, D) and multiplied by W_O (D, D).  No biases.  The decoder's causal mask adds -1e9
above the diagonal of the logits.  Self-attention is cross-attention of a stream with itself.
"""
import math
from typing import NamedTuple

from kernels.activations import softmax_rows_backward
from kernels.backend import array_module, check_float, check_params

MASK_VALUE = -1e9


def split_heads(x, H):
    """(B, T, D) -> (B, H, T, P)."""
    B, T, D = x.shape
    return x.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, T, P) -> (B, T, D), contiguous."""
    B, H, T, P = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * P)


def per_head_weight_grad(x_h, d_h):
    """sum over batch and tokens of x_h^T d_h, per head: (B, H, T, P) x (B, H, T, P) -> (H, P, P)."""
    B, H, T, P = x_h.shape
    xt = x_h.transpose(1, 3, 0, 2).reshape(H, P, B * T)  # (H, P, B*T)
    dd = d_h.transpose(1, 0, 2, 3).reshape(H, B * T, P)  # (H, B*T, P)
    return xt @ dd                                        # (H, P, P)


class AttentionCache(NamedTuple):
    xq_h: object    # (B, H, T, P) query stream split into heads
    xkv_h: object   # (B, H, S, P) key/value stream split into heads
    q: object       # (B, H, T, P)
    k: object       # (B, H, S, P)
    v: object       # (B, H, S, P)
    a: object       # (B, H, T, S) attention weights (zero where masked)
    heads: object   # (B, T, D) concatenated head outputs, for dW_O
    params: dict    # the weights, for the input gradients


def _check_attention(x, z, params, causal):
    check_float("x", x, ndim=3)
    check_float("z", z, ndim=3)
    WQ = params.get("WQ") if isinstance(params, dict) else None
    if WQ is None or WQ.ndim != 3:
        raise ValueError("attention params: expected 'WQ', 'WK', 'WV' of shape (H, P, P) and 'WO' (D, D)")
    H, P = WQ.shape[0], WQ.shape[1]
    B, T, D = x.shape
    if D % H:
        raise ValueError(f"x: width D = {D} is not divisible by H = {H} heads")
    if H * P != D:
        raise ValueError(f"params['WQ']: expected (H, D/H, D/H) = ({H}, {D // H}, {D // H}), got {tuple(WQ.shape)}")
    if z.shape[0] != B or z.shape[2] != D:
        raise ValueError(f"z: expected shape ({B}, S, {D}) to match x {tuple(x.shape)}, got {tuple(z.shape)}")
    if z.dtype != x.dtype:
        raise TypeError(f"z: expected dtype {x.dtype} (x's), got {z.dtype}")
    if causal and z.shape[1] != T:
        raise ValueError(f"causal: a causal mask needs as many keys as queries, got T = {T}, S = {z.shape[1]}")
    check_params("attention", params, {"WQ": (H, P, P), "WK": (H, P, P), "WV": (H, P, P), "WO": (D, D)},
                 x.dtype)
    return H


def _attention_forward(x, z, params, *, causal=False):
    """Queries from x (B, T, D), keys and values from z (B, S, D) -> (B, T, D)."""
    H = _check_attention(x, z, params, causal)
    xp = array_module(x)
    xq_h, xkv_h = split_heads(x, H), split_heads(z, H)     # (B, H, T, P), (B, H, S, P)
    q = xq_h @ params["WQ"]                                 # (B, H, T, P) x (H, P, P) -> (B, H, T, P)
    k = xkv_h @ params["WK"]                                # (B, H, S, P)
    v = xkv_h @ params["WV"]                                # (B, H, S, P)
    P = q.shape[-1]
    logits = (q @ k.transpose(0, 1, 3, 2)) * x.dtype.type(1 / math.sqrt(P))  # (B, H, T, S)
    if causal:
        T = x.shape[1]
        above = xp.triu(xp.ones((T, T), dtype=bool), k=1)   # (T, T) keys after the query
        logits = logits + xp.where(above, x.dtype.type(MASK_VALUE), x.dtype.type(0))
    logits = logits - logits.max(axis=-1, keepdims=True)     # (B, H, T, S) for overflow safety
    e = xp.exp(logits)
    a = e / e.sum(axis=-1, keepdims=True)                    # (B, H, T, S) softmax over keys
    heads = merge_heads(a @ v)                               # (B, H, T, P) -> (B, T, D)
    out = heads @ params["WO"]                               # (B, T, D)
    return out, AttentionCache(xq_h, xkv_h, q, k, v, a, heads, params)


def _attention_backward(dout, cache):
    """Gradients into the query stream x, the key/value stream z, and the four weights."""
    xq_h, xkv_h, q, k, v, a, heads, params = cache
    B, T, D = dout.shape
    H, P = q.shape[1], q.shape[-1]
    dWO = heads.reshape(-1, D).T @ dout.reshape(-1, D)        # (D, D) sum over B*T of heads^T dout
    dheads = split_heads(dout @ params["WO"].T, H)            # (B, H, T, P)
    da = dheads @ v.transpose(0, 1, 3, 2)                     # (B, H, T, S) through a @ v
    dv = a.transpose(0, 1, 3, 2) @ dheads                     # (B, H, S, P) through a @ v
    dlogits = softmax_rows_backward(da, a)                    # (B, H, T, S); zero where masked (a = 0)
    dlogits = dlogits * dout.dtype.type(1 / math.sqrt(P))     # the 1/sqrt(P) scaling
    dq = dlogits @ k                                          # (B, H, T, P) through q k^T
    dk = dlogits.transpose(0, 1, 3, 2) @ q                    # (B, H, S, P) through q k^T
    grads = {"WQ": per_head_weight_grad(xq_h, dq),            # (H, P, P)
             "WK": per_head_weight_grad(xkv_h, dk),           # (H, P, P)
             "WV": per_head_weight_grad(xkv_h, dv),           # (H, P, P)
             "WO": dWO}
    dx = merge_heads(dq @ params["WQ"].transpose(0, 2, 1))    # (B, T, D) through xq_h W_Q
    dz = merge_heads(dk @ params["WK"].transpose(0, 2, 1)     # (B, S, D) through xkv_h W_K ...
                     + dv @ params["WV"].transpose(0, 2, 1))  # ... and through xkv_h W_V
    return (dx, dz), grads


def mha_forward(x, params, *, causal=False):
    """Multi-head self-attention.  x: (B, T, D) -> (B, T, D); causal masks future keys."""
    return _attention_forward(x, x, params, causal=causal)


def mha_backward(dout, cache):
    """The stream feeds queries, keys and values: its gradient is the sum of both paths."""
    (dx, dz), grads = _attention_backward(dout, cache)
    return dx + dz, grads


def mhca_forward(x, z, params):
    """Multi-head cross-attention: queries from x (B, T, D), keys/values from z (B, S, D)."""
    return _attention_forward(x, z, params, causal=False)


def mhca_backward(dout, cache):
    """Gradients into both streams: (dx, dz), and the weights."""
    return _attention_backward(dout, cache)
