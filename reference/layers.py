"""Every layer of the lab's transformer, written directly from the maths in jax.numpy."""
import jax
import jax.numpy as jnp
import numpy as np

# A composition marks each of its layers as one call named BOUNDARY + the layer's name: the unit a
# hand implementation computes in one kernel call, whose results it rounds to its format
# (the rounding model, checks.rounding, reads the mark; reference.transformer sets it).
BOUNDARY = "layer:"


def as_layer(name, fn, *args):
    """fn(*args) as one call of the program named ``layer:name`` (same values, same gradients)."""
    call = lambda *a: fn(*a)  # noqa: E731  (a fresh function to carry the name)
    call.__name__ = call.__qualname__ = BOUNDARY + name
    return jax.jit(call)(*args)


def embedding(ids, params):
    return jnp.asarray(params["E"])[jnp.asarray(ids)]


def posenc(x, params):
    _, T, D = x.shape
    pos = np.arange(T)[:, None]
    i = np.arange(D)[None, :]
    angle = pos * 10000.0 ** (-2 * (i // 2) / D)
    table = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    return x + jnp.asarray(table, dtype=x.dtype)


def rms_norm(x, params, *, eps=1e-8):
    return x / jnp.sqrt(jnp.mean(x ** 2, axis=-1, keepdims=True) + eps)


def layernorm(x, params, *, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return params["g"] * (x - mean) / jnp.sqrt(var + eps) + params["b"]


def softmax(x, params):
    return jax.nn.softmax(x, axis=-1)


def leaky_relu(x, params, *, slope=0.1):
    return jnp.where(x > 0, x, slope * x)


def linear(x, params):
    return x @ params["W"] + params["b"]


def ff(x, params, *, slope=0.1):
    return leaky_relu(linear(x, {"W": params["W1"], "b": params["b1"]}), {}, slope=slope) \
        @ params["W2"] + params["b2"]


def mhca(x, z, params, *, causal=False):
    B, T, D = x.shape
    S = z.shape[1]
    H, P, _ = params["WQ"].shape
    xh = x.reshape(B, T, H, P)
    zh = z.reshape(B, S, H, P)
    q = jnp.einsum("bthp,hpq->bhtq", xh, params["WQ"])
    k = jnp.einsum("bshp,hpq->bhsq", zh, params["WK"])
    v = jnp.einsum("bshp,hpq->bhsq", zh, params["WV"])
    logits = jnp.einsum("bhtp,bhsp->bhts", q, k) * (1.0 / float(np.sqrt(P)))  # a weak Python float keeps the dtype
    if causal:
        logits = logits + jnp.where(np.triu(np.ones((T, S), bool), k=1), -1e9, 0.0).astype(x.dtype)
    a = jax.nn.softmax(logits, axis=-1)
    heads = jnp.einsum("bhts,bhsp->bthp", a, v).reshape(B, T, D)
    return heads @ params["WO"]


def mha(x, params, *, causal=False):
    return mhca(x, x, params, causal=causal)


def _standardise(x):
    return layernorm(x, {"g": 1.0, "b": 0.0})  # weak Python floats keep the dtype


def qknorm_mhca(x, z, params, *, causal=False):
    """Cross-attention whose per-head queries and keys are layer-normalised over the head width,
    times the gains gq, gk (H, P), before the scaled product."""
    B, T, D = x.shape
    S = z.shape[1]
    H, P, _ = params["WQ"].shape
    q = _standardise(jnp.einsum("bthp,hpq->bhtq", x.reshape(B, T, H, P), params["WQ"]))
    k = _standardise(jnp.einsum("bshp,hpq->bhsq", z.reshape(B, S, H, P), params["WK"]))
    q, k = q * params["gq"][None, :, None, :], k * params["gk"][None, :, None, :]
    v = jnp.einsum("bshp,hpq->bhsq", z.reshape(B, S, H, P), params["WV"])
    logits = jnp.einsum("bhtp,bhsp->bhts", q, k) * (1.0 / float(np.sqrt(P)))
    if causal:
        logits = jnp.where(np.tril(np.ones((T, S), bool)), logits, -jnp.inf)
    a = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhts,bhsp->bthp", a, v).reshape(B, T, D) @ params["WO"]


def cross_entropy(logits, targets, params):
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_p, jnp.asarray(targets)[..., None], axis=-1))


def dropout(x, params, *, rate, mask=None, rng=None):
    if mask is None:
        raise ValueError("the dropout oracle needs the keep-mask (mask=)")
    return x * jnp.asarray(mask, dtype=x.dtype) / (1 - rate)
