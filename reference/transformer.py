"""The whole encoder-decoder transformer in jax.numpy, forward only: the oracle of the model.

Written from the maths of the article (docs/article.md) with this package's layers, never with the kernels: same
parameter names (``enc0.attn.WQ`` ... ``out.b``), the same fixed embedding table passed as
``embedding=``, Start = V - 2 and Finish = V - 1.  Gradients come from ``jax.grad``.
"""
import functools

import jax
import jax.numpy as jnp

from reference.layers import cross_entropy, dropout as dropout_layer, embedding as embed, ff, \
    linear, mha, mhca, posenc, rms_norm


def _layer(params, prefix):
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def _blocks(params):
    return sum(1 for key in params if key.endswith(".attn.WQ"))


def _stream(ids, params, embedding):
    table = jnp.asarray(embedding, dtype=params["out.W"].dtype)
    return posenc(embed(ids, {"E": table}), {})


def encoder(src, params, *, embedding):
    x = _stream(src, params, embedding)
    for i in range(_blocks(params)):
        x = x + mha(rms_norm(x, {}), _layer(params, f"enc{i}.attn."))
        x = x + ff(rms_norm(x, {}), _layer(params, f"enc{i}.ff."))
    return x


def decoder(y_in, z, params, *, embedding, dropout=0.0, dropout_mask=None):
    y = _stream(y_in, params, embedding)
    for i in range(_blocks(params)):
        y = y + mha(rms_norm(y, {}), _layer(params, f"dec{i}.self."), causal=True)
        y = y + mhca(rms_norm(y, {}), z, _layer(params, f"dec{i}.cross."))
        y = y + ff(rms_norm(y, {}), _layer(params, f"dec{i}.ff."))
    n = rms_norm(y, {})
    if dropout:
        n = dropout_layer(n, {}, rate=dropout, mask=dropout_mask)
    return linear(n, _layer(params, "out."))


def model(src, tgt, params, *, embedding, dropout=0.0, dropout_mask=None, rng=None, watch=None):
    """Mean cross-entropy of decoder(Start + tgt) against tgt + Finish.  rng and watch are
    accepted for the kernel's signature; the oracle needs the dropout mask itself.
    Compiled with jax.jit as one program: op by op, the first gradient of a new shape spends
    most of its time compiling each of the few hundred small operations."""
    return _model(src, tgt, params, embedding, float(dropout), dropout_mask)


@functools.partial(jax.jit, static_argnames=("dropout",))
def _model(src, tgt, params, embedding, dropout, dropout_mask):
    V = params["out.W"].shape[1]
    tgt = jnp.asarray(tgt)
    B = tgt.shape[0]
    y_in = jnp.concatenate([jnp.full((B, 1), V - 2, tgt.dtype), tgt], axis=1)
    y_out = jnp.concatenate([tgt, jnp.full((B, 1), V - 1, tgt.dtype)], axis=1)
    z = encoder(jnp.asarray(src), params, embedding=embedding)
    logits = decoder(y_in, z, params, embedding=embedding, dropout=dropout,
                     dropout_mask=dropout_mask)
    return cross_entropy(logits, y_out, {})
