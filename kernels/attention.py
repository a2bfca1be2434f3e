"""Multi-head self- and cross-attention in the article's per-head form.

The input (B, T, D) is split into H heads of width P = D / H *before* projecting; head h has its
own P x P matrices W_Q[h], W_K[h], W_V[h], so those have shape (H, P, P).  Heads are concatenated
back to (B, T, D) and multiplied by W_O (D, D).  No biases.  The decoder's causal mask hides the
keys after each query (the article adds -1e9 to their logits; see activations.softmax_rows).
Self-attention is cross-attention of a stream with itself.

Inside, heads come first: (H, B, T, P).  The per-head projections are then H matrix products of
(B*T, P) by (P, P), and every batched product runs over contiguous (H, B) stacks.

QK-norm (``qknorm_mhca_forward``; the model's ``qk_norm`` option): each head's queries and keys
are layer-normalised over their P features (mean and variance, eps 1e-5, as Wortsman et al. 2023's
qk-layernorm) and multiplied by learned gains g_Q[h], g_K[h] of shape (H, P), no bias (a key bias
adds the same amount to every logit of a query and cancels in the softmax).  The logits
(g_Q q^).(g_K k^)/sqrt(P) then lie within +-sqrt(P) max_j |g_Q[h, j] g_K[h, j]|: the gains carry
the logit scale, so a norm with unit gains does not remove it by construction.  The same
backward serves both forms: it passes dq and dk back through the norm when the cache holds one.
"""
import math
from typing import NamedTuple

from kernels.activations import softmax_rows, softmax_rows_backward
from kernels.backend import array_module, check_float, check_params
from kernels.layernorm import standardise, standardise_backward
from kernels.linear import column_sum
from kernels.precision import half_precision_backward, half_precision


def split_heads(x, H):
    """(B, T, D) -> (H, B*T, P), a view: head h holds features h*P ... (h+1)*P - 1."""
    B, T, D = x.shape
    return x.reshape(B * T, H, D // H).transpose(1, 0, 2)


def merge_heads(x_h, B):
    """(H, B*T, P) or (H, B, T, P) -> (B, T, D), contiguous: the heads concatenated."""
    H, P = x_h.shape[0], x_h.shape[-1]
    return x_h.reshape(H, -1, P).transpose(1, 0, 2).reshape(B, -1, H * P)


def causal_keep(T, dtype, xp):
    """(T, T) 1 on and below the diagonal (keys a query may see), 0 above."""
    return xp.tri(T, dtype=dtype)


class AttentionCache(NamedTuple):
    xq_h: object    # (H, B*T, P) query stream split into heads (a view of the input)
    xkv_h: object   # (H, B*S, P) key/value stream split into heads
    q: object       # (H, B, T, P)
    k: object       # (H, B, S, P)
    v: object       # (H, B, S, P)
    a: object       # (H, B, T, S) attention weights (zero where masked)
    heads: object   # (B*T, D) concatenated head outputs, for dW_O
    params: dict    # the weights, for the input gradients
    qk: object = None  # QkNormCache with QK-norm (q and k above are then the normalised ones)


class QkNormCache(NamedTuple):
    q_hat: object    # (H, B, T, P) the queries standardised over P, before the gain
    k_hat: object    # (H, B, S, P) the keys likewise
    q_inv: object    # (H, B, T, 1) 1 / sqrt(var + eps) of each query
    k_inv: object    # (H, B, S, 1)


def _check_attention(x, z, params, causal, qk_norm=False):
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
    gains = {"gq": (H, P), "gk": (H, P)} if qk_norm else {}
    check_params("qknorm_attention" if qk_norm else "attention", params,
                 {"WQ": (H, P, P), "WK": (H, P, P), "WV": (H, P, P), "WO": (D, D), **gains}, x.dtype)
    return H


def _stacked_transposed(params, names):
    """The per-head matrices' transposes stacked: (H, P, P) each -> (H, n P, P), contiguous, for
    one product dx_h = [dq | dk | dv] [W_Q | W_K | W_V]^T.  (A product whose second operand is
    a transposed view measured 1.3-4x slower than on this small contiguous copy.)"""
    xp = array_module(params[names[0]])
    return xp.concatenate([params[n].transpose(0, 2, 1) for n in names], axis=1)


def _transposed(x):
    """(..., M, N) -> (..., N, M), a contiguous copy: NumPy's batched products of attention's
    small matrices measured 3-4x slower with a transposed view as the second operand."""
    xp = array_module(x)
    out = xp.empty((*x.shape[:-2], x.shape[-1], x.shape[-2]), dtype=x.dtype)
    out[...] = x.swapaxes(-1, -2)
    return out


def _qk_norm(q, k, params):
    """Each head's queries (H, B, T, P) and keys (H, B, S, P) standardised over P and scaled by
    their gains (H, P): (q, k, QkNormCache)."""
    q_hat, q_inv = standardise(q)                                   # (H, B, T, P), (H, B, T, 1)
    k_hat, k_inv = standardise(k)                                   # (H, B, S, P), (H, B, S, 1)
    gq, gk = params["gq"][:, None, None, :], params["gk"][:, None, None, :]  # (H, 1, 1, P) each
    return q_hat * gq, k_hat * gk, QkNormCache(q_hat, k_hat, q_inv, k_inv)


def _qk_norm_backward(dq, dk, cache, params):
    """Back through the gains and the standardisation: (dq, dk, {gq, gk}) from the gradients of
    the normalised q (H, B, T, P) and k (H, B, S, P)."""
    gq, gk = params["gq"][:, None, None, :], params["gk"][:, None, None, :]  # (H, 1, 1, P) each
    H, P = dq.shape[0], dq.shape[-1]
    grads = {"gq": column_sum((dq * cache.q_hat).reshape(H, -1, P)),  # (H, P) over B and T
             "gk": column_sum((dk * cache.k_hat).reshape(H, -1, P))}  # (H, P) over B and S
    return (standardise_backward(dq * gq, cache.q_hat, cache.q_inv),  # (H, B, T, P)
            standardise_backward(dk * gk, cache.k_hat, cache.k_inv), grads)  # (H, B, S, P)


def _attention_forward(x, z, params, *, causal=False, qk_norm=False):
    """Queries from x (B, T, D), keys and values from z (B, S, D) -> (B, T, D).

    q, k and v come from three products, not one by [W_Q | W_K | W_V]: the one product's
    column slices are strided views, and the products that read them measured slower than the
    two saved calls (1.4x at the article's sizes).  The head outputs are written straight into
    the (B, T, D) layout."""
    H = _check_attention(x, z, params, causal, qk_norm)
    xp = array_module(x)
    (B, T, D), S = x.shape, z.shape[1]
    P = D // H
    xq_h, xkv_h = split_heads(x, H), split_heads(z, H)          # (H, B*T, P), (H, B*S, P)
    q = (xq_h @ params["WQ"]).reshape(H, B, T, P)               # (H, B*T, P) x (H, P, P) -> (H, B, T, P)
    k = (xkv_h @ params["WK"]).reshape(H, B, S, P)              # (H, B, S, P)
    v = (xkv_h @ params["WV"]).reshape(H, B, S, P)              # (H, B, S, P)
    qk = None
    if qk_norm:
        q, k, qk = _qk_norm(q, k, params)                       # (H, B, T, P), (H, B, S, P)
    logits = q @ _transposed(k)                                 # (H, B, T, P) x (H, B, P, S) -> (H, B, T, S)
    logits *= x.dtype.type(1 / math.sqrt(P))                    # the 1/sqrt(P) scaling
    a = softmax_rows(logits, causal_keep(T, x.dtype, xp) if causal else None,
                     overwrite=True)                            # (H, B, T, S), over the logits
    heads = xp.empty((B, T, H, P), dtype=x.dtype)               # (B, T, H, P): heads concatenated
    xp.matmul(a, v, out=heads.transpose(2, 0, 1, 3))            # (H, B, T, P) view written in place
    heads = heads.reshape(B * T, D)                             # (B*T, D)
    out = (heads @ params["WO"]).reshape(B, T, D)               # (B, T, D)
    return out, AttentionCache(xq_h, xkv_h, q, k, v, a, heads, params, qk)


def _attention_backward(dout, cache, *, same_stream):
    """Head-space gradients and the weights' gradients.  same_stream (self-attention): one
    (H, B*T, P) gradient of the stream, its three paths summed by one product; otherwise the
    query stream's (H, B*T, P) and the key/value stream's (H, B*S, P)."""
    xq_h, xkv_h, q, k, v, a = cache.xq_h, cache.xkv_h, cache.q, cache.k, cache.v, cache.a
    params, xp = cache.params, array_module(dout)
    H, B, T, P = q.shape
    S, D = k.shape[2], H * P
    dout2 = dout.reshape(B * T, D)                                  # (B*T, D)
    dWO = cache.heads.T @ dout2                                     # (D, D) sum over B*T of heads^T dout
    dheads = split_heads((dout2 @ params["WO"].T).reshape(B, T, D), H).reshape(H, B, T, P)
    da = dheads @ _transposed(v)                                    # (H, B, T, S) through a @ v
    dlogits = softmax_rows_backward(da, a)                          # (H, B, T, S); 0 where masked (a = 0)
    dlogits *= dout.dtype.type(1 / math.sqrt(P))                    # the 1/sqrt(P) scaling
    # dq, dk, dv side by side, each written by its product into its slice:
    # self-attention (H, B, T, 3P) = [dq | dk | dv]; cross-attention dq and (H, B, S, 2P) = [dk | dv]
    dqkv = xp.empty((H, B, S, (3 if same_stream else 2) * P), dtype=dout.dtype)
    dkv = dqkv[..., P:] if same_stream else dqkv                     # (H, B, S, 2P)
    dq = dqkv[..., :P] if same_stream else xp.empty((H, B, T, P), dtype=dout.dtype)
    xp.matmul(dlogits, k, out=dq)                                   # (H, B, T, P) through q k^T
    xp.matmul(dlogits.transpose(0, 1, 3, 2), q, out=dkv[..., :P])   # (H, B, S, P) through q k^T
    xp.matmul(a.transpose(0, 1, 3, 2), dheads, out=dkv[..., P:])    # (H, B, S, P) through a @ v
    norm_grads = {}
    if cache.qk is not None:                                        # QK-norm: back through it
        dq[...], dkv[..., :P], norm_grads = _qk_norm_backward(dq, dkv[..., :P], cache.qk, params)
    if same_stream:
        dqkv = dqkv.reshape(H, B * T, 3 * P)                        # (H, B*T, 3P)
        dW = xq_h.transpose(0, 2, 1) @ dqkv                         # (H, P, 3P) sum over B*T of x_h^T [dq|dk|dv]
        grads = {"WQ": dW[..., :P], "WK": dW[..., P:2 * P], "WV": dW[..., 2 * P:], "WO": dWO,
                 **norm_grads}
        dx_h = dqkv @ _stacked_transposed(params, ("WQ", "WK", "WV"))  # (H, B*T, P) all three paths
        return dx_h, None, grads
    dq, dkv = dq.reshape(H, B * T, P), dkv.reshape(H, B * S, 2 * P)  # (H, B*T, P), (H, B*S, 2P)
    dWkv = xkv_h.transpose(0, 2, 1) @ dkv                           # (H, P, 2P) sum over B*S
    grads = {"WQ": xq_h.transpose(0, 2, 1) @ dq,                    # (H, P, P) sum over B*T of x_h^T dq
             "WK": dWkv[..., :P], "WV": dWkv[..., P:], "WO": dWO, **norm_grads}
    dxq_h = dq @ _stacked_transposed(params, ("WQ",))               # (H, B*T, P) through xq_h W_Q
    dxkv_h = dkv @ _stacked_transposed(params, ("WK", "WV"))        # (H, B*S, P) through K and V
    return dxq_h, dxkv_h, grads


@half_precision
def mha_forward(x, params, *, causal=False):
    """Multi-head self-attention.  x: (B, T, D) -> (B, T, D); causal masks future keys."""
    return _attention_forward(x, x, params, causal=causal)


@half_precision_backward
def mha_backward(dout, cache):
    """The stream feeds queries, keys and values: its gradient is the sum of the three paths.
    Also the backward of QK-norm self-attention (qknorm_mhca_forward(x, x, ...): the model's)."""
    dx_h, _, grads = _attention_backward(dout, cache, same_stream=True)
    return merge_heads(dx_h, dout.shape[0]), grads                  # (B, T, D)


@half_precision
def mhca_forward(x, z, params):
    """Multi-head cross-attention: queries from x (B, T, D), keys/values from z (B, S, D)."""
    return _attention_forward(x, z, params, causal=False)


def _cross_backward(dout, cache):
    """(dx, dz) of cross-attention, plain or QK-norm (the cache says which), and the weights'."""
    dxq_h, dxkv_h, grads = _attention_backward(dout, cache, same_stream=False)
    B = dout.shape[0]
    return (merge_heads(dxq_h, B), merge_heads(dxkv_h, B)), grads   # (B, T, D), (B, S, D)


@half_precision_backward
def mhca_backward(dout, cache):
    """Gradients into both streams: (dx, dz), and the weights."""
    return _cross_backward(dout, cache)


@half_precision
def qknorm_mhca_forward(x, z, params, *, causal=False):
    """Cross-attention with QK-norm (module docstring): queries from x (B, T, D), keys/values
    from z (B, S, D) -> (B, T, D); params as mhca's plus the gains gq, gk (H, P).  Self-attention
    is z = x (the model's qk_norm option; mha_backward then sums the stream's paths)."""
    return _attention_forward(x, z, params, causal=causal, qk_norm=True)


@half_precision_backward
def qknorm_mhca_backward(dout, cache):
    """(dx, dz) and the weights' gradients, the gains' included."""
    return _cross_backward(dout, cache)
