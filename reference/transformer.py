"""The whole encoder-decoder transformer in jax.numpy, forward only: the oracle of the model.

Written from the maths of the article (docs/article.md) with this package's layers, never with the kernels: same
parameter names (``enc0.attn.WQ`` ... ``out.b``), the same fixed embedding table passed as
``embedding=``, Start = V - 2 and Finish = V - 1.  Gradients come from ``jax.grad``.

Each layer is one call named ``layer:NAME`` (``reference.layers.as_layer``): the rounding model
perturbs what a layer returns at the checked format and its inside at the compute format, as a
half-precision composition rounds (its residual sums, between the layers, also at the format).
"""
import functools

import jax
import jax.numpy as jnp

from reference import layers
from reference.layers import as_layer


def _layer(params, prefix):
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def _blocks(params):
    return sum(1 for key in params if key.endswith(".attn.WQ"))


def _stream(ids, params, embedding):
    table = jnp.asarray(embedding, dtype=params["out.W"].dtype)
    x = as_layer("embedding", lambda i, t: layers.embedding(i, {"E": t}), ids, table)
    return as_layer("posenc", lambda x: layers.posenc(x, {}), x)


def _norm(x):
    return as_layer("rms_norm", lambda x: layers.rms_norm(x, {}), x)


def _residual(x, layer, norm_position):
    """x + layer(norm(x)) pre-norm (the article's), norm(x + layer(x)) post-norm (Xiong et al.
    2020's Post-LN)."""
    if norm_position == "post":
        return _norm(x + layer(x))
    if norm_position != "pre":
        raise ValueError(f"norm_position: expected 'pre' or 'post', got {norm_position!r}")
    return x + layer(_norm(x))


def attention_sublayer(x, params, *, causal=False, norm_position="pre"):
    """The stage x + MHA(norm(x)) (enc*.attn, dec*.self); post-norm: norm(x + MHA(x)).  With
    QK-norm gains in params, the QK-norm attention of the stream with itself."""
    if "gq" in params:
        return _residual(x, lambda n: as_layer(
            "qknorm_mhca", lambda n, p: layers.qknorm_mhca(n, n, p, causal=causal), n, params),
            norm_position)
    return _residual(x, lambda n: as_layer("mha", lambda n, p: layers.mha(n, p, causal=causal),
                                           n, params), norm_position)


def cross_sublayer(x, z, params, *, norm_position="pre"):
    """The stage x + MHCA(norm(x), Z) (dec*.cross); post-norm: norm(x + MHCA(x, Z)); QK-norm
    when params hold its gains."""
    layer = layers.qknorm_mhca if "gq" in params else layers.mhca
    return _residual(x, lambda n: as_layer(layer.__name__, lambda n, z, p: layer(n, z, p), n, z,
                                           params), norm_position)


def ff_sublayer(x, params, *, norm_position="pre"):
    """The stage x + FF(norm(x)) (enc*.ff, dec*.ff); post-norm: norm(x + FF(x))."""
    return _residual(x, lambda n: as_layer("ff", layers.ff, n, params), norm_position)


def head(y, params, *, dropout=0.0, dropout_mask=None, norm_position="pre"):
    """The stage ``out``: logits = Out(dropout(norm(y))); post-norm Out(dropout(y)), with no
    final norm (the stream is already normalised, as in Xiong et al.'s Post-LN)."""
    n = y if norm_position == "post" else _norm(y)
    if dropout:
        n = as_layer("dropout", lambda n, m: layers.dropout(n, {}, rate=dropout, mask=m), n,
                     dropout_mask)
    return as_layer("linear", layers.linear, n, params)


def probe(probes, name, value):
    """value + probes[name] where a probe of that stage is given: the gradient with respect to
    the probe is the gradient with respect to the stage's output (checks.bisection)."""
    return value + probes[name] if probes and name in probes else value


def encoder(src, params, *, embedding, probes=None, norm_position="pre"):
    x = _stream(src, params, embedding)
    pos = {"norm_position": norm_position}
    for i in range(_blocks(params)):
        x = probe(probes, f"enc{i}.attn",
                  attention_sublayer(x, _layer(params, f"enc{i}.attn."), **pos))
        x = probe(probes, f"enc{i}.ff", ff_sublayer(x, _layer(params, f"enc{i}.ff."), **pos))
    return x


def decoder(y_in, z, params, *, embedding, dropout=0.0, dropout_mask=None, probes=None,
            norm_position="pre"):
    y = _stream(y_in, params, embedding)
    pos = {"norm_position": norm_position}
    for i in range(_blocks(params)):
        y = probe(probes, f"dec{i}.self",
                  attention_sublayer(y, _layer(params, f"dec{i}.self."), causal=True, **pos))
        y = probe(probes, f"dec{i}.cross",
                  cross_sublayer(y, z, _layer(params, f"dec{i}.cross."), **pos))
        y = probe(probes, f"dec{i}.ff", ff_sublayer(y, _layer(params, f"dec{i}.ff."), **pos))
    return probe(probes, "out", head(y, _layer(params, "out."), dropout=dropout,
                                     dropout_mask=dropout_mask, **pos))


def model(src, tgt, params, *, embedding, dropout=0.0, dropout_mask=None, rng=None, watch=None,
          probes=None, norm_position="pre"):
    """Mean cross-entropy of decoder(Start + tgt) against tgt + Finish.  rng and watch are
    accepted for the kernel's signature; the oracle needs the dropout mask itself.  ``probes``
    (stage name -> array of the stage's output shape) are added to the stages' outputs.
    ``norm_position``: "pre" (the article's) or "post" (every stage norm(x + layer(x)), no final
    norm).  Compiled with jax.jit as one program: op by op, the first gradient of a new shape
    spends most of its time compiling each of the few hundred small operations."""
    return _model(src, tgt, params, embedding, float(dropout), dropout_mask, probes,
                  str(norm_position))


@functools.partial(jax.jit, static_argnames=("dropout", "norm_position"))
def _model(src, tgt, params, embedding, dropout, dropout_mask, probes, norm_position):
    V = params["out.W"].shape[1]
    tgt = jnp.asarray(tgt)
    B = tgt.shape[0]
    y_in = jnp.concatenate([jnp.full((B, 1), V - 2, tgt.dtype), tgt], axis=1)
    y_out = jnp.concatenate([tgt, jnp.full((B, 1), V - 1, tgt.dtype)], axis=1)
    z = encoder(jnp.asarray(src), params, embedding=embedding, probes=probes,
                norm_position=norm_position)
    logits = decoder(y_in, z, params, embedding=embedding, dropout=dropout,
                     dropout_mask=dropout_mask, probes=probes, norm_position=norm_position)
    loss = as_layer("cross_entropy", lambda l, t: layers.cross_entropy(l, t, {}), logits, y_out)
    return probe(probes, "loss", loss)
