"""Token embedding lookup: a fixed orthogonal table in the article, trainable here if wanted."""
from typing import NamedTuple

import numpy

from kernels.backend import array_module, check_float, check_ids, scatter_add
from kernels.precision import half_precision_backward, half_precision


def orthogonal_embedding(V, D, seed=13, dtype=numpy.float32):
    """The article's fixed table: first V rows of Q from the QR of a D x D normal matrix."""
    if V > D:
        raise ValueError(f"V: orthogonal embeddings need V <= D, got V = {V} > D = {D}")
    q, _ = numpy.linalg.qr(numpy.random.default_rng(seed).standard_normal((D, D)))  # (D, D)
    return q[:V].astype(dtype)  # (V, D)


class EmbeddingCache(NamedTuple):
    ids: object      # (B, T) integer token ids
    vocab: int       # V, the number of rows of the table


@half_precision
def embedding_forward(ids, params):
    """out[b, t] = E[ids[b, t]].  ids: (B, T) integers in [0, V); params E: (V, D)."""
    if not isinstance(params, dict) or set(params) != {"E"}:
        raise ValueError(f"embedding params: expected keys ['E'], got {sorted(params)}")
    E = params["E"]
    check_float("embedding params['E']", E, ndim=2)
    check_ids("ids", ids, E.shape[0])
    if ids.ndim != 2:
        raise ValueError(f"ids: expected rank 2 (B, T), got shape {tuple(ids.shape)}")
    out = E[ids]  # (B, T, D)
    return out, EmbeddingCache(ids, E.shape[0])


@half_precision_backward
def embedding_backward(dout, cache):
    """dE[v] = sum of dout over every position holding token v (repeated ids accumulate)."""
    xp = array_module(dout)
    D = dout.shape[-1]
    dE = xp.zeros((cache.vocab, D), dtype=dout.dtype)                       # (V, D)
    scatter_add(dE, cache.ids.reshape(-1), dout.reshape(-1, D))            # (B*T, D) into (V, D)
    return None, {"E": dE}  # token ids are not differentiable
