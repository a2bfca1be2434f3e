"""A user's own test of a kernel pair with the lab's checker: ``pytest examples/``.

assert_layer takes check_layer's arguments and fails the test with the whole report (the three
legs, the verdict and the diagnosis of each failing tensor) as its message.
"""
import jax.numpy as jnp
import numpy as np

from checks import assert_layer


def gelu_forward(x, params):             # y = x * sigmoid(1.702 x), the sigmoid GELU
    s = 1 / (1 + np.exp(-1.702 * x))
    return x * s, (x, s)


def gelu_backward(dy, cache):
    x, s = cache
    return dy * (s + 1.702 * x * s * (1 - s)), {}


def gelu_oracle(x, params):
    return x * (1 / (1 + jnp.exp(-1.702 * x)))


def test_gelu_float64():
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    assert_layer(gelu_forward, gelu_backward, gelu_oracle, [x], {}, name="gelu",
                 input_names=("x",), axes={"x": ("batch", "token", "feature")})


def test_gelu_float32():
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    assert_layer(gelu_forward, gelu_backward, gelu_oracle, [x], {}, name="gelu")
