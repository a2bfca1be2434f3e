"""The zoo's foreign section: backward bugs in layers the lab has never seen.

Three layers written here as test material, not as lab kernels (they are not in the registry and
the lab's model does not use them), each a forward directly above its backward and its
``jax.numpy`` oracle below:

    tanh-GELU   0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi)
    SwiGLU      (silu(x W1 + b1) * (x W2 + b2)) W3, silu(z) = z sigmoid(z)
    RoPE        rotary position embedding of (B, T, H, P) in the halves layout: feature i is
                paired with feature i + P/2 and the pair rotated by (offset + t) base^(-2i/P)

Each bug is what a person writing the backward gets wrong, made by calling the correct backward
with something altered (a wrong coefficient, a modified cache, a gradient swapped or summed
over the wrong axes).  The checker sees these layers as a user would: through ``check_layer``
with the layer's axis names and sizes, nothing registered.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from checks.zoo import Bug
from kernels.backend import array_module, check_float, check_params


# --- tanh-GELU --------------------------------------------------------------------------------

GELU_C = math.sqrt(2 / math.pi)
GELU_A = 0.044715


class GeluCache(NamedTuple):
    x: object  # (...) the input
    t: object  # (...) tanh(c (x + a x^3))


def gelu_forward(x, params):
    """The tanh approximation of GELU.  x: (...) -> (...).  No parameters."""
    check_float("x", x)
    check_params("gelu", params, {}, x.dtype)
    xp = array_module(x)
    c, a = x.dtype.type(GELU_C), x.dtype.type(GELU_A)
    t = xp.tanh(c * (x + a * x ** 3))                                    # (...)
    return x.dtype.type(0.5) * x * (1 + t), GeluCache(x, t)


def gelu_backward(dy, cache, *, half=0.5, cubic=3 * GELU_A, chain=GELU_C, tanh_term=1.0,
                  direct_term=1.0):
    """dx = dy (half (1 + t) + half x (1 - t^2) c (1 + 3 a x^2)): the direct term and the term
    through tanh.  The keywords are the formula's constants, for the zoo's wrong ones."""
    x, t = cache.x, cache.t
    k = lambda v: x.dtype.type(v)
    through_tanh = x * (1 - t * t) * k(chain) * (1 + k(cubic) * x * x)  # (...)
    return dy * k(half) * (k(direct_term) * (1 + t) + k(tanh_term) * through_tanh), {}


def gelu_oracle(x, params):
    return 0.5 * x * (1 + jnp.tanh(GELU_C * (x + GELU_A * x ** 3)))


# --- SwiGLU -----------------------------------------------------------------------------------

class SwigluCache(NamedTuple):
    x: object       # (B, T, D) the input
    gate: object    # (B, T, F) x W1 + b1, before silu
    s: object       # (B, T, F) sigmoid(gate)
    value: object   # (B, T, F) x W2 + b2
    hidden: object  # (B, T, F) silu(gate) * value, for dW3
    params: dict    # W1, W2 (D, F), W3 (F, D), for the input gradient


def silu_slope(gate, s):
    """d silu / d gate = s + gate s (1 - s): through the gate itself and through sigmoid."""
    return s + gate * s * (1 - s)


def swiglu_hidden_grads(dy, cache, *, slope=silu_slope):
    """(dgate, dvalue), both (B, T, F): the upstream gradient at the two projections."""
    dh = dy @ cache.params["W3"].T                                       # (B, T, F)
    return dh * cache.value * slope(cache.gate, cache.s), dh * cache.gate * cache.s


def swiglu_forward(x, params):
    """(silu(x W1 + b1) * (x W2 + b2)) W3.  x: (B, T, D) -> (B, T, D)."""
    check_float("x", x, ndim=3)
    W1 = params.get("W1") if isinstance(params, dict) else None
    if W1 is None or W1.ndim != 2:
        raise ValueError("swiglu params: expected 'W1', 'W2' (D, F), 'b1', 'b2' (F,), 'W3' (F, D)")
    D, F = W1.shape
    check_params("swiglu", params, {"W1": (D, F), "b1": (F,), "W2": (D, F), "b2": (F,),
                                    "W3": (F, D)}, x.dtype)
    xp = array_module(x)
    gate = x @ W1 + params["b1"]                                         # (B, T, F)
    s = 1 / (1 + xp.exp(-gate))                                          # (B, T, F)
    value = x @ params["W2"] + params["b2"]                              # (B, T, F)
    hidden = gate * s * value                                            # (B, T, F)
    return hidden @ params["W3"], SwigluCache(x, gate, s, value, hidden, params)


def swiglu_backward(dy, cache, *, slope=silu_slope):
    """dx through the gate and the value projections; every weight and bias."""
    dgate, dvalue = swiglu_hidden_grads(dy, cache, slope=slope)          # (B, T, F) each
    W1, W2 = cache.params["W1"], cache.params["W2"]
    D, F = W1.shape
    x2, dy2 = cache.x.reshape(-1, D), dy.reshape(-1, D)                  # (B*T, D)
    dg2, dv2 = dgate.reshape(-1, F), dvalue.reshape(-1, F)               # (B*T, F)
    dx = dgate @ W1.T + dvalue @ W2.T                                    # (B, T, D)
    return dx, {"W1": x2.T @ dg2, "b1": dg2.sum(axis=0), "W2": x2.T @ dv2,
                "b2": dv2.sum(axis=0), "W3": cache.hidden.reshape(-1, F).T @ dy2}


def swiglu_oracle(x, params):
    gate = x @ params["W1"] + params["b1"]
    return (gate * jax.nn.sigmoid(gate) * (x @ params["W2"] + params["b2"])) @ params["W3"]


# --- RoPE -------------------------------------------------------------------------------------

ROPE_BASE = 10000.0


def rope_tables(T, P, offset, dtype, xp=np, width=None):
    """cos and sin of the angles (offset + t) base^(-2i/width), each (T, 1, P/2); the width
    is the head's, P (``width`` only for the zoo's wrong one)."""
    if P % 2:
        raise ValueError(f"P: rotary embedding needs an even head width, got P = {P}")
    freq = ROPE_BASE ** (-2 * np.arange(P // 2) / (width or P))          # (P/2,)
    angle = (offset + np.arange(T))[:, None, None] * freq                # (T, 1, P/2)
    return xp.asarray(np.cos(angle), dtype=dtype), xp.asarray(np.sin(angle), dtype=dtype)


class RopeCache(NamedTuple):
    cos: object  # (T, 1, P/2) cos of the angles, broadcast over batch and heads
    sin: object  # (T, 1, P/2)


def rotate_halves(x, cos, sin):
    """Each pair (x_i, x_{i+P/2}) rotated by the angle whose cos and sin are given."""
    xp = array_module(x)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]                                # (B, T, H, P/2)
    return xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # (B, T, H, P)


def rope_forward(x, params, *, offset=0):
    """x: (B, T, H, P) -> (B, T, H, P), token t rotated by position offset + t."""
    check_float("x", x, ndim=4)
    check_params("rope", params, {}, x.dtype)
    _, T, _, P = x.shape
    cos, sin = rope_tables(T, P, offset, x.dtype, array_module(x))       # (T, 1, P/2) each
    return rotate_halves(x, cos, sin), RopeCache(cos, sin)


def rope_backward(dy, cache):
    """A rotation's transpose is the rotation by -theta."""
    return rotate_halves(dy, cache.cos, -cache.sin), {}


def rope_oracle(x, params, *, offset=0):
    _, T, _, P = x.shape
    freq = ROPE_BASE ** (-2 * np.arange(P // 2) / P)
    angle = (offset + np.arange(T))[:, None, None] * freq
    cos, sin = jnp.asarray(np.cos(angle)), jnp.asarray(np.sin(angle))
    x1, x2 = x[..., :P // 2], x[..., P // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


# --- the layers as a user checks them ---------------------------------------------------------

def _normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Layer:
    """A layer outside the registry, checked through ``check_layer`` as a user would."""
    name: str
    forward: Callable
    backward: Callable
    oracle: Callable
    make: Callable           # (rng, dtype) -> (inputs, params)
    axes: dict
    sizes: dict
    static: dict = dataclasses.field(default_factory=dict)

    def check(self, dtype=np.float64, seed=0, backward=None):
        from checks.engine import check_layer
        inputs, params = self.make(np.random.default_rng(seed), np.dtype(dtype))
        return check_layer(self.forward, backward or self.backward, self.oracle, inputs, params,
                           static=self.static, seed=seed, name=self.name, input_names=("x",),
                           axes=self.axes, sizes=self.sizes)


GELU_SIZES = {"B": 2, "T": 4, "F": 6}
SWIGLU_SIZES = {"B": 2, "T": 3, "D": 4, "F": 6}
ROPE_SIZES = {"B": 2, "T": 4, "H": 2, "P": 8}


def _swiglu_case(rng, dtype):
    B, T, D, F = (SWIGLU_SIZES[k] for k in "BTDF")
    w = lambda shape: _normal(rng, shape, dtype, 1 / math.sqrt(shape[0]))
    bias = lambda: _normal(rng, (F,), dtype, 0.1)
    x = _normal(rng, (B, T, D), dtype)
    return [x], {"W1": w((D, F)), "b1": bias(), "W2": w((D, F)), "b2": bias(), "W3": w((F, D))}


def _rope_case(rng, dtype):
    return [_normal(rng, tuple(ROPE_SIZES[k] for k in "BTHP"), dtype)], {}


BTHP = ("batch", "token", "head", "feature")
GELU = Layer("gelu", gelu_forward, gelu_backward, gelu_oracle,
             lambda rng, dt: ([_normal(rng, tuple(GELU_SIZES[k] for k in "BTF"), dt, 1.5)], {}),
             axes={"x": ("batch", "token", "hidden")}, sizes=GELU_SIZES)
SWIGLU = Layer("swiglu", swiglu_forward, swiglu_backward, swiglu_oracle, _swiglu_case,
               axes={"x": ("batch", "token", "feature"), "W1": ("row", "col"),
                     "W2": ("row", "col"), "W3": ("row", "col"), "b1": ("hidden",),
                     "b2": ("hidden",)}, sizes=SWIGLU_SIZES)
ROPE = Layer("rope", rope_forward, rope_backward, rope_oracle, _rope_case, axes={"x": BTHP},
             sizes=ROPE_SIZES)
# decoding with a cache: the T new tokens sit at positions 3 ... 3 + T - 1
ROPE_OFFSET = dataclasses.replace(ROPE, name="rope-offset", static={"offset": 3})
LAYERS = [GELU, SWIGLU, ROPE, ROPE_OFFSET]


# --- the broken backwards ---------------------------------------------------------------------

def _gelu(**wrong):
    return lambda dy, cache: gelu_backward(dy, cache, **wrong)


def _swiglu_grads(alter):
    def backward(dy, cache):
        dx, grads = swiglu_backward(dy, cache)
        return dx, alter(dict(grads))
    return backward


def _swiglu_swapped(grads):
    """The gate's and the value's gradients mixed up: W1 and W2 (and their biases) swapped."""
    return {**grads, "W1": grads["W2"], "W2": grads["W1"], "b1": grads["b2"], "b2": grads["b1"]}


def _swiglu_value_path_dropped(dy, cache):
    """dx through the gate only: the value projection's term forgotten."""
    W2 = cache.params["W2"]
    dx, _ = swiglu_backward(dy, cache._replace(params={**cache.params, "W2": W2 * 0}))
    return dx, swiglu_backward(dy, cache)[1]


def _swiglu_bias_token_sums(dy, cache):
    """db1 summed over the batch axis only: (T, F) instead of (F,)."""
    dx, grads = swiglu_backward(dy, cache)
    dgate, _ = swiglu_hidden_grads(dy, cache)                            # (B, T, F)
    return dx, {**grads, "b1": dgate.sum(axis=0)}                        # (T, F)


def _swiglu_w3_from_gate(dy, cache):
    """dW3 from silu(gate), the gate's activation, instead of the hidden product."""
    return swiglu_backward(dy, cache._replace(hidden=cache.gate * cache.s))


def _rope(alter_cache):
    return lambda dy, cache: rope_backward(dy, alter_cache(cache))


def _rope_interleaved(dy, cache):
    """The backward written for the interleaved layout (pairs 2i, 2i+1) of a halves forward."""
    xp = array_module(dy)
    even, odd = dy[..., 0::2], dy[..., 1::2]                             # (B, T, H, P/2)
    cos, sin = cache.cos, cache.sin
    dx = xp.stack([even * cos + odd * sin, odd * cos - even * sin], axis=-1)  # (B, T, H, P/2, 2)
    return dx.reshape(dy.shape), {}                                      # (B, T, H, P)


def _rope_tables_of(cache, **where):
    """The cache's tables recomputed at another offset or width."""
    T, P = cache.cos.shape[0], 2 * cache.cos.shape[-1]
    return dict(zip(("cos", "sin"), rope_tables(T, P, dtype=cache.cos.dtype, **where)))


def _swiglu_slope(slope):
    return lambda dy, cache: swiglu_backward(dy, cache, slope=slope)


GELU_TANH_ARG = "(`GELU_C * (x + GELU_A * x ** 3)`)"  # how the diagnosis quotes the oracle
WIDE = ROPE_SIZES["H"] * ROPE_SIZES["P"]


def _bugs():
    """(name, layer, broken backward, the tensor shown, the phrase its diagnosis must contain
    to count as explained; "" where the checker explains nothing)."""
    return [Bug(*b) for b in [
        ("GELU: the x^3 term's derivative missing", GELU, _gelu(cubic=0.0), "x",
         "missing the path through `integer_pow`"),
        ("GELU: 3·0.044715 written as 0.044715", GELU, _gelu(cubic=GELU_A), "x",
         "(`x ** 3`) is scaled by 1/3"),
        ("GELU: the 0.5 dropped", GELU, _gelu(half=1.0), "x", "scaled by a constant: 2 x"),
        ("GELU: the sech^2 term with the wrong sign", GELU, _gelu(tanh_term=-1.0), "x",
         f"{GELU_TANH_ARG} has the wrong sign"),
        ("GELU: the chain factor sqrt(2/pi) forgotten", GELU, _gelu(chain=1.0), "x",
         f"{GELU_TANH_ARG} is scaled by"),
        ("GELU: only the product rule's tanh term", GELU, _gelu(direct_term=0.0), "x",
         "(`0.5 * x`)"),
        ("SwiGLU: silu' missing its z·s·(1 - s) term", SWIGLU, _swiglu_slope(lambda z, s: s),
         "W1", "missing the path through `logistic`"),
        ("SwiGLU: silu' as the sigmoid's derivative s·(1 - s)", SWIGLU,
         _swiglu_slope(lambda z, s: z * s * (1 - s)), "W1",
         "(`gate * jax.nn.sigmoid(gate)`)"),
        ("SwiGLU: gate and value paths swapped", SWIGLU, _swiglu_grads(_swiglu_swapped), "W1",
         "dW1 and dW2 are swapped"),
        ("SwiGLU: dW1 transposed", SWIGLU, _swiglu_grads(lambda g: {**g, "W1": g["W1"].T}),
         "W1", "its shape is the transpose"),
        ("SwiGLU: dx misses the value path", SWIGLU, _swiglu_value_path_dropped, "x",
         "missing the path through operand 0 of `dot_general`"),
        ("SwiGLU: gate bias summed over the batch only", SWIGLU, _swiglu_bias_token_sums, "b1",
         "missing a sum over a broadcast axis"),
        ("SwiGLU: dW3 from silu(gate) instead of the product", SWIGLU, _swiglu_w3_from_gate,
         "W3", "takes `gate * jax.nn.sigmoid(gate)`"),
        ("RoPE: +sin instead of -sin (rotates by +theta)", ROPE,
         _rope(lambda c: c._replace(sin=-c.sin)), "x", "(`x1 * sin`) has the wrong sign"),
        ("RoPE: cos and sin swapped", ROPE, _rope(lambda c: c._replace(cos=c.sin, sin=c.cos)),
         "x", "reads cache.cos and cache.sin in each other's place"),
        ("RoPE: interleaved pairs in the backward of a halves forward", ROPE, _rope_interleaved,
         "x", "exact at token 0"),
        ("RoPE: angles from the model width H·P, not the head width", ROPE,
         _rope(lambda c: c._replace(**_rope_tables_of(c, offset=0, width=WIDE))), "x",
         "exact at token 0 and at features 0, 4"),
        ("RoPE: the position offset forgotten in backward", ROPE_OFFSET,
         _rope(lambda c: c._replace(**_rope_tables_of(c, offset=0))), "x",
         "the right one for offset = 0"),
    ]]


BUGS = _bugs()
