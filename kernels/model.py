"""The whole encoder-decoder transformer, composed from the layer kernels.

    encoder:  x = PE(E[src]);  per block: x = x + MHA(norm(x));  x = x + FF(norm(x))   -> Z
    decoder:  y = PE(E[Start + target]);  per block: y = y + MHA_causal(norm(y));
              y = y + MHCA(norm(y), Z);  y = y + FF(norm(y))
              logits = Out(dropout(norm(y)))                  # the final norm, in training and generation
    loss:     cross-entropy(logits, target + Finish)

The embedding table E (V, D) is fixed, not trained (the article's orthogonal rows): it is passed
as ``embedding=`` and cast to the parameters' dtype like the positional table.  The trained
parameters live in one flat dict whose keys name the layer: ``enc0.attn.WQ``, ``enc0.ff.W1``,
``dec0.self.WQ``, ``dec0.cross.WQ``, ``dec0.ff.b2``, ``out.W`` ...; the number of blocks per side,
D, H, F and V are read from it.  The last two ids of the vocabulary are Start (V - 2) and
Finish (V - 1); the article's V = 12 gives digits 0-9, Start 10, Finish 11.

``model_backward`` calls the layers' backwards in the reverse order of ``model_forward``.
A ``watch(layer, direction, array)`` callback, when given, sees every layer's output on the way
forward and every gradient on the way back (training's debug mode stops at the first non-finite
one).  The model is a sequence of named stages (``enc0.attn`` ... ``dec0.ff``, the ``out`` head,
the ``loss``), each a kernel pair; every stage runs through a ``tape`` (``DIRECT`` by default),
an object with ``forward(name, forward, backward, inputs, params, static)`` and
``backward(name, backward, dout, cache)``: ``checks.bisection.Tape`` records the stages there.
``decode`` is the one decoder: teacher-forced training and greedy ``generate`` both call it.

QK-norm (``ModelConfig.qk_norm``, off by default): every attention layer (encoder self, decoder
self and cross) normalises its per-head queries and keys (kernels/attention.py,
``qknorm_mhca_forward``) with gains ``gq``, ``gk`` (H, P) that start at one and are trained.  A
parameter dict with ``enc0.attn.gq`` is a QK-norm model; the weights of a seed are the same with
and without it (the gains take no draw).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import numpy

from kernels.attention import (mha_backward, mha_forward, mhca_backward, mhca_forward,
                               qknorm_mhca_forward)
from kernels.backend import array_module, check_float, check_ids, check_params
from kernels.dropout import dropout_backward, dropout_forward, dropout_mask as draw_mask
from kernels.embedding import embedding_forward, orthogonal_embedding
from kernels.feedforward import ff_backward, ff_forward
from kernels.linear import linear_backward, linear_forward
from kernels.loss import cross_entropy_backward, cross_entropy_forward
from kernels.norm import rms_norm_backward, rms_norm_forward
from kernels.positional import posenc_backward, posenc_forward
from kernels.precision import FLOAT32_INSIDE, computes_in


# --- configuration and parameters --------------------------------------------------------

# Where each residual stage normalises.  "pre" (the article's): x + layer(norm(x)), and a final
# norm before the output layer.  "post" (the original Transformer's, Xiong et al. 2020's Post-LN):
# norm(x + layer(x)), and no final norm, as in Xiong et al.'s Post-LN: the stream leaving the last
# stage is already normalised.  Both use the lab's parameter-free RMS norm, not a layer norm with
# gain and bias.  The parameters are the same in both, so the position is an argument of
# model_forward and generate, not read from the parameter dict.
NORM_POSITIONS = ("pre", "post")

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes of the model (the article's defaults).  Parameters do not depend on the length T."""
    D: int = 32       # model width
    H: int = 4        # heads, P = D / H
    F: int = 128      # feed-forward width
    V: int = 12       # vocabulary: V - 2 data tokens, then Start and Finish
    blocks: int = 1   # blocks per side (encoder and decoder each)
    qk_norm: bool = False  # QK-norm with learned gains in every attention layer
    norm_position: str = "pre"  # "pre": x + layer(norm(x)); "post": norm(x + layer(x)) (NORM_POSITIONS)

    def __post_init__(self):
        for name in ("D", "H", "F", "V", "blocks"):
            value = getattr(self, name)
            if not isinstance(value, (int, numpy.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.D % self.H:
            raise ValueError(f"D: the width D = {self.D} must be divisible by H = {self.H} heads")
        if self.D % 2:
            raise ValueError(f"D: the positional encoding needs an even width, got D = {self.D}")
        if self.V < 3:
            raise ValueError(f"V: expected at least 3 ids (one data token, Start, Finish), got {self.V}")
        if self.V > self.D:
            raise ValueError(f"V: orthogonal embeddings need V <= D, got V = {self.V} > D = {self.D}")
        if not isinstance(self.qk_norm, (bool, numpy.bool_)):
            raise TypeError(f"qk_norm: expected True or False, got {self.qk_norm!r}")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position: expected one of {', '.join(NORM_POSITIONS)}, "
                             f"got {self.norm_position!r}")

    @property
    def start(self) -> int:
        return self.V - 2

    @property
    def finish(self) -> int:
        return self.V - 1


def _attention_shapes(c):
    P = c.D // c.H
    gains = {"gq": (c.H, P), "gk": (c.H, P)} if c.qk_norm else {}
    return {"WQ": (c.H, P, P), "WK": (c.H, P, P), "WV": (c.H, P, P), "WO": (c.D, c.D), **gains}


def _ff_shapes(c):
    return {"W1": (c.D, c.F), "b1": (c.F,), "W2": (c.F, c.D), "b2": (c.D,)}


def prefixed(prefix, mapping):
    """{'WQ': a} -> {'enc0.attn.WQ': a}."""
    return {prefix + key: value for key, value in mapping.items()}


def sub(params, prefix):
    """The inverse of prefixed: the entries of one layer, with the prefix removed."""
    return {key[len(prefix):]: value for key, value in params.items() if key.startswith(prefix)}


def param_shapes(config: ModelConfig) -> dict:
    """Every trained parameter's name and shape, in the order the initialiser draws them."""
    shapes = {}
    for i in range(config.blocks):
        shapes.update(prefixed(f"enc{i}.attn.", _attention_shapes(config)))
        shapes.update(prefixed(f"enc{i}.ff.", _ff_shapes(config)))
    for i in range(config.blocks):
        shapes.update(prefixed(f"dec{i}.self.", _attention_shapes(config)))
        shapes.update(prefixed(f"dec{i}.cross.", _attention_shapes(config)))
        shapes.update(prefixed(f"dec{i}.ff.", _ff_shapes(config)))
    shapes.update({"out.W": (config.D, config.V), "out.b": (config.V,)})
    return shapes


def init_params(config: ModelConfig, *, seed=0, dtype=numpy.float32, std=0.1, bias_std=0.0):
    """Weights normal(0, std), biases normal(0, bias_std) (zero by default), from default_rng(seed);
    QK-norm gains one, without a draw (the other parameters are those of the plain model)."""
    rng = numpy.random.default_rng(seed)
    params = {}
    for key, shape in param_shapes(config).items():
        if key.endswith((".gq", ".gk")):
            params[key] = numpy.ones(shape, dtype=dtype)
            continue
        scale = bias_std if key.rsplit(".", 1)[1].startswith("b") else std
        params[key] = (scale * rng.standard_normal(shape)).astype(dtype)
    return params


def embedding_table(config: ModelConfig, dtype=numpy.float32):
    """The article's fixed orthogonal table (V, D), from default_rng(13)."""
    return orthogonal_embedding(config.V, config.D, dtype=dtype)


def config_of(params) -> ModelConfig:
    """Read the sizes from a parameter dict and check it has exactly the expected entries."""
    if not isinstance(params, dict) or "out.W" not in params or "enc0.attn.WQ" not in params \
            or "enc0.ff.W1" not in params:
        got = sorted(params)[:6] if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"params: expected the model's dict ('enc0.attn.WQ', 'enc0.ff.W1', ..., "
                         f"'out.W'), got {got}")
    D, V = params["out.W"].shape
    H = params["enc0.attn.WQ"].shape[0]
    F = params["enc0.ff.W1"].shape[1]
    blocks = sum(1 for key in params if key.endswith(".attn.WQ"))
    config = ModelConfig(D=int(D), H=int(H), F=int(F), V=int(V), blocks=blocks,
                         qk_norm="enc0.attn.gq" in params)
    check_params("model", params, param_shapes(config), params["out.W"].dtype)
    return config


# --- the shared pieces: embedding and a pre-norm residual sublayer -------------------------

def _notify(watch, layer, direction, value):
    if watch is not None:
        watch(layer, direction, value)


def _embed(ids, embedding, config, dtype, xp):
    """PE(E[ids]): (B, T) -> (B, T, D).  The fixed table is a constant, cast to the model's dtype."""
    check_float("embedding", embedding, ndim=2)
    if tuple(embedding.shape) != (config.V, config.D):
        raise ValueError(f"embedding: expected shape (V, D) = ({config.V}, {config.D}), "
                         f"got {tuple(embedding.shape)}")
    x, _ = embedding_forward(ids, {"E": xp.asarray(embedding, dtype=dtype)})  # (B, T, D)
    x, _ = posenc_forward(x, {})                                               # (B, T, D)
    return x  # nothing to cache: the table is not trained and PE passes gradients through


class Direct:
    """The stages run as written; ``checks.bisection.Tape`` has the same two methods and records."""

    def forward(self, name, forward, backward, inputs, params, static):
        return forward(*inputs, params, **static)

    def backward(self, name, backward, dout, cache):
        return backward(dout, cache)


DIRECT = Direct()


class SublayerCache(NamedTuple):
    norm: object   # RmsNormCache of the sublayer's input
    layer: object  # the layer's own cache


def pre_norm_residual(x, *extra_and_params, layer_forward, **static):
    """x + layer(norm(x), *extra): the pre-norm residual step, a stage of the model.
    x: (B, T, D) -> (B, T, D); extra: cross-attention's Z (B, S, D)."""
    *extra, params = extra_and_params
    n, norm_cache = rms_norm_forward(x, {})                              # (B, T, D)
    y, layer_cache = layer_forward(n, *extra, params, **static)          # (B, T, D)
    return x + y, SublayerCache(norm_cache, layer_cache)


def pre_norm_residual_backward(dout, cache, *, layer_backward):
    """Through the layer, then the norm, plus the residual path: (dx or (dx, dextra), grads)."""
    dinputs, grads = layer_backward(dout, cache.layer)
    dn, dextra = dinputs if isinstance(dinputs, tuple) else (dinputs, None)  # cross-attention: (dx, dz)
    dx, _ = rms_norm_backward(dn, cache.norm)                            # (B, T, D) through the norm
    dx += dout                          # residual: both paths add (in place: the norm's fresh array)
    return dx if dextra is None else (dx, dextra), grads


class PostNormCache(NamedTuple):
    layer: object  # the layer's own cache
    norm: object   # RmsNormCache of the residual sum x + layer(x)


def post_norm_residual(x, *extra_and_params, layer_forward, norm_position="post", **static):
    """norm(x + layer(x, *extra)): the post-norm residual step (Xiong et al. 2020's Post-LN), a
    stage of the model.  x: (B, T, D) -> (B, T, D); extra: cross-attention's Z (B, S, D).
    ``norm_position`` is part of the stage's static arguments so that an oracle looked up by the
    stage's kind (checks.bisection) sees it too; here it can only be "post"."""
    if norm_position != "post":
        raise ValueError(f"norm_position: the post-norm stage expects 'post', got {norm_position!r}")
    *extra, params = extra_and_params
    y, layer_cache = layer_forward(x, *extra, params, **static)          # (B, T, D)
    out, norm_cache = rms_norm_forward(x + y, {})                        # (B, T, D)
    return out, PostNormCache(layer_cache, norm_cache)


def post_norm_residual_backward(dout, cache, *, layer_backward):
    """Through the norm first, then the layer plus the residual path: (dx or (dx, dextra), grads)."""
    ds, _ = rms_norm_backward(dout, cache.norm)                          # (B, T, D) d(x + layer(x))
    dinputs, grads = layer_backward(ds, cache.layer)
    dx, dextra = dinputs if isinstance(dinputs, tuple) else (dinputs, None)  # cross-attention: (dx, dz)
    dx = dx + ds                        # residual: both paths add (a new array: dx may be the layer's)
    return dx if dextra is None else (dx, dextra), grads


def _stage(tape, name, forward, backward, inputs, params, watch=None, **static):
    """One named stage through the tape; watch sees its output.  Returns (out, cache)."""
    out, cache = tape.forward(name, forward, backward, tuple(inputs), params, static)
    _notify(watch, name, "forward", out)
    return out, cache


def _stage_backward(tape, name, backward, dout, cache, grads, watch=None):
    """The stage's backward through the tape; its parameter gradients go into grads."""
    dinputs, stage_grads = tape.backward(name, backward, dout, cache)
    grads.update(prefixed(name + ".", stage_grads))
    _notify(watch, name, "backward", dinputs[0] if isinstance(dinputs, tuple) else dinputs)
    return dinputs


def sublayer_pair(layer, norm_position="pre"):
    """(forward, backward) of the pre- or post-norm residual step around layer = (forward,
    backward)."""
    if norm_position == "post":
        return (functools.partial(post_norm_residual, layer_forward=layer[0]),
                functools.partial(post_norm_residual_backward, layer_backward=layer[1]))
    return (functools.partial(pre_norm_residual, layer_forward=layer[0]),
            functools.partial(pre_norm_residual_backward, layer_backward=layer[1]))


def _qknorm_self_forward(x, params, *, causal=False):
    """Self-attention with QK-norm: the cross form with z = x, whose cache mha_backward takes
    (it sums the stream's three paths).  x: (B, T, D) -> (B, T, D)."""
    return qknorm_mhca_forward(x, x, params, causal=causal)


def _pair(name, qk_norm=False, norm_position="pre"):
    """The kernel pair of the sublayer stage named name (``dec0.cross`` -> cross's); qk_norm
    picks the QK-norm forwards (the attention backwards serve both: they go back through the
    norm when the cache holds one).  The kernels are looked up when the stage runs, so a
    profiler that wraps this module's kernels (experiments.shares) sees every call."""
    kind = name.rsplit(".", 1)[1]
    if kind == "cross":
        return sublayer_pair((qknorm_mhca_forward if qk_norm else mhca_forward, mhca_backward),
                             norm_position)
    if kind == "ff":
        return sublayer_pair((ff_forward, ff_backward), norm_position)
    return sublayer_pair((_qknorm_self_forward if qk_norm else mha_forward, mha_backward),
                         norm_position)                      # attn (encoder), self (decoder)


def _position(config):
    """The stages' static argument for the norm position: none for the default "pre" (the
    stages are called as before the option existed), {"norm_position": "post"} otherwise."""
    return {} if config.norm_position == "pre" else {"norm_position": config.norm_position}


def _sublayer(tape, x, name, params, extra=(), watch=None, **static):
    """The residual stage named name (``dec0.cross``) through the tape; pre-norm unless static
    says ``norm_position="post"``."""
    layer_params = sub(params, name + ".")
    forward, backward = _pair(name, "gq" in layer_params, static.get("norm_position", "pre"))
    return _stage(tape, name, forward, backward, (x, *extra), layer_params, watch, **static)


def _sublayer_backward(tape, dx, name, cache, grads, watch=None):
    """Back through the stage named name: (dx, dextra or None)."""
    position = "post" if isinstance(cache, PostNormCache) else "pre"
    dinputs = _stage_backward(tape, name, _pair(name, norm_position=position)[1], dx, cache, grads,
                              watch)
    return dinputs if isinstance(dinputs, tuple) else (dinputs, None)


# --- encoder -------------------------------------------------------------------------------

class EncoderBlockCache(NamedTuple):
    attn: SublayerCache
    ff: SublayerCache


class EncoderCache(NamedTuple):
    blocks: tuple  # EncoderBlockCache per block


def encode(src, params, *, embedding, watch=None, config=None, tape=DIRECT):
    """Z = encoder(src).  src: (B, S) ids -> (B, S, D), no final norm (as in the article).
    ``config``: the sizes (and norm_position) when the caller has already validated params with
    config_of; without it the model is pre-norm."""
    config = config or config_of(params)
    dtype, xp = params["out.W"].dtype, array_module(params["out.W"])
    x = _embed(src, embedding, config, dtype, xp)                                  # (B, S, D)
    blocks = []
    position = _position(config)
    for i in range(config.blocks):
        x, attn = _sublayer(tape, x, f"enc{i}.attn", params, watch=watch,
                            **position)                                            # (B, S, D)
        x, ff = _sublayer(tape, x, f"enc{i}.ff", params, watch=watch, **position)  # (B, S, D)
        blocks.append(EncoderBlockCache(attn, ff))
    return x, EncoderCache(tuple(blocks))


def encode_backward(dz, cache, grads, watch=None, tape=DIRECT):
    """Back through the encoder blocks in reverse; adds their gradients to grads."""
    dx = dz                                                                        # (B, S, D)
    for i in reversed(range(len(cache.blocks))):
        block = cache.blocks[i]
        dx, _ = _sublayer_backward(tape, dx, f"enc{i}.ff", block.ff, grads, watch)
        dx, _ = _sublayer_backward(tape, dx, f"enc{i}.attn", block.attn, grads, watch)
    dx, _ = posenc_backward(dx, None)  # (B, S, D) the fixed embedding table takes no gradient
    return dx


# --- decoder -------------------------------------------------------------------------------

class DecoderBlockCache(NamedTuple):
    self_attn: SublayerCache
    cross: SublayerCache
    ff: SublayerCache


class HeadCache(NamedTuple):
    norm: object     # RmsNormCache of the decoder stream, or None post-norm (no final norm)
    dropout: object  # DropoutCache, or None without dropout
    out: object      # LinearCache of the output projection


def head_forward_pass(y, params, *, dropout=0.0, dropout_mask=None, norm_position="pre"):
    """The ``out`` stage: logits = Out(dropout(norm(y))), or Out(dropout(y)) post-norm, whose
    stream is already normalised (Xiong et al.'s Post-LN has no final norm).  y: (B, T+1, D) ->
    (B, T+1, V); params: W (D, V), b (V,); dropout_mask (B, T+1, D) when dropout > 0."""
    n, norm = (y, None) if norm_position == "post" else rms_norm_forward(y, {})      # (B, T+1, D)
    drop = None
    if dropout:
        n, drop = dropout_forward(n, {}, rate=dropout, mask=dropout_mask)             # (B, T+1, D)
    logits, out = linear_forward(n, params)                                          # (B, T+1, V)
    return logits, HeadCache(norm, drop, out)


def head_backward_pass(dlogits, cache, *, out_backward=linear_backward):
    """Back through the output projection (out_backward), dropout and the norm: (dy, grads)."""
    dn, grads = out_backward(dlogits, cache.out)                                      # (B, T+1, D)
    if cache.dropout is not None:
        dn, _ = dropout_backward(dn, cache.dropout)                                  # (B, T+1, D)
    if cache.norm is None:                                                           # post-norm
        return dn, grads
    dy, _ = rms_norm_backward(dn, cache.norm)                                        # (B, T+1, D)
    return dy, grads


class DecoderCache(NamedTuple):
    blocks: tuple  # DecoderBlockCache per block
    head: HeadCache


def decode(y_in, z, params, *, embedding, dropout=0.0, dropout_mask=None, rng=None, watch=None,
           config=None, tape=DIRECT):
    """Logits for every decoder position.  y_in: (B, T+1) ids starting with Start; z: (B, S, D)
    -> (B, T+1, V).  The same function serves training (teacher forcing) and generation.
    ``config``: as for encode (its norm_position too)."""
    config = config or config_of(params)
    dtype, xp = params["out.W"].dtype, array_module(params["out.W"])
    check_float("z", z, ndim=3)
    if z.shape[0] != y_in.shape[0] or z.shape[2] != config.D or z.dtype != dtype:
        raise ValueError(f"z: expected ({y_in.shape[0]}, S, {config.D}) of dtype {dtype}, "
                         f"got {tuple(z.shape)} of {z.dtype}")
    y = _embed(y_in, embedding, config, dtype, xp)                                  # (B, T+1, D)
    position = _position(config)
    blocks = []
    for i in range(config.blocks):
        y, self_attn = _sublayer(tape, y, f"dec{i}.self", params, watch=watch,
                                 causal=True, **position)                           # (B, T+1, D)
        y, cross = _sublayer(tape, y, f"dec{i}.cross", params, (z,), watch,
                             **position)                                            # (B, T+1, D)
        y, ff = _sublayer(tape, y, f"dec{i}.ff", params, watch=watch, **position)   # (B, T+1, D)
        blocks.append(DecoderBlockCache(self_attn, cross, ff))
    static = dict(position)
    if dropout:
        if (dropout_mask is None) == (rng is None):
            raise ValueError("dropout: give exactly one of dropout_mask= (boolean array) or "
                             "rng= (Generator)")
        if dropout_mask is None:  # drawn here, so that the stage is a function of its inputs
            dropout_mask = draw_mask(y.shape, dropout, rng)                          # (B, T+1, D)
        static.update(dropout=dropout, dropout_mask=dropout_mask)
    logits, head = _stage(tape, "out", head_forward_pass, head_backward_pass, (y,),
                          sub(params, "out."), watch, **static)                      # (B, T+1, V)
    return logits, DecoderCache(tuple(blocks), head)


def decode_backward(dlogits, cache, grads, watch=None, tape=DIRECT):
    """Back through the output layer, the final norm and the blocks in reverse.  Returns dz."""
    dy = _stage_backward(tape, "out", head_backward_pass, dlogits, cache.head, grads,
                         watch)                                                      # (B, T+1, D)
    dz = 0
    for i in reversed(range(len(cache.blocks))):
        block = cache.blocks[i]
        dy, _ = _sublayer_backward(tape, dy, f"dec{i}.ff", block.ff, grads, watch)
        dy, dz_i = _sublayer_backward(tape, dy, f"dec{i}.cross", block.cross, grads, watch)
        dz = dz + dz_i                                      # (B, S, D) every block reads Z
        dy, _ = _sublayer_backward(tape, dy, f"dec{i}.self", block.self_attn, grads, watch)
    posenc_backward(dy, None)  # (B, T+1, D) stops at the fixed embedding table
    return dz


# --- the whole model: loss, forward and backward ------------------------------------------

class ModelCache(NamedTuple):
    encoder: EncoderCache
    decoder: DecoderCache
    loss: object    # CrossEntropyCache
    logits: object  # (B, T+1, V), for accuracy and inspection
    order: tuple    # the parameter names, so the gradients come back in the same order
    tape: object    # the tape the stages ran through, for the backward


def teacher_forcing(tgt, config, xp):
    """Decoder input [Start] + target and output target + [Finish]: (B, T) -> two (B, T+1)."""
    B = tgt.shape[0]
    start = xp.full((B, 1), config.start, dtype=tgt.dtype)     # (B, 1)
    finish = xp.full((B, 1), config.finish, dtype=tgt.dtype)   # (B, 1)
    return xp.concatenate([start, tgt], axis=1), xp.concatenate([tgt, finish], axis=1)


@computes_in(FLOAT32_INSIDE)  # its layers' policy; between them it rounds to the format
def model_forward(src, tgt, params, *, embedding, dropout=0.0, dropout_mask=None, rng=None,
                  watch: Callable | None = None, tape=DIRECT, norm_position="pre"):
    """Training loss of the whole model.  src: (B, S) ids; tgt: (B, T) ids; params as
    ``init_params``; embedding: the fixed (V, D) table.  Dropout (rate ``dropout``) zeroes entries
    of the final-normalised decoder stream before the output layer, with ``dropout_mask`` (B, T+1, D)
    or a seeded Generator ``rng``.  ``tape``: what runs the stages (``checks.bisection.Tape`` records
    them).  ``norm_position``: "pre" or "post" (NORM_POSITIONS).  Returns (loss, cache)."""
    config = dataclasses.replace(config_of(params), norm_position=norm_position)
    check_ids("src", src, config.V)
    check_ids("tgt", tgt, config.V)
    if src.ndim != 2 or tgt.ndim != 2 or src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src, tgt: expected (B, S) and (B, T) with the same B, "
                         f"got {tuple(src.shape)} and {tuple(tgt.shape)}")
    xp = array_module(params["out.W"])
    z, encoder = encode(src, params, embedding=embedding, watch=watch, config=config,
                        tape=tape)                                                  # (B, S, D)
    y_in, y_out = teacher_forcing(tgt, config, xp)                                  # (B, T+1) each
    logits, decoder = decode(y_in, z, params, embedding=embedding, dropout=dropout,
                             dropout_mask=dropout_mask, rng=rng, watch=watch, config=config,
                             tape=tape)                                             # (B, T+1, V)
    loss, loss_cache = _stage(tape, "loss", cross_entropy_forward, cross_entropy_backward,
                              (logits, y_out), {}, watch)                           # ()
    return loss, ModelCache(encoder, decoder, loss_cache, logits, tuple(params), tape)


@computes_in(FLOAT32_INSIDE)
def model_backward(dloss, cache, *, watch: Callable | None = None):
    """Every parameter's gradient, the stages' backwards called in reverse order (through the
    tape of the forward).  Returns ((None, None), grads): token ids take no gradient; grads has
    the keys of params."""
    tape, grads = cache.tape, {}
    dlogits, _ = _stage_backward(tape, "loss", cross_entropy_backward, dloss, cache.loss, grads,
                                 watch)                                             # (B, T+1, V)
    dz = decode_backward(dlogits, cache.decoder, grads, watch, tape)                # (B, S, D)
    encode_backward(dz, cache.encoder, grads, watch, tape)
    return (None, None), {key: grads[key] for key in cache.order}


# --- greedy generation ---------------------------------------------------------------------

class Generated(NamedTuple):
    tokens: object  # (B, 1 + steps) Start, then the generated ids (pad after a sequence's Finish)
    logits: object  # (B, steps, V) the last-position logits of each step
    steps: int      # decoder steps run (fewer than max_new when every sequence finished early)


def generate(src, params, *, embedding, max_new=None, pad=None, norm_position="pre"):
    """Greedy decoding: encode once, start from [Start], append the argmax of the last position.
    Stops as soon as every sequence has produced Finish; later positions of a finished sequence
    hold ``pad`` (Finish by default).  ``max_new`` defaults to S + 1 (S tokens and Finish).
    ``norm_position``: the model's, as in model_forward."""
    config = dataclasses.replace(config_of(params), norm_position=norm_position)
    check_ids("src", src, config.V)
    if src.ndim != 2:
        raise ValueError(f"src: expected rank 2 (B, S), got shape {tuple(src.shape)}")
    pad = config.finish if pad is None else pad
    if not isinstance(pad, (int, numpy.integer)) or not 0 <= pad < config.V:
        raise ValueError(f"pad: expected an id in [0, {config.V}), got {pad!r}")
    max_new = src.shape[1] + 1 if max_new is None else max_new
    if not isinstance(max_new, (int, numpy.integer)) or max_new < 1:
        raise ValueError(f"max_new: expected a positive integer, got {max_new!r}")
    xp = array_module(params["out.W"])
    z, _ = encode(src, params, embedding=embedding, config=config)                  # (B, S, D)
    B = src.shape[0]
    tokens = xp.full((B, 1), config.start, dtype=src.dtype)                          # (B, 1)
    done = xp.zeros(B, dtype=bool)                                                   # (B,)
    step_logits = []
    for _ in range(max_new):
        logits, _ = decode(tokens, z, params, embedding=embedding, config=config)    # (B, t, V)
        last = logits[:, -1]                                                         # (B, V)
        nxt = xp.where(done, pad, last.argmax(axis=-1)).astype(src.dtype)            # (B,)
        tokens = xp.concatenate([tokens, nxt[:, None]], axis=1)                      # (B, t + 1)
        step_logits.append(last)
        done = done | (nxt == config.finish)
        if bool(done.all()):
            break
    return Generated(tokens, xp.stack(step_logits, axis=1), len(step_logits))
